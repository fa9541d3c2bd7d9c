"""`ctrtrain bench train`: training throughput on the reference configuration, against the
machine's dense limit for the same shapes: DeepFM's by default, any model of the family with
`--model` (the dense limit is that of DeepFM's MLP, measured for the models whose deep part it
is: deepfm and wide_deep).

Every measured run is a fresh process (thread pools are fixed when TensorFlow starts, and
peak RSS is per process). A run trains warm-up steps, then measured steps; the figure is the
median over repeats of examples/s across the measured steps, with the share of step time
spent waiting for input (input-bound %) reported separately from compute. Repeats go round
the variants (one run of each per round), and the ratio to the dense limit is the median of
each run's ratio to the dense limit measured right after it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from .machine import CONTENDED_CORES, LoadWindow, describe_machine, process_cpu_s
from .runner import KEEP_FREED_MEMORY, run_json

# The SageMaker DeepFM sample's configuration (with its dropout), on ids as sparse as real
# Criteo's: Zipf(0.7) within each field gives about 8,400 distinct rows per batch of 1,024
# (real Criteo rows: about 10,000; the earlier Zipf(1.2) data: 3,700, which flattered sparse
# updates). The figure is measured on the data and reported beside the speed.
REFERENCE = {"rows": 1_000_000, "feature_size": 1_000_000, "zipf": 0.7, "embedding_size": 16,
             "deep_layers": [256, 128, 64], "dropout": 0.5, "batch_size": 1024,
             "optimizer": "adam", "l2_reg": 1e-4}


def prepare_reference_data(work: Path, rows: int, feature_size: int,
                           zipf: float = REFERENCE["zipf"]) -> Path:
    """Synthesized Criteo-like data converted to TFRecord once, then reused."""
    from ..data.manifest import MANIFEST_NAME
    from ..data.synth import SynthConfig, synthesize_tfrecord
    out = work / f"ref-{rows}-{feature_size}-zipf{zipf}"
    tf_dir = out / "tfrecord" / "train"
    if (tf_dir / MANIFEST_NAME).exists():
        return tf_dir
    synthesize_tfrecord(out, SynthConfig(rows=rows, feature_size=feature_size, zipf=zipf,
                                         valid_fraction=0.0, test_fraction=0.0),
                        tfrecord_dir="tfrecord", overwrite=True)
    return tf_dir


def reference_run() -> dict:
    """The reference configuration's settings of one run (without the data set's)."""
    return {k: v for k, v in REFERENCE.items() if k not in ("rows", "feature_size", "zipf")}


def prepare_bag_data(work: Path, rows: int, feature_size: int, fields: int, length: int,
                           zipf: float = REFERENCE["zipf"], kind: str = "multi_hot") -> Path:
    """The reference data with `fields` of its 26 categorical fields replaced by multi_hot
    bags (or, kind "sequence", histories) of 0 to `length` ids (a vocabulary each: 20,000
    ids in a table of 1M, a fiftieth of smaller tables), made once."""
    vocab = min(20_000, max(2, feature_size // 50))
    from ..data.manifest import MANIFEST_NAME
    from ..data.synth import CRITEO_CARDINALITIES, SynthConfig, synthesize
    name = "multihot" if kind == "multi_hot" else "history"
    out = work / f"{name}-{rows}-{feature_size}-{fields}x{length}-zipf{zipf}"
    if (out / "train" / MANIFEST_NAME).exists():
        return out / "train"
    shape = ({"multi_hot_fields": fields, "multi_hot_len": length} if kind == "multi_hot" else
             {"sequence_fields": fields, "sequence_len": length})
    synthesize(out, SynthConfig(rows=rows, feature_size=feature_size, zipf=zipf,
                                valid_fraction=0.0, test_fraction=0.0, files_per_split=8,
                                categorical_fields=len(CRITEO_CARDINALITIES) - fields,
                                multi_hot_vocab=vocab, **shape), overwrite=True)
    return out / "train"


# DIN's reference: the reference data with one categorical field replaced by a history of up
# to 20 ids (DIN's and DeepCTR's examples use 20 to 50), weighed against field C1.
HISTORY = {"length": 20, "din_target": "C1"}
# The SageMaker sample's input: prefetch(500000) records before its steps (estimator_runner.py).
ESTIMATOR_BUFFER = 500_000


def batch_stats(data: str, batch_size: int, batches: int = 20) -> dict:
    """Over the first batches of the shuffled training stream: the mean distinct table rows
    a batch touches (the sparse update's work) and the ids an example holds (every field's,
    a bag's real ids, a numeric field's row)."""
    import numpy as np

    from ..input.pipeline import PipelineConfig, dataset_from_dir
    ds, _ = dataset_from_dir(data, PipelineConfig(batch_size=batch_size), training=True)
    distinct, ids = [], []
    for b in ds.take(batches):
        held = [b["ids"].numpy().ravel()]
        if "bag_ids" in b:
            bag = b["bag_ids"].numpy().ravel()
            held.append(bag[bag >= 0])
        n_numeric = b["numeric"].shape[1] if "numeric" in b else 0
        every = np.concatenate(held)
        distinct.append(len(np.unique(every)) + n_numeric)
        ids.append((len(every) + n_numeric * b["label"].shape[0]) / b["label"].shape[0])
    return {"distinct_rows_per_batch": float(np.mean(distinct)),
            "ids_per_example": float(np.mean(ids))}


def window(warmup: int) -> int:
    """Steps per logged window: a divisor of `warmup`, so that the measured windows (those
    after it) hold no warm-up step, the first one's tracing above all."""
    return math.gcd(warmup, 50) if warmup else 50


