"""The fused kernels (kernels) against TensorFlow's ops, the reference path: the
block of a batch and its gradient, Adam's catch-up read and update, a whole training run, and
the fallback where the library is not built. Run on TF 2.21 and on 2.15 (marked tf215)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from ctrtrain.models.base import ModelConfig
from ctrtrain import kernels
from ctrtrain.kernels.build import build
from ctrtrain.train.step import build_training

pytestmark = pytest.mark.tf215


@pytest.fixture(scope="module", autouse=True)
def library():
    build()     # the install scripts built it; a no-op then
    assert kernels.available()
    yield
    kernels.set_enabled(True)


@pytest.mark.parametrize("ids", [
    np.minimum(np.random.default_rng(0).zipf(1.1, 39 * 1024), 10**7),   # a batch: long tail
    np.array([5, -3, 2**62, 5, 0, -3, 0], np.int64),    # negative and huge ids hash too
    np.array([], np.int64)])
def test_the_distinct_ids_are_tf_uniques(ids):
    distinct, where = kernels.unique(tf.constant(ids, tf.int64))
    reference = tf.unique(tf.constant(ids, tf.int64))
    np.testing.assert_array_equal(distinct.numpy(), reference.y.numpy())
    np.testing.assert_array_equal(where.numpy(), reference.idx.numpy())
    assert where.dtype == tf.int32


@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
def test_the_block_and_its_gradients_are_tensorflows(index_dtype):
    rng = np.random.default_rng(0)
    params = tf.constant(rng.normal(size=(300, 17)).astype(np.float32))
    where = tf.constant(rng.zipf(1.3, 4000) % 300, index_dtype)     # repeated rows, as in a batch
    values = tf.constant(rng.random(4000).astype(np.float32))
    upstream = tf.constant(rng.normal(size=(4000, 17)).astype(np.float32))

    def block_and_grads(fused):
        with tf.GradientTape() as tape:
            tape.watch([params, values])
            if fused:
                block = kernels.scaled_gather(params, where, values)
            else:
                block = tf.gather(params, where) * values[:, None]
            loss = tf.reduce_sum(block * upstream)
        d_params, d_values = tape.gradient(loss, [params, values])
        return block.numpy(), tf.convert_to_tensor(d_params).numpy(), d_values.numpy()

    fused, reference = block_and_grads(True), block_and_grads(False)
    np.testing.assert_array_equal(fused[0], reference[0])
    np.testing.assert_allclose(fused[1], reference[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fused[2], reference[2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("first_order", [True, False])
def test_the_fm_terms_and_their_gradient_are_tensorflows(first_order):
    from ctrtrain.models import blocks
    rng = np.random.default_rng(1)
    block = tf.constant(rng.normal(0, 0.1, size=(64, 39, 17)).astype(np.float32))
    up_first, up_fm = (tf.constant(rng.normal(size=64).astype(np.float32)) for _ in range(2))

    def terms_and_grad(fused):
        kernels.set_enabled(fused)
        with tf.GradientTape() as tape:
            tape.watch(block)
            first, fm = blocks.first_and_fm(block, first_order)
            loss = tf.reduce_sum(fm * up_fm)
            if first_order:
                loss += tf.reduce_sum(first * up_first)
        kernels.set_enabled(True)
        return [x.numpy() for x in (first, fm) if x is not None] + [
            tape.gradient(loss, block).numpy()]

    fused, reference = terms_and_grad(True), terms_and_grad(False)
    assert len(fused) == len(reference) == (3 if first_order else 2)
    for f, r in zip(fused, reference):
        np.testing.assert_allclose(f, r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.7])
def test_dropout_in_one_pass_drops_and_scales_as_tensorflows(rate):
    """The fused dropout against tf.nn.dropout on the same input: the share dropped and the
    scale of what is kept, no pattern between neighbours (4 elements share a 64-bit draw);
    the same seed the same mask, another seed another; its gradient the same mask."""
    from ctrtrain.models import blocks
    x = tf.constant(np.random.default_rng(2).uniform(1, 2, (1000, 997)).astype(np.float32))
    seed = tf.constant([3, 4], tf.int64)
    fused = kernels.dropout(x, rate, seed).numpy()
    ours, theirs = fused == 0, tf.nn.dropout(x, rate=rate).numpy() == 0
    n = x.shape[0] * x.shape[1]
    five_sigma = 5 * np.sqrt(rate * (1 - rate) / n)
    assert abs(ours.mean() - rate) < five_sigma and abs(theirs.mean() - rate) < five_sigma
    np.testing.assert_allclose(fused[~ours], x.numpy()[~ours] / (1 - rate), rtol=1e-6)
    for a, b in ((ours[:, :-1], ours[:, 1:]), (ours[:, :-4], ours[:, 4:])):
        assert abs((a & b).mean() - rate**2) < 5 * np.sqrt(rate**2 * (1 - rate**2) / a.size)
    np.testing.assert_array_equal(kernels.dropout(x, rate, seed).numpy(), fused)
    other = kernels.dropout(x, rate, tf.constant([3, 5], tf.int64)).numpy() == 0
    assert abs((ours & other).mean() - rate**2) < five_sigma
    up = tf.constant(np.random.default_rng(3).normal(size=x.shape).astype(np.float32))
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(kernels.dropout(x, rate, seed) * up)
    np.testing.assert_allclose(tape.gradient(loss, x).numpy(),
                               np.where(ours, 0, up.numpy() / (1 - rate)), rtol=1e-6)
    # The MLP's dropout: the kernel where it runs, TensorFlow's op elsewhere.
    for on, op in ((True, "CtrDropout"), (False, "RandomUniform")):
        kernels.set_enabled(on)
        graph = tf.function(lambda h: blocks.dropout(h, rate)).get_concrete_function(x).graph
        kernels.set_enabled(True)
        assert op in {o.type for o in graph.get_operations()}



@pytest.mark.parametrize("rate,width", [(0.0, 400), (0.5, 400), (0.3, 70)])
def test_an_mlp_layers_gradient_in_one_pass_is_tensorflows(rate, width):
    """dropout(relu(z + b)) back to z and b: the one-pass gradient against TensorFlow's
    gradients of the same layer (the same dropout mask: the same seed), with zeros in z + b,
    a width that is not a whole number of column blocks (70) and no dropout (rate 0). And the
    MLP takes it where the kernels run: the same output and gradients as TensorFlow's ops."""
    from ctrtrain.models import blocks
    rng = np.random.default_rng(4)
    z = rng.normal(size=(300, width)).astype(np.float32)
    z[:, :5] = 0.0      # relu(z + b) at its kink: b is 0 there
    b = rng.normal(size=width).astype(np.float32)
    b[:5] = 0.0
    z, b = tf.constant(z), tf.constant(b)
    up = tf.constant(rng.normal(size=(300, width)).astype(np.float32))
    seed = tf.constant([7, 9], tf.int64)
    with tf.GradientTape() as tape:
        tape.watch([z, b])
        h = tf.nn.relu(z + b)
        y = kernels.dropout(h, rate, seed) if rate else h
        loss = tf.reduce_sum(y * up)
    dz, db = kernels.relu_dropout_grad(up, y, rate)
    want_dz, want_db = tape.gradient(loss, [z, b])
    np.testing.assert_allclose(dz.numpy(), want_dz.numpy(), rtol=1e-6)
    np.testing.assert_allclose(db.numpy(), want_db.numpy(), rtol=1e-5, atol=1e-5)

    mlp = blocks.MLP(width, [64, 32, 1], rates=(0.0, 0.0), seed=3)
    x = tf.constant(rng.normal(size=(300, width)).astype(np.float32))

    def output_and_grads(fused):
        kernels.set_enabled(fused)
        with tf.GradientTape() as tape:
            out = mlp(x, training=True)
            loss = tf.reduce_sum(out * up[:, :1])
        grads = tape.gradient(loss, mlp.kernels + mlp.biases)
        kernels.set_enabled(True)
        return [out.numpy()] + [g.numpy() for g in grads]

    for f, r in zip(output_and_grads(True), output_and_grads(False)):
        np.testing.assert_allclose(f, r, rtol=1e-5, atol=1e-6)

    def gradient_ops(fused):
        def grads(v):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(mlp(v, training=True))
            return tape.gradient(loss, mlp.kernels + mlp.biases)
        kernels.set_enabled(fused)
        graph = tf.function(grads).get_concrete_function(x).graph
        kernels.set_enabled(True)
        return {o.type for o in graph.get_operations()}

    assert "CtrReluDropoutGrad" in gradient_ops(True) and "ReluGrad" not in gradient_ops(True)
    assert "CtrReluDropoutGrad" not in gradient_ops(False) and "ReluGrad" in gradient_ops(False)


