"""Interaction blocks a model is made of, each a small piece over the embedded fields
(engine/tables.py `Embedded`): the first-order sum and FM's pairwise term, the MLP, DCN-v2's
cross network, xDeepFM's compressed interaction network, AutoInt's self-attention and DIN's
target attention.

Plain tf.Module and tf.Variable, no Keras: Keras 3 breaks parameter-server training:
its `Embedding` over a sharded variable fails in `tape.gradient` (a ShardedVariable has no
`handle`), `model.fit` does not support ParameterServerStrategy, and its Adam updates tables
densely (about 2x slower). A block's `variables_to_update()` are its trainable variables (the optimizer
updates them densely) and `penalized()` the kernels the model's l2_dense applies to.
"""

from __future__ import annotations

import itertools
import math

import tensorflow as tf

from .. import kernels


def first_and_fm(block, first_order: bool = True):
    """(first-order sum [B] or None, FM's second-order term [B]) of an embedded block
    [B, F, width]: sum_f w_f x_f and 1/2 sum_k [(sum_f e_fk)^2 - sum_f e_fk^2].

    The terms slice the small per-example sums [B, width], never the [B, F, width] block by
    column (the gradients of such slices cost more than the FM itself). In one pass each way
    where the fused kernels run (ctrtrain/kernels)."""
    if block.dtype == tf.float32 and kernels.usable_here():
        return kernels.fm(block, first_order)
    summed = tf.reduce_sum(block, 1)                                     # [B, width]
    square_of_sum = tf.square(summed) - tf.reduce_sum(tf.square(block), 1)
    if not first_order:
        return None, 0.5 * tf.reduce_sum(square_of_sum, 1)
    return summed[:, 0], 0.5 * tf.reduce_sum(square_of_sum[:, 1:], 1)


def dropout(h, rate: float, fused: bool = True):
    """tf.nn.dropout(h, rate): in one pass each way where the fused kernels run (float32, not
    inside an XLA cluster: `fused` False), its mask drawn from a seed pair that a stateful op
    draws each step as tf.nn.dropout's own random op does (same global-seed behaviour)."""
    if fused and h.dtype == tf.float32 and kernels.usable_here():
        seed = tf.random.uniform([2], maxval=tf.int64.max, dtype=tf.int64)
        return kernels.dropout(h, rate, seed)
    return tf.nn.dropout(h, rate=rate)


def relu_dropout(z, b, rate: float, fused: bool = True):
    """dropout(relu(z + b), rate) (rate 0: relu(z + b)), an MLP layer after its matmul. Where
    the fused kernels run (float32, not inside an XLA cluster) its gradient to z and b is one
    pass (kernels.relu_dropout_grad) instead of dropout's gradient, ReluGrad and the bias's
    Sum; the forward is the same ops either way (oneDNN fuses the matmul, bias and ReLU)."""
    if not (fused and z.dtype == tf.float32 and kernels.usable_here()):
        h = tf.nn.relu(z + b)
        return dropout(h, rate, fused) if rate > 0 else h

    @tf.custom_gradient
    def layer(z, b):
        h = tf.nn.relu(z + b)
        y = dropout(h, rate) if rate > 0 else h
        return y, lambda dy: kernels.relu_dropout_grad(dy, y, rate)

    return layer(z, b)


def first_order(block):
    """sum_f w_f x_f [B] of a block whose column 0 is the first-order weight."""
    return tf.reduce_sum(block, 1)[:, 0]


def mlp_over_fields(cfg, first_order: bool, out: int | None = 1, seed: int = 1):
    """The model's MLP (deep_layers, dropout, batch_norm, ...) over the embedded block read
    flat [B, slots * width] and the numeric values that enter as values (Embedded.deep_input),
    then a linear layer of `out` units (None: the last hidden layer's output). With a
    first-order column the first kernel's rows facing it are held at zero, so the MLP sees the
    embeddings alone and nothing slices the block (see first_and_fm). `seed`: added to the
    model's seed."""
    k, n = cfg.embedding_size, cfg.numeric_appended
    width = cfg.slots * (int(first_order) + k) + n
    mask = None
    if first_order:
        mask = tf.constant(([0.0] + [1.0] * k) * cfg.slots + [1.0] * n, shape=[width, 1],
                           dtype=tf.float32)
    units = list(cfg.deep_layers) + ([out] if out else [])
    return MLP(width, units, cfg.rates(), cfg.batch_norm, seed=cfg.seed + seed, input_mask=mask,
               mixed_precision=cfg.mixed_precision, xla=cfg.xla, linear_last=bool(out))


