"""The update rules: Adam, Adagrad, FTRL, SGD and momentum, each with its dense step (TensorFlow's
fused kernels), its sparse step on a table's rows, and the closed form that catches a row up
on the steps it skipped (how and when a table's rows are updated: updates.py)."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from ... import kernels
from .updates import Optimizer, gather_rows, raw


class _AdamDrift:
    """How far k steps without gradient after step a move a row, in Adam.

    Step a + j moves it by lr_{a+j} beta1^j m / (beta2^(j/2) sqrt(v) + eps), where (m, v) are
    the row's moments after step a and lr_s = lr sqrt(1 - beta2^s) / (1 - beta1^s). With
    D_c(a, k) = sum_{j=1..k} lr_{a+j} c^j, the sum is exactly m D_r / sqrt(v) where eps << sqrt(v)
    (r = beta1 / sqrt(beta2)), and exactly m D_b1 / eps where sqrt(v) << eps; the drift used,
    m D_r / (sqrt(v) + eps D_r / D_b1), is exact at both ends and between them within the
    bound measured in tests/test_table_updates.py. With G_c(s) = sum_{j>=1} lr_{s+j} c^j
    (bounded for c < 1), D_c(a, k) = G_c(a) - c^k G_c(a + k); G_c is tabulated up to the step
    T where the bias corrections reach 1 within 1e-9, and is constant beyond it."""

    def __init__(self, lr: float, beta1: float, beta2: float):
        from ...errors import ConfigError
        self.ratios = (beta1 / math.sqrt(beta2), beta1)
        if self.ratios[0] >= 1:
            raise ConfigError(f"table_updates catchup needs adam_beta1 < sqrt(adam_beta2) (the "
                              f"skipped drift is a series in beta1/sqrt(beta2) = "
                              f"{self.ratios[0]:.4f}); use table_updates: dense")
        T = int(min(4_000_000, math.ceil(math.log(1e-9) / math.log(max(beta1, beta2))) + 1))
        s = np.arange(1, T + 2, dtype=np.float64)
        lr_s = lr * np.sqrt(1 - beta2 ** s) / (1 - beta1 ** s)      # lr_1 .. lr_{T+1}
        self.T, self.tables = T, []
        for c in self.ratios:
            g = np.empty(T + 1)
            g[T] = lr * c / (1 - c)
            for i in range(T - 1, -1, -1):                           # G(i) = c (lr_{i+1} + G(i+1))
                g[i] = c * (lr_s[i] + g[i + 1])
            self.tables.append(g)
        # H(k) = sum_{j<=k} (1-beta1^j)/sqrt(1-beta2^j): in units of lr, how far k steps move a
        # row whose moments hold only the L2 gradient of those k steps (1 per step later on).
        j = np.arange(1, T + 1, dtype=np.float64)
        self.H = np.concatenate([[0.0], np.cumsum((1 - beta1 ** j) / np.sqrt(1 - beta2 ** j))])

    def l2_steps(self, k):
        """H(k) per row, float32 [rows, 1] (beyond T: 1 per step)."""
        h = tf.gather(tf.constant(self.H, tf.float64), tf.minimum(k, self.T))
        h = h + tf.cast(tf.maximum(k - self.T, 0), tf.float64)
        return tf.cast(h, tf.float32)[:, None]

    def sums(self, a, k):
        """(D_r(a, k), D_b1(a, k)) per row, float32 [rows, 1]."""
        out = []
        for c, g in zip(self.ratios, self.tables):
            G = tf.constant(g, tf.float64)
            ga = tf.gather(G, tf.minimum(a, self.T))
            gb = tf.gather(G, tf.minimum(a + k, self.T))
            d = ga - tf.pow(tf.constant(c, tf.float64), tf.cast(k, tf.float64)) * gb
            out.append(tf.cast(d, tf.float32)[:, None])
        return out

    def __call__(self, m, root_v, a, k, epsilon: float):
        d_r, d_b1 = self.sums(a, k)
        return tf.math.divide_no_nan(m * d_r, root_v + epsilon * tf.math.divide_no_nan(d_r, d_b1))


class Adam(Optimizer):
    """Adam (TensorFlow's ResourceApplyAdam: lr_t = lr sqrt(1-beta2^t)/(1-beta1^t), eps outside
    the root). On table rows both moments share one slot [rows, 2 * width], so a sparse step
    gathers and scatters once."""
    slot_names = ("m", "v")
    catches_up = True

    def _slot_shapes(self, var, is_table: bool):
        if is_table:
            return [("moments", [var.shape[0], 2 * var.shape[1]])]
        return [("m", var.shape), ("v", var.shape)]

    def __init__(self, learning_rate=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-7, name="adam",
                 **table):
        super().__init__(learning_rate, name, **table)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self._drift = (_AdamDrift(learning_rate, beta1, beta2)
                       if self.table_updates == "catchup" else None)

    def _powers(self):
        t = tf.cast(self.iterations, tf.float32)
        return tf.pow(self.beta1, t), tf.pow(self.beta2, t)

    def _dense(self, var, grad):
        b1p, b2p = self._powers()
        raw.ResourceApplyAdam(var=var.handle, m=self.slot(var, "m").handle,
                              v=self.slot(var, "v").handle, beta1_power=b1p, beta2_power=b2p,
                              lr=self.learning_rate, beta1=self.beta1, beta2=self.beta2,
                              epsilon=self.epsilon, grad=grad)

    def _dense_with_terms(self, var, grad, row_mask, l2: float):
        """In one pass of the fused kernel where it runs (kernels.adam_dense): the gradient's
        terms and ResourceApplyAdam's step together."""
        if not (kernels.usable_here() and var.dtype == tf.float32):
            return super()._dense_with_terms(var, grad, row_mask, l2)
        b1p, b2p = self._powers()
        lr = self.learning_rate * tf.sqrt(1 - b2p) / (1 - b1p)    # as ResourceApplyAdam's
        kernels.adam_dense(var, self.slot(var, "m"), self.slot(var, "v"), grad,
                           None if row_mask is None else tf.reshape(row_mask, [-1]), lr,
                           self.beta1, self.beta2, self.epsilon, l2)

    def _caught_up(self, var, rows, settle: bool = False):
        """The rows' moments after the steps they skipped, what to subtract from the stored
        rows to bring them there (0 in lazy mode), and the rows then (None: not needed)."""
        pending = self._pending.pop(id(var), None) if self._reuse and not settle else None
        if pending is not None:     # computed by row_correction for these rows this step
            self._mark_current(var, rows)
            return pending
        moments = self.slot(var, "moments")
        m, v = tf.split(gather_rows(moments, rows), 2, axis=1)
        if self._drift is None:
            return m, v, 0.0, None
        last, k = self._idle_steps(var, rows, settle)
        return self._decayed(var, rows, m, v, last, k)

    def _decayed(self, var, rows, m, v, last, k, stored=None):
        """(m, v, offset, current rows or None): current = stored - offset (given when the
        table has L2, whose gradient needs them)."""
        if self.table_l2 and stored is None:
            stored = gather_rows(var, rows)
        return self._decayed_math(m, v, last, k, stored, self.iterations)

    def _decayed_math(self, m, v, last, k, stored, iterations):
        root_v = tf.sqrt(v)
        # The drift is linear in the learning rate, whose base value the tables hold.
        drift = self._drift(m, root_v, last, k, self.epsilon) * self.lr_scale
        kf = tf.cast(k, tf.float32)[:, None]
        b1k, b2k = tf.pow(self.beta1, kf), tf.pow(self.beta2, kf)
        if not self.table_l2:
            return b1k * m, b2k * v, drift, None
        shrunk = self._idle_l2(stored - drift, root_v, last, k, iterations)
        grad = self.table_l2 * shrunk       # the L2 gradient the last skipped steps saw
        return (b1k * m + (1 - b1k) * grad, b2k * v + (1 - b2k) * tf.square(grad),
                stored - shrunk, shrunk)

    def _idle_l2(self, theta, root_v, last, k, iterations):
        """Where the table's L2 (gradient l2 * row) takes a row through k steps without data.
        Dense Adam moves it by lr_t m/(sqrt(v)+eps) with m -> l2 * row. While the row's own v
        (sqrt(v) decaying as beta2^(s/2)) dominates, |row| decays by exp(-E), E = lr l2
        sum_j (1-beta1^j) beta2^(-j/2) / sqrt(v) (eps as in the drift); once the L2 gradient
        dominates v, Adam's normalised step moves it by lr (1-beta1^j)/sqrt(1-beta2^j) at the
        j-th step (exactly lr per step for a row no batch ever touched). The row takes the
        slower of the two: an approximation, whose bound tests/test_table_updates.py states."""
        kf = tf.cast(k, tf.float32)[:, None]
        t = tf.cast(tf.maximum(iterations, 1), tf.float32)
        lr = self.learning_rate * tf.sqrt(1 - tf.pow(self.beta2, t)) / (1 - tf.pow(self.beta1, t))
        q = self.beta2 ** -0.5
        kq = tf.minimum(kf, 80.0 / math.log(q))      # q^k stays finite; E is huge by then
        b1q = self.beta1 * q
        w1 = (q * (tf.pow(q, kq) - 1) / (q - 1)
              - b1q * (1 - tf.pow(b1q, kq)) / (1 - b1q))        # sum (1 - b1^j) q^j
        w0 = kf - self.beta1 * (1 - tf.pow(self.beta1, kf)) / (1 - self.beta1)  # sum (1 - b1^j)
        e = tf.math.divide_no_nan(lr * self.table_l2 * w1,
                                  root_v + self.epsilon * tf.math.divide_no_nan(w1, w0))
        moved = tf.where((last == 0)[:, None], self.learning_rate * kf,
                         lr * self._drift.l2_steps(k))
        size = tf.abs(theta)
        size = tf.maximum(tf.maximum(size * tf.exp(-e), size - moved), 0.0)
        return tf.sign(theta) * size

    def _fused(self, var) -> bool:
        """The catch-up runs in the fused kernels (ctrtrain/kernels): a float32 table, the
        kernels built and usable here; the TensorFlow ops (the reference) otherwise."""
        return self._drift is not None and var.dtype == tf.float32 and kernels.usable_here()

    def _drift_constants(self):
        """The drift's tables and ratios as the fused kernels take them (one constant each
        per trace)."""
        d = self._drift
        return (tf.constant(np.stack(d.tables + [d.H]), tf.float64),
                tf.constant(d.ratios, tf.float64))

    def read_rows(self, var, rows):
        # One kernel reads and catches up a plain variable's rows (a distributed one's
        # replica copy is read by the lookup, then row_correction).
        if self._fused(var) and not isinstance(var, tf.distribute.DistributedValues):
            now, caught = kernels.adam_catchup_lookup(
                var, self.slot(var, "moments"), self.slot(var, "last_step"), rows,
                self.iterations, self.lr_scale, self.learning_rate, *self._drift_constants(),
                self.beta1, self.beta2, self.epsilon, self.table_l2)
            self._pending[id(var)] = caught
            return now
        return super().read_rows(var, rows)

    def row_correction(self, var, rows, stored=None):
        if self._drift is None:
            return None
        if self._fused(var):
            if stored is None:
                stored = gather_rows(var, rows)
            offset, m, v, current = kernels.adam_catchup_read(
                stored, self.slot(var, "moments"), self.slot(var, "last_step"), rows,
                self.iterations, self.lr_scale, self.learning_rate, *self._drift_constants(),
                self.beta1, self.beta2, self.epsilon, self.table_l2)
            self._pending[id(var)] = (m, v, offset, current)
            return offset
        # Read before this step counts: the rows as of the end of the previous step.
        m, v = tf.split(gather_rows(self.slot(var, "moments"), rows), 2, axis=1)
        caught = self._decayed(var, rows, m, v, *self._skipped(var, rows, self.iterations),
                               stored)
        self._pending[id(var)] = caught
        return caught[2]

    def _sparse(self, var, grad, rows):
        b1p, b2p = self._powers()
        lr = self.learning_rate * tf.sqrt(1 - b2p) / (1 - b1p)
        if self._reuse and id(var) in self._pending and self._fused(var):
            kernels.adam_catchup_apply(
                var, self.slot(var, "moments"), self.slot(var, "last_step"), rows, grad,
                self._pending.pop(id(var)), self.iterations, lr, self.beta1, self.beta2,
                self.epsilon, self.table_l2)
            return
        m, v, offset, current = self._caught_up(var, rows)
        if self.table_l2:
            grad = grad + self.table_l2 * (current if current is not None else gather_rows(var, rows))
        m = self.beta1 * m + (1 - self.beta1) * grad
        v = self.beta2 * v + (1 - self.beta2) * tf.square(grad)
        raw.ResourceScatterUpdate(resource=self.slot(var, "moments").handle, indices=rows,
                                  updates=tf.concat([m, v], 1))
        raw.ResourceScatterSub(resource=var.handle, indices=rows,
                               updates=offset + lr * m / (tf.sqrt(v) + self.epsilon))

    def _settle(self, var, rows):
        m, v, drift, _ = self._caught_up(var, rows, settle=True)
        raw.ResourceScatterUpdate(resource=self.slot(var, "moments").handle, indices=rows,
                                  updates=tf.concat([m, v], 1))
        raw.ResourceScatterSub(resource=var.handle, indices=rows, updates=drift)