def _bag_features(rng, batch=300):
    """Two single fields and three bags (5 columns mean, 3 sum, 4 sqrtn) as the data holds
    them: ids left-aligned, -1 padding, some bags empty, one example's mean bag weighted 0."""
    ids = rng.zipf(1.3, (batch, 2)) % 400
    bag_ids = np.where(rng.random((batch, 12)) < 0.6, rng.zipf(1.2, (batch, 12)) % 400, -1)
    bag_ids = np.array([sorted(r, key=lambda i: i < 0) for r in bag_ids])   # padding last
    bag_ids[0, :5] = -1                                                       # an empty bag
    weights = np.where(bag_ids >= 0, rng.uniform(0.1, 2.0, bag_ids.shape), 0.0)
    weights[1, :5] = 0.0                                                      # weights sum to 0
    return {"ids": tf.constant(ids, tf.int64), "values": tf.ones([batch, 2]),
            "bag_ids": tf.constant(bag_ids, tf.int64),
            "bag_weights": tf.constant(weights, tf.float32)}


@pytest.mark.parametrize("bag_ids", [
    _bag_features(np.random.default_rng(8))["bag_ids"].numpy(),
    np.full((3, 4), -1, np.int64),                  # nothing held
    np.zeros((0, 5), np.int64)])                    # no rows