def _run_worker(kind: str, params: dict, env: dict | None = None) -> dict:
    """One measured run in a fresh Python process; returns its JSON result."""
    return run_json([sys.executable, "-m", "ctrtrain.bench.train_bench", kind,
                     json.dumps(params)], "benchmark worker", env=env)[-1]


# Run parameters _train_worker maps onto TrainConfig itself.
_MAPPED = {"embedding_size", "deep_layers", "batch_size", "optimizer", "dropout", "table_updates",
           "feature_size", "cache", "xla", "mixed_precision", "threads"}
# The models whose deep part is the dense limit's MLP (all fields' embeddings in, one logit).
DENSE_LIMIT_MODELS = ("deepfm", "wide_deep")


def model_settings(p: dict) -> dict:
    """The reference's model settings that the run's model reads (LR has no MLP, FM no
    dropout; a variant naming one its model does not read is refused: check_variants)."""
    from ..models import MODELS
    reads = MODELS[p.get("model", "deepfm")].reads
    given = {"embedding_size": p["embedding_size"], "deep_layers": tuple(p["deep_layers"]),
             "dropout": p.get("dropout", 0.0), "xla": p.get("xla", False),
             "mixed_precision": p.get("mixed_precision", False)}
    return {k: v for k, v in given.items() if k in reads}


def check_variants(variants: dict, model: str) -> None:
    """Refuses, before any run, a variant that names a model setting its model does not read:
    its figure would carry a label (bf16, another MLP) the run ignored."""
    from ..errors import ConfigError
    from ..models import DEEP, MODELS
    for name, over in variants.items():
        m = over.get("model", model)
        if m not in MODELS:
            raise ConfigError(f"variant {name}: model {m!r} is not one of {', '.join(MODELS)}")
        for key in sorted(set(over) & set(DEEP) - set(MODELS[m].reads)):
            raise ConfigError(f"variant {name}: {key}: model {m} does not use it")


