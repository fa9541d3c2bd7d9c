"""Optimizers for a CTR model: an embedding table's update costs O(rows in the batch), not
O(table), and trains as the dense update does.

A batch touches a few thousand of a table's rows. Dense Adam (Keras, the SageMaker DeepFM
sample, DeepCTR) still moves every row at every step: the moments of an untouched row decay,
the row keeps drifting along them, and the table's L2 pulls it towards 0. Three ways to update
a table (`table_updates`):

- `catchup` (what the default `auto` takes above 100,000 rows: train/config.py): a row
  not in the batch is left alone, and when it is next read (the
  forward pass reads a batch's rows through `row_correction`, so each gradient is taken where
  dense training would take it), updated, or the table is read whole (evaluation, the final
  checkpoint, export: `settle`), it is first brought to where the dense update would have
  taken it in the steps it skipped, from a per-row counter of its last step. The skipped
  decay of Adam's moments is beta^k and the drift along them a closed form in sums of the
  skipped steps' learning rates, tabulated once (`_AdamDrift`); SGD and momentum with the
  table's L2 are a linear map per skipped step, applied k times in closed form; Adagrad's and
  FTRL's rows do not move without gradient (with L2, Adagrad's shrink by a constant factor).
  Adam's skipped L2 steps have no closed form and are approximated (`Adam._idle_l2`); the
  bounds are measured in tests/test_table_updates.py.
- `lazy`: rows not in the batch neither move nor decay (TensorFlow Addons' LazyAdam).
  Cheapest; it trains differently where the table is much larger than a batch's rows.
- `dense`: every row at every step, with TensorFlow's dense kernels: the reference, O(table).

The table's L2 (`table_l2`, the sample's `l2_reg * tf.nn.l2_loss(table)`) is added to the
gradient here, after any cross-replica reduction, at the rows' current values.

Gradients of looked-up tables arrive as tf.IndexedSlices, summed here per distinct row. Dense
gradients use TensorFlow's fused kernels. Slots are created up front (`build`), each colocated
with its variable (`colocate_vars_with`: beside its shard on a parameter server, never
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
TABLE_UPDATES = ("catchup", "lazy", "dense")
SETTLE_ROWS = 1 << 16


def _dedupe(g: tf.IndexedSlices):
    rows, where = tf.unique(g.indices)
    return tf.math.unsorted_segment_sum(g.values, where, tf.shape(rows)[0]), rows


def gather_rows(var, rows):
    """The rows of a resource variable (a table or its slot), read without a gradient."""
    return raw.ResourceGather(resource=var.handle, indices=rows, dtype=var.dtype)


class Optimizer(tf.Module):
    slot_names: tuple[str, ...] = ()
    slot_init: dict[str, float] = {}
    catches_up = False   # has a per-row last-step counter in `catchup` mode

    def __init__(self, learning_rate: float, name=None, table_updates: str = "catchup",
                 table_l2: float = 0.0):
        super().__init__(name=name)
        from ...errors import ConfigError
        if table_updates not in TABLE_UPDATES:
            raise ConfigError(f"table_updates must be one of {', '.join(TABLE_UPDATES)}, "
                              f"not {table_updates!r}")
        self.base_learning_rate = learning_rate
        # What decays on a plateau have made of it (train/controller.py): checkpointed, so a
        # resumed run keeps them whatever learning rate it is given. A decay comes right after
        # an evaluation has settled every row, so the catch-up of later skipped steps spans
        # steps of one learning rate.
        self.lr_scale = tf.Variable(1.0, trainable=False, name="lr_scale")
        self.table_updates, self.table_l2 = table_updates, table_l2
        self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")
        self.slots: list[dict[str, tf.Variable]] = []
        self._index: dict[int, int] = {}
        self._tables: list = []
        # What row_correction computed for a table's rows in this step's forward pass, for
        # the update to reuse when its rows are those rows (one replica, unique gradients).
        # Set past tf.Module's attribute tracking: tensors of a trace, never checkpointed.
        object.__setattr__(self, "_pending", {})
        self._reuse = False

    @property
    def learning_rate(self):
        """The learning rate now (a tensor: read at every step)."""
        return self.base_learning_rate * self.lr_scale

    def build(self, variables, tables=(), terms=()):
        """Creates the slots of each variable (call inside the strategy's scope if any).
        `tables`: the embedding tables (or table shards) among them (updated per table_updates).
        `terms`: (variable, row mask [rows, 1] or None, l2) of dense variables whose gradient
        the update makes grad x row_mask + l2 x variable (the model's gradient_terms): after
        the replicas' reduction, in the update's own pass where the optimizer has a kernel
        for it (Adam), instead of element-wise passes of the step's own."""
        # past tf.Module's attribute tracking, as _pending: constants, never checkpointed
        object.__setattr__(self, "_terms", {id(v): (mask, l2) for v, mask, l2 in terms})
        table_ids = {id(t) for t in tables}
        for var in variables:
            self._index[id(var)] = len(self.slots)
            if id(var) in table_ids:
                self._tables.append(var)
            is_table = self.is_table(var)
            slots = {n: make_slot(var, n, shape, self.slot_init.get(n, 0.0))
                     for n, shape in self._slot_shapes(var, is_table)}
            if is_table and self.counts_steps:
                slots["last_step"] = make_slot(var, "last_step", var.shape[:1], 0, tf.int64)
            self.slots.append(slots)

    def _slot_shapes(self, var, is_table: bool):
        return [(n, var.shape) for n in self.slot_names]

    def slot(self, var, name):
        return self.slots[self._index[id(var)]][name]

    def _among_tables(self, var) -> bool:
        return any(var is t for t in self._tables)

    def is_table(self, var) -> bool:
        """A table updated sparsely (catchup or lazy)."""
        return self.table_updates != "dense" and self._among_tables(var)

    @property
    def counts_steps(self) -> bool:
        """Tables keep per-row last-step counters: catchup mode, for an optimizer whose rows
        change in steps that skip them."""
        return self.catches_up and self.table_updates == "catchup"

    def apply_gradients(self, grads_and_vars, unique_indices: bool = False):
        """`unique_indices`: sparse gradients are already summed per distinct row."""
        raw.AssignAddVariableOp(resource=self.iterations.handle,
                                value=tf.constant(1, self.iterations.dtype))
        self._reuse = unique_indices
        for g, v in grads_and_vars:
            if g is None:
                continue
            sparse_table = self.is_table(v)
            if isinstance(g, tf.IndexedSlices) and sparse_table:
                values, rows = (g.values, g.indices) if unique_indices else _dedupe(g)
            elif sparse_table:    # densified on the way (sparse_reduce: dense): every row
                values, rows = g, tf.range(tf.shape(g, out_type=tf.int64)[0])
            else:                 # a dense variable, or a table in `dense` mode
                g = tf.convert_to_tensor(g)
                if self.table_l2 and self._among_tables(v):
                    g = g + self.table_l2 * v
                terms = self._terms.get(id(v))
                if terms is None:
                    self._dense(v, g)
                else:
                    self._dense_with_terms(v, g, *terms)
                continue
            self._sparse(v, values, rows)
        self._pending.clear()
        self._reuse = False

    def _dense_with_terms(self, var, grad, row_mask, l2: float):
        """The dense update with grad x row_mask + l2 x var as the gradient (build's `terms`).
        Computed beside the variable: under parameter servers the variable is not read across
        the network a second time (the gradient goes there for the update anyway)."""
        with tf.device(var.device):
            if row_mask is not None:
                grad = grad * row_mask
            if l2:
                grad = grad + l2 * var
        self._dense(var, grad)

    def reset_rows(self, var, rows):
        """A table's `rows` given to new ids (a dynamic field's, models/engine/dynamic.py):
        their slots as a new row's, and current as of this step (nothing skipped to catch
        up). Call before the step's forward pass reads them."""
        for name, slot in self.slots[self._index[id(var)]].items():
            if name == "last_step":
                value = tf.fill(tf.shape(rows), tf.identity(self.iterations))
            else:
                value = tf.fill(tf.concat([tf.shape(rows), tf.shape(slot)[1:]], 0),
                                tf.constant(self.slot_init.get(name, 0.0), slot.dtype))
            raw.ResourceScatterUpdate(resource=slot.handle, indices=rows, updates=value)

    def settle(self):
        """Brings every row of every table to the current step (catchup mode; a no-op
        otherwise): before the table is read whole (evaluation, export). O(table)."""
        if self.table_updates != "catchup":
            return
        for var in self._tables:
            # In blocks of rows: the catch-up's temporaries over a whole 10M-row table would
            # take gigabytes. (A while loop written out: the functions that call this are
            # traced without AutoGraph, train/step.py.)
            n = tf.shape(var, out_type=tf.int64)[0]

            def block(start, var=var, n=n):
                self._settle(var, tf.range(start, tf.minimum(start + SETTLE_ROWS, n)))
                return start + SETTLE_ROWS
            tf.while_loop(lambda start, n=n: start < n, block, [tf.constant(0, tf.int64)])

    def _settle(self, var, rows):
        pass

    def _with_l2(self, grad, var, rows):
        """The rows' gradient plus their L2's (for rows that are current as stored)."""
        return grad + self.table_l2 * gather_rows(var, rows) if self.table_l2 else grad

    def read_rows(self, var, rows):
        """The forward pass's lookup of a table's distinct `rows`: the stored rows less
        row_correction, differentiable with respect to `var` (IndexedSlices at `rows`). An
        optimizer with a fused kernel for both overrides it."""
        stored = tf.nn.embedding_lookup(var, rows)
        offset = self.row_correction(var, rows, stored) if isinstance(var, tf.Variable) else None
        return stored if offset is None else stored - tf.stop_gradient(offset)

    def row_correction(self, var, rows, stored=None):
        """What to subtract from the stored rows to read them as the dense update would have
        left them (catchup mode), without changing anything: the forward pass reads rows
        through it, so that a step's gradient is taken where dense training would take it.
        None when stored rows are already current. `stored`: the rows as the caller read them
        (saves a gather)."""
        return None

    def _skipped(self, var, rows, upto):
        """(the rows' last steps, the steps each skipped up to step `upto`). Never negative:
        under parameter servers another worker may have counted a step meanwhile."""
        last = gather_rows(self.slot(var, "last_step"), rows)
        return last, tf.maximum(upto - last, 0)

    def _mark_current(self, var, rows):
        """The rows' counters set to the current step."""
        raw.ResourceScatterUpdate(resource=self.slot(var, "last_step").handle, indices=rows,
                                  updates=tf.fill(tf.shape(rows), tf.identity(self.iterations)))

    def _idle_steps(self, var, rows, settle: bool):
        """`_skipped` up to the current step t when settling, up to t - 1 before applying step
        t; then the rows are marked current."""
        last, k = self._skipped(var, rows, self.iterations - (0 if settle else 1))
        self._mark_current(var, rows)
        return last, k


def make_slot(var, name: str, shape, value: float, dtype=None):
    strategy = tf.distribute.get_strategy()
    with strategy.extended.colocate_vars_with(var):
        return tf.Variable(tf.fill(shape, tf.constant(value, dtype or var.dtype)), trainable=False,
                           name=f"{var.name.split(':')[0]}/{name}")
