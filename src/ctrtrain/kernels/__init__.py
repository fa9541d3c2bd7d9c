"""Fused CPU kernels for the sparse half of the step (ctr_kernels.cc), with the TensorFlow ops
as the reference and the fallback.

`available()` loads the library build.py made for this TensorFlow; where there is none (not
built, no compiler, another TensorFlow) it says so once, and the callers run the TensorFlow
ops (as they do, silently, with CTRTRAIN_KERNELS=0 or `fused_kernels: false`), which compute
the same to float32 precision (tests/test_kernels.py). The kernels run on this process's CPU:
callers use them only for variables this process holds (not under parameter servers, whose
variables live elsewhere), and never in an export (`off`).
"""

from __future__ import annotations

import contextlib
import os

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

_lib = None
_tried = False
_enabled = True


def set_enabled(on: bool) -> None:
    """Steps traced after this use the kernels (when available) or the TensorFlow ops: the
    tests and benchmarks that compare the two paths in one process."""
    global _enabled
    _enabled = on


def available() -> bool:
    """The kernels are loaded (tried once per process; a fallback is said once)."""
    global _lib, _tried
    if not _tried:
        _tried = True
        if os.environ.get("CTRTRAIN_KERNELS", "1") == "0":
            return False
        from .build import damage, library_path
        path = library_path()
        rebuild = "`python -m ctrtrain.kernels.build --force` rebuilds it"
        if not path.exists():
            print(f"ctrtrain: fused kernels not built for TensorFlow {tf.__version__} ({path} "
                  f"is missing; `python -m ctrtrain.kernels.build` builds it): "
                  f"running the TensorFlow ops instead", flush=True)
            return False
        why = damage(path)      # loading a cut or foreign library can crash the process
        if why:
            print(f"ctrtrain: fused kernels not loaded: {path} is not the file the build "
                  f"wrote ({why}; {rebuild}): running the TensorFlow ops instead", flush=True)
            return False
        try:
            lib = tf.load_op_library(str(path))
        except (tf.errors.NotFoundError, OSError) as e:
            print(f"ctrtrain: fused kernels could not be loaded ({e}): running the TensorFlow "
                  f"ops instead", flush=True)
            return False
        missing = [op for op in OPS if not hasattr(lib, op)]
        if missing:
            print(f"ctrtrain: fused kernels not used: {path} lacks the ops {missing} ({rebuild}): "
                  "running the TensorFlow ops instead", flush=True)
            return False
        _lib = lib
    return _lib is not None


# Every op the wrappers below call: a library that lacks one is not used.
OPS = ("ctr_adam_catchup_apply", "ctr_adam_catchup_lookup", "ctr_adam_catchup_read",
       "ctr_adam_dense",
       "ctr_bag_pool", "ctr_bag_pool_grad", "ctr_dice", "ctr_dice_grad", "ctr_dropout",
       "ctr_field_attention", "ctr_field_attention_grad", "ctr_fm", "ctr_fm_grad", "ctr_held",
       "ctr_outer_product", "ctr_outer_product_grad", "ctr_pair_product",
       "ctr_pair_product_grad", "ctr_relu_dropout_grad", "ctr_scaled_gather",
       "ctr_scaled_segment_sum", "ctr_unique")


@contextlib.contextmanager
def off():
    """TensorFlow's ops in what is traced inside: a SavedModel (train/export.py) must load
    and serve where this library is not (TF Serving, another machine)."""
    global _enabled
    was, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = was


def usable_here() -> bool:
    """available(), and the step runs where this process loaded them: not under parameter
    servers, whose workers and servers are other processes running the traced step."""
    strategy = tf.distribute.get_strategy()
    return (_enabled and available()
            and not isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy))


def unique(ids):
    """(distinct, where): tf.unique(ids) for int64 ids, the same result."""
    return _lib.ctr_unique(ids=ids)


def scaled_gather(params, where, values):
    """[N, W]: params[where[n]] * values[n] (params [U, W], where [N], values [N])."""
    return _lib.ctr_scaled_gather(params=params, where=where, values=values)


@tf.RegisterGradient("CtrScaledGather")
def _scaled_gather_grad(op, grad):
    params, where, values = op.inputs
    d_params = _lib.ctr_scaled_segment_sum(grad=grad, where=where, values=values,
                                           num_rows=tf.shape(params, out_type=tf.int64)[0])
    # Only computed where something differentiates the values (pruned otherwise).
    d_values = tf.reduce_sum(grad * tf.gather(params, where), 1)
    return d_params, None, d_values


def held(bag_ids):
    """(held [V, 2], ids [V]): the (example, column) of every id of bag_ids [B, C] that is
    not padding (-1), in row-major order, and those ids: tf.where(bag_ids >= 0) and a
    GatherNd in one pass."""
    return _lib.ctr_held(bag_ids=bag_ids)


POOLINGS = {"sum": 0, "mean": 1, "sqrtn": 2}