def _train_worker(p: dict) -> dict:
    from ..train import train
    from ..train.config import TrainConfig, settings_from_mapping
    from ..train.threads import ThreadConfig
    # Other training settings a variant names (l2_reg, adam_epsilon, a model's options), parsed
    # as a config file's (din_attention_units: "8" or [8]).
    fields = {f.name for f in dataclasses.fields(TrainConfig)} - {"train_dir", "model_dir", "steps"}
    other = settings_from_mapping({k: v for k, v in p.items() if k in fields and k not in _MAPPED},
                                  "variant")
    with tempfile.TemporaryDirectory() as md:
        cfg = TrainConfig(**other, **model_settings(p),
            train_dir=p["data"], model_dir=md, batch_size=p["batch_size"],
            optimizer=p["optimizer"], steps=p["warmup"] + p["steps"], log_every=p["window"],
            table_updates=p.get("table_updates", "auto"),
            feature_size=p.get("model_feature_size"),
            checkpoint_every=0, export=False, progress=False, quiet=True, cache=p.get("cache", False),
            threads=ThreadConfig(**p.get("threads", {})))
        r = train(cfg)
    measured = [w for w in r["windows"] if w["step"] > p["warmup"]]
    steps = sum(w["steps"] for w in measured)
    assert steps == p["steps"], (steps, p)     # no warm-up step in the figure (window())
    secs = sum(w["seconds"] for w in measured)
    wait = sum(w["input_wait_s"] for w in measured)
    comp = sum(w["compute_s"] for w in measured)
    return {"examples_per_s": steps * p["batch_size"] / secs, "step_ms": 1000 * secs / steps,
            "input_bound": wait / (wait + comp), "input_ms": 1000 * wait / steps,
            "compute_ms": 1000 * comp / steps,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "cpu_s": process_cpu_s()}


def _dense_worker(p: dict) -> dict:
    """The MLP alone (same shapes, same optimizer, the model's MLP's dropout, no embeddings, no
    input pipeline). The backward includes the gradient with respect to the MLP's input: in
    DeepFM that input is the trainable embeddings, so that matmul is part of the MLP's cost."""
    from ..train.threads import ThreadConfig, apply_threads
    apply_threads(ThreadConfig(**p.get("threads", {})))
    import tensorflow as tf
    from .. import kernels
    from ..models.blocks import dropout, glorot_uniform
    from ..models.engine.optimizers import make_optimizer
    kernels.set_enabled(p.get("fused_kernels", True))    # a variant's fused_kernels: false
    width = p["field_size"] * p["embedding_size"]
    dims = [width] + list(p["deep_layers"]) + [1]
    glorot = glorot_uniform(0)
    kernels = [tf.Variable(glorot((a, b))) for a, b in zip(dims[:-1], dims[1:])]
    biases = [tf.Variable(tf.zeros([b])) for b in dims[1:]]
    variables = kernels + biases
    opt = make_optimizer(p["optimizer"], 1e-3)
    opt.build(variables)
    dtype = tf.bfloat16 if p.get("mixed_precision") else tf.float32

    @tf.function(autograph=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            tape.watch(x)
            h = tf.cast(x, dtype)
            for i, (k, b) in enumerate(zip(kernels, biases)):
                h = tf.matmul(h, tf.cast(k, dtype)) + tf.cast(b, dtype)
                if i < len(kernels) - 1:
                    h = tf.nn.relu(h)
                    if p.get("dropout"):
                        h = dropout(h, p["dropout"])
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=y, logits=tf.cast(h[:, 0], tf.float32)))
        grads = tape.gradient(loss, variables + [x])
        opt.apply_gradients(zip(grads[:-1], variables))
        return loss + 0.0 * tf.reduce_sum(grads[-1][:1])

    x = tf.random.normal([p["batch_size"], width])
    y = tf.cast(tf.random.uniform([p["batch_size"]]) > 0.75, tf.float32)
    for _ in range(p["warmup"]):
        step(x, y).numpy()
    t = time.perf_counter()
    for _ in range(p["steps"]):
        loss = step(x, y)
    loss.numpy()
    secs = time.perf_counter() - t
    return {"examples_per_s": p["steps"] * p["batch_size"] / secs,
            "step_ms": 1000 * secs / p["steps"], "cpu_s": process_cpu_s()}


