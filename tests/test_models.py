"""The model family on one engine (models/): each model's logit is its paper's formula,
computed here from its variables; each trains, checkpoints, resumes exactly, exports and
predicts what training predicted; a setting a model does not read is refused by name."""

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import cli, ctrtrain_here, run_cli

tf = pytest.importorskip("tensorflow")

DATA = {"rows": 40_000, "feature_size": 2_000, "seed": 3}   # test_distributed.py's
# DeepFM, the default, is what test_train.py, test_distributed.py and the others train.
MODELS = ["lr", "fm", "wide_deep", "dcn_v2", "xdeepfm", "autoint", "dlrm", "din"]
# Declared fields of the formula tests' batch (features()): DIN's history is the bag.
FIELDS = (("C1", "categorical"), ("C2", "categorical"), ("I1", "numeric"),
          ("hist_C2", "sequence"))


def features(batch=4):
    """A batch of every field kind: 2 single ids with values, 1 numeric, 1 bag of up to 3."""
    rng = np.random.default_rng(0)
    return {"ids": tf.constant(rng.integers(0, 10, (batch, 2))),
            "values": tf.constant(rng.uniform(0.5, 1.5, (batch, 2)).astype(np.float32)),
            "numeric": tf.constant(rng.uniform(0, 2, (batch, 1)).astype(np.float32)),
            "bag_ids": tf.constant([[4, 7, -1], [-1, -1, -1], [1, 1, 2], [9, -1, -1]][:batch],
                                   tf.int64),
            "bag_weights": tf.constant([[0.5, 2.0, 0], [0, 0, 0], [1, 1, 1], [3, 0, 0]][:batch],
                                       tf.float32)}


@pytest.mark.tf215
def test_the_kernels_start_as_keras_glorot_uniform_would_start_them():
    """blocks.glorot_uniform draws what Keras' GlorotUniform draws with the same seed (Keras 3
    on 2.21, Keras 2 on 2.15), bit for bit, without importing Keras in ctrtrain's processes."""
    from ctrtrain.models.blocks import glorot_uniform
    for seed in (0, 1, 3 * 1024 + 5):
        for shape in ((312, 400), (4, 1), (64, 32)):
            np.testing.assert_array_equal(glorot_uniform(seed)(shape).numpy(),
                                          tf.initializers.GlorotUniform(seed=seed)(shape).numpy())


def slots(table, f):
    """[B, 4, width]: each field's row times its value (the bag summed), from the table."""
    ids, values = f["ids"].numpy(), f["values"].numpy()
    out = []
    for b in range(ids.shape[0]):
        bag = sum((table[i] * w for i, w in zip(f["bag_ids"].numpy()[b], f["bag_weights"].numpy()[b])
                   if i >= 0), np.zeros(table.shape[1], np.float32))
        out.append([table[ids[b, 0]] * values[b, 0], table[ids[b, 1]] * values[b, 1],
                    table[10] * f["numeric"].numpy()[b, 0], bag])
    return np.array(out)


def np_mlp(mlp, h, mask=None):
    """The MLP block's output computed from its variables: ReLU after each hidden layer."""
    for i, (k, b) in enumerate(zip(mlp.kernels, mlp.biases)):
        k = k.numpy() * (mask if i == 0 and mask is not None else 1)
        h = h @ k + b.numpy()
        if i < mlp.hidden:
            h = np.maximum(h, 0)
    return h


def np_cross(cross, x0):
    """DCN-v2's x_{l+1} = x0 * (W_l x_l + b_l) + x_l, from the block's variables."""
    x = x0
    for i, b in enumerate(cross.biases):
        w = cross.v[i].numpy() @ cross.u[i].numpy().T if cross.rank else cross.w[i].numpy()
        x = x0 * (x @ w + b.numpy()) + x
    return x


def np_cin(cin, e):
    """X^k_{h,d} = sum_{i,j} W^k_{h,i,j} X^{k-1}_{i,d} X^0_{j,d}, each map summed over d."""
    x, pooled, m = e, [], e.shape[1]                           # [B, maps, D]
    x0 = x
    for w, b in zip(cin.kernels, cin.biases):
        w = w.numpy().reshape(x.shape[1], m, -1)               # [i, j, h]
        x = np.einsum("bid,bjd,ijh->bhd", x, x0, w) + b.numpy()[None, :, None]
        pooled.append(x.sum(2))
    return np.concatenate(pooled, 1)


def np_attention(layer, e):
    """Each head: softmax over the fields of <W_Q e_m, W_K e_k>, times W_V e_k; heads
    concatenated, plus W_res e_m, ReLU."""
    s, out = layer.size, []
    for h in range(layer.heads):
        q, k, v = (e @ w.numpy()[:, h * s:(h + 1) * s] for w in (layer.query, layer.key, layer.value))
        scores = q @ k.transpose(0, 2, 1)
        a = np.exp(scores - scores.max(-1, keepdims=True))
        out.append((a / a.sum(-1, keepdims=True)) @ v)
    return np.maximum(np.concatenate(out, -1) + e @ layer.residual.numpy(), 0)


def np_dice(dice, s, mean=None, var=None):
    """p(s) s + (1 - p(s)) alpha s, p = sigmoid of s standardized (by the moving statistics
    unless others are given)."""
    mean = dice.mean.numpy() if mean is None else mean
    var = dice.var.numpy() if var is None else var
    p = 1 / (1 + np.exp(-(s - mean) / np.sqrt(var + 1e-8)))
    return p * s + (1 - p) * dice.alpha.numpy() * s


def np_din_block(m, s, f):
    """DIN's MLP input: the slots, the history's replaced by sum_j a(e_j, q) e_j over its held
    items (a: the activation unit's MLP over [e_j, q, e_j - q, e_j q], Dice, linear out)."""
    ids = f["bag_ids"].numpy()
    held = ids >= 0
    rows = np.where(held[..., None], m.table.numpy()[np.maximum(ids, 0)], 0.0)   # [B, L, k]
    q = np.broadcast_to(s[:, 1][:, None], rows.shape)                  # C2 (hist_C2's target)
    h = np.concatenate([rows, q, rows - q, rows * q], -1)
    att = m.attention
    for i, (k, b) in enumerate(zip(att.kernels, att.biases)):
        h = h @ k.numpy() + b.numpy()
        if i < len(att.dice):
            h = np_dice(att.dice[i], h)
    out = s.copy()
    out[:, 3] = ((h[..., 0] * held)[..., None] * rows).sum(1)
    return out


