"""The id map of a dynamic field (models/engine/dynamic.py): raw 64-bit ids claim rows of a
pool, admitted after N sightings, given back least-frequent-first or after a ttl."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from ctrtrain.models.engine.dynamic import DynamicIds  # noqa: E402

BIG = [2 ** 62 + 5, -(2 ** 63) + 7, 123456789012345]    # any int64 is an id


def rows_of(m, keys, step):
    rows, claimed = m.assign(tf.constant(keys, tf.int64), step)
    return rows.numpy().tolist(), sorted(claimed.numpy().tolist())


def test_each_new_id_claims_a_row_of_its_own_and_keeps_it():
    m = DynamicIds(rows=8, base=100)
    rows, claimed = rows_of(m, [BIG[0], BIG[1], BIG[0], BIG[2]], step=1)
    assert rows[0] == rows[2] and len({rows[0], rows[1], rows[3]}) == 3
    assert all(101 <= r < 108 for r in rows) and claimed == sorted({rows[0], rows[1], rows[3]})
    again, claimed = rows_of(m, [[BIG[2]], [BIG[0]]], step=2)       # any shape
    assert again == [[rows[3]], [rows[0]]] and claimed == []
    assert m.lookup(tf.constant([BIG[1], 42], tf.int64)).numpy().tolist() == [rows[1], 100]
    assert int(m.live()) == 3


def test_a_full_pool_gives_back_its_least_seen_rows_and_holds_its_cap():
    m = DynamicIds(rows=4)        # row 0 shared: 3 ids at most
    rows_of(m, [1, 1, 1, 2, 2, 3], step=1)            # counts: 1 -> 3, 2 -> 2, 3 -> 1
    rows, claimed = rows_of(m, [4], step=2)
    assert claimed == [int(m.lookup(tf.constant([4], tf.int64))[0])]
    assert int(m.lookup(tf.constant([3], tf.int64))[0]) == 0       # the least seen went
    assert int(m.live()) == 3
    # An endless stream of new ids: never more rows than the pool; the frequent id stays.
    keep = int(m.lookup(tf.constant([1], tf.int64))[0])
    for step in range(3, 40):
        rows, _ = rows_of(m, [1, 1000 + step, 2000 + step], step)
        assert rows[0] == keep and int(m.live()) == 3
    # A batch with more new ids than free rows: those left over read row 0 this time.
    rows, claimed = rows_of(m, [1, 5, 6, 7], step=40)
    assert rows[0] == keep and sorted(rows[1:]).count(0) == 1 and len(claimed) == 2


def test_admission_after_n_sightings_and_eviction_after_a_ttl():
    m = DynamicIds(rows=6, admit=2, ttl=5)
    assert rows_of(m, [7], step=1) == ([0], [])         # seen once: row 0, only counted
    rows, claimed = rows_of(m, [7], step=2)
    assert rows[0] > 0 and claimed == rows
    rows_of(m, [8, 8, 9, 9], step=3)                    # admitted at once: twice in a batch
    for step in range(4, 10):
        rows_of(m, [8, 9], step)                        # 8, 9 seen more than 7 ever was
    assert int(m.live(step=9)) == 2                      # 7 last seen at step 2: expired
    # A new id takes a free row first; with none free, the expired 7 goes before 8 or 9.
    small = DynamicIds(rows=3, ttl=5)
    rows_of(small, [7], 1)
    rows_of(small, [8, 8, 8], 2)
    for step in range(3, 10):
        rows_of(small, [8], step)
    rows, _ = rows_of(small, [10], step=10)
    got = small.lookup(tf.constant([7, 8, 10], tf.int64)).numpy().tolist()
    assert got[0] == 0 and got[1] > 0 and got[2] == rows[0] > 0


def test_the_map_is_checkpointed_and_restores_exactly(tmp_path):
    m = DynamicIds(rows=16, base=3, admit=2)
    for step, batch in enumerate([[1, 2, 3, 1], [2, 4, 5, 5], [6, 1, 4]], start=1):
        rows_of(m, batch, step)
    path = tf.train.Checkpoint(ids=m).save(str(tmp_path / "ckpt"))
    copy = DynamicIds(rows=16, base=3, admit=2)
    tf.train.Checkpoint(ids=copy).restore(path).assert_existing_objects_matched()
    probe = tf.constant([1, 2, 3, 4, 5, 6, 99], tf.int64)
    assert copy.lookup(probe).numpy().tolist() == m.lookup(probe).numpy().tolist()
    for name in ("key", "count", "seen"):
        np.testing.assert_array_equal(getattr(copy, name).numpy(), getattr(m, name).numpy())
    # ... and goes on as the original does: the pending count of 3 (seen once) included.
    assert rows_of(copy, [3, 7], 4) == rows_of(m, [3, 7], 4)


def test_two_maps_fed_the_same_batches_agree_inside_a_function():
    """What processes of a synchronous job rely on: the same batches, the same rows."""
    a, b = DynamicIds(rows=32), DynamicIds(rows=32)
    step_a, step_b = tf.function(a.assign), tf.function(b.assign)
    rng = np.random.default_rng(0)
    for step in range(1, 30):
        keys = tf.constant(rng.integers(-(2 ** 40), 2 ** 40, 20) // 1000 * 1000, tf.int64)
        at = tf.constant(step, tf.int64)     # a tensor: one trace for every step
        ra, ca = step_a(keys, at)
        rb, cb = step_b(keys, at)
        np.testing.assert_array_equal(ra.numpy(), rb.numpy())
        np.testing.assert_array_equal(ca.numpy(), cb.numpy())
    # A sweep gives back an eighth of the pool at once (4 rows here), some of them queued
    # free until new keys claim them: never more than the pool, never far below it.
    assert 31 - 4 <= int(a.live()) <= 31


def test_pools_side_by_side_each_within_its_own_rows():
    """One map for several fields (a pool each, keys already distinct across fields: the
    pipeline salts them): a pool that runs short gives back its own rows only."""
    m = DynamicIds(pools=[(10, 4), (100, 8)])
    steady = [1001, 1002, 1003, 1004, 1005]          # the second field's: 5 of its 7 rows
    first = None
    for step in range(1, 30):
        churn = [step * 10 + j for j in range(5)]     # the first field's: 5 new keys a step
        keys = tf.constant(list(zip(churn, steady)), tf.int64)
        rows, claimed = m.assign(keys, step)
        rows = rows.numpy()
        assert set(rows[:, 0]) <= set(range(10, 14)) and set(rows[:, 1]) <= set(range(101, 108))
        # The first pool has 3 rows to give a step's 5 new keys: 2 read its shared row 10.
        assert sorted(rows[:, 0]).count(10) == 2 and len(set(rows[:, 0]) - {10}) == 3
        if first is None:
            first = rows[:, 1]
        np.testing.assert_array_equal(rows[:, 1], first)     # never given back
        assert set(claimed.numpy()) <= set(range(11, 14)) | set(first)
    np.testing.assert_array_equal(m.lookup(keys).numpy(), rows)
    assert int(m.live()) == 3 + 5


def test_pending_counts_stay_within_the_pools_rows():
    """admit 2 under a stream of keys each seen once: the pending counts never hold more
    keys than the pool has rows; a key seen twice within that window is admitted."""
    m = DynamicIds(rows=8, admit=2)
    for step in range(1, 40):
        rows_of(m, [step * 100 + j for j in range(3)], step)
        assert int(m.pending.size()) <= 8
    rows_of(m, [7, 7], 40)                   # twice in one batch: admitted at once
    rows_of(m, [9], 41)
    rows, claimed = rows_of(m, [9], 42)      # twice within the window: admitted
    assert rows[0] > 0 and claimed == rows
    assert int(m.lookup(tf.constant([7], tf.int64))[0]) > 0