class Adagrad(Optimizer):
    """Adagrad (TensorFlow's AdagradV2). A row without gradient does not move, so without the
    table's L2 `catchup` and `lazy` are dense's result exactly. With it, a skipped step shrinks
    the row by 1 - lr l2 / (sqrt(acc) + eps), taken as constant over the skipped steps (their
    (l2 row)^2 adds to acc less than float32 resolves next to acc's initial 0.1)."""
    slot_names = ("accumulator",)
    slot_init = {"accumulator": 0.1}

    def __init__(self, learning_rate=0.05, epsilon=1e-7, initial_accumulator=0.1,
                 name="adagrad", **table):
        super().__init__(learning_rate, name, **table)
        self.epsilon = epsilon
        self.slot_init = {"accumulator": initial_accumulator}
        self.catches_up = bool(self.table_l2)

    def _dense(self, var, grad):
        raw.ResourceApplyAdagradV2(var=var.handle, accum=self.slot(var, "accumulator").handle,
                                   lr=self.learning_rate, epsilon=self.epsilon, grad=grad)

    def _caught_up(self, var, rows, k):
        """The rows and accumulators after k skipped steps."""
        theta = gather_rows(var, rows)
        acc = gather_rows(self.slot(var, "accumulator"), rows)
        c = 1 - self.learning_rate * self.table_l2 / (tf.sqrt(acc) + self.epsilon)
        kf = tf.cast(k, tf.float32)[:, None]
        ck = tf.pow(c, kf)
        seen = tf.math.divide_no_nan(1 - tf.square(ck), 1 - tf.square(c))   # sum_j c^(2j)
        return theta, theta * ck, acc + tf.square(self.table_l2 * theta) * seen

    def _sparse(self, var, grad, rows):
        accum = self.slot(var, "accumulator")
        if not self.counts_steps:
            raw.ResourceSparseApplyAdagradV2(var=var.handle, accum=accum.handle,
                                             lr=self.learning_rate, epsilon=self.epsilon,
                                             grad=self._with_l2(grad, var, rows), indices=rows)
            return
        _, k = self._idle_steps(var, rows, settle=False)
        stored, theta, acc = self._caught_up(var, rows, k)
        grad = grad + self.table_l2 * theta
        acc = acc + tf.square(grad)
        raw.ResourceScatterUpdate(resource=accum.handle, indices=rows, updates=acc)
        raw.ResourceScatterSub(resource=var.handle, indices=rows, updates=stored - theta
                               + self.learning_rate * grad / (tf.sqrt(acc) + self.epsilon))

    def row_correction(self, var, rows, stored=None):
        if not self.counts_steps:
            return None
        _, k = self._skipped(var, rows, self.iterations)
        stored, theta, _ = self._caught_up(var, rows, k)
        return stored - theta

    def _settle(self, var, rows):
        if not self.counts_steps:
            return
        _, k = self._idle_steps(var, rows, settle=True)
        stored, theta, acc = self._caught_up(var, rows, k)
        raw.ResourceScatterUpdate(resource=self.slot(var, "accumulator").handle, indices=rows,
                                  updates=acc)
        raw.ResourceScatterSub(resource=var.handle, indices=rows, updates=stored - theta)