def test_the_held_bag_ids_are_tf_wheres(bag_ids):
    held, ids = kernels.held(tf.constant(bag_ids, tf.int64))
    where = tf.where(bag_ids >= 0)
    np.testing.assert_array_equal(held.numpy().reshape(-1, 2), where.numpy())
    np.testing.assert_array_equal(ids.numpy(), tf.gather_nd(bag_ids, where).numpy())


def test_the_bags_pooled_and_their_gradient_are_tensorflows():
    """The pooled bags (sum, mean, sqrtn in one batch; empty bags and a zero divisor) and the
    table's gradient through them, with the kernels and with TensorFlow's ops; the unpooled
    rows DIN reads are the same either way."""
    from ctrtrain.models.engine.tables import EmbeddingTable
    cfg = ModelConfig(feature_size=400, field_size=5, embedding_size=8,
                      bags=((5, "mean"), (3, "sum"), (4, "sqrtn")))
    table = EmbeddingTable(cfg, first_order=True)
    features = _bag_features(np.random.default_rng(4))
    up = tf.constant(np.random.default_rng(5).normal(size=(300, 5, 9)).astype(np.float32))

    def pooled_and_grad(fused):
        kernels.set_enabled(fused)
        with tf.GradientTape() as tape:
            embedded = table(features)
            loss = tf.reduce_sum(embedded.block * up)
        kernels.set_enabled(True)
        rows, held = embedded.bag_rows(2)
        grad = tf.convert_to_tensor(tape.gradient(loss, table.table))
        return embedded.block.numpy(), grad.numpy(), rows.numpy(), held.numpy()

    fused, reference = pooled_and_grad(True), pooled_and_grad(False)
    assert np.abs(reference[0][:, 2:]).sum(-1).min() == 0            # the zero bags are there
    np.testing.assert_allclose(fused[0], reference[0], rtol=1e-5, atol=1e-7)
    # Rows summed from many terms: float32 precision relative to the largest of them.
    np.testing.assert_allclose(fused[1], reference[1], rtol=1e-5,
                               atol=1e-6 * np.abs(reference[1]).max())
    np.testing.assert_array_equal(fused[2], reference[2])
    np.testing.assert_array_equal(fused[3], reference[3])
    ids = features["bag_ids"].numpy()[:, 8:]                   # the third bag's columns
    expected = np.where((ids >= 0)[..., None], table.table.numpy()[np.maximum(ids, 0)], 0)
    np.testing.assert_array_equal(fused[2], expected)
    np.testing.assert_array_equal(fused[3], ids >= 0)
    graph = tf.function(lambda f: table(f).block).get_concrete_function(features).graph
    assert "CtrBagPool" in {o.type for o in graph.get_operations()}
    # The reads past the block (DIN's): a single field's rows, the block with a bag replaced.
    embedded, x = table(features), tf.ones([300, 9])
    block = embedded.block.numpy()
    np.testing.assert_array_equal(embedded.field_row(1).numpy(), block[:, 1])
    replaced = embedded.with_bag(1, x).numpy()
    np.testing.assert_array_equal(replaced[:, 3], x.numpy())
    np.testing.assert_array_equal(np.delete(replaced, 3, 1), np.delete(block, 3, 1))


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("held_share", [0.6, 0.0])
def test_dice_and_its_gradient_are_tensorflows(training, held_share):
    """DIN's Dice in one op each way against its TensorFlow ops: the output, the moving
    averages it moves, and the gradient of s (through the batch's mean and var in training)
    and of alpha; a batch with no held item (every statistic 0) too."""
    from ctrtrain.models.blocks import Dice
    rng = np.random.default_rng(6)
    s = tf.constant(rng.normal(0.3, 2.0, (3000, 40)).astype(np.float32))
    mask = tf.constant((rng.random(3000) < held_share).astype(np.float32))
    up = tf.constant(rng.normal(size=(3000, 40)).astype(np.float32))

    def run(fused):
        dice = Dice(40)
        dice.alpha.assign(rng.uniform(-0.5, 0.5, 40).astype(np.float32))
        dice.mean.assign(np.linspace(-1, 1, 40).astype(np.float32))
        dice.var.assign(np.linspace(0.5, 3, 40).astype(np.float32))
        kernels.set_enabled(fused)
        with tf.GradientTape() as tape:
            tape.watch(s)
            loss = tf.reduce_sum(dice(s, mask, training) * up)
        kernels.set_enabled(True)
        d_s, d_alpha = tape.gradient(loss, [s, dice.alpha])
        return [x.numpy() for x in (loss, d_s, d_alpha, dice.mean, dice.var)]

    rng_state = rng.bit_generator.state
    fused = run(True)
    rng.bit_generator.state = rng_state     # the same alpha for both
    reference = run(False)
    for f, r in zip(fused, reference):
        np.testing.assert_allclose(f, r, rtol=2e-5, atol=1e-5 * max(1.0, np.abs(r).max()))
    assert np.abs(fused[1]).max() > 0
    dice = Dice(40)
    graph = tf.function(lambda x: dice(x, mask, training)).get_concrete_function(s).graph
    assert "CtrDice" in {o.type for o in graph.get_operations()}