def bag_pool(rows, where, held, weights, bag_of_column, poolings):
    """[B, bags, W]: each bag's held ids' rows (`rows[where[v]]`, `held[v]` its (example,
    column) in weights [B, C]) times their weights, pooled as `poolings` says (per bag: sum,
    mean, sqrtn); `bag_of_column` the bag of each column (tables.py EmbeddingTable._pooled)."""
    pooled, _ = _lib.ctr_bag_pool(rows=rows, where=where, held=held, weights=weights,
                                  bag_of_column=list(bag_of_column),
                                  poolings=[POOLINGS[p] for p in poolings])
    return pooled


@tf.RegisterGradient("CtrBagPool")
def _bag_pool_grad(op, d_pooled, _d_denom):
    rows, where, held, weights = op.inputs
    d_rows = _lib.ctr_bag_pool_grad(grad=d_pooled, where=where, held=held, weights=weights,
                                    denom=op.outputs[1],
                                    num_rows=tf.shape(rows, out_type=tf.int64)[0],
                                    bag_of_column=op.get_attr("bag_of_column"))
    return d_rows, None, None, None     # the weights are data


def fm(block, first_order: bool):
    """(first-order sum [B] or None, FM's second-order term [B]) of a float32 block
    [B, F, W] (models/blocks.py first_and_fm)."""
    first, second, _ = _lib.ctr_fm(block=block, first_order=first_order)
    return (first if first_order else None), second


@tf.RegisterGradient("CtrFm")
def _fm_grad(op, d_first, d_fm, _d_summed):
    block, summed = op.inputs[0], op.outputs[2]
    batch = tf.shape(block)[:1]
    d_first = tf.zeros(batch) if d_first is None else d_first
    d_fm = tf.zeros(batch) if d_fm is None else d_fm
    return _lib.ctr_fm_grad(block=block, summed=summed, d_first=d_first, d_fm=d_fm,
                            first_order=op.get_attr("first_order"))


def adam_catchup_read(stored, moments, last_step, rows, iterations, lr_scale, learning_rate,
                      drift, ratios, beta1, beta2, epsilon, table_l2):
    """(offset, m, v, current or None) of Adam's catch-up for `rows` (optimizers.py
    Adam._decayed_math): `stored - offset` are the rows as dense Adam would have them."""
    offset, m, v, current = _lib.ctr_adam_catchup_read(
        stored=stored, moments=moments.handle, last_step=last_step.handle, rows=rows,
        iterations=iterations, lr_scale=lr_scale, learning_rate=learning_rate, drift=drift,
        ratios=ratios, beta1=beta1, beta2=beta2, epsilon=epsilon, table_l2=table_l2)
    return offset, m, v, (current if table_l2 else None)


def adam_catchup_lookup(table, moments, last_step, rows, iterations, lr_scale, learning_rate,
                        drift, ratios, beta1, beta2, epsilon, table_l2):
    """(now, caught): the table's `rows` read and caught up in one pass -- `now` the rows as
    dense Adam would have them, differentiable with respect to `table` (its gradient is the
    table's IndexedSlices at `rows`, as a lookup's); `caught` = (m, v, offset, current or
    None) as adam_catchup_apply takes it. `table` a variable of this process."""
    # Recorded as a read of the variable, as its own sparse_read does: the tape then watches
    # it, and the step's gradient reaches it through this op's.
    resource_variable_ops.variable_accessed(table)
    now, offset, m, v = _lib.ctr_adam_catchup_lookup(
        table=table.handle, moments=moments.handle, last_step=last_step.handle, rows=rows,
        iterations=iterations, lr_scale=lr_scale, learning_rate=learning_rate, drift=drift,
        ratios=ratios, beta1=beta1, beta2=beta2, epsilon=epsilon, table_l2=table_l2)
    return now, (m, v, offset, now if table_l2 else None)


@tf.RegisterGradient("CtrAdamCatchupLookup")
def _catchup_lookup_grad(op, d_now, *_):
    table, rows = op.inputs[0], op.inputs[3]
    return [tf.IndexedSlices(d_now, rows, tf.raw_ops.VariableShape(input=table))] \
        + [None] * (len(op.inputs) - 1)


def adam_catchup_apply(var, moments, last_step, rows, grad, caught, step, lr, beta1, beta2,
                       epsilon, table_l2):
    """Adam's step on `rows` in place (optimizers.py Adam._sparse), from `caught`, what
    adam_catchup_read gave for these rows; their last_step set to `step`."""
    m, v, offset, current = caught
    if current is None:
        current = tf.zeros([0, grad.shape[1]], tf.float32)
    return _lib.ctr_adam_catchup_apply(
        var=var.handle, moments=moments.handle, last_step=last_step.handle, rows=rows,
        grad=grad, m=m, v=v, offset=offset, current=current, iterations=step, lr=lr,
        beta1=beta1, beta2=beta2, epsilon=epsilon, table_l2=table_l2)


