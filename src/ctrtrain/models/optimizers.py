"""Sparse-aware optimizers: an embedding update costs O(rows in the batch), not O(table).

Gradients of looked-up tables arrive as tf.IndexedSlices; they are summed per distinct row
and applied to those rows only (lazy Adam; TensorFlow's own sparse kernels for Adagrad, FTRL
and momentum). Dense gradients use TensorFlow's fused kernels. Slots are created up front (`build`), each
colocated with its variable (`colocate_vars_with`: beside its shard on a parameter server, never
partitioned itself; mirrored where the variable is mirrored).

Every update is a resource op on `var.handle`. Under a mirrored strategy (one host's devices,
or all-reduce across workers) the handle inside a replica is that replica's own copy, so each
replica applies the same all-reduced gradient to its copy and the copies stay equal -- no
merge_call, and the same code serves a single process, parameter servers (plain variables and
table shards on the servers) and Horovod (plain variables).
"""

from __future__ import annotations

import tensorflow as tf

raw = tf.raw_ops


def _dedupe(g: tf.IndexedSlices):
    rows, where = tf.unique(g.indices)
    return tf.math.unsorted_segment_sum(g.values, where, tf.shape(rows)[0]), rows


class Optimizer(tf.Module):
    slot_names: tuple[str, ...] = ()
    slot_init: dict[str, float] = {}

    def __init__(self, learning_rate: float, name=None):
        super().__init__(name=name)
        self.learning_rate = learning_rate
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
        self.slots: list[dict[str, tf.Variable]] = []
        self._index: dict[int, int] = {}

    def build(self, variables, tables=()):
        """Creates the slots of each variable (call inside the strategy's scope if any).
        `tables`: the embedding tables (or table shards) among them (updated sparsely)."""
        table_ids = {id(t) for t in tables}
        for var in variables:
            self._index[id(var)] = len(self.slots)
            self.slots.append({n: _slot(var, n, shape, self.slot_init.get(n, 0.0))
                               for n, shape in self._slot_shapes(var, id(var) in table_ids)})

    def _slot_shapes(self, var, is_table: bool):
        return [(n, var.shape) for n in self.slot_names]

    def slot(self, var, name):
        return self.slots[self._index[id(var)]][name]

    def apply_gradients(self, grads_and_vars, unique_indices: bool = False):
        """`unique_indices`: sparse gradients are already summed per distinct row."""
        raw.AssignAddVariableOp(resource=self.iterations.handle,
                                value=tf.constant(1, self.iterations.dtype))
        for g, v in grads_and_vars:
            if g is None:
                continue
            if isinstance(g, tf.IndexedSlices):
                values, rows = (g.values, g.indices) if unique_indices else _dedupe(g)
                self._sparse(v, values, rows)
            else:
                self._dense(v, g)

    def _dense(self, var, grad):
        raise NotImplementedError

    def _sparse(self, var, grad, rows):
        raise NotImplementedError


class Adam(Optimizer):
    """Adam; on embedding rows the lazy variant (moments of untouched rows do not decay).
    Both moments share one slot [rows, 2 * width] so a sparse step gathers and scatters once."""
    slot_names = ("moments",)

    def _slot_shapes(self, var, is_table: bool):
        if is_table:
            return [("moments", [var.shape[0], 2 * var.shape[1]])]
        return [("m", var.shape), ("v", var.shape)]

    def __init__(self, learning_rate=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-7, name="adam"):
        super().__init__(learning_rate, name)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon

    def _powers(self):
        t = tf.cast(self.iterations, tf.float32)
        return tf.pow(self.beta1, t), tf.pow(self.beta2, t)

    def _dense(self, var, grad):
        b1p, b2p = self._powers()
        if "moments" in self.slots[self._index[id(var)]]:  # a table with a dense gradient
            return self._sparse(var, grad, tf.range(tf.shape(grad, out_type=tf.int64)[0]))
        raw.ResourceApplyAdam(var=var.handle, m=self.slot(var, "m").handle,
                              v=self.slot(var, "v").handle, beta1_power=b1p, beta2_power=b2p,
                              lr=self.learning_rate, beta1=self.beta1, beta2=self.beta2,
                              epsilon=self.epsilon, grad=grad)

    def _sparse(self, var, grad, rows):
        b1p, b2p = self._powers()
        lr = self.learning_rate * tf.sqrt(1 - b2p) / (1 - b1p)
        moments = self.slot(var, "moments")
        old_m, old_v = tf.split(raw.ResourceGather(resource=moments.handle, indices=rows,
                                                   dtype=moments.dtype), 2, axis=1)
        m_rows = self.beta1 * old_m + (1 - self.beta1) * grad
        v_rows = self.beta2 * old_v + (1 - self.beta2) * tf.square(grad)
        raw.ResourceScatterUpdate(resource=moments.handle, indices=rows,
                                  updates=tf.concat([m_rows, v_rows], 1))
        raw.ResourceScatterSub(resource=var.handle, indices=rows,
                               updates=lr * m_rows / (tf.sqrt(v_rows) + self.epsilon))