@pytest.mark.parametrize("heads,size", [(2, 8), (3, 5)])
def test_autoints_attention_and_its_gradient_are_tensorflows(heads, size):
    """AutoInt's attention over 39 fields in one op each way against its TensorFlow ops
    (transposes, batched matmuls, softmax): the layer's output and the gradients of its input
    and of every projection."""
    from ctrtrain.models.blocks import SelfAttention
    rng = np.random.default_rng(7)
    e = tf.constant(rng.normal(0, 0.5, (64, 39, 16)).astype(np.float32))
    up = tf.constant(rng.normal(size=(64, 39, heads * size)).astype(np.float32))
    layer = SelfAttention(16, heads, size, seed=3)

    def run(fused):
        kernels.set_enabled(fused)
        with tf.GradientTape() as tape:
            tape.watch(e)
            loss = tf.reduce_sum(layer(e) * up)
        kernels.set_enabled(True)
        grads = tape.gradient(loss, [e] + layer.variables_to_update())
        return [loss.numpy()] + [g.numpy() for g in grads]

    fused, reference = run(True), run(False)
    for f, r in zip(fused, reference):
        np.testing.assert_allclose(f, r, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(r).max()))
    graph = tf.function(layer).get_concrete_function(e).graph
    assert "CtrFieldAttention" in {o.type for o in graph.get_operations()}


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_the_cins_outer_products_and_their_gradient_are_exact(dtype):
    """xDeepFM's row-wise outer products and their gradient to both factors, against float64
    of the same inputs, with widths that fill no vector (11 x 7) and a whole one (16);
    bfloat16 inputs give products and sums rounded once from float32's."""
    rng = np.random.default_rng(5)
    tol = 1e-6 if dtype == tf.float32 else 2 ** -8     # bfloat16: 8 significant bits
    for rows, na, nb in ((300, 11, 7), (50, 3, 16)):
        a, b, g = (tf.constant(rng.normal(size=s).astype(np.float32), dtype)
                   for s in ((rows, na), (rows, nb), (rows, na * nb)))
        with tf.GradientTape() as tape:
            tape.watch([a, b])
            z = kernels.outer_product(a, b)
        da, db = tape.gradient(z, [a, b], output_gradients=g)
        assert z.dtype == da.dtype == dtype and da.shape == a.shape and db.shape == b.shape
        a, b, g = (t.numpy().astype(np.float64) for t in (a, b, g))
        g = g.reshape(rows, na, nb)
        np.testing.assert_allclose(z.numpy().astype(np.float64).reshape(rows, na, nb),
                                   a[:, :, None] * b[:, None, :], rtol=tol, atol=1e-30)
        scale = np.abs(g).sum((1, 2)).max() * 4
        np.testing.assert_allclose(da.numpy().astype(np.float64), np.einsum("rij,rj->ri", g, b),
                                   rtol=tol, atol=tol * scale)
        np.testing.assert_allclose(db.numpy().astype(np.float64), np.einsum("rij,ri->rj", g, a),
                                   rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_the_pair_products_and_their_gradient_are_exact(dtype):
    """The CIN's first layer's products of the fields with themselves, each pair i <= j once,
    row-major, and their gradient (the diagonal's x_i^2 counted twice), against float64."""
    rng = np.random.default_rng(8)
    rows, m = 200, 11
    x = tf.constant(rng.normal(size=(rows, m)).astype(np.float32), dtype)
    g = tf.constant(rng.normal(size=(rows, m * (m + 1) // 2)).astype(np.float32), dtype)
    z, dx = kernels.pair_product(x), _pair_grad(g, x)
    xs, gs = x.numpy().astype(np.float64), g.numpy().astype(np.float64)
    pairs = [(i, j) for i in range(m) for j in range(i, m)]
    want_z = np.stack([xs[:, i] * xs[:, j] for i, j in pairs], 1)
    want_dx = np.zeros_like(xs)
    for p, (i, j) in enumerate(pairs):
        want_dx[:, i] += gs[:, p] * xs[:, j]
        want_dx[:, j] += gs[:, p] * xs[:, i]
    tol = 1e-6 if dtype == tf.float32 else 2 ** -8
    np.testing.assert_allclose(z.numpy().astype(np.float64), want_z, rtol=tol, atol=1e-30)
    np.testing.assert_allclose(dx.numpy().astype(np.float64), want_dx, rtol=tol,
                               atol=tol * np.abs(gs).sum(1).max() * 4)


def _pair_grad(g, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        z = kernels.pair_product(x)
    return tape.gradient(z, x, output_gradients=g)


def test_the_cin_and_its_gradient_are_tensorflows_with_the_one_pass_gradient():
    """The CIN (maps 7, 5, 4 over 11 fields, embedding 6) with the kernels (the first layer
    over the distinct pairs, folded weights; the second's products in one pass) and with
    TensorFlow's ops (the full products): the same output and the same gradients of the
    embeddings and of every layer's weights."""
    from ctrtrain.models.blocks import CIN
    rng = np.random.default_rng(6)
    v = tf.constant(rng.normal(0, 0.5, (64, 11, 6)).astype(np.float32))
    up = tf.constant(rng.normal(size=(64, 16)).astype(np.float32))
    cin = CIN(11, [7, 5, 4], seed=2)

    def run(fused):
        kernels.set_enabled(fused)
        with tf.GradientTape() as tape:
            tape.watch(v)
            out = cin(v)
            loss = tf.reduce_sum(out * up)
        kernels.set_enabled(True)
        grads = tape.gradient(loss, [v] + cin.variables_to_update())
        return [out.numpy()] + [g.numpy() for g in grads]

    for f, r in zip(run(True), run(False)):
        np.testing.assert_allclose(f, r, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(r).max()))

    def gradient_ops(fused):
        def grads(v):
            with tf.GradientTape() as tape:
                tape.watch(v)
                loss = tf.reduce_sum(cin(v))
            return tape.gradient(loss, [v] + cin.kernels)
        kernels.set_enabled(fused)
        graph = tf.function(grads).get_concrete_function(v).graph
        kernels.set_enabled(True)
        return {o.type for o in graph.get_operations()}

    ours = {"CtrOuterProduct", "CtrOuterProductGrad", "CtrPairProduct", "CtrPairProductGrad"}
    assert ours <= gradient_ops(True) and not ours & gradient_ops(False)


def test_an_index_outside_the_rows_is_refused_by_name():
    params = tf.zeros([5, 3])
    with pytest.raises(tf.errors.InvalidArgumentError, match="where index 7 at 2 is outside"):
        kernels.scaled_gather(params, tf.constant([0, 4, 7]), tf.ones([3]))


B, F, ROWS = 256, 10, 5000


def _batches(n, seed=0):
    """Zipf ids: rows a few batches touch and rows that skip many steps, as in CTR data."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = np.minimum(rng.zipf(1.3, (B, F)) - 1, ROWS - 1).astype(np.int64)
        out.append({"ids": tf.constant(ids),
                    "values": tf.constant(rng.random((B, F)).astype(np.float32)),
                    "label": tf.constant((rng.random(B) < 0.3).astype(np.float32))})
    return out


def _training(fused, table_l2):
    kernels.set_enabled(fused)
    # Rows of 0.01 (the scale this comparison was written at): from 1e-4 some rows' gradients
    # are near Adam's epsilon, where the two float orders of the same update part by 1e-3.
    cfg = ModelConfig(feature_size=ROWS, field_size=F, embedding_size=4, deep_layers=(16, 8),
                      dropout=0.0, seed=1, embedding_init=0.01)
    model, opt, step, _ = build_training(
        cfg, "adam", 1e-2, optimizer_params={"table_updates": "catchup", "table_l2": table_l2})
    return model, opt, step


def _state(model, opt):
    t = model.embeddings.table
    return t.numpy(), opt.slot(t, "moments").numpy(), opt.slot(t, "last_step").numpy()


@pytest.mark.parametrize("table_l2", [0.0, 1e-3])
def test_catchup_adam_in_the_kernels_is_the_tensorflow_ops_update(table_l2):
    """From the same state, the fused catch-up (read, then update in place) and the TensorFlow
    ops give the same rows, moments and step counters to float32 precision: after one step,
    over 40 steps with a learning-rate decay in the middle, and through settle()."""
    batches = _batches(40)
    runs = {}
    for fused in (True, False):
        model, opt, step = _training(fused, table_l2)
        losses = [float(step(batches[0]))]
        first = _state(model, opt)
        for i, b in enumerate(batches[1:]):
            if i == 20:
                opt.lr_scale.assign(0.5)
            losses.append(float(step(b)))
        trained = _state(model, opt)
        tf.function(opt.settle)()
        runs[fused] = losses, first, trained, _state(model, opt)
    (l_f, *s_f), (l_r, *s_r) = runs[True], runs[False]
    np.testing.assert_allclose(l_f, l_r, rtol=1e-5)
    for fused, reference, tol in zip(s_f, s_r, (1e-7, 2e-5, 2e-5)):
        np.testing.assert_allclose(fused[0], reference[0], rtol=1e-5, atol=tol)   # rows
        np.testing.assert_allclose(fused[1], reference[1], rtol=1e-4, atol=tol)   # m, v
        np.testing.assert_array_equal(fused[2], reference[2])                     # last steps
    skipped = s_r[1][2]
    assert len(np.unique(skipped)) > 10, "rows skipped various numbers of steps"


@pytest.mark.parametrize("l2_dense", [0.0, 1e-2])
def test_dense_adam_folds_the_l2_and_the_held_rows_into_its_update(l2_dense):
    """The MLP kernels' Adam update with the gradient's terms folded in (kernels.adam_dense,
    and the TensorFlow ops where it does not run) is the update of the loss with the L2
    penalty added and the first kernel's first-order rows masked, as the step computed it
    before: the same variables and moments to float32 precision over 30 steps with a
    learning-rate decay, and those rows exactly zero throughout."""
    from ctrtrain.models import build_model
    from ctrtrain.models.engine.optimizers import make_optimizer
    batches = _batches(30, seed=3)
    runs = {}
    for path in ("fused", "ops", "penalized loss"):
        kernels.set_enabled(path == "fused")
        cfg = ModelConfig(feature_size=ROWS, field_size=F, embedding_size=4, deep_layers=(16, 8),
                          dropout=0.0, seed=1, embedding_init=0.01, l2_dense=l2_dense)
        params = {"table_updates": "dense"}
        if path != "penalized loss":
            model, opt, step, variables = build_training(cfg, "adam", 1e-2, optimizer_params=params)
        else:   # the step as it was: L2 differentiated with the loss, the kernel masked
            model, opt = build_model(cfg), make_optimizer("adam", 1e-2, **params)
            variables = model.embedding_tables + model.dense_variables()
            opt.build(variables, tables=model.embedding_tables)
            first = model.mlp.kernels[0]

            @tf.function(autograph=False)
            def step(batch, model=model, opt=opt, variables=variables, first=first):
                with tf.GradientTape() as tape:
                    logits, l2 = model(batch, training=True)
                    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                        labels=batch["label"], logits=logits))
                    total = loss + l2
                grads = tape.gradient(total, variables)
                grads = [g * model.mlp.input_mask if v is first else g
                         for g, v in zip(grads, variables)]
                opt.apply_gradients(zip(grads, variables))
                return loss
        held = model.mlp.input_mask.numpy()[:, 0] == 0
        assert held.sum() == F           # DeepFM's first-order column, one row a field
        for i, b in enumerate(batches):
            if i == 15:
                opt.lr_scale.assign(0.5)
            step(b)
            assert not model.mlp.kernels[0].numpy()[held].any(), (path, i)
        if path != "penalized loss":
            ops = {o.type for o in step.get_concrete_function(batches[0]).graph.get_operations()}
            assert ("CtrAdamDense" in ops) == (path == "fused"), (path, sorted(ops))
        k0 = model.mlp.kernels[0]
        runs[path] = ([v.numpy() for v in model.dense_variables()],
                      [opt.slot(k0, "m").numpy(), opt.slot(k0, "v").numpy()])
    for path in ("fused", "ops"):
        for got, want in zip(runs[path][0] + runs[path][1],
                             runs["penalized loss"][0] + runs["penalized loss"][1]):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=path)
        assert not runs[path][1][0][held].any() and not runs[path][1][1][held].any()


def _caught_up_float64(opt, stored, moments, last, iterations):
    """Adam's catch-up (optimizers.py Adam._decayed_math, _AdamDrift, Adam._idle_l2) in
    float64: (offset, m, v, current or None), the yardstick of both float32 paths."""
    w = stored.shape[1]
    m, v = moments[:, :w].astype(np.float64), moments[:, w:].astype(np.float64)
    b1, b2, eps, l2, lr0 = opt.beta1, opt.beta2, opt.epsilon, opt.table_l2, opt.base_learning_rate
    k = np.maximum(iterations - last, 0)
    d = opt._drift
    sums = [g[np.minimum(last, d.T)] - c ** k * g[np.minimum(last + k, d.T)]
            for c, g in zip(d.ratios, d.tables)]
    d_r, d_b1 = (x[:, None] for x in sums)
    root_v = np.sqrt(v)
    with np.errstate(divide="ignore", invalid="ignore"):    # 0/0 where a row never moved
        denom = root_v + eps * np.where(d_b1 != 0, d_r / d_b1, 0)
        drift = np.where(denom > 0, m * d_r / denom, 0)
    kf = k[:, None].astype(np.float64)
    b1k, b2k = b1 ** kf, b2 ** kf
    if not l2:
        return drift, b1k * m, b2k * v, None
    t = max(iterations, 1)
    lr = lr0 * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
    q = b2 ** -0.5
    kq = np.minimum(kf, 80 / np.log(q))
    w1 = q * (q ** kq - 1) / (q - 1) - b1 * q * (1 - (b1 * q) ** kq) / (1 - b1 * q)
    w0 = kf - b1 * (1 - b1 ** kf) / (1 - b1)
    e = lr * l2 * w1 / (root_v + eps * np.divide(w1, w0, out=np.zeros_like(w1), where=w0 != 0))
    moved = np.where((last == 0)[:, None], lr0 * kf, lr * d.H[np.minimum(k, d.T)][:, None])
    theta = stored - drift
    size = np.maximum(np.maximum(np.abs(theta) * np.exp(-e), np.abs(theta) - moved), 0)
    shrunk = np.sign(theta) * size
    grad = l2 * shrunk
    return (stored - shrunk, b1k * m + (1 - b1k) * grad, b2k * v + (1 - b2k) * grad ** 2,
            shrunk)


@pytest.mark.parametrize("table_l2", [0.0, 1e-3])
def test_the_catchup_read_is_as_exact_as_the_tensorflow_ops(table_l2):
    """The forward pass's read of rows that skipped 0 to 30 steps: the kernel's offset,
    moments and caught-up rows and the TensorFlow ops', each against the same formulas in
    float64. The kernel is at least as close as the ops are (whose float32 sums in
    Adam._idle_l2, q^k - 1 with q - 1 = 5e-4, lose up to 1e-4 of the shrinkage; the kernel
    sums them in float64)."""
    model, opt, step = _training(True, table_l2)
    for b in _batches(30, seed=1):
        step(b)
    t = model.embeddings.table
    rows = tf.range(0, ROWS, 7, dtype=tf.int64)
    stored = tf.gather(t, rows)
    moments = tf.gather(opt.slot(t, "moments"), rows).numpy()
    last = tf.gather(opt.slot(t, "last_step"), rows).numpy()
    exact = _caught_up_float64(opt, stored.numpy().astype(np.float64), moments, last,
                               int(opt.iterations.numpy()))
    errors = {}
    for fused in (True, False):
        kernels.set_enabled(fused)
        offset = opt.row_correction(t, rows, stored)
        m, v, _, current = opt._pending.pop(id(t))
        got = (offset, m, v, current)
        errors[fused] = [np.max(np.abs(g.numpy() - x)) for g, x in zip(got, exact)
                         if x is not None]
    assert len(np.unique(last)) > 10, "rows skipped various numbers of steps"
    # Rows are ~0.1: the kernel within a few float32 roundings of them (measured: 1.4e-7 with
    # L2, where the ops are 6.5e-6 off).
    for name, f, r in zip(("offset", "m", "v", "current"), errors[True], errors[False]):
        assert f <= 3e-7 and f <= max(1.01 * r, 1e-8), (name, f, r)


@pytest.mark.parametrize("table_l2", [0.0, 1e-3])
def test_the_catchup_lookup_reads_the_rows_the_read_gives_with_a_lookups_gradient(table_l2):
    """Adam.read_rows's one kernel (the table's rows read and caught up) against a gather of
    the stored rows and the catch-up read: the same rows now, moments and offset; its
    gradient is the table's IndexedSlices at the rows, as a lookup's."""
    model, opt, step = _training(True, table_l2)
    for b in _batches(30, seed=2):
        step(b)
    t = model.embeddings.table
    rows = tf.constant(np.random.default_rng(0).permutation(ROWS)[:300], tf.int64)
    upstream = tf.constant(np.random.default_rng(1).normal(size=(300, t.shape[1])), tf.float32)
    with tf.GradientTape() as tape:
        now = opt.read_rows(t, rows)
        loss = tf.reduce_sum(now * upstream)
    grad = tape.gradient(loss, t)
    m, v, offset, current = opt._pending.pop(id(t))
    assert isinstance(grad, tf.IndexedSlices)
    np.testing.assert_array_equal(grad.indices.numpy(), rows.numpy())
    np.testing.assert_array_equal(grad.values.numpy(), upstream.numpy())

    stored = tf.gather(t, rows)
    read_offset = opt.row_correction(t, rows, stored)
    read = opt._pending.pop(id(t))
    for got, want in zip((m, v, offset), read[:3]):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    np.testing.assert_allclose(now.numpy(), (stored - read_offset).numpy(), rtol=0, atol=1e-7)
    if table_l2:
        np.testing.assert_array_equal(current.numpy(), read[3].numpy())
    assert np.abs(offset.numpy()).max() > 0, "the rows had steps to catch up"


@pytest.mark.slow
def test_training_without_the_library_says_so_and_learns_the_same(synth_data, tmp_path):
    """`ctrtrain train` where no library was built for this TensorFlow (an empty
    CTRTRAIN_KERNELS_DIR) runs the TensorFlow ops and says so; with the environment's library
    (built by the install script, `python -m ctrtrain.kernels.build`: the `library` fixture
    makes sure) the same command is silent about it and ends with the same test AUC; either
    export holds TensorFlow's own ops only."""
    root, _ = synth_data(rows=20_000, feature_size=5_000)
    results = {}
    for built in (False, True):
        env = {**os.environ, "CTRTRAIN_KERNELS_DIR": str(tmp_path / "empty")}
        if built:
            del env["CTRTRAIN_KERNELS_DIR"]
        r = subprocess.run([sys.executable, "-m", "ctrtrain.cli", "train",
                            "--train", root / "tf" / "train", "--test", root / "tf" / "test",
                            "--model-dir", tmp_path / f"m{built}", "--table-updates", "catchup",
                            "--quiet"], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        said = "fused kernels not built" in r.stdout
        assert said != built, r.stdout[-2000:]
        results[built] = json.loads((tmp_path / f"m{built}" / "result.json").read_text())
        # The export serves without the library: TensorFlow's ops only.
        graph = next((tmp_path / f"m{built}" / "export").glob("*/saved_model.pb")).read_bytes()
        assert b"Ctr" not in graph
    assert abs(results[True]["test"]["auc"] - results[False]["test"]["auc"]) < 1e-4



def test_a_damaged_or_foreign_library_is_not_loaded(tmp_path):
    """F37: a library under the kernels' name that is cut short crashed the process at load
    (Bus error, exit 135) and a foreign one raised AttributeError at the first step. Either
    fails the checksum the build recorded: the process says so and runs TensorFlow's ops."""
    from ctrtrain.kernels.build import checksum_path, library_path
    real = library_path()
    damaged = tmp_path / real.name
    probe = ("from ctrtrain import kernels; import tensorflow as tf; "
             "print('available', kernels.available()); "
             "print(float(tf.reduce_sum(tf.unique(tf.constant([3, 3, 5], tf.int64)).y)))")
    foreign = next(p for p in (tf.sysconfig.get_lib() + "/libtensorflow_framework.so.2",)
                   if os.path.exists(p))
    for body in (real.read_bytes()[: real.stat().st_size // 3], open(foreign, "rb").read()):
        damaged.write_bytes(body)
        checksum_path(damaged).write_text(checksum_path(real).read_text())
        r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           env={**os.environ, "CTRTRAIN_KERNELS_DIR": str(tmp_path)}, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "is not the file the build wrote" in r.stdout and "available False" in r.stdout
        assert r.stdout.strip().endswith("8.0")


def test_a_cut_library_whose_checksum_was_recomputed_is_not_loaded(tmp_path):
    """A library cut short whose recorded checksum was then recomputed from the cut file (a
    careless copy, or on purpose) passed the checksum and crashed the process at load (Bus
    error). The file is checked to be a whole ELF library first: said, and TensorFlow's ops
    run. A cut of two thirds, and of the last byte only (the section headers), alike."""
    from ctrtrain.kernels.build import checksum_path, library_path, sha256
    real = library_path()
    cut = tmp_path / real.name
    probe = ("from ctrtrain import kernels; import tensorflow as tf; "
             "print('available', kernels.available()); "
             "print(float(tf.reduce_sum(tf.unique(tf.constant([3, 3, 5], tf.int64)).y)))")
    size = real.stat().st_size
    for keep in (size // 3, size - 1):
        cut.write_bytes(real.read_bytes()[:keep])
        checksum_path(cut).write_text(sha256(cut) + "\n")
        r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           env={**os.environ, "CTRTRAIN_KERNELS_DIR": str(tmp_path)}, timeout=120)
        assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
        assert f"{cut} is not the file the build wrote (it is cut short: the file ends at " \
               f"byte {keep:,}" in r.stdout and "available False" in r.stdout, r.stdout
        assert r.stdout.strip().endswith("8.0")