def adam_dense(var, m, v, grad, row_mask, lr, beta1, beta2, epsilon, l2):
    """Adam's step on dense `var` in place with grad x row_mask + l2 x var as its gradient
    (optimizers.py Adam._dense_with_terms); row_mask [rows] or None (every row); `lr` is
    lr sqrt(1 - beta2^t) / (1 - beta1^t)."""
    if row_mask is None:
        row_mask = tf.zeros([0], tf.float32)
    return _lib.ctr_adam_dense(var=var.handle, m=m.handle, v=v.handle, grad=grad,
                               row_mask=row_mask, lr=lr, beta1=beta1, beta2=beta2,
                               epsilon=epsilon, l2=l2)


def dice(s, mask, alpha, moving_mean, moving_var, training: bool, eps: float):
    """(out, mean, var): models/blocks.py Dice on s [N, units], mask [N]; mean and var the
    batch's (training) or the moving ones given (inference)."""
    return _lib.ctr_dice(s=s, mask=mask, alpha=alpha, moving_mean=moving_mean,
                         moving_var=moving_var, training=training, eps=eps)


@tf.RegisterGradient("CtrDice")
def _dice_grad(op, d_out, _d_mean, _d_var):
    # The mean and var outputs feed only the moving averages' assignments: no gradient.
    s, mask, alpha = op.inputs[:3]
    d_s, d_alpha = _lib.ctr_dice_grad(grad=d_out, s=s, mask=mask, alpha=alpha,
                                      mean=op.outputs[1], var=op.outputs[2],
                                      training=op.get_attr("training"), eps=op.get_attr("eps"))
    return d_s, None, d_alpha, None, None


def field_attention(q, k, v, heads: int):
    """[B, m, heads * size]: per example and head, softmax(Q K^T) V over the m fields (models/
    blocks.py SelfAttention), from q, k, v [B, m, heads * size]."""
    return _lib.ctr_field_attention(q=q, k=k, v=v, heads=heads)[0]


@tf.RegisterGradient("CtrFieldAttention")
def _field_attention_grad(op, d_out, _d_probs):
    return _lib.ctr_field_attention_grad(d_out=d_out, q=op.inputs[0], k=op.inputs[1],
                                         v=op.inputs[2], probs=op.outputs[1],
                                         heads=op.get_attr("heads"))


def dropout(x, rate: float, seed):
    """tf.nn.dropout(x, rate) for float32 x, its mask drawn from `seed` (int64 [2], a new
    pair each step) in the same pass; the rate held to the nearest 1/65536 (ctr_kernels.cc)."""
    return _lib.ctr_dropout(x=x, seed=seed, rate=rate)


@tf.RegisterGradient("CtrDropout")
def _dropout_grad(op, grad):
    # The same mask (the same seed and indices), the same scale: dropout is linear in x.
    return _lib.ctr_dropout(x=grad, seed=op.inputs[1], rate=op.get_attr("rate")), None


def relu_dropout_grad(dy, y, rate: float):
    """(dz, db): the gradient of y = dropout(relu(z + b), rate) (rate 0: no dropout) with
    respect to z [B, n] and b [n], from dy and y alone, in one pass (ctr_kernels.cc)."""
    return _lib.ctr_relu_dropout_grad(dy=dy, y=y, rate=rate)


def outer_product(a, b):
    """[R, A B]: each row's outer product, z[r, i B + j] = a[r, i] b[r, j] (a [R, A], b [R, B],
    float32 or bfloat16)."""
    return _lib.ctr_outer_product(a=a, b=b)


@tf.RegisterGradient("CtrOuterProduct")
def _outer_product_grad(op, grad):
    # One pass over grad; the sums in float32 for bfloat16 too.
    return _lib.ctr_outer_product_grad(grad=grad, a=op.inputs[0], b=op.inputs[1])


def pair_product(x):
    """[R, M (M + 1) / 2]: x[r, i] x[r, j] for i <= j, row-major over (i, j) (x [R, M], float32
    or bfloat16)."""
    return _lib.ctr_pair_product(x=x)


@tf.RegisterGradient("CtrPairProduct")
def _pair_product_grad(op, grad):
    return _lib.ctr_pair_product_grad(grad=grad, x=op.inputs[0])


tf.no_gradient("CtrPairProductGrad")
tf.no_gradient("CtrOuterProductGrad")
tf.no_gradient("CtrReluDropoutGrad")
tf.no_gradient("CtrUnique")
tf.no_gradient("CtrHeld")
tf.no_gradient("CtrFmGrad")
tf.no_gradient("CtrBagPoolGrad")
tf.no_gradient("CtrDiceGrad")
tf.no_gradient("CtrFieldAttentionGrad")
tf.no_gradient("CtrAdamCatchupRead")
tf.no_gradient("CtrAdamCatchupApply")
tf.no_gradient("CtrScaledSegmentSum")
