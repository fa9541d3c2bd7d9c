"""Raw 64-bit keys onto pools of table rows that new keys claim and old ones give back: the
id map of the dynamic fields (issue 57: an id space that never stops growing).

A fixed table gives every id a row known in advance (a vocabulary, or a hash bucket that it
shares with every value hashed alike). A dynamic field instead maps each raw key (a hash of
the raw value, any int64) to a row of its own, claimed when the key is first seen -- or, with
`admit` N, when it has been seen N times; until then it reads its pool's shared first row and
only its count is kept, for at most as many keys as the pools have rows (beyond that every
pending count is forgotten at once) -- and given back when its pool needs room: rows not seen for `ttl`
steps first, then the least frequently seen, never one the batch at hand reads. Each dynamic
field's pool is its hash buckets (base .. base + rows - 1 of the one embedding table), so the
table's optimizer, checkpoints and export serve it unchanged and its memory is the fixed
table's, whatever the number of keys the stream brings; what a row claimed by a new key held
before is reset by the caller (the rows `assign` returns: train/step.py).

One map serves every dynamic field of a model (keys must differ across fields: the pipeline
salts each field's with its name, input/pipeline.py field_ids), and a step costs one de-duplication, one
hash-table lookup and a few scatters however many fields are dynamic (a map per field cost 26
of each, and 12 s of tracing, on a 26-field stream). Claims are served from a queue of free
rows per pool; when a pool's queue runs short, one sweep ranks every pool's rows (two stable
sorts) and refills each queue with its best `sweep` share at least -- free rows, then expired,
then the least seen -- evicting the held ones among them. A sweep is O(rows log rows), paid
once per that share of new keys rather than at every step.

This is the managed-collision design (TorchRec's MCH modules, Monolith's collisionless
tables, DeepRec's admission and eviction) over TensorFlow's own MutableHashTable: the key ->
slot map is checkpointed with the model (tf.train.Checkpoint tracks it). Per slot three
variables: the key holding it, its count (times seen while it held the slot) and the step it
was last seen (-1: free; -2: a pool's shared row). Every choice is deterministic (ties go to
the lower slot), so processes that assign the same batches in the same order agree.

Where the map lives follows the strategy (dynamic_ids): one map a process (the replicas of a
mirrored process share it; the processes of an all-reduce job each keep their copy the same,
train/runtime.py assign_keys), or, under parameter servers, one part a server holding the
keys k with k mod S = its index (ShardedDynamicIds).
"""

from __future__ import annotations

import contextlib

import numpy as np
import tensorflow as tf

raw = tf.raw_ops

_FREE = -1           # `seen` of a free slot
_SHARED = -2         # `seen` of a pool's shared row (never held, never given)
_COUNTS = 2 ** 40     # counts rank up to this in a sweep
SWEEP = 0.125        # a sweep queues at least this share of each pool