def hold_rows(m):
    """Zero the kernel rows the model holds at zero (gradient_terms' masks: the MLP's rows
    facing the first-order column), as training keeps them: values assigned at random are
    not weights the model can have."""
    for var, mask, _ in m.gradient_terms():
        if mask is not None:
            var.assign(var * mask)


@pytest.mark.parametrize("name,options", [
    ("lr", {}), ("fm", {}), ("deepfm", {}), ("wide_deep", {}),
    ("dcn_v2", {}), ("dcn_v2", {"dcn_linear": False}),
    ("dcn_v2", {"cross_structure": "stacked", "cross_rank": 2}),
    ("xdeepfm", {"cin_layers": (3, 2)}), ("autoint", {"attention_layers": 2}),
    ("dlrm", {"bottom_layers": (6,)}), ("din", {"din_attention_units": (5, 2)})])
def test_each_model_computes_its_papers_logit(name, options):
    from ctrtrain.models import build_model
    from ctrtrain.models.base import ModelConfig
    m = build_model(ModelConfig(feature_size=10, field_size=4, embedding_size=3, numeric_fields=1,
                                deep_layers=(5, 4), bags=((3, "sum"),), initial_bias=0.25,
                                fields=FIELDS, model=name, seed=1, options=options))
    m.table.assign(tf.random.normal(m.table.shape, seed=2))
    for v in m.dense_variables()[1:]:     # biases too: none may hide behind a zero
        v.assign(tf.random.normal(v.shape, stddev=0.3, seed=3))
    hold_rows(m)
    for d in getattr(getattr(m, "attention", None), "dice", []):   # DIN's moving statistics
        d.mean.assign(tf.random.normal(d.mean.shape, stddev=0.3, seed=4))
        d.var.assign(tf.random.uniform(d.var.shape, 0.5, 2.0, seed=5))
    f = features()
    logits, l2 = m(f)
    s = slots(m.table.numpy(), f)
    width = m.table.shape[1]
    flat = s.reshape(len(s), -1)
    first = s[:, :, 0].sum(1)
    e = s[:, :, 1:]
    fm = 0.5 * ((e.sum(1) ** 2) - (e ** 2).sum(1)).sum(1)
    no_first = np.tile([0.0] + [1.0] * 3, 4)[:, None]   # the MLP never reads w
    if name == "lr":
        assert width == 1 and m.dense_variables() == [m.bias]
        want = first
    elif name == "fm":
        assert m.dense_variables() == [m.bias]
        want = first + fm
    elif name == "deepfm":
        want = first + fm + np_mlp(m.mlp, flat, no_first)[:, 0]
    elif name == "wide_deep":
        want = first + np_mlp(m.mlp, flat, no_first)[:, 0]
    elif name == "xdeepfm":
        want = first + np_mlp(m.cin_out, np_cin(m.cin, e))[:, 0] + np_mlp(m.mlp, flat, no_first)[:, 0]
    elif name == "autoint":                              # no first order
        x = s
        for layer in m.layers:
            x = np_attention(layer, x)
        assert width == 3 and len(m.layers) == 2 and x.shape == (4, 4, 16)
        want = np_mlp(m.out, x.reshape(len(x), -1))[:, 0]
    elif name == "dlrm":     # bottom MLP over the numeric value; dots of every two vectors
        z = np_mlp(m.bottom, f["numeric"].numpy())
        assert width == 3 and z.shape == (4, 3)
        v = np.concatenate([z[:, None], s[:, [0, 1, 3]]], 1)             # numeric slot left out
        dots = [np.einsum("bd,bd->b", v[:, i], v[:, j]) for i in range(4) for j in range(i + 1, 4)]
        want = np_mlp(m.top, np.concatenate([z, np.stack(dots, 1)], 1))[:, 0]
    elif name == "din":      # the bag (hist_C2), unpooled, weighed against C2's embedding
        assert width == 3 and m.dense_variables()[1:] == m.attention.variables_to_update() + \
            m.mlp.variables_to_update()
        want = np_mlp(m.mlp, np_din_block(m, s, f).reshape(len(s), -1))[:, 0]
    else:                    # dcn_v2: the linear term (DeepCTR's) unless dcn_linear false
        linear = options.get("dcn_linear", True)
        assert width == 3 + linear
        x0 = (e if linear else s).reshape(len(s), -1)  # the cross network never reads w
        if options.get("cross_structure") == "stacked":
            assert m.cross.rank == 2
            want = np_mlp(m.mlp, np_cross(m.cross, x0))[:, 0]
        else:
            assert len(m.cross.biases) == 3
            deep = np_mlp(m.mlp, flat, no_first) if linear else np_mlp(m.mlp, flat)
            want = np_mlp(m.out, np.concatenate([np_cross(m.cross, x0), deep], 1))[:, 0]
        want = want + first if linear else want
    np.testing.assert_allclose(logits.numpy(), 0.25 + want, rtol=1e-4, atol=1e-5)
    assert l2 == 0.0


@pytest.mark.parametrize("numeric_input", ["value", "both"])
@pytest.mark.parametrize("name,options", [
    ("deepfm", {}), ("wide_deep", {}), ("dcn_v2", {}), ("dcn_v2", {"dcn_linear": False}),
    ("xdeepfm", {"cin_layers": (3, 2)}), ("autoint", {"attention_layers": 2}),
    ("din", {"din_attention_units": (5, 2)})])