class NumericLinear(tf.Module):
    """sum_j w_j x_j [B] of the numeric values x [B, n] (w starts at zero, as the table's
    first-order column does)."""

    def __init__(self, n: int, name="numeric_linear"):
        super().__init__(name=name)
        self.kernel = tf.Variable(tf.zeros([n, 1]), name="kernel")

    def variables_to_update(self):
        return [self.kernel]

    def penalized(self):
        return []

    def __call__(self, x):
        return tf.matmul(x, self.kernel)[:, 0]


class MLP(tf.Module):
    """Dense layers `units` (the last one linear, unless `linear_last` is False), ReLU,
    optional batch normalization and dropout after each hidden one. `input_mask` [width, 1]:
    inputs whose rows of the first kernel start at zero and stay there (the optimizer masks
    their gradient: CTRModel.gradient_terms), so a model can feed the whole embedded block
    and the MLP still sees only the embeddings (DeepFM: not the first-order column)."""

    def __init__(self, width: int, units, rates=(), batch_norm: bool = False, seed: int = 0,
                 input_mask=None, mixed_precision: bool = False, xla: bool = False,
                 linear_last: bool = True, name: str = "mlp"):
        super().__init__(name=name)
        units = list(units)
        self.hidden = len(units) - 1 if linear_last else len(units)
        self.rates = tuple(rates) or (0.0,) * self.hidden
        self.mixed_precision, self.input_mask = mixed_precision, input_mask
        self.kernels, self.biases, self.bn = [], [], []
        glorot = glorot_uniform(seed)
        for i, n in enumerate(units):
            init = glorot((width, n))
            if i == 0 and input_mask is not None:
                init = init * input_mask
            self.kernels.append(tf.Variable(init, name=f"kernel_{i}"))
            self.biases.append(tf.Variable(tf.zeros([n]), name=f"bias_{i}"))
            if batch_norm and i < self.hidden:
                self.bn.append(BatchNorm(n, name=f"bn_{i}"))
            width = n
        # XLA only here: the sparse part has dynamic shapes.
        self.xla = xla
        self._run = tf.function(self._eager, jit_compile=True, autograph=False) if xla \
            else self._eager

    def variables_to_update(self):
        bn = [v for b in self.bn for v in (b.gamma, b.beta)]
        return self.kernels + self.biases + bn

    def penalized(self):
        return self.kernels

    def __call__(self, h, training: bool = False):
        """[B, units[-1]] float32 (computed in bfloat16 with mixed_precision)."""
        return self._run(h, training)

    def _eager(self, h, training: bool):
        dtype = tf.bfloat16 if self.mixed_precision else tf.float32
        h = tf.cast(h, dtype)
        for i, (kern, b) in enumerate(zip(self.kernels, self.biases)):
            # The first kernel's masked rows are zero (their gradient is masked in the
            # optimizer's update: the model's gradient_terms), so no mask is applied here.
            z = tf.matmul(h, tf.cast(kern, dtype))
            if i < self.hidden and not self.bn:
                h = relu_dropout(z, tf.cast(b, dtype), self.rates[i] if training else 0.0,
                                 fused=not self.xla)
                continue
            h = z + tf.cast(b, dtype)
            if i < self.hidden:    # with batch normalization between the bias and the ReLU
                h = tf.cast(self.bn[i](tf.cast(h, tf.float32), training), dtype)
                h = tf.nn.relu(h)
                rate = self.rates[i]
                if training and rate > 0:
                    h = dropout(h, rate, fused=not self.xla)
        return tf.cast(h, tf.float32)