class Ftrl(Optimizer):
    """FTRL-proximal. A row's weights are a function of its accumulator and linear slot,
    which a step without gradient leaves unchanged: dense FTRL sets every row to that function
    at its first step (rows never touched become 0, not their initial value). `catchup` does
    the same to the rows a step touches and, in `settle`, to all."""
    slot_names = ("accumulator", "linear")
    slot_init = {"accumulator": 0.1}

    def __init__(self, learning_rate=0.05, l1=0.0, l2=0.0, lr_power=-0.5, initial_accumulator=0.1,
                 name="ftrl", **table):
        super().__init__(learning_rate, name, **table)
        self.l1, self.l2, self.lr_power = l1, l2, lr_power
        self.slot_init = {"accumulator": initial_accumulator}

    def _dense(self, var, grad):
        raw.ResourceApplyFtrl(var=var.handle, accum=self.slot(var, "accumulator").handle,
                              linear=self.slot(var, "linear").handle, grad=grad,
                              lr=self.learning_rate, l1=self.l1, l2=self.l2, lr_power=self.lr_power)

    def _sparse(self, var, grad, rows):
        if self.table_updates == "catchup":   # as the steps before this one left them
            raw.ResourceScatterUpdate(resource=var.handle, indices=rows,
                                      updates=self._weights(var, rows, self.iterations - 1))
        raw.ResourceSparseApplyFtrl(var=var.handle, accum=self.slot(var, "accumulator").handle,
                                    linear=self.slot(var, "linear").handle,
                                    grad=self._with_l2(grad, var, rows), indices=rows,
                                    lr=self.learning_rate, l1=self.l1, l2=self.l2,
                                    lr_power=self.lr_power)

    def _weights(self, var, rows, steps_done):
        """The rows' weights as dense steps would have set them from their slots."""
        accum = gather_rows(self.slot(var, "accumulator"), rows)
        linear = gather_rows(self.slot(var, "linear"), rows)
        quadratic = tf.pow(accum, -self.lr_power) / self.learning_rate + 2 * self.l2
        w = tf.where(tf.abs(linear) > self.l1,
                     (tf.sign(linear) * self.l1 - linear) / quadratic, tf.zeros_like(linear))
        # Before the first step no dense step has run: rows keep their initial values.
        return tf.where(steps_done > 0, w, gather_rows(var, rows))

    def _settle(self, var, rows):
        raw.ResourceScatterUpdate(resource=var.handle, indices=rows,
                                  updates=self._weights(var, rows, self.iterations))

    def row_correction(self, var, rows, stored=None):
        if self.table_updates != "catchup":
            return None
        return gather_rows(var, rows) - self._weights(var, rows, self.iterations)