def test_numeric_values_enter_each_deep_model_as_deepctrs_densefeat(name, options, numeric_input):
    """numeric_input value: the numeric field has no row and no slot; its value follows the
    embeddings in the MLP's input (DCN-v2: in x0, which both the cross network and the MLP
    read; AutoInt: beside the attention's output) and meets a weight of its own in the linear
    part, never FM's, the CIN's or the attention's interactions (DeepCTR's DenseFeat).
    numeric_input both: the field keeps its row and slot (its row times its value in every
    block, its column 0 the linear weight) and its value follows the embeddings as well."""
    from ctrtrain.models import build_model
    from ctrtrain.models.base import ModelConfig
    both = numeric_input == "both"
    m = build_model(ModelConfig(feature_size=10, field_size=4, embedding_size=3, numeric_fields=1,
                                numeric_input=numeric_input, deep_layers=(5, 4),
                                bags=((3, "sum"),), initial_bias=0.25, fields=FIELDS, model=name,
                                seed=1, options=options))
    assert m.table.shape[0] == (11 if both else 10)   # a row for the numeric field, or none
    m.table.assign(tf.random.normal(m.table.shape, seed=2))
    for v in m.dense_variables()[1:]:
        v.assign(tf.random.normal(v.shape, stddev=0.3, seed=3))
    hold_rows(m)
    for d in getattr(getattr(m, "attention", None), "dice", []):
        d.mean.assign(tf.random.normal(d.mean.shape, stddev=0.3, seed=4))
        d.var.assign(tf.random.uniform(d.var.shape, 0.5, 2.0, seed=5))
    f = features()
    x = f["numeric"].numpy()
    table = m.table.numpy()
    padded = table if both else np.concatenate([table, np.zeros((1, table.shape[1]), np.float32)])
    four = slots(padded, f)                       # without a row, the numeric slot all zeros
    kept = [0, 1, 2, 3] if both else [0, 1, 3]    # C1, C2, (I1,) the bag
    s = four[:, kept]
    fo = table.shape[1] == 4
    assert (m.numeric_linear is not None) == (fo and not both)
    first = 0.0
    if fo:
        first = s[:, :, 0].sum(1) + (0 if both else (x @ m.numeric_linear.kernel.numpy())[:, 0])
    e = s[:, :, 1:] if fo else s
    deep_in = np.concatenate([s.reshape(len(s), -1), x], 1)
    no_first = np.concatenate([np.tile([0.0] + [1.0] * 3, len(kept)), [1.0]])[:, None]
    if name == "deepfm":
        fm = 0.5 * ((e.sum(1) ** 2) - (e ** 2).sum(1)).sum(1)
        want = first + fm + np_mlp(m.mlp, deep_in, no_first)[:, 0]
    elif name == "wide_deep":
        want = first + np_mlp(m.mlp, deep_in, no_first)[:, 0]
    elif name == "xdeepfm":
        want = first + np_mlp(m.cin_out, np_cin(m.cin, e))[:, 0] + \
            np_mlp(m.mlp, deep_in, no_first)[:, 0]
    elif name == "autoint":
        a = s
        for layer in m.layers:
            a = np_attention(layer, a)
        want = np_mlp(m.out, np.concatenate([a.reshape(len(a), -1), x], 1))[:, 0]
    elif name == "din":
        block = np_din_block(m, four, f)[:, kept]
        want = np_mlp(m.mlp, np.concatenate([block.reshape(len(s), -1), x], 1))[:, 0]
    else:
        x0 = np.concatenate([e.reshape(len(s), -1), x], 1)
        deep = np_mlp(m.mlp, deep_in, no_first if fo else None)
        want = first + np_mlp(m.out, np.concatenate([np_cross(m.cross, x0), deep], 1))[:, 0]
    np.testing.assert_allclose(m(f)[0].numpy(), 0.25 + want, rtol=1e-4, atol=1e-5)


def test_xdeepfm_mixed_precision_computes_the_cin_in_bfloat16():
    """--mixed-precision reaches the CIN (its matmuls are most of xDeepFM's step): the same
    logit as float32 to bfloat16's precision, and not bit-equal (so the flag is not ignored)."""
    from ctrtrain.models import build_model
    from ctrtrain.models.base import ModelConfig
    vectors = tf.constant(np.random.default_rng(2).normal(size=(64, 4, 3)), tf.float32)

    def cin(mixed):
        m = build_model(ModelConfig(feature_size=10, field_size=4, embedding_size=3,
                                    deep_layers=(5, 4), model="xdeepfm", seed=1,
                                    mixed_precision=mixed, options={"cin_layers": (6, 5)}))
        return m.cin(vectors).numpy()
    full, half = cin(False), cin(True)
    assert full.dtype == half.dtype == np.float32 and not np.array_equal(full, half)
    np.testing.assert_allclose(half, full, rtol=0.05, atol=0.02 * np.abs(full).max())


@pytest.mark.parametrize("layers", [(6,), (6, 5), (6, 5, 4)])
def test_the_cins_last_layer_pooled_first_is_the_per_dimension_form(layers):
    """The last layer summed over the dimensions before its weights (inner products, then
    W^K once per example) against the paper's order (W^K per dimension, then the sum): the
    same output and the same gradients of the embeddings and of every weight, with one
    layer (X^0 by itself), two and three; and in bfloat16 to its precision."""
    from ctrtrain.models.blocks import CIN
    rng = np.random.default_rng(4)
    v = tf.constant(rng.normal(0, 0.5, (32, 9, 5)).astype(np.float32))
    up = tf.constant(rng.normal(size=(32, sum(layers))).astype(np.float32))

    def run(cin, first):
        cin.pool_last_first = first
        with tf.GradientTape() as tape:
            tape.watch(v)
            out = cin(v)
            loss = tf.reduce_sum(out * up)
        grads = tape.gradient(loss, [v] + cin.variables_to_update())
        return [out.numpy()] + [g.numpy() for g in grads]

    for mixed, tol in ((False, 1e-5), (True, 0.05)):
        cin = CIN(9, list(layers), seed=3, mixed_precision=mixed)
        for b in cin.biases:                            # zero at the start: not here
            b.assign(rng.normal(size=b.shape))
        for f, r in zip(run(cin, True), run(cin, False)):
            np.testing.assert_allclose(f, r, rtol=tol, atol=tol * max(1.0, np.abs(r).max()))