class Adagrad(Optimizer):
    slot_names = ("accumulator",)
    slot_init = {"accumulator": 0.1}

    def __init__(self, learning_rate=0.05, epsilon=1e-7, initial_accumulator=0.1, name="adagrad"):
        super().__init__(learning_rate, name)
        self.epsilon = epsilon
        self.slot_init = {"accumulator": initial_accumulator}

    def _dense(self, var, grad):
        raw.ResourceApplyAdagradV2(var=var.handle, accum=self.slot(var, "accumulator").handle,
                                   lr=self.learning_rate, epsilon=self.epsilon, grad=grad)

    def _sparse(self, var, grad, rows):
        raw.ResourceSparseApplyAdagradV2(var=var.handle, accum=self.slot(var, "accumulator").handle,
                                         lr=self.learning_rate, epsilon=self.epsilon, grad=grad,
                                         indices=rows)


class Ftrl(Optimizer):
    slot_names = ("accumulator", "linear")
    slot_init = {"accumulator": 0.1}

    def __init__(self, learning_rate=0.05, l1=0.0, l2=0.0, lr_power=-0.5, initial_accumulator=0.1,
                 name="ftrl"):
        super().__init__(learning_rate, name)
        self.l1, self.l2, self.lr_power = l1, l2, lr_power
        self.slot_init = {"accumulator": initial_accumulator}

    def _dense(self, var, grad):
        raw.ResourceApplyFtrl(var=var.handle, accum=self.slot(var, "accumulator").handle,
                              linear=self.slot(var, "linear").handle, grad=grad,
                              lr=self.learning_rate, l1=self.l1, l2=self.l2, lr_power=self.lr_power)

    def _sparse(self, var, grad, rows):
        raw.ResourceSparseApplyFtrl(var=var.handle, accum=self.slot(var, "accumulator").handle,
                                    linear=self.slot(var, "linear").handle, grad=grad, indices=rows,
                                    lr=self.learning_rate, l1=self.l1, l2=self.l2,
                                    lr_power=self.lr_power)


class Momentum(Optimizer):
    """SGD with momentum (momentum=0: plain SGD, no slot)."""

    def __init__(self, learning_rate=0.01, momentum=0.9, name="momentum"):
        super().__init__(learning_rate, name)
        self.momentum = momentum
        self.slot_names = ("momentum",) if momentum else ()

    def _dense(self, var, grad):
        if self.momentum:
            raw.ResourceApplyMomentum(var=var.handle, accum=self.slot(var, "momentum").handle,
                                      lr=self.learning_rate, grad=grad, momentum=self.momentum)
        else:
            raw.ResourceApplyGradientDescent(var=var.handle, alpha=self.learning_rate, delta=grad)

    def _sparse(self, var, grad, rows):
        if self.momentum:
            raw.ResourceSparseApplyMomentum(var=var.handle, accum=self.slot(var, "momentum").handle,
                                            lr=self.learning_rate, grad=grad, indices=rows,
                                            momentum=self.momentum)
        else:
            raw.ResourceScatterSub(resource=var.handle, indices=rows,
                                   updates=self.learning_rate * grad)


def _slot(var, name: str, shape, value: float):
    strategy = tf.distribute.get_strategy()
    with strategy.extended.colocate_vars_with(var):
        return tf.Variable(tf.fill(shape, tf.constant(value, var.dtype)), trainable=False,
                           name=f"{var.name.split(':')[0]}/{name}")


OPTIMIZERS = {"adam": Adam, "adagrad": Adagrad, "ftrl": Ftrl, "sgd": Momentum, "momentum": Momentum}


def make_optimizer(name: str, learning_rate: float, **params) -> Optimizer:
    """`params`: the optimizer's own settings (Adam's beta1, beta2, epsilon; Adagrad's and
    FTRL's initial_accumulator; FTRL's l1, l2; momentum)."""
    from ..errors import ConfigError
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {name!r} (allowed: {', '.join(OPTIMIZERS)})")
    if name == "sgd":
        return Momentum(learning_rate, momentum=0.0, name="sgd")
    return OPTIMIZERS[name](learning_rate, **params)