class BatchNorm(tf.Module):
    def __init__(self, units: int, momentum: float = 0.99, eps: float = 1e-3, name=None):
        super().__init__(name=name)
        self.gamma = tf.Variable(tf.ones([units]), name="gamma")
        self.beta = tf.Variable(tf.zeros([units]), name="beta")
        self.mean = tf.Variable(tf.zeros([units]), trainable=False, name="moving_mean")
        self.var = tf.Variable(tf.ones([units]), trainable=False, name="moving_var")
        self.momentum, self.eps = momentum, eps

    def __call__(self, h, training):
        if training:
            mean, var = tf.nn.moments(h, [0])
            update_moving(((self.mean, mean), (self.var, var)), self.momentum)
        else:
            mean, var = self.mean, self.var
        return tf.nn.batch_normalization(h, mean, var, self.beta, self.gamma, self.eps)


def update_moving(stats, momentum: float):
    """Moves each (variable, batch value) pair's moving average toward the batch's value. On the
    handle: under a mirrored strategy each replica keeps moving statistics of its own batches
    (the chief's are exported), as the optimizer updates its copy."""
    for stat, batch_value in stats:
        tf.raw_ops.AssignVariableOp(resource=stat.handle,
                                    value=momentum * stat + (1 - momentum) * batch_value)


class Dice(tf.Module):
    """DIN's data-adaptive activation (Zhou et al., 2018, eq. 9): p(s) s + (1 - p(s)) alpha s,
    p(s) = sigmoid((s - E[s]) / sqrt(Var[s] + eps)), per unit; E and Var over the batch's held
    positions in training (`weights` [N] masks the padding out), their moving averages in
    inference; alpha trainable, from 0."""

    def __init__(self, units: int, momentum: float = 0.99, eps: float = 1e-8, name=None):
        super().__init__(name=name)
        self.alpha = tf.Variable(tf.zeros([units]), name="alpha")
        self.mean = tf.Variable(tf.zeros([units]), trainable=False, name="moving_mean")
        self.var = tf.Variable(tf.ones([units]), trainable=False, name="moving_var")
        self.momentum, self.eps = momentum, eps

    def __call__(self, s, weights, training):
        """s [N, units], weights [N] (1 held, 0 padding). In one op each way where the fused
        kernels run (ctrtrain/kernels: some thirty element-wise ops otherwise)."""
        if s.dtype == tf.float32 and kernels.usable_here():
            out, mean, var = kernels.dice(s, weights, self.alpha, self.mean, self.var,
                                          bool(training), self.eps)
            if training:
                update_moving(((self.mean, mean), (self.var, var)), self.momentum)
            return out
        if training:
            w = weights[:, None]
            n = tf.reduce_sum(w)
            mean = tf.math.divide_no_nan(tf.reduce_sum(s * w, 0), n)
            var = tf.math.divide_no_nan(tf.reduce_sum(tf.square(s - mean) * w, 0), n)
            update_moving(((self.mean, mean), (self.var, var)), self.momentum)
        else:
            mean, var = self.mean, self.var
        p = tf.sigmoid((s - mean) * tf.math.rsqrt(var + self.eps))
        return p * s + (1 - p) * self.alpha * s


class TargetAttention(tf.Module):
    """DIN's local activation unit (Zhou et al., 2018, fig. 2): each history item e_j is
    weighed by a small MLP over [e_j, q, e_j - q, e_j * q] against the target q (hidden layers
    `units` with Dice, then one linear output), and the history pools to sum_j w_j e_j over the
    held items. As the paper: the weights are not normalized by a softmax (DeepCTR's default
    too); DeepCTR feeds [q, e_j, q - e_j, q * e_j], the same up to the first kernel's signs.
    (q [B, k], rows [B, L, k], held [B, L]) -> [B, k]."""

    def __init__(self, width: int, units, seed: int = 0, name="target_attention"):
        super().__init__(name=name)
        glorot = glorot_uniform(seed)
        self.kernels, self.biases, self.dice, n = [], [], [], 4 * width
        for i, u in enumerate(list(units) + [1]):
            self.kernels.append(tf.Variable(glorot((n, u)), name=f"kernel_{i}"))
            self.biases.append(tf.Variable(tf.zeros([u]), name=f"bias_{i}"))
            if i < len(units):
                self.dice.append(Dice(u, name=f"dice_{i}"))
            n = u

    def variables_to_update(self):
        return self.kernels + self.biases + [d.alpha for d in self.dice]

    def penalized(self):
        return self.kernels

    def __call__(self, q, rows, held, training: bool = False):
        length, width = rows.shape[1], rows.shape[2]
        # The first layer, [e, q, e - q, e * q] W = [e, e * q] [W_e + W_d; W_p] + q (W_q - W_d):
        # the target's part once per example instead of once per item, half the per-item
        # product (the same function; the variables stay the paper's W).
        w_e, w_q, w_d, w_p = tf.split(self.kernels[0], 4, 0)
        per_item = tf.matmul(tf.reshape(tf.concat([rows, rows * q[:, None, :]], 2),
                                        [-1, 2 * width]), tf.concat([w_e + w_d, w_p], 0))
        per_example = tf.matmul(q, w_q - w_d) + self.biases[0]
        units = per_example.shape[1]
        h = tf.reshape(tf.reshape(per_item, [-1, length, units]) + per_example[:, None, :],
                       [-1, units])
        mask = tf.reshape(tf.cast(held, tf.float32), [-1])
        for i, (kern, b) in enumerate(zip(self.kernels, self.biases)):
            if i > 0:
                h = tf.matmul(h, kern) + b
            if i < len(self.dice):
                h = self.dice[i](h, mask, training)
        weights = tf.reshape(h[:, 0] * mask, [-1, length, 1])       # 0 for the padding
        return tf.reduce_sum(weights * rows, 1)