def test_dlrm_without_numeric_fields_interacts_the_embeddings_alone():
    """The fixed schema (values scale ids' rows): no bottom MLP; the top MLP reads the dot
    products of every two fields' embeddings."""
    from ctrtrain.models import build_model
    from ctrtrain.models.base import ModelConfig
    m = build_model(ModelConfig(feature_size=10, field_size=3, embedding_size=2,
                                deep_layers=(4,), model="dlrm", seed=1))
    m.table.assign(tf.random.normal(m.table.shape, seed=2))
    f = {k: v[:, :3] for k, v in features().items() if k in ("ids", "values")}
    f["ids"] = tf.concat([f["ids"], (f["ids"][:, :1] + 3) % 10], 1)
    f["values"] = tf.concat([f["values"], f["values"][:, :1]], 1)
    e = m.table.numpy()[f["ids"].numpy()] * f["values"].numpy()[:, :, None]
    dots = np.stack([np.einsum("bd,bd->b", e[:, i], e[:, j]) for i, j in ((0, 1), (0, 2), (1, 2))], 1)
    assert m.bottom is None
    np.testing.assert_allclose(m(f)[0].numpy(), np_mlp(m.top, dots)[:, 0], rtol=1e-4, atol=1e-5)


def test_dice_standardizes_by_the_held_positions_in_training():
    from ctrtrain.models.blocks import Dice
    d = Dice(2)
    d.alpha.assign([0.5, -1.0])
    s = np.array([[1.0, 2.0], [3.0, -1.0], [100.0, 100.0]], np.float32)   # the last: padding
    got = d(tf.constant(s), tf.constant([1.0, 1.0, 0.0]), training=True).numpy()
    mean, var = s[:2].mean(0), s[:2].var(0)
    np.testing.assert_allclose(got, np_dice(d, s, mean, var), rtol=1e-5)
    np.testing.assert_allclose(d.mean.numpy(), 0.01 * mean, rtol=1e-5)
    np.testing.assert_allclose(d.var.numpy(), 0.99 + 0.01 * var, rtol=1e-5)


def test_din_names_the_fields_it_needs():
    from ctrtrain.errors import ConfigError
    from ctrtrain.models.din import din_fields
    opts = {"din_sequence": "", "din_target": ""}
    with pytest.raises(ConfigError, match="model din needs a sequence field.*declares none"):
        din_fields((), opts)
    fields = (("user", "categorical"), ("item", "categorical"), ("genres", "multi_hot"),
              ("hist_item", "sequence"))
    assert din_fields(fields, opts) == (1, 1, "item", "hist_item")
    with pytest.raises(ConfigError, match="din_target: 'genres' is not a categorical field "
                                          "of the data .its categorical fields: user, item"):
        din_fields(fields, {**opts, "din_target": "genres"})
    with pytest.raises(ConfigError, match="din_sequence: 'genres' is not a sequence field"):
        din_fields(fields, {**opts, "din_sequence": "genres"})
    clicks = fields[:3] + (("clicks", "sequence"),)
    with pytest.raises(ConfigError, match="din_target: name the categorical field the history "
                                          "clicks is weighed against .one of user, item"):
        din_fields(clicks, opts)
    assert din_fields(clicks, {**opts, "din_target": "user"}) == (0, 1, "user", "clicks")
    with pytest.raises(ConfigError, match="din_sequence: name the history among the sequence "
                                          "fields clicks, hist_item"):
        din_fields(clicks + (("hist_item", "sequence"),), opts)


@pytest.mark.parametrize("setting, value", [("deep_layers", (400, 400)), ("dropout", 0.5),
                                            ("embedding_size", 8), ("embedding_init", 1e-4)])
def test_a_setting_the_model_does_not_read_is_refused_by_name(setting, value):
    from ctrtrain.errors import ConfigError
    from ctrtrain.train.config import TrainConfig, check_config
    with pytest.raises(ConfigError, match=f"^{setting}: model lr does not use it"):
        check_config(TrainConfig(train_dir="d", model_dir="m", model="lr", **{setting: value}))
    check_config(TrainConfig(train_dir="d", model_dir="m", model="deepfm", **{setting: value}))
    if setting not in ("embedding_size", "embedding_init"):
        with pytest.raises(ConfigError, match=f"^{setting}: model fm does not use it"):
            check_config(TrainConfig(train_dir="d", model_dir="m", model="fm", **{setting: value}))


@pytest.mark.parametrize("model,setting,std", [("deepfm", None, 1e-4), ("xdeepfm", None, 1e-4),
                                               ("fm", None, 0.01), ("deepfm", 0.01, 0.01)])
def test_embedding_init_is_the_tables_initial_spread(model, setting, std):
    """The embeddings start normal around 0 with standard deviation `embedding_init`; by
    default the model's: 1e-4 as DeepCTR and FuxiCTR, FM 0.01. The first-order column
    starts at 0."""
    from ctrtrain.models import build_model
    from ctrtrain.train.config import TrainConfig, model_config
    cfg = TrainConfig(train_dir="d", model_dir="m", model=model, embedding_init=setting,
                      embedding_size=16)
    table = build_model(model_config(cfg, feature_size=20_000, field_size=4)).table.numpy()
    assert not table[:, 0].any()
    assert table[:, 1:].mean() == pytest.approx(0.0, abs=std / 20)
    assert table[:, 1:].std() == pytest.approx(std, rel=0.01)


def test_an_unknown_model_or_a_wrong_option_is_named(tmp_path):
    r = run_cli("train", "--train", tmp_path, "--model-dir", tmp_path / "m", "--model", "dnn",
                check=False)
    assert r.returncode == 2 and "'dnn' is not one of lr, fm, deepfm, wide_deep" in r.stderr
    # A model's own option, given to another model (a flag, as a user types it).
    r = run_cli("train", "--train", tmp_path, "--model-dir", tmp_path / "m", "--cross-layers",
                "2", check=False)
    assert r.returncode == 2 and "cross_layers: model deepfm does not use it" in r.stderr
    r = run_cli("train", "--train", tmp_path, "--model-dir", tmp_path / "m", "--model", "dcn_v2",
                "--cross-structure", "diagonal", check=False)
    assert r.returncode == 2 and "'diagonal' is not one of parallel, stacked" in r.stderr