def _estimator_run(python: str, params: dict, env: dict | None = None) -> dict:
    """One run of the SageMaker sample's TF1 Estimator (estimator_runner.py) in `python`."""
    runner = str(Path(__file__).with_name("estimator_runner.py"))
    return run_json([python, runner, json.dumps(params)], "estimator reference", env=env)[-1]


def _deepctr_params(run: dict, feature_size: int, arrays: Path, schema) -> dict:
    """deepctr_runner.py's parameters for a variant's run: the same shapes, optimizer, L2,
    the model's own options (its defaults, or the variant's; DIN's history and target as
    ctrtrain's DIN picks them from the data's declared fields, `schema`), and its steps."""
    from ..models import MODELS
    from .quality import with_din_fields
    options = with_din_fields(run["model"], {n: o.parse(run[n]) if n in run else o.default
                                             for n, o in MODELS[run["model"]].options.items()},
                              schema)
    return {"model": run["model"], "options": options, "train": str(arrays),
            "feature_size": feature_size, "embedding_size": run["embedding_size"],
            "deep_layers": list(run["deep_layers"]), "dropout": run.get("dropout", 0.0),
            "l2": run["l2_reg"], "learning_rate": 1e-3, "batch_size": run["batch_size"],
            "seed": 0, "speed": {"warmup": run["warmup"], "steps": run["steps"]}}