class CrossNetwork(tf.Module):
    """DCN-v2's cross network (Wang et al., 2021, eq. 1): x_{l+1} = x0 * (W_l x_l + b_l) + x_l,
    W_l full rank [d, d], or low rank U_l V_l^T (U, V [d, r]) when `rank` > 0 (the paper's
    DCN-Mix without its mixture of experts). Returns x_L [B, d]."""

    def __init__(self, width: int, layers: int, rank: int = 0, seed: int = 0, name="cross"):
        super().__init__(name=name)
        glorot = glorot_each(seed)
        self.rank = rank
        if rank:
            self.u = [tf.Variable(glorot((width, rank)), name=f"u_{i}") for i in range(layers)]
            self.v = [tf.Variable(glorot((width, rank)), name=f"v_{i}") for i in range(layers)]
            self.kernels = self.u + self.v
        else:
            self.w = [tf.Variable(glorot((width, width)), name=f"w_{i}") for i in range(layers)]
            self.kernels = list(self.w)
        self.biases = [tf.Variable(tf.zeros([width]), name=f"b_{i}") for i in range(layers)]

    def variables_to_update(self):
        return self.kernels + self.biases

    def penalized(self):
        return self.kernels

    def __call__(self, x0):
        x = x0
        for i, b in enumerate(self.biases):
            if self.rank:
                mixed = tf.matmul(tf.matmul(x, self.v[i]), self.u[i], transpose_b=True)
            else:
                mixed = tf.matmul(x, self.w[i])
            x = x0 * (mixed + b) + x
        return x