def test_a_dcn_v2_run_from_before_its_linear_term_resumes_only_without_it(tmp_path, data):
    """dcn_linear (default true) came after DCN-v2 trained without a linear term: a model
    directory recorded then holds no weight column, and is refused by name, not by a shape
    error deep in the checkpoint, unless the run says --no-dcn-linear."""
    md = tmp_path / "m"
    base = ["train", "--train", data / "train", "--model-dir", md, "--model", "dcn_v2",
            "--batch-size", 256, "--quiet", "--no-export", "--embedding-size", 4,
            "--deep-layers", "8", "--cross-layers", 1]
    code, _, err = cli(*base, "--steps", 4, "--no-dcn-linear")
    assert code == 0, err
    record = json.loads((md / "train_config.json").read_text())
    del record["dcn_linear"]                                  # as recorded before it existed
    (md / "train_config.json").write_text(json.dumps(record))
    code, _, err = cli(*base, "--steps", 6)
    assert code == 2 and "dcn_linear=False" in err, err
    code, _, err = cli(*base, "--steps", 6, "--no-dcn-linear")
    assert code == 0, err
    assert json.loads((md / "result.json").read_text())["resumed_from"] == 4


@pytest.fixture(scope="module")
def data(synth_data):
    return synth_data(**DATA)[0] / "tf"


@pytest.fixture(scope="module")
def history_data(tmp_path_factory):
    """Declared fields with a history (S1, a sequence field), for DIN."""
    from trainutil import made_once
    return made_once(tmp_path_factory, "history", lambda d: ctrtrain_here(
        "data", "synth", "--out", d / "data", "--rows", 12_000, "--feature-size", 2_000,
        "--seed", 5, "--numeric-fields", 1, "--categorical-fields", 4, "--sequence-fields", 1,
        "--sequence-len", 5, "--multi-hot-vocab", 300, "--files-per-split", 2,
        "--processes", 1))[0] / "data"


@pytest.mark.slow
def test_din_on_data_without_a_history_is_refused_by_name(data, tmp_path):
    r = run_cli("train", "--train", data / "train", "--model-dir", tmp_path / "m", "--model",
                "din", "--steps", 1, check=False)
    assert r.returncode == 2 and "model din needs a sequence field" in r.stderr, r.stderr[-2000:]


@pytest.mark.slow
def test_the_written_config_holds_the_models_own_options_as_it_used_them(history_data,
                                                                          tmp_path):
    """<model-dir>/config.yaml (issue 56): the shared settings and DIN's own options, not every
    other model's, with the history DIN used named (din_sequence was left to the data: its
    only sequence field, S1) and `auto` settings made concrete; it re-runs as --config, in
    the same directory (resuming) and in another."""
    import yaml

    from ctrtrain.models import MODELS
    from ctrtrain.train.config import UNIVERSAL
    md = tmp_path / "m"
    ctrtrain_here("train", "--train", history_data / "train", "--model-dir", md, "--model",
                  "din", "--din-target", "C1", "--din-attention-units", "8", "--deep-layers",
                  "16", "--embedding-size", 4, "--steps", 4, "--quiet", "--no-export")
    written = yaml.safe_load((md / "config.yaml").read_text())
    model = written["model"]
    assert (model["din_sequence"], model["din_target"], model["din_attention_units"]) == \
        ("S1", "C1", [8])
    others = {o for name, e in MODELS.items() if name != "din" for o in e.options}
    assert not others & set(model), others & set(model)
    assert set(model) == {*UNIVERSAL, *MODELS["din"].reads, *MODELS["din"].options}
    assert written["optimizer"]["table_updates"] == "dense"          # auto, for 2,000 rows
    assert written["schedule"]["batch_size"] == 256 and written["data"]["shuffle_buffer"] > 0
    ctrtrain_here("train", "--config", md / "config.yaml", "--steps", 6)
    assert json.loads((md / "result.json").read_text())["resumed_from"] == 4
    # A model directory recorded before DIN's fields were resolved (''), resumed.
    record = json.loads((md / "train_config.json").read_text())
    (md / "train_config.json").write_text(json.dumps({**record, "din_sequence": "",
                                                      "din_target": ""}))
    ctrtrain_here("train", "--config", md / "config.yaml", "--steps", 8)
    assert json.loads((md / "result.json").read_text())["resumed_from"] == 6
    ctrtrain_here("train", "--config", md / "config.yaml", "--model-dir", tmp_path / "m2")
    again = yaml.safe_load((tmp_path / "m2" / "config.yaml").read_text())
    # (the resumed runs rewrote md's config.yaml with their steps)
    assert again["model"] == model and again["schedule"] == {**written["schedule"], "steps": 8}


@pytest.fixture
def data_of(request):
    """The data a model trains on in these tests: DIN needs a history, the others read the
    fixed schema's (test_distributed.py's data)."""
    return lambda name: request.getfixturevalue("history_data" if name == "din" else "data")


def small(model) -> dict:
    """Settings that keep a test's model small (the cost is start-up, not steps)."""
    from ctrtrain.models import MODELS
    out = {"embedding_size": 4} if "embedding_size" in MODELS[model].reads else {}
    # xDeepFM's CIN and DLRM's top MLP (over 39 fields' 741 dot products) cost most.
    own = {"xdeepfm": {"cin_layers": "16,16"}, "dlrm": {"deep_layers": "64"},
           "din": {"din_target": "C1", "din_attention_units": "8", "deep_layers": "64"}}
    # Declared numeric fields as values (no rows, a dense linear weight) in two of the
    # models and as both (rows, and the values in x0) in DCN-v2, so that every mode's family
    # job, and DIN's resume, export and predict on its declared fields, train them that way;
    # the others (and DeepFM's runs) as embeddings.
    values = {"numeric_input": "value"} if model in ("wide_deep", "din") else \
        {"numeric_input": "both"} if model == "dcn_v2" else {}
    return {**out, **own.get(model, {}), **values}