def run_train_bench(work_dir="runs/bench-train", rows=REFERENCE["rows"],
                    feature_size=REFERENCE["feature_size"], steps=300, warmup=50, repeats=3,
                    variants: dict[str, dict] | None = None, json_path=None,
                    data: str | None = None, estimator_python: str | None = None,
                    model: str = "deepfm", deepctr_python: str | None = None,
                    system_malloc: bool = False) -> dict:
    """`data`: the user's own training data (a directory, files or a glob; indexed if it has
    no manifest) instead of the synthesized reference set. `estimator_python`: a python with
    tf.estimator (TF 2.15) to measure the SageMaker sample's Estimator in the same run.
    `model`: the model every variant trains unless it names its own (`model:`).
    `deepctr_python`: a DeepCTR 0.9.4 environment's python (scripts/deepctr_env.sh) to measure
    DeepCTR's implementation of each variant's model (the ones it has) in the same run, on the
    same rows, trained as DeepCTR users train (Keras `fit` on arrays). Every run, ctrtrain's
    and its peers', has glibc keep the memory it frees (runner.KEEP_FREED_MEMORY), unless
    `system_malloc`."""
    from ..errors import ConfigError
    from .quality import DEEPCTR_MODELS
    variants = dict(variants or {"reference": {}})
    check_variants(variants, model)
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    from ..data.index import resolve_source
    field_size, schema = 39, None
    if data:
        m, _ = resolve_source(data)
        field_size, rows, feature_size, schema = (m.field_size, m.records, m.feature_size,
                                                  m.schema)
    elif any(v.get("model", model) == "din" for v in variants.values()):
        # A history is what DIN reads; the other variants of the run train on the same data.
        data = prepare_bag_data(work, rows, feature_size, 1, HISTORY["length"], kind="sequence")
        m, _ = resolve_source(data)
        field_size, schema = m.field_size, m.schema
        for name, over in variants.items():
            if over.get("model", model) == "din":
                variants[name] = {"din_target": HISTORY["din_target"], **over}
    else:
        data = prepare_reference_data(work, rows, feature_size)
    if deepctr_python and rows < (warmup + steps) * REFERENCE["batch_size"]:
        raise ConfigError(f"--deepctr-python: DeepCTR trains {warmup} + {steps} batches of "
                          f"{REFERENCE['batch_size']} rows once through; the data has {rows:,}")
    base = reference_run()
    base.update(data=str(data), steps=steps, warmup=warmup, window=window(warmup),
                field_size=field_size, model=model)
    exported: set[int] = set()      # DeepCTR's arrays written by this run, by their rows
    sparsity = _run_worker("sparsity", {"data": str(data), "batch_size": base["batch_size"]})
    print(f"data {data}: {sparsity['distinct_rows_per_batch']:,.0f} distinct table rows per "
          f"batch of {base['batch_size']}", flush=True)
    out = {"machine": describe_machine(), "data": str(data), "config": {**REFERENCE, "rows": rows,
           "feature_size": feature_size, "steps": steps, "warmup": warmup, "repeats": repeats,
           "model": model}, **sparsity, "variants": {},
           "allocator": "glibc defaults" if system_malloc else
           " ".join(f"{k}={v}" for k, v in KEEP_FREED_MEMORY.items())}
    allocator = {} if system_malloc else KEEP_FREED_MEMORY
    if allocator:
        print(f"every run with glibc keeping the memory it frees ({out['allocator']}; "
              "--system-malloc: its defaults)", flush=True)
    # Repeats go round in rounds, each run with its peers measured beside it, the order within
    # a round reversed every other round (A B, B A): this VM's speed drifts by tens of percent
    # over minutes (the dense limit moved from 150k to 230k ex/s between variants of one
    # invocation), which runs made apart, or always in the same order, would take for the
    # trainers'. A ratio is taken within a round, and its spread is reported.
    peers = []                        # (kind, variant): a variant's dense limit and DeepCTR
    deepctr_params, est_params = {}, None
    for name, over in variants.items():
        run = {**base, **over}
        if run["model"] in DENSE_LIMIT_MODELS:
            peers.append(("dense", name))
        if deepctr_python and run["model"] not in DEEPCTR_MODELS:
            print(f"{name}: DeepCTR has no {run['model']}", flush=True)
        elif deepctr_python:
            # Exported anew by each run of the command (the data may have changed since).
            need = (warmup + steps) * run["batch_size"]
            arrays = work / "arrays" / f"deepctr-{need}.npz"
            if need not in exported:
                from .quality import export_arrays
                arrays.parent.mkdir(parents=True, exist_ok=True)
                export_arrays(str(data), arrays, rows=need)
                exported.add(need)
            deepctr_params[name] = _deepctr_params(run, feature_size, arrays, schema)
            peers.append(("deepctr", name))
    if estimator_python:
        m, base_dir = resolve_source(str(data))
        # The sample's input fills a 500,000-record buffer before its steps run at their
        # speed: its warm-up lasts until the buffer is full (or the data is read once, when
        # smaller), then 100 steps are timed. The files themselves: `data` may be a glob or
        # files without a manifest.
        est_warmup = math.ceil(min(m.records, ESTIMATOR_BUFFER) / base["batch_size"])
        est_params = {**base, "feature_size": feature_size, "l2": base["l2_reg"],
                      "learning_rate": 1e-3,
                      "files": [os.path.join(base_dir, f.path) for f in m.files],
                      "compression": m.compression, "steps": min(steps, 100),
                      "warmup": est_warmup}

    def measure(kind: str, name: str | None) -> dict:
        load = LoadWindow()
        if kind == "train":
            r = _run_worker("train", {**base, **variants[name]}, allocator)
        elif kind == "dense":
            r = _run_worker("dense", {**base, **variants[name], "steps": 200, "warmup": 20},
                            allocator)
        elif kind == "deepctr":
            r = run_json([deepctr_python, str(Path(__file__).with_name("deepctr_runner.py")),
                          json.dumps(deepctr_params[name])], "DeepCTR", env=allocator)[-1]
        else:
            r = _estimator_run(estimator_python, est_params, allocator)
        return {**r, "load": load.report(r.get("cpu_s"))}

    got: dict = {}                    # (kind, variant) -> its runs, one a round
    order = []
    first = next(iter(variants))
    rounds = []
    for i in range(repeats):
        # A round: each variant's run, then its peers; the Estimator's beside the first
        # variant's.
        tasks = [t for name in variants for t in
                 [("train", name)] + [p for p in peers if p[1] == name]
                 + ([("estimator", None)] if name == first and est_params else [])]
        rounds.append(tasks[::-1] if i % 2 else tasks)
    total = sum(map(len, rounds))
    for kind, name in (t for tasks in rounds for t in tasks):
        order.append(f"{kind} {name}" if name else kind)
        r = measure(kind, name)
        got.setdefault((kind, name), []).append(r)
        # A line a run: a bench of the family beside DeepCTR runs for most of an hour, and
        # its report is written at the end.
        print(f"run {len(order)}/{total}: {order[-1]}: {r['examples_per_s']:,.0f} ex/s"
              f"{' (contended)' if r['load'].get('contended') else ''}", flush=True)
    runs_of = {k: [r["examples_per_s"] for r in v] for k, v in got.items()}
    contended = sum(r["load"].get("contended", False) for v in got.values() for r in v)
    out.update(order=order, contended_runs=contended)

    def spread(xs: list[float]) -> dict:
        return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}

    for name, over in variants.items():
        run = {**base, **over}
        runs = got[("train", name)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]
               if isinstance(runs[0][k], (int, float)) and not isinstance(runs[0][k], bool)}
        med.update(model=run["model"], runs=runs_of[("train", name)], settings=over,
                   loads=[r["load"] for r in runs])
        limit = "dense limit: DeepFM's MLP, not this model's part"
        if ("dense", name) in got:
            dense = runs_of[("dense", name)]
            # The ratio of each run to the dense limit measured in its round, then the median.
            ratios = [r / d for r, d in zip(runs_of[("train", name)], dense)]
            med.update(dense_limit_examples_per_s=statistics.median(dense),
                       dense_limit_runs=dense, ratio_runs=ratios,
                       dense_limit_loads=[r["load"] for r in got[("dense", name)]],
                       ratio_to_dense_limit=statistics.median(ratios),
                       ratio_to_dense_limit_spread=spread(ratios))
            limit = (f"dense limit {statistics.median(dense):>9,.0f} ex/s  ratio "
                     f"{med['ratio_to_dense_limit']:.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
        out["variants"][name] = med
        print(f"{name:24s} {run['model']:9s} {med['examples_per_s']:>9,.0f} ex/s  step "
              f"{med['step_ms']:6.2f} ms (input wait {med['input_ms']:5.2f} ms, compute "
              f"{med['compute_ms']:6.2f} ms, input-bound {med['input_bound']:.1%})  {limit}  "
              f"peak RSS {med['peak_rss_mb']:,.0f} MB", flush=True)
        if ("deepctr", name) in got:
            peer = got[("deepctr", name)]
            eps = runs_of[("deepctr", name)]
            ratios = [r / d for r, d in zip(runs_of[("train", name)], eps)]
            med.update(deepctr={"examples_per_s": statistics.median(eps), "runs": eps,
                                "step_ms": statistics.median(r["step_ms"] for r in peer),
                                "tensorflow": peer[0]["tensorflow"],
                                "loads": [r["load"] for r in peer]},
                       ratio_to_deepctr=statistics.median(ratios),
                       ratio_to_deepctr_runs=ratios, ratio_to_deepctr_spread=spread(ratios))
            print(f"{'':24s} DeepCTR 0.9.4 {statistics.median(eps):>9,.0f} ex/s (TF "
                  f"{peer[0]['tensorflow']}): ctrtrain {med['ratio_to_deepctr']:.2f}x "
                  f"({min(ratios):.2f}-{max(ratios):.2f} by round)", flush=True)
    if est_params:
        est = got[("estimator", None)]
        eps = runs_of[("estimator", None)]
        out["estimator_sample"] = {
            "examples_per_s": statistics.median(eps), "runs": eps,
            "tensorflow": est[0]["tensorflow"], "warmup_steps": est_params["warmup"],
            "measured_steps": est_params["steps"], "curve": est[0]["curve"],
            "loads": [r["load"] for r in est]}
        curve = ", ".join(f"{c['examples_per_s']:,.0f}" for c in est[0]["curve"])
        print(f"{'SageMaker sample Estimator':24s} {statistics.median(eps):>9,.0f} ex/s (TF "
              f"{est[0]['tensorflow']}; {est_params['steps']} steps timed after "
              f"{est_params['warmup']} of warm-up; ex/s by 50 steps from the start: {curve})",
              flush=True)
        for name, v in out["variants"].items():
            ratios = [r / e for r, e in zip(runs_of[("train", name)], eps)]
            v.update(ratio_to_estimator_sample=statistics.median(ratios),
                     ratio_to_estimator_sample_runs=ratios,
                     ratio_to_estimator_sample_spread=spread(ratios))
            print(f"{name:24s} {v['ratio_to_estimator_sample']:.2f}x the Estimator sample "
                  f"({min(ratios):.2f}-{max(ratios):.2f} by round)", flush=True)
    if contended:
        print(f"warning: {contended} run(s) shared the machine with other processes (more "
              f"than {CONTENDED_CORES} cores of other load): see each run's `load` in the "
              "report", flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=2) + "\n")
    return out