class Momentum(Optimizer):
    """SGD with momentum (TensorFlow's: accum = momentum accum + g; var -= lr accum;
    momentum=0: plain SGD, no slot). A skipped step, whose only gradient is the table's L2
    (l2 row), is linear in (row, velocity): k of them are the matrix power M^k,
    M = [[1 - lr l2, -lr mu], [l2, mu]], which `catchup` applies in closed form
    (Cayley-Hamilton: M^k = alpha_k M + beta_k I from M's two real eigenvalues): exact."""

    def __init__(self, learning_rate=0.01, momentum=0.9, name="momentum", **table):
        super().__init__(learning_rate, name, **table)
        from ...errors import ConfigError
        self.momentum = momentum
        self.slot_names = ("momentum",) if momentum else ()
        self.catches_up = bool(momentum or self.table_l2)
        lr, lam, mu = learning_rate, self.table_l2, momentum
        self.M = ((1 - lr * lam, -lr * mu), (lam, mu))
        trace, det = 1 - lr * lam + mu, mu
        disc = trace * trace - 4 * det
        if self.counts_steps and disc <= 0:
            raise ConfigError("table_updates catchup with momentum needs learning_rate * l2 < "
                              "(1 - sqrt(momentum))^2; use table_updates: dense")
        root = math.sqrt(max(disc, 0.0))
        self.eig = ((trace + root) / 2, (trace - root) / 2)

    def _dense(self, var, grad):
        if self.momentum:
            raw.ResourceApplyMomentum(var=var.handle, accum=self.slot(var, "momentum").handle,
                                      lr=self.learning_rate, grad=grad, momentum=self.momentum)
        else:
            raw.ResourceApplyGradientDescent(var=var.handle, alpha=self.learning_rate, delta=grad)

    def _velocity(self, var, rows, like):
        return gather_rows(self.slot(var, "momentum"), rows) if self.momentum else tf.zeros_like(like)

    def _advance(self, theta, accum, k):
        """(row, velocity) after k skipped steps."""
        e1, e2 = self.eig
        kd = tf.cast(k, tf.float64)[:, None]
        p1 = tf.pow(tf.constant(e1, tf.float64), kd)
        p2 = tf.pow(tf.constant(e2, tf.float64), kd)
        alpha = tf.cast((p1 - p2) / (e1 - e2), tf.float32)
        beta = tf.cast((e1 * p2 - e2 * p1) / (e1 - e2), tf.float32)
        (m00, m01), (m10, m11) = self.M
        return ((alpha * m00 + beta) * theta + alpha * m01 * accum,
                alpha * m10 * theta + (alpha * m11 + beta) * accum)

    def row_correction(self, var, rows, stored=None):
        if not self.counts_steps:
            return None
        stored = gather_rows(var, rows) if stored is None else stored
        _, k = self._skipped(var, rows, self.iterations)
        return stored - self._advance(stored, self._velocity(var, rows, stored), k)[0]

    def _sparse(self, var, grad, rows):
        lr = self.learning_rate
        if not self.counts_steps:
            grad = self._with_l2(grad, var, rows)
            if not self.momentum:
                raw.ResourceScatterSub(resource=var.handle, indices=rows, updates=lr * grad)
            else:
                raw.ResourceSparseApplyMomentum(var=var.handle, indices=rows, grad=grad, lr=lr,
                                                accum=self.slot(var, "momentum").handle,
                                                momentum=self.momentum)
            return
        stored = gather_rows(var, rows)
        _, k = self._idle_steps(var, rows, settle=False)
        theta, accum = self._advance(stored, self._velocity(var, rows, stored), k)
        accum = self.momentum * accum + grad + self.table_l2 * theta
        if self.momentum:
            raw.ResourceScatterUpdate(resource=self.slot(var, "momentum").handle, indices=rows,
                                      updates=accum)
        raw.ResourceScatterSub(resource=var.handle, indices=rows,
                               updates=stored - theta + lr * accum)

    def _settle(self, var, rows):
        if not self.counts_steps:
            return
        stored = gather_rows(var, rows)
        _, k = self._idle_steps(var, rows, settle=True)
        theta, accum = self._advance(stored, self._velocity(var, rows, stored), k)
        if self.momentum:
            raw.ResourceScatterUpdate(resource=self.slot(var, "momentum").handle, indices=rows,
                                      updates=accum)
        raw.ResourceScatterSub(resource=var.handle, indices=rows, updates=stored - theta)


OPTIMIZERS = {"adam": Adam, "adagrad": Adagrad, "ftrl": Ftrl, "sgd": Momentum, "momentum": Momentum}


def make_optimizer(name: str, learning_rate: float, **params) -> Optimizer:
    """`params`: the optimizer's own settings (Adam's beta1, beta2, epsilon; Adagrad's and
    FTRL's initial_accumulator; FTRL's l1, l2; momentum) and how tables are updated
    (table_updates, table_l2)."""
    from ...errors import ConfigError
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {name!r} (allowed: {', '.join(OPTIMIZERS)})")
    if name == "sgd":
        params.pop("momentum", None)
        return Momentum(learning_rate, momentum=0.0, name="sgd", **params)
    return OPTIMIZERS[name](learning_rate, **params)