def train(data, md, model, steps, *extra):
    size = [f"--{k.replace('_', '-')}={v}" for k, v in small(model).items()]
    ctrtrain_here("train", "--train", data / "train", "--test", data / "test", "--model-dir", md,
                  "--model", model, "--steps", steps, "--batch-size", "256",
                  "--checkpoint-every", "20", "--predictions", "auto", "--quiet",
                  "--learning-rate", "0.01", *size, *extra)
    return json.loads((md / "result.json").read_text())


def probs(csv):
    return np.array([float(line.split(",")[1]) for line in csv.read_text().splitlines()[1:]])


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_each_model_trains_resumes_exactly_exports_and_predicts_the_same(name, data_of, tmp_path):
    data = data_of(name)
    whole = train(data, tmp_path / "whole", name, 40)
    assert whole["test"]["auc"] > 0.6, whole["test"]
    # Stopped at a checkpoint, then the same command with more steps: the same model.
    train(data, tmp_path / "resumed", name, 20, "--no-export")
    resumed = train(data, tmp_path / "resumed", name, 40, "--no-export")
    assert resumed["resumed_from"] == 20 and resumed["step"] == 40
    np.testing.assert_allclose(probs(tmp_path / "resumed" / "predictions.csv"),
                               probs(tmp_path / "whole" / "predictions.csv"), atol=1e-6)
    # The exported model predicts what training's evaluation did.
    ctrtrain_here("predict", "--model", tmp_path / "whole" / "export", "--input", data / "test",
                  "--out", tmp_path / "p.csv")
    np.testing.assert_allclose(probs(tmp_path / "p.csv"),
                               probs(tmp_path / "whole" / "predictions.csv"), atol=1e-6)
    info = json.loads(next((tmp_path / "whole" / "export").glob("*/assets.extra/ctrtrain.json"))
                      .read_text())
    assert info["model"] == name


def family(**shared) -> dict:
    """Runs for tests/jobs/train_each_model.py: every model but DeepFM (tested in every mode
    on its own), 30 small steps each, with SHARED settings (a mode's devices, its batch). A
    run's CPU is mostly its set-up (tracing, evaluation, export), not its steps: 60 steps
    instead cost each job 4 (all-reduce, mirrored) to 7 (parameter servers, Horovod) CPU-s
    more, for AUCs up to 0.05 higher. Measured at 30: DLRM's the lowest (0.675-0.686 with
    parameter servers, 0.680 mirrored, 0.704 all-reduce and Horovod), the others 0.71-0.76."""
    return {m: {"steps": 30, "batch_size": 256, "learning_rate": 0.01, **shared, **small(m)}
            for m in MODELS}


def assert_family_trained(done: dict, mode: str) -> None:
    """Each model of family() in DONE (runs.json) reached AUC > 0.6 in its 30 steps under
    MODE and exported with its model and mode recorded."""
    for name in MODELS:
        r, export = done[name]["result"], done[name]["export"]
        assert r["mode"] == mode and r["step"] == 30 and r["test"]["auc"] > 0.6, (name, r)
        assert (export["model"], export["mode"]) == (name, mode), (name, export)
        # how the declared numeric fields entered (embedding for the models that read no
        # numeric_input: LR, FM and DLRM keep their own forms)
        assert export["numeric_input"] == small(name).get("numeric_input", "embedding"), name


# Every model in the parameter-server trainer (train/ps.py), on the declared fields (numeric,
# multi-hot bags, a history: conftest's `declared`): one job trains the models in turn in the
# same processes (tests/jobs/train_each_model.py), since a launch's start-up (3 to 8
# TensorFlow processes) costs more than a model's few steps (issue 28's budget). It also
# trains DeepFM on them for an epoch, its table split over both servers. The synchronous
# trainer's jobs (all-reduce, mirrored, Horovod) train the family beside the DeepFM they
# compare with one process (test_fields.py).
@pytest.mark.slow
def test_each_model_trains_in_a_parameter_server_job(declared, tmp_path):
    """A real launch: 2 workers and 2 parameter servers holding the table in shards, each
    process configured by the recipe from what the job gives it."""
    from test_distributed import launch
    runs = {**family(), "deepfm-1-epoch": {"model": "deepfm", "epochs": 1, "batch_size": 256,
                                           "learning_rate": 0.00035}}   # the example's rate
    done = launch(tmp_path, "deepfm-parameter-server", declared, runs=runs)[0]
    assert list(done) == list(runs)
    assert_family_trained(done, "parameter_server")
    deepfm = done["deepfm-1-epoch"]
    assert deepfm["export"]["model"] == "deepfm"
    assert deepfm["start"]["table_shards"] == 2     # the table (numeric rows too) split
    # one epoch: 0.729-0.735 measured (2 epochs: 0.749-0.752, for 4 CPU-s more)
    assert deepfm["result"]["test"]["auc"] > 0.65, deepfm["result"]["test"]


@pytest.mark.tf215
def test_each_model_trains_and_exports_on_tensorflow_2_15(declared, tmp_path):
    """Every model of the family on TensorFlow 2.15 (the release of SageMaker's Horovod
    containers), one process: family()'s 30 steps on the declared fields, tested and
    exported. In the 2.15 pass only: the 2.21 pass trains every model in every mode. (Horovod
    combines each model's gradients as the all-reduce trainer does, a list of dense and
    row-sliced gradients whatever the model: its job trains DeepFM, test_fields.py; the family
    in two Horovod ranks cost about 110 CPU-s more than this.)"""
    import tensorflow as tf
    if not tf.__version__.startswith("2.15"):
        pytest.skip("the 2.15 pass's test (the 2.21 pass trains the family in every mode)")
    for name, settings in family().items():
        md = tmp_path / name
        ctrtrain_here("train", "--train", declared / "train", "--test", declared / "test",
                      "--model-dir", md, "--model", name, "--quiet",
                      *[f"--{k.replace('_', '-')}={v}" for k, v in settings.items()])
        r = json.loads((md / "result.json").read_text())
        assert r["step"] == 30 and r["test"]["auc"] > 0.6, (name, r["test"])
        export = json.loads(next(md.glob("export/*/assets.extra/ctrtrain.json")).read_text())
        assert export["model"] == name and export["numeric_input"] == \
            small(name).get("numeric_input", "embedding"), (name, export)