class CIN(tf.Module):
    """xDeepFM's compressed interaction network (Lian et al., 2018, eq. 6):
    X^k_h = sum_{i,j} W^k_{h,i,j} (X^{k-1}_i * X^0_j), the products taken per embedding
    dimension, then each feature map sum-pooled over the dimensions: returns [B, sum H_k].

    As the paper: every layer's feature maps feed both the output and the next layer, with no
    activation. DeepCTR's CIN splits each hidden layer's maps in half (one half to the output,
    one to the next layer) and applies ReLU by default.

    `mixed_precision`: the products and matmuls in bfloat16 (float32 master weights, the
    pooling in float32), as the MLP: bfloat16 matmuls run 2.2x float32's on a CPU with
    AVX512_BF16 and the [B, D, H m] products are half the bytes (xDeepFM's step 1.21x faster
    at the reference shapes: docs/models.md, Speed).

    Where the kernels run, the products are written, and their gradient read, in one pass
    (outer_rows), and the first layer, X^0 by itself, multiplies each distinct pair of fields
    once with the weights of (i, j) and (j, i) added (fold_pairs): half its matmul. The same
    function and gradients as the paper's form, which runs where they do not.

    The last layer's maps feed only the sum over the dimensions, and the layer is linear, so
    the sum is taken first: sum_d X^K_h = sum_{i,j} W^K_{h,i,j} <X^{K-1}_i, X^0_j> + D b_h,
    the inner products over the D dimensions a batched [H, D] x [D, m] matmul and W^K applied
    once per example instead of once per dimension: D (16) times fewer multiplications for
    that layer, which at the paper's 128,128 maps was 6/7 of the CIN's (`pool_last_first`
    False computes it per dimension, as the paper writes it, for comparison)."""

    pool_last_first = True

    def __init__(self, fields: int, layers, seed: int = 0, mixed_precision: bool = False,
                 name="cin"):
        super().__init__(name=name)
        self.dtype = tf.bfloat16 if mixed_precision else tf.float32
        glorot = glorot_uniform(seed)
        self.kernels, self.biases, previous = [], [], fields
        for i, h in enumerate(layers):
            self.kernels.append(tf.Variable(glorot((previous * fields, h)), name=f"w_{i}"))
            self.biases.append(tf.Variable(tf.zeros([h]), name=f"b_{i}"))
            previous = h

    def variables_to_update(self):
        return self.kernels + self.biases

    def penalized(self):
        return self.kernels

    def __call__(self, vectors):
        """vectors [B, m, D] -> [B, sum of the layers' widths]."""
        m, d = vectors.shape[1], vectors.shape[2]
        x0 = tf.reshape(tf.transpose(tf.cast(vectors, self.dtype), [0, 2, 1]), [-1, m])  # [B D, m]
        x, pooled, last = x0, [], len(self.kernels) - 1
        for k, (w, b) in enumerate(zip(self.kernels, self.biases)):
            if k == last and self.pool_last_first:
                pooled.append(self._pooled_layer(x0, x, w, b, d))
                break
            # One 2-D matmul over all B x D rows: a [B, D, H m] x [H m, H_k] matmul runs as B
            # small ones (3x slower at the paper's 128,128 maps).
            if k == 0 and kernels.usable_here():     # X^0 by itself: each pair once
                z, w = kernels.pair_product(x0), fold_pairs(w, m)
            else:
                z, w = outer_rows(x0, x), field_major(w, m)
            x = tf.matmul(z, tf.cast(w, self.dtype)) + tf.cast(b, self.dtype)
            pooled.append(tf.reduce_sum(tf.cast(tf.reshape(x, [-1, d, w.shape[1]]), tf.float32),
                                        1))
        return tf.concat(pooled, 1)

    def _pooled_layer(self, x0, x, w, b, d: int):
        """sum_d of a layer's maps [B, H_k] from x0 [B D, m] and x [B D, H]: the inner
        products over d summed in float32 (as the pooling of the other layers), row i m + j
        of w's paper order, then the weights in the CIN's precision."""
        def per_example(t):                                     # [B D, n] -> [B, D, n]
            return tf.reshape(tf.cast(t, tf.float32), [-1, d, t.shape[1]])
        inner = tf.matmul(per_example(x), per_example(x0), transpose_a=True)   # [B, H, m]
        inner = tf.reshape(inner, [-1, w.shape[0]])
        out = tf.matmul(tf.cast(inner, self.dtype), tf.cast(w, self.dtype))
        return tf.cast(out, tf.float32) + d * b


def fold_pairs(w, m: int):
    """[m (m + 1) / 2, H]: the weights w [m m, H] of the products x_i x_j (row i m + j) for
    the distinct pairs i <= j of kernels.pair_product, W_ij + W_ji (W_ii on the diagonal), so
    that pair_product(x) @ fold_pairs(w) = outer_rows(x, x) @ w. The gradient reaching w is
    the full product's: each of W_ij and W_ji gets the pair's (the diagonal's two halves sum
    to its one; dense, as w's gradient is without the fold)."""
    pairs = [(i, j) for i in range(m) for j in range(i, m)]
    w3 = tf.reshape(w, [m, m, -1])
    both = tf.reshape(w3 + tf.transpose(w3, [1, 0, 2]), [m * m, -1])     # W_ij + W_ji
    return (tf.gather(both, [i * m + j for i, j in pairs])
            * tf.constant([[0.5 if i == j else 1.0] for i, j in pairs]))