def run_multi_hot_bench(work_dir="runs/bench-train", rows=REFERENCE["rows"],
                        feature_size=REFERENCE["feature_size"], fields: int = 5, length: int = 5,
                        steps=300, warmup=50, repeats=3, json_path=None) -> dict:
    """The reference configuration on the one-hot reference data and on the same data with
    `fields` categorical fields made bags of 0 to `length` ids, in one run (repeats go round
    the two, so machine drift falls on both alike). A bag is more ids per example, so the
    figure compared is ids per second: examples/s x ids per example."""
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    sets = {"one-hot": prepare_reference_data(work, rows, feature_size),
            f"multi-hot {fields}x{length}": prepare_bag_data(work, rows, feature_size,
                                                             fields, length)}
    base = reference_run()
    base.update(steps=steps, warmup=warmup, window=window(warmup))
    out = {"machine": describe_machine(), "config": {**REFERENCE, "rows": rows,
           "feature_size": feature_size, "steps": steps, "warmup": warmup, "repeats": repeats,
           "multi_hot_fields": fields, "multi_hot_len": length}, "sets": {}}
    stats = {name: _run_worker("sparsity", {"data": str(d), "batch_size": base["batch_size"]})
             for name, d in sets.items()}
    runs: dict[str, list] = {name: [] for name in sets}
    for _ in range(repeats):
        for name, d in sets.items():
            runs[name].append(_run_worker("train", {**base, "data": str(d)}))
    for name, d in sets.items():
        med = {k: statistics.median(r[k] for r in runs[name]) for k in runs[name][0]}
        med.update(stats[name], data=str(d), runs=[r["examples_per_s"] for r in runs[name]],
                   ids_per_s=med["examples_per_s"] * stats[name]["ids_per_example"])
        out["sets"][name] = med
        print(f"{name:18s} {med['examples_per_s']:>9,.0f} ex/s  {med['ids_per_example']:5.1f} ids "
              f"per example  {med['ids_per_s']:>11,.0f} ids/s  "
              f"{med['distinct_rows_per_batch']:>7,.0f} distinct rows per batch  "
              f"step {med['step_ms']:6.2f} ms (input-bound {med['input_bound']:.1%})", flush=True)
    one, multi = out["sets"].values()
    out["ids_per_s_ratio"] = multi["ids_per_s"] / one["ids_per_s"]
    print(f"multi-hot / one-hot ids per second: {out['ids_per_s_ratio']:.2f}", flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    kind, params = sys.argv[1], json.loads(sys.argv[2])
    if kind == "sparsity":
        result = batch_stats(params["data"], params["batch_size"])
    else:
        result = (_train_worker if kind == "train" else _dense_worker)(params)
    print(json.dumps(result))