def test_bench_train_refuses_a_variant_its_model_ignores(tmp_path):
    (tmp_path / "v.yaml").write_text("bf16: {mixed_precision: true}\n")
    code, _, err = cli("bench", "train", "--model", "lr", "--variants", tmp_path / "v.yaml",
                       "--work-dir", tmp_path / "w")
    assert code == 2 and "variant bf16: mixed_precision: model lr does not use it" in err, err
    (tmp_path / "v.yaml").write_text("x: {model: dnn}\n")
    code, _, err = cli("bench", "train", "--variants", tmp_path / "v.yaml",
                       "--work-dir", tmp_path / "w")
    assert code == 2 and "variant x: model 'dnn' is not one of lr, fm" in err, err
    assert not (tmp_path / "w").exists()     # refused before any data is made


@pytest.mark.slow
def test_bench_train_measures_the_model_named_and_deepctrs(data, tmp_path):
    """`bench train --model`: every variant trains that model unless it names its own; the
    reference's settings a model does not read are left out (LR reads no MLP's), and the dense
    limit (DeepFM's MLP) is measured only beside the models whose deep part it is. With
    --deepctr-python, DeepCTR's implementation of each model it has (with the variant's
    options) runs on the same rows in the same run."""
    from test_bench import deepctr_python
    peer = deepctr_python()
    (tmp_path / "v.yaml").write_text("lr: {}\ndcn: {model: dcn_v2, cross_layers: 1}\n")
    r = run_cli("bench", "train", "--data", data / "train", "--model", "lr", "--variants",
                tmp_path / "v.yaml", "--steps", 20, "--warmup", 5, "--repeats", 1, "--work-dir",
                tmp_path / "w", "--json", tmp_path / "b.json",
                *(["--deepctr-python", peer] if peer else []))
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["config"]["model"] == "lr"
    assert {n: v["model"] for n, v in b["variants"].items()} == {"lr": "lr", "dcn": "dcn_v2"}
    assert all(v["examples_per_s"] > 0 and "ratio_to_dense_limit" not in v
               for v in b["variants"].values())
    if peer:
        assert "DeepCTR has no lr" in r.stdout and "deepctr" not in b["variants"]["lr"]
        dcn = b["variants"]["dcn"]
        assert dcn["deepctr"]["examples_per_s"] > 0 and len(dcn["deepctr"]["runs"]) == 1
        assert dcn["ratio_to_deepctr"] == dcn["examples_per_s"] / dcn["deepctr"]["examples_per_s"]
        # DeepCTR's run right after the variant's, its load recorded as ctrtrain's is
        assert b["order"] == ["train lr", "train dcn", "deepctr dcn"]
        assert dcn["deepctr"]["loads"][0]["machine_cores"] > 0
    # every run with glibc keeping what it frees (runner.KEEP_FREED_MEMORY): the peers'
    # table-sized temporaries are not paged in anew each step
    assert b["allocator"] == "MALLOC_MMAP_THRESHOLD_=2000000000 MALLOC_TRIM_THRESHOLD_=4000000000"
    assert "every run with glibc keeping the memory it frees" in r.stdout


@pytest.mark.slow
def test_bench_train_takes_each_runs_ratio_to_the_dense_limit_beside_it(data, tmp_path):
    """Repeats go round the variants, each run's dense limit measured beside it, the order
    reversed every other round: the ratio is the median of the runs' own ratios (the VM's
    speed drifts between runs), given with its spread; each run's load of other processes
    is recorded."""
    import statistics
    # One variant (each run is a process of its own: 2 repeats of a run and its dense limit
    # are 4 processes); several variants in one bench: the test of --model above.
    (tmp_path / "v.yaml").write_text("b: {steps_per_execution: 1}\n")
    r = run_cli("bench", "train", "--data", data / "train", "--variants", tmp_path / "v.yaml",
                "--steps", 20, "--warmup", 5, "--repeats", 2, "--work-dir", tmp_path / "w",
                "--json", tmp_path / "b.json", "--system-malloc")
    b = json.loads((tmp_path / "b.json").read_text())
    # a line as each run ends, in the order run
    assert [line.split(":")[1].strip() for line in r.stdout.splitlines()
            if line.startswith("run ")] == b["order"], r.stdout
    assert "run 4/4: train b:" in r.stdout, r.stdout
    assert list(b["variants"]) == ["b"] and b["allocator"] == "glibc defaults"
    for v in b["variants"].values():
        assert len(v["runs"]) == len(v["dense_limit_runs"]) == 2
        assert v["ratio_runs"] == [r / d for r, d in zip(v["runs"], v["dense_limit_runs"])]
        assert v["ratio_to_dense_limit"] == statistics.median(v["ratio_runs"])
        assert v["ratio_to_dense_limit_spread"] == {"min": min(v["ratio_runs"]), "median": v[
            "ratio_to_dense_limit"], "max": max(v["ratio_runs"])}
        for load in v["loads"]:
            assert load["seconds"] > 0 and load["machine_cores"] > 0 and load["other_cores"] >= 0
            assert load["contended"] == (load["other_cores"] > 0.2)
    assert b["order"] == ["train b", "dense b", "dense b", "train b"]
    v = b["variants"]["b"]
    assert b["contended_runs"] == sum(ld["contended"] for ld in v["loads"] + v["dense_limit_loads"])
    assert b["variants"]["b"]["settings"] == {"steps_per_execution": 1}