def field_major(w, m: int):
    """w [H m, H_k] (row i m + j: map i of the layer before times field j, the paper's order)
    with its rows in the order of outer_rows(x0, x), j H + i: the gradient's kernel then runs
    over H contiguous values (128, whole vectors) instead of m (39: two vectors and a ragged
    rest)."""
    return tf.reshape(tf.transpose(tf.reshape(w, [-1, m, w.shape[1]]), [1, 0, 2]),
                      [-1, w.shape[1]])


def outer_rows(a, b):
    """[R, A B]: each row's outer product a[r, :] b[r, :] (a [R, A], b [R, B]), flat. In one
    pass each way where the kernels run (kernels.outer_product): TensorFlow's broadcast Mul and
    its gradient's two Muls and two Sums over [R, A B] were a quarter of xDeepFM's step."""
    if kernels.usable_here():
        return kernels.outer_product(a, b)
    return tf.reshape(a[:, :, None] * b[:, None, :], [-1, a.shape[1] * b.shape[1]])


def glorot_uniform(seed: int):
    """Glorot-uniform initial values of a 2-D kernel, exactly what Keras'
    `tf.initializers.GlorotUniform(seed)` gives (Keras 3 on TF 2.21 and Keras 2 on 2.15 both
    draw TensorFlow's stateless uniform with seed [seed, 0] in +-sqrt(6 / (fan_in +
    fan_out)); tests/test_models.py compares), without importing Keras: a third of a
    process's start (ctrtrain/tf_start.py)."""
    def init(shape, dtype=tf.float32):
        fan_in, fan_out = shape
        limit = math.sqrt(3.0 / max(1.0, (fan_in + fan_out) / 2.0))
        return tf.random.stateless_uniform(shape, seed=[seed, 0], minval=-limit, maxval=limit,
                                           dtype=dtype)
    return init


def glorot_each(seed: int):
    """Glorot-uniform initial values, different at every call: a seeded initializer gives
    the same values each time it is called, so variables of one shape made with one start
    equal (AutoInt's W_Q, W_K, W_V and W_res, DCN-v2's cross layers)."""
    calls = itertools.count(seed * 1024)      # blocks' seeds differ by 1: far apart here
    return lambda shape: glorot_uniform(next(calls))(shape)


class SelfAttention(tf.Module):
    """AutoInt's interacting layer (Song et al., 2019, eqs. 5-8): multi-head self-attention
    over the fields, softmax(<W_Q e_m, W_K e_k>) without scaling (as the paper, DeepCTR and
    FuxiCTR by default), the heads concatenated, plus W_res e_m (the residual), then ReLU.
    [B, m, d_in] -> [B, m, heads * size]."""

    def __init__(self, width: int, heads: int, size: int, residual: bool = True, seed: int = 0,
                 name="attention"):
        super().__init__(name=name)
        glorot = glorot_each(seed)
        self.heads, self.size = heads, size
        self.query, self.key, self.value = (tf.Variable(glorot((width, heads * size)), name=n)
                                            for n in ("w_query", "w_key", "w_value"))
        self.residual = (tf.Variable(glorot((width, heads * size)), name="w_res")
                         if residual else None)

    def variables_to_update(self):
        return [self.query, self.key, self.value] + ([self.residual] if self.residual is not None
                                                     else [])

    def penalized(self):
        return self.variables_to_update()

    def __call__(self, e):
        m = e.shape[1]
        q, k, v = (tf.einsum("bmi,io->bmo", e, w) for w in (self.query, self.key, self.value))
        if e.dtype == tf.float32 and kernels.usable_here():
            # Each (example, head) in one pass, forward and back: TensorFlow's batched
            # matmuls of B x heads tiny matrices, transposes and softmax cost more.
            out = kernels.field_attention(q, k, v, self.heads)
        else:
            def heads(x):   # [B, m, heads * size] -> [B, heads, m, size]
                return tf.transpose(tf.reshape(x, [-1, m, self.heads, self.size]), [0, 2, 1, 3])
            attention = tf.nn.softmax(tf.matmul(heads(q), heads(k), transpose_b=True))
            out = tf.reshape(tf.transpose(tf.matmul(attention, heads(v)), [0, 2, 1, 3]),
                             [-1, m, self.heads * self.size])                # [B, m, h size]
        if self.residual is not None:
            out = out + tf.einsum("bmi,io->bmo", e, self.residual)
        return tf.nn.relu(out)