class DynamicIds(tf.Module):
    def __init__(self, rows: int | None = None, base: int = 0, admit: int = 1, ttl: int = 0,
                 pools=None, sweep: float = SWEEP, guard: int = 0, device: str | None = None,
                 name: str = "dynamic_ids"):
        """`pools`: (first row, rows) of each dynamic field, in the order of the key columns
        `assign` and `lookup` take; or one pool of `rows` rows from `base`. `guard`: a slot
        seen within this many steps before the current one is not given back (asynchronous
        workers: another worker's step may still read it). `device`: where the map lives
        (a parameter server: ShardedDynamicIds), None for the strategy's placement."""
        super().__init__(name=name)
        pools = tuple((int(b), int(r)) for b, r in (pools or [(base, rows)]))
        if any(r < 2 for _, r in pools):
            raise ValueError("a dynamic field's pool needs at least 2 rows (one is shared)")
        self.pools, self.admit, self.ttl, self.guard = pools, int(admit), int(ttl), int(guard)
        sizes = np.array([r for _, r in pools], np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        total = int(sizes.sum())
        pool_of_slot = np.repeat(np.arange(len(pools)), sizes)
        self._offsets, self._sizes = offsets, sizes
        self._pool_of_slot = pool_of_slot
        self._row_of_slot = np.concatenate([np.arange(b, b + r) for b, r in pools])
        contiguous = np.array_equal(self._row_of_slot, self._row_of_slot[0] + np.arange(total))
        self._first_row = int(self._row_of_slot[0]) if contiguous else None
        self._sweep_rows = np.maximum(1, np.ceil(sizes * sweep)).astype(np.int64)
        # count and seen have one more slot (`total`): a sink that the step's unknown keys
        # count into, so that counting needs no mask of the batch's keys.
        seen = np.full(total + 1, _FREE, np.int64)
        seen[offsets] = _SHARED
        seen[total] = _SHARED
        self._total = total
        # Each pool's free slots, best first, in its own region of `queue`: claims take
        # queue[offset + head ...] while head < avail; a sweep refills it.
        queue = np.arange(total, dtype=np.int64) + 1
        with tf.device(device) if device else contextlib.nullcontext():
            self.slots = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, -1,
                                                                 name="slots")
            self.pending = tf.lookup.experimental.MutableHashTable(
                tf.int64, tf.int64, 0, name="pending") if self.admit > 1 else None
            variable = _placed_variable if device else _variable
            self.key = variable(np.zeros([total], np.int64), "key")
            self.count = variable(np.zeros([total + 1], np.int64), "count")
            self.seen = variable(seen, "seen")
            self.queue = variable(queue, "queue")
            self.head = variable(np.zeros([len(pools)], np.int64), "head")
            self.avail = variable(sizes - 1, "avail")

    def _rows(self, slot, pool):
        """Table rows of slots [n] of keys of pools [n] (-1: no slot, the pool's shared row)."""
        slot = tf.where(slot >= 0, slot, tf.gather(tf.constant(self._offsets), pool))
        if self._first_row is not None:     # pools side by side in the table: an offset
            return slot + self._first_row
        return tf.gather(tf.constant(self._row_of_slot), slot)

    def lookup(self, keys: tf.Tensor) -> tf.Tensor:
        """Table rows of `keys` [N, pools] (one pool: any shape) without changing anything
        (evaluation, serving): a key with no row of its own reads its pool's shared row."""
        flat, pool = flat_keys(keys, len(self.pools))
        return _shaped(self.lookup_flat(flat, pool), keys, len(self.pools))

    def lookup_flat(self, flat, pool):
        """lookup of keys [n] of pools [n]."""
        return self._rows(tf.reshape(self.slots.lookup(flat), [-1]), pool)

    def assign(self, keys: tf.Tensor, step) -> tuple[tf.Tensor, tf.Tensor]:
        """(table rows of `keys` [N, pools] (one pool: any shape), the rows claimed by new
        keys in this call): counts and last-seen steps updated, new keys admitted into their
        pools' free or given-back slots. The caller resets the claimed rows (their vectors
        and optimizer state) before reading them."""
        flat, pool = flat_keys(keys, len(self.pools))
        rows, claimed = self.assign_flat(flat, pool, step)
        return _shaped(rows, keys, len(self.pools)), claimed

    def assign_flat(self, flat, pool, step):
        """assign of keys [n] of pools [n]. One lookup of every key; only the new ones are
        de-duplicated (a batch's keys are mostly known ones)."""
        step = tf.cast(step, tf.int64)
        slot = tf.reshape(self.slots.lookup(flat), [-1])      # a known rank, for the masks
        found = slot >= 0
        counted = tf.where(found, slot, self._total)                # unknown keys: the sink
        _scatter(raw.ResourceScatterAdd, self.count, counted, tf.ones_like(counted))
        _scatter(raw.ResourceScatterUpdate, self.seen, counted, tf.fill(tf.shape(counted), step))
        at_new = tf.where(~found)[:, 0]
        new, where, new_counts = tf.unique_with_counts(tf.gather(flat, at_new),
                                                       out_idx=tf.int64)
        new_counts = tf.cast(new_counts, tf.int64)
        new_pool = tf.math.unsorted_segment_min(tf.gather(pool, at_new), where, tf.size(new))
        admitted = tf.ones_like(new, tf.bool)
        if self.pending is not None:
            so_far = tf.reshape(self.pending.lookup(new), [-1]) + new_counts
            admitted = so_far >= self.admit
            self.pending.insert(tf.boolean_mask(new, ~admitted),
                                tf.boolean_mask(so_far, ~admitted))
            self.pending.remove(tf.boolean_mask(new, admitted))
            new_counts = so_far
            # At most as many pending counts as the pools have rows: beyond that all are
            # forgotten at once (a key must reach `admit` within that window), so that a
            # stream of ever-new keys seen once holds no memory beyond the cap.
            tf.cond(self.pending.size() > self._total,
                    lambda: self.pending.remove(self.pending.export()[0]),
                    tf.no_op)
        # The admitted keys pool after pool (in order of first sight within a pool), as
        # their claims are served.
        at = tf.boolean_mask(tf.range(tf.size(new, out_type=tf.int64)), admitted)
        at = tf.gather(at, tf.argsort(tf.gather(new_pool, at), stable=True))
        chosen, ok = self._claim(*(tf.gather(t, at) for t in (new, new_counts, new_pool)),
                                 step)
        # Each new key's slot (-1: not admitted, or its pool had none to give) at its places.
        slot_of_new = tf.scatter_nd(tf.boolean_mask(at, ok)[:, None], chosen + 1,
                                    tf.shape(new, tf.int64)) - 1
        slot = tf.tensor_scatter_nd_update(slot, at_new[:, None], tf.gather(slot_of_new, where))
        return self._rows(slot, pool), tf.gather(tf.constant(self._row_of_slot), chosen)

    def _claim(self, new, new_counts, new_pool, step):
        """Slots for the new keys (sorted by pool), as many as their pools can give: (the
        slots, which keys got one)."""
        pools = len(self.pools)
        need = tf.math.unsorted_segment_sum(tf.ones_like(new_pool), new_pool, pools)
        short = _read(self.head) + need > _read(self.avail)
        with tf.control_dependencies([tf.cond(tf.reduce_any(short),
                                              lambda: self._sweep(short, need, step),
                                              lambda: tf.constant(0, tf.int64))]):
            head, avail = _read(self.head), _read(self.avail)
        start = tf.cumsum(need, exclusive=True)
        rank = tf.range(tf.size(new, out_type=tf.int64)) - tf.gather(start, new_pool)
        at = tf.gather(head, new_pool) + rank
        ok = at < tf.gather(avail, new_pool)
        chosen = _gather(self.queue, tf.boolean_mask(
            tf.gather(tf.constant(self._offsets), new_pool) + at, ok))
        keys, counts = tf.boolean_mask(new, ok), tf.boolean_mask(new_counts, ok)
        raw.AssignVariableOp(resource=self.head.handle, value=tf.minimum(head + need, avail))
        self.slots.insert(keys, chosen)
        _scatter(raw.ResourceScatterUpdate, self.key, chosen, keys)
        _scatter(raw.ResourceScatterUpdate, self.count, chosen, counts)
        _scatter(raw.ResourceScatterUpdate, self.seen, chosen, tf.fill(tf.shape(chosen), step))
        return chosen, ok

    def _sweep(self, short, need, step):
        """Refills the queue of every pool that is `short` with its best max(sweep share,
        need) slots: free ones first, then expired ones (the least seen first), then the
        least seen; never a shared row nor a slot this batch reads. The held ones among them
        are given back now. Only the short pools' slots are ranked: a small pool that runs
        short often does not sort the large ones."""
        c = lambda v: tf.constant(v, tf.int64)    # noqa: E731
        pool_of_slot = tf.constant(self._pool_of_slot, tf.int64)
        slots = tf.where(tf.gather(short, pool_of_slot))[:, 0]       # ascending, pool-major
        seen = tf.gather(_read(self.seen), slots)
        count = tf.gather(_read(self.count), slots)
        free, held = tf.equal(seen, _FREE), seen >= 0
        expired = tf.logical_and(held, step - seen > self.ttl) if self.ttl else \
            tf.zeros_like(free)
        blocked = tf.logical_or(tf.equal(seen, _SHARED), tf.logical_and(held, seen >= step - self.guard))
        # One sort of one int64 per slot: its pool above its class (free 3, expired 2,
        # held 1, blocked 0) above how rarely it was seen (counts capped at 2^40).
        rarity = _COUNTS - tf.minimum(count, _COUNTS - 1)
        kind = tf.where(free, c(3), tf.where(blocked, c(0), tf.where(expired, c(2), c(1))))
        mine = tf.gather(pool_of_slot, slots)
        rank_key = (len(self.pools) - 1 - mine) * (4 * _COUNTS) + \
            kind * _COUNTS + tf.where(blocked | free, c(0), rarity)
        order = tf.cast(tf.argsort(rank_key, direction="DESCENDING", stable=True), tf.int64)
        usable = tf.gather(kind, order) > 0
        pool = tf.gather(mine, order)
        held = tf.gather(held, order)
        order = tf.gather(slots, order)
        # A short pool's slots are one block of the order: its rank is its place there.
        start = tf.cumsum(tf.where(short, tf.constant(self._sizes), 0), exclusive=True)
        rank = tf.range(tf.size(order, out_type=tf.int64)) - tf.gather(start, pool)
        target = tf.maximum(tf.constant(self._sweep_rows), need)
        take = tf.logical_and(rank < tf.gather(target, pool), usable)
        taken, taken_pool = tf.boolean_mask(order, take), tf.boolean_mask(pool, take)
        given = tf.boolean_mask(taken, tf.boolean_mask(held, take))
        self.slots.remove(_gather(self.key, given))
        _scatter(raw.ResourceScatterUpdate, self.seen, given,
                 tf.fill(tf.shape(given), c(_FREE)))
        _scatter(raw.ResourceScatterUpdate, self.count, given, tf.zeros_like(given))
        # Taken slots are each pool's first ranks: they go to the front of its region.
        _scatter(raw.ResourceScatterUpdate, self.queue, tf.boolean_mask(rank, take) + tf.gather(
            tf.constant(self._offsets), taken_pool), taken)
        refilled = tf.math.unsorted_segment_sum(tf.ones_like(taken_pool), taken_pool,
                                                len(self.pools))
        raw.AssignVariableOp(resource=self.avail.handle,
                             value=tf.where(short, refilled, _read(self.avail)))
        raw.AssignVariableOp(resource=self.head.handle,
                             value=tf.where(short, c(0), _read(self.head)))
        return tf.size(taken, out_type=tf.int64)

    def live(self, step=None) -> tf.Tensor:
        """Slots held by a key (with `step` and a ttl: seen within the ttl)."""
        seen = _read(self.seen)[:self._total]
        held = seen >= 0
        if step is not None and self.ttl:
            held = tf.logical_and(held, tf.cast(step, tf.int64) - seen <= self.ttl)
        return tf.reduce_sum(tf.cast(held, tf.int64))