@pytest.mark.slow
def test_bench_profile_profiles_the_model_named(data, tmp_path):
    """`bench profile --model`: that model's step, op by op (DCN-v2's cross layers' matmuls
    among its ops); a setting the model does not read is refused by name; the trace it read
    is not left behind."""
    (tmp_path / "tmp").mkdir()
    run_cli("bench", "profile", "--data", data / "train", "--model", "dcn_v2", "--json",
            tmp_path / "p.json", env={"TMPDIR": str(tmp_path / "tmp")})
    assert not [p.name for p in (tmp_path / "tmp").iterdir() if "profile" in p.name]
    p = json.loads((tmp_path / "p.json").read_text())
    assert p["model"] == "dcn_v2" and p["wall_ms_per_step"] > 0
    assert any("MatMul" in o["op"] for o in p["ops"]), p["ops"]
    code, _, err = cli("bench", "profile", "--data", data / "train", "--model", "lr",
                       "--mixed-precision")
    assert code == 2 and "--mixed-precision: model lr does not use it" in err, err


@pytest.mark.slow
def test_bench_train_din_without_data_makes_the_reference_with_a_history(tmp_path):
    """`bench train --model din` on the synthesized reference: one of its categorical fields
    replaced by a history of up to 20 ids (declared fields), weighed against C1; DeepCTR's DIN
    on the same rows trains with the target and the options of the variant ctrtrain's DIN
    trains with (--variants)."""
    from test_bench import deepctr_python
    peer = deepctr_python()
    (tmp_path / "v.yaml").write_text("din: {din_attention_units: '8'}\n")
    run_cli("bench", "train", "--model", "din", "--rows", 8_000, "--feature-size", 5_000,
            "--variants", tmp_path / "v.yaml", "--steps", 4, "--warmup", 2, "--repeats", 1,
            "--work-dir", tmp_path / "w", "--json", tmp_path / "b.json",
            *(["--deepctr-python", peer] if peer else []))
    b = json.loads((tmp_path / "b.json").read_text())
    assert "history-8000-5000-1x20" in b["data"]
    fields = json.loads((Path(b["data"]) / "manifest.json").read_text())["fields"]
    assert fields[-1] == {"name": "S1", "kind": "sequence", "max_len": 20, "pooling": "mean"}
    din = b["variants"]["din"]
    assert din["model"] == "din"
    assert din["settings"] == {"din_target": "C1", "din_attention_units": "8"}, din["settings"]
    assert din["examples_per_s"] > 0 and (not peer or din["deepctr"]["examples_per_s"] > 0)


@pytest.mark.slow
def test_dlrm_reads_declared_numeric_fields_through_its_bottom_mlp(tmp_path):
    """Declared numeric fields (values as the data holds them) enter DLRM's bottom MLP; the
    model trains, exports and predicts what training predicted, from records."""
    d = tmp_path / "data"
    ctrtrain_here("data", "synth", "--out", d, "--rows", 12_000, "--feature-size", 2_000, "--seed", 4,
                  "--numeric-fields", 3, "--categorical-fields", 5, "--multi-hot-fields", 1,
                  "--multi-hot-len", 3, "--multi-hot-vocab", 200, "--files-per-split", 1,
                  "--processes", 1)
    md = tmp_path / "m"
    ctrtrain_here("train", "--train", d / "train", "--test", d / "test", "--model-dir", md, "--model",
                  "dlrm", "--bottom-layers", "16", "--embedding-size", "4", "--deep-layers", "32",
                  "--epochs", 2, "--batch-size", 256, "--learning-rate", "0.005", "--predictions",
                  "auto", "--quiet")
    r = json.loads((md / "result.json").read_text())
    assert r["test"]["auc"] > 0.6, r["test"]
    ctrtrain_here("predict", "--model", md / "export", "--input", d / "test", "--out", tmp_path / "p.csv")
    np.testing.assert_allclose(probs(tmp_path / "p.csv"), probs(md / "predictions.csv"), atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("which, sizes", [("100k", [80_000, 10_000, 10_000]),
                                          ("1m", [800_167, 100_021, 100_021])])
def test_movielens_example_makes_real_histories(tmp_path, which, sizes):
    """examples/movielens.py: MovieLens-100K and -1M from the package index (RecBole's wheel,
    scikit-rec's source archive), every rating a row in time order, split 80/10/10 by time;
    each row's history is the user's earlier clicks (ratings >= 4), the most recent first
    cut, sharing item_id's ids. -100K through the whole script (its CSVs featurized); -1M's
    own reading and splitting in this process (the featurize of those columns is -100K's)."""
    import importlib.util
    import subprocess
    import sys

    import pandas as pd
    root = Path(__file__).resolve().parents[1]
    script = root / "examples" / "movielens.py"
    if which == "100k":
        subprocess.run([sys.executable, str(script), str(tmp_path), "--set", which,
                        "--history", "5"], check=True, capture_output=True, timeout=900)
    else:
        spec = importlib.util.spec_from_file_location("movielens_example", script)
        example = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(example)
        assert list(example.write_splits(which, tmp_path, 5).values()) == sizes
    parts = {s: pd.read_csv(tmp_path / f"{s}.csv", dtype=str, keep_default_na=False)
             for s in ("train", "valid", "test")}
    assert [len(p) for p in parts.values()] == sizes
    d = pd.concat(parts.values(), ignore_index=True)
    assert (d.release_year != "").mean() > 0.99 and d.genres.str.len().min() > 0
    clicked: dict[str, list[str]] = {}
    for user, item, rating, hist in zip(d.user_id, d.item_id, d.rating, d.hist_item_id):
        before = clicked.setdefault(user, [])
        assert hist == "|".join(before[-5:])
        if int(rating) >= 4:
            before.append(item)
    if which == "1m":
        return
    m = json.loads((tmp_path / "train" / "manifest.json").read_text())
    assert m["records"] == sizes[0] and m["fields"][-1]["name"] == "hist_item_id"
    vocab = json.loads((tmp_path / "train" / "vocab.json").read_text())
    assert vocab["schema"]["shared"] == {"hist_item_id": "item_id"}