class ShardedDynamicIds(tf.Module):
    """The map partitioned by key over parameter servers (asynchronous training): the key
    k's slot is held by server k mod S, whose DynamicIds has its own part of every pool (a
    contiguous S-th of the field's rows, each part with its own shared row). A worker's step
    sends each server only its keys, and each server assigns them inside a CriticalSection
    of its own, so the steps that workers run at the same time update a server's map one
    after the other (the lock is taken once the keys have arrived: a step's map update holds
    it only while the server computes). Steps run asynchronously: a row another worker's step
    is still reading is protected by `guard` (ps.py: twice the workers); a row given back
    while a slower step still reads it takes that step's update, the staleness asynchronous
    training has anyway."""

    def __init__(self, pools, devices, admit: int = 1, ttl: int = 0, guard: int = 0,
                 name: str = "dynamic_ids"):
        super().__init__(name=name)
        self.pools = tuple((int(b), int(r)) for b, r in pools)
        n = len(devices)
        if any(r < 2 * n for _, r in self.pools):
            raise ValueError(f"a dynamic field's pool needs at least {2 * n} rows over {n} "
                             f"parameter servers (2 a server: one is shared)")
        self.devices = tuple(devices)
        self.shards = [DynamicIds(pools=[(b + r * s // n, r * (s + 1) // n - r * s // n)
                                         for b, r in self.pools],
                                  admit=admit, ttl=ttl, guard=guard, device=d, name=f"shard{s}")
                       for s, d in enumerate(self.devices)]
        self._sections = []
        for s, d in enumerate(self.devices):
            with tf.device(d):
                self._sections.append(tf.CriticalSection(name=f"dynamic_ids_shard{s}"))

    def _routes(self, keys):
        """(flat keys, their pools, [where the keys of server s are] for each s)."""
        flat, pool = flat_keys(keys, len(self.pools))
        owner = tf.math.floormod(flat, len(self.shards))
        return flat, pool, [tf.where(tf.equal(owner, s))[:, 0] for s in range(len(self.shards))]

    def lookup(self, keys):
        flat, pool, routes = self._routes(keys)
        rows = tf.zeros_like(flat)
        for ids, at in zip(self.shards, routes):
            rows = tf.tensor_scatter_nd_update(
                rows, at[:, None], ids.lookup_flat(tf.gather(flat, at), tf.gather(pool, at)))
        return _shaped(rows, keys, len(self.pools))

    def assign(self, keys, step):
        flat, pool, routes = self._routes(keys)
        step = tf.cast(step, tf.int64)
        rows, claimed = tf.zeros_like(flat), []
        for ids, section, device, at in zip(self.shards, self._sections, self.devices, routes):
            mine, mine_pool = tf.gather(flat, at), tf.gather(pool, at)
            with tf.device(device):
                got, new = section.execute(
                    lambda ids=ids, mine=mine, mine_pool=mine_pool: _with_effects(
                        lambda: ids.assign_flat(mine, mine_pool, step)),
                    exclusive_resource_access=False)
            rows = tf.tensor_scatter_nd_update(rows, at[:, None], got)
            claimed.append(new)
        return _shaped(rows, keys, len(self.pools)), tf.concat(claimed, 0)

    def live(self, step=None):
        return tf.add_n([ids.live(step) for ids in self.shards])


def _with_effects(fn):
    """fn()'s outputs, once every stateful op it made has run. A CriticalSection releases its
    lock when the outputs are computed: an update the outputs do not depend on (an insert,
    a scatter of `seen`) could otherwise land after another worker's step took the lock --
    in a job of two workers, two slots were seen held whose keys the map did not hold."""
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    out = fn()
    effects = [op for op in graph.get_operations()[before:] if op.op_def.is_stateful]
    with tf.control_dependencies(effects):
        return tf.nest.map_structure(tf.identity, out)


def dynamic_ids(pools, admit: int = 1, ttl: int = 0):
    """The map of a model's dynamic fields, made for the strategy in scope: partitioned over
    the parameter servers under a ParameterServerStrategy (a server each part, its guard
    twice the workers), one map a process otherwise (the processes of an all-reduce job
    each their copy, kept the same: train/runtime.py Runtime.assign_keys)."""
    strategy = tf.distribute.get_strategy()
    if isinstance(strategy, tf.distribute.ParameterServerStrategy):
        # The cluster as the job's TF_CONFIG gives it (train/ps.py builds the strategy from
        # it; the strategy does not expose its resolver).
        cluster = tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec()
        servers = cluster.num_tasks("ps")
        return ShardedDynamicIds(pools, [f"/job:ps/task:{s}/device:CPU:0" for s in range(servers)],
                                 admit=admit, ttl=ttl, guard=2 * cluster.num_tasks("worker"))
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        # The replicas of one process share one map (the runtime assigns it once a step, in
        # a merge_call): its variables are not mirrored but on the host's first CPU.
        return DynamicIds(pools=pools, admit=admit, ttl=ttl, device="/device:CPU:0")
    return DynamicIds(pools=pools, admit=admit, ttl=ttl)


def flat_keys(keys, pools: int):
    """(keys [N * pools], the pool of each) of keys [N, pools] (one pool: any shape)."""
    flat = tf.reshape(tf.cast(keys, tf.int64), [-1])
    at = tf.range(tf.size(flat, out_type=tf.int64))
    return flat, (at % pools if pools > 1 else tf.zeros_like(at))


def _shaped(rows, keys, pools: int):
    """Rows [n] as keys [N, pools] are (one pool: any shape), the pools' dimension static
    where the keys' is not (an all-gather's)."""
    if pools > 1:
        return tf.ensure_shape(tf.reshape(rows, [-1, pools]), keys.shape)
    return tf.ensure_shape(tf.reshape(rows, tf.shape(keys)), keys.shape)


def _variable(value, name):
    return tf.Variable(value, trainable=False, name=name)


def _placed_variable(value, name):
    """A variable where the device scope says, whatever the strategy in scope: a
    ParameterServerStrategy's creator would place it round-robin, or split it, ignoring the
    scope (a map's variables must live with its hash tables). TensorFlow's own distributed
    values make theirs this way (ps_values)."""
    from tensorflow.python.ops import resource_variable_ops
    return resource_variable_ops.ResourceVariable(value, trainable=False, name=name)


# Every read and update goes through the variable's handle: inside a replica of an all-reduce
# job that is the replica's own copy, which every replica updates alike from the same
# all-gathered keys (a MirroredVariable's own update methods would ask for an aggregation).
def _read(var):
    return raw.ReadVariableOp(resource=var.handle, dtype=var.dtype)


def _gather(var, indices):
    return raw.ResourceGather(resource=var.handle, indices=indices, dtype=var.dtype)


def _scatter(op, var, indices, updates):
    op(resource=var.handle, indices=indices, updates=updates)
