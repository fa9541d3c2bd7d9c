"""`ctrtrain bench quality`: how good a model each way of training gives, on a fixed protocol.

Each data set (a directory with train/, valid/ and test/ data directories) is trained for a
fixed number of epochs by every variant: ctrtrain with each `table_updates` (catchup, lazy,
dense: the dense reference), and DeepCTR 0.9.4's implementation of the same model (`--model`:
DeepFM by default; DEEPCTR_MODELS) when its environment is there (scripts/deepctr_env.sh), on
the same fields (declared ones too: DIN's history and target as ctrtrain's DIN picks them) and
with the model options the variants train with (`auto:din_target=C1`).
After every epoch each variant's model is evaluated on the validation and the test split
(AUC, logloss); the figure a run is judged by is the test AUC at the epoch
with the best validation AUC (early stopping on validation, keeping the best epoch). Every run
is a fresh process with the same configuration (embedding 16, MLP 256-128-64, dropout 0.5,
batch 1024, Adam 1e-3, L2 1e-4 as the SageMaker sample's l2_reg: the issue's peer comparison):
the `sample` protocol. The `defaults` protocol runs each trainer as its user gets it: ctrtrain
with `ctrtrain train`'s defaults, DeepCTR with its model functions' defaults (embedding 4,
MLP 256-128-64, dropout 0, L2 1e-5 on the embeddings and the linear part, Adam 1e-3: the
defaults of DeepFM(), WDL(), DCN(), ... and SparseFeat) and the batch of its examples (256),
both on the same model structure (DCN-v2's matrix cross, the CIN's and DIN's forms); with
--batch-size both train with that batch.

Without data sets given, a synthetic long-tail set is made once in the work directory: Criteo's
39 fields and cardinalities scaled to 200,000 rows of table, ids Zipf(0.7) within each field
(about 8,000 distinct rows per batch of 1024, as real Criteo), labels from a hidden FM with
a known Bayes-optimal AUC.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from ..data.files import staged
from ..errors import ConfigError
from ..models import MODELS
from ..train.config import TABLE_UPDATES
from .machine import describe_machine
from .runner import run_json

CONFIG = {"embedding_size": 16, "deep_layers": [256, 128, 64], "dropout": 0.5,
          "batch_size": 1024, "learning_rate": 1e-3, "l2": 1e-4, "seed": 0}
VARIANTS = ("auto", *TABLE_UPDATES)     # auto: the default, as a user gets it
LONG_TAIL = {"rows": 500_000, "feature_size": 200_000, "zipf": 0.7}
PROTOCOLS = ("sample", "defaults")
DEEPCTR_EXAMPLES_BATCH = 256    # DeepCTR's examples' model.fit(batch_size=256)
BAR = 0.002    # the default's (and catchup's) test AUC may trail dense's by at most this
# ctrtrain's models DeepCTR also has (deepctr_runner.py builds them): LR, FM and DLRM it has not.
DEEPCTR_MODELS = ("deepfm", "wide_deep", "dcn_v2", "xdeepfm", "autoint", "din")


def long_tail_data(work: Path) -> Path:
    from ..data.synth import SynthConfig, synthesize
    out = work / "synth-long-tail"
    if (out / "synth.json").exists():
        return out
    synthesize(out, SynthConfig(rows=LONG_TAIL["rows"], feature_size=LONG_TAIL["feature_size"],
                                zipf=LONG_TAIL["zipf"]), overwrite=True)
    return out


def split_variants(text: str) -> list[str]:
    """`auto,catchup:adam_epsilon=1e-8,output_bias=zero` -> ["auto", "catchup:adam_epsilon=1e-8,
    output_bias=zero"]: a comma starts a new variant unless what follows is one more setting
    (key=value without a `:`) of the one before."""
    variants: list[str] = []
    for piece in text.split(","):
        if variants and "=" in piece and ":" not in piece:
            variants[-1] += "," + piece
        else:
            variants.append(piece)
    return variants


def variant_settings(variant: str) -> dict:
    """`catchup` or `catchup:adam_epsilon=1e-8,output_bias=zero`: table_updates and other
    training settings (by their names in `ctrtrain train --help`)."""
    from ..train.config import settings_from_mapping
    updates, _, rest = variant.partition(":")
    raw = {"table_updates": updates}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"variant {variant!r}: {item!r} is not key=value")
        raw[key.strip()] = value.strip()
    return settings_from_mapping(raw, f"variant {variant!r}")


def peer_options(model: str, variants, schema) -> dict:
    """The model's options for DeepCTR's one run: those every variant trains with (the
    defaults, or the variants' own settings, which must then agree); for din, the history and
    target resolved from the data's declared fields (`schema`) as ctrtrain's DIN resolves them."""
    defaults = {n: o.default for n, o in MODELS[model].options.items()}
    chosen = [{**defaults, **{k: v for k, v in variant_settings(v).items() if k in defaults}}
              for v in variants] or [defaults]
    if any(c != chosen[0] for c in chosen):
        raise ConfigError(f"--deepctr-python: the variants train {model} with different options "
                          f"({', '.join(variants)}); DeepCTR's one run needs the same for all")
    return with_din_fields(model, chosen[0], schema)


def peer_refusal(params: dict, schema) -> str | None:
    """Why deepctr_runner.py cannot run DeepCTR with `params` (the model, its options,
    numeric_as) on data of this declared schema (None: the fixed schema), or None: the
    runner's own check (deepctr_runner.unfed), asked before any run."""
    from .deepctr_runner import unfed
    return unfed(params, None if schema is None else schema.to_json())


def with_din_fields(model: str, options: dict, schema) -> dict:
    """The options with, for din, the history and target resolved from the data's declared
    fields (`schema`) as ctrtrain's DIN resolves them: DeepCTR's runner names them."""
    if model != "din":
        return options
    from ..models.din import din_fields
    *_, target, history = din_fields(
        [(f.name, f.kind) for f in schema.fields] if schema else [], options)
    return {**options, "din_target": target, "din_sequence": history}


def _ctrtrain_worker(p: dict) -> list[dict]:
    """One ctrtrain run; its evaluations per epoch."""
    from ..data.index import resolve_source
    from ..train import train
    from ..train.config import TrainConfig, table_scale
    # An epoch is the whole batches of the training set, as training counts it, at the batch
    # the run trains with (a variant's own, `auto` resolved as training resolves it).
    records = resolve_source(p["train"])[0].records
    settings = variant_settings(p["variant"])
    batch = settings.get("batch_size", p["batch_size"])
    batch = table_scale(records)["batch_size"] if batch == "auto" else batch
    steps_per_epoch = records // batch
    with tempfile.TemporaryDirectory() as md:
        # The protocol's model settings that the model reads (LR has no MLP, ...); none for
        # the defaults protocol (the training defaults).
        shape = {"embedding_size": p["embedding_size"], "deep_layers": tuple(p["deep_layers"]),
                 "dropout": p["dropout"], "learning_rate": p["learning_rate"],
                 "l2_reg": p["l2"]} if p.get("protocol", "sample") == "sample" else {}
        reads = {*MODELS[p["model"]].reads, "learning_rate", "l2_reg"}
        base = dict(
            train_dir=p["train"], valid_dir=p["valid"], test_dir=p["test"], model_dir=md,
            model=p["model"], **{k: v for k, v in shape.items() if k in reads},
            batch_size=p["batch_size"], seed=p["seed"], epochs=p["epochs"],
            eval_every=steps_per_epoch,
            eval_test=True, checkpoint_every=0, export=False, progress=False, quiet=True,
            # Every epoch trained and its last model evaluated: the protocol picks the best.
            early_stopping=0, export_best=False)
        cfg = TrainConfig(**{**base, **settings})
        r = train(cfg)      # resolves table_updates auto in cfg
        events = [json.loads(line) for line in (Path(md) / "metrics.jsonl").read_text().splitlines()]
    epochs: dict[int, dict] = {}
    for e in events:
        if e["event"] == "eval":
            epoch = e["step"] // steps_per_epoch
            epochs.setdefault(epoch, {"epoch": epoch})[e["split"]] = {
                "auc": e["auc"], "logloss": e["logloss"]}
    out = [epochs[k] for k in sorted(epochs)]
    out[-1]["examples_per_s"] = r.get("examples_per_s")
    out[-1]["table_updates"] = cfg.table_updates
    out[-1]["settings"] = {k: getattr(cfg, k) for k in (
        "embedding_size", "deep_layers", "dropout", "l2_reg", "learning_rate", "batch_size")}
    return out


def export_arrays(split_dir: str, out: Path, rows: int | None = None) -> Path:
    """A split (its first `rows` records, in file order) as labels/ids/values arrays (read by
    ctrtrain's own reader) for DeepCTR; with declared fields also its numeric, bag_ids and
    bag_weights arrays (docs/fields.md, "Batches and serving") and `fields`, the declaration
    as JSON."""
    import numpy as np

    from ..input.pipeline import PipelineConfig, dataset_from_dir
    ds, m = dataset_from_dir(split_dir, PipelineConfig(batch_size=8192), training=False)
    if rows is not None:
        ds = ds.unbatch().take(rows).batch(8192)
    keys = {"labels": "label", "ids": "ids", "values": "values", "numeric": "numeric",
            "bag_ids": "bag_ids", "bag_weights": "bag_weights"}   # array: batch key (the last
                                                                  # three: declared fields)
    parts: dict[str, list] = {}
    for b in ds:
        for k, key in keys.items():
            if key in b:
                parts.setdefault(k, []).append(b[key].numpy())
    arrays = {k: np.concatenate(v) for k, v in parts.items()}
    if m.fields is not None:    # a 0-d string array: np.load reads it without pickle
        arrays["fields"] = np.array(json.dumps(m.schema.to_json()))
    np.savez(out, **arrays)
    return out


def selected(epochs: list[dict]) -> dict:
    """The epoch with the best validation AUC, and its test figures."""
    best = max(epochs, key=lambda e: e["valid"]["auc"])
    return {"epoch": best["epoch"], "test_auc": best["test"]["auc"],
            "test_logloss": best["test"]["logloss"]}


def over_seeds(picked: list[dict]) -> dict:
    """The selected test AUCs of one trainer's runs with different seeds: their mean and its
    standard error (the spread of the runs / sqrt(n); 0 for one run)."""
    import statistics
    aucs = [p["test_auc"] for p in picked]
    se = statistics.stdev(aucs) / len(aucs) ** 0.5 if len(aucs) > 1 else 0.0
    return {"test_auc": statistics.fmean(aucs), "se": se, "runs": aucs,
            "epochs": [p["epoch"] for p in picked]}


def last_epoch(epochs: list[dict]) -> dict:
    """The last epoch's test figures (a fixed number of epochs, no validation to choose by)."""
    e = epochs[-1]
    return {"epoch": e["epoch"], "test_auc": e["test"]["auc"],
            "test_logloss": e["test"]["logloss"]}


def difference(a: dict, b: dict) -> dict:
    """a's mean test AUC minus b's (over_seeds), with the standard error of the difference."""
    return {"test_auc": a["test_auc"] - b["test_auc"], "se": (a["se"] ** 2 + b["se"] ** 2) ** 0.5}


def run_quality_bench(datasets: list[tuple[str, str]], work_dir: str, epochs: int,
                      variants=VARIANTS, deepctr_python: str | None = None,
                      out: str | None = None, batch_size: int | None = None,
                      model: str = "deepfm", seeds: int = 1,
                      peer_numeric: str = "dense", protocol: str = "sample") -> dict:
    """`batch_size`: instead of the configuration's 1024 (small data sets). `model`: what
    every run trains (MODELS; its own options at their defaults); DeepCTR runs only for the
    models it has (DEEPCTR_MODELS). `seeds`: every run repeated with seeds 0..seeds-1 (initial
    values, dropout, shuffling), reported per seed and as a mean with its
    standard error: a difference of 0.002 is within one run's seed-to-seed spread.
    `peer_numeric`: how DeepCTR takes the fixed schema's numeric columns (deepctr_runner's
    numeric_as: "dense", as its users do, or "scaled", as ctrtrain's model does).
    `protocol`: PROTOCOLS (module doc)."""
    from ..data.index import resolve_source
    from ..train.config import TrainConfig
    if protocol == "sample":
        config = {**CONFIG, **({"batch_size": batch_size} if batch_size else {})}
    else:
        config = {"batch_size": batch_size or TrainConfig.batch_size, "seed": CONFIG["seed"]}
    config.update(model=model, protocol=protocol,
                  options={n: o.default for n, o in MODELS[model].options.items()})
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    if not datasets:
        datasets = [("synthetic long tail", str(long_tail_data(work)))]
    report = {"machine": describe_machine(), "config": config, "epochs": epochs, "sets": {},
              "complete": False}
    # Every set read and checked before the first run: a clear error now, not in a worker
    # an hour into the suite.
    for variant in variants:
        variant_settings(variant)
    peer = bool(deepctr_python) and model in DEEPCTR_MODELS
    read = {}
    for name, root in datasets:
        splits = {s: str(Path(root) / s) for s in ("train", "valid", "test")}
        manifests = {s: resolve_source(d)[0] for s, d in splits.items()}
        records = manifests["train"].records
        if isinstance(config["batch_size"], int) and config["batch_size"] > records:
            raise ConfigError(f"{name}: its training split has {records} records, fewer than "
                              f"one batch of {config['batch_size']}: give --batch-size (for "
                              "every set of the run) or run this set on its own")
        options = None
        if peer:    # likewise: what DeepCTR's run trains with, and that the runner can feed it
            schema = manifests["train"].schema
            options = peer_options(model, variants, schema)
            why = peer_refusal({**config, "options": options, "numeric_as": peer_numeric},
                               schema)
            if why:
                raise ConfigError(f"{name}: --deepctr-python: {why}")
        read[name] = (root, splits, manifests, options)
    for name, (root, splits, manifests, options) in read.items():
        commands = {}       # label: (argv but the parameters, parameters)
        for variant in variants:
            commands[f"ctrtrain {variant}"] = (
                [sys.executable, "-m", "ctrtrain.bench.quality"],
                {**config, **splits, "epochs": epochs, "variant": variant})
        if deepctr_python and model not in DEEPCTR_MODELS:
            print(f"[{name}] DeepCTR has no {model}: no peer run", flush=True)
        elif peer:
            arrays = work / "arrays" / name.replace(" ", "-")
            arrays.mkdir(parents=True, exist_ok=True)
            params = {**config, "options": options, "epochs": epochs,
                      "feature_size": manifests["train"].feature_size,
                      "numeric_as": peer_numeric}
            if protocol == "defaults" and not batch_size:
                params["batch_size"] = DEEPCTR_EXAMPLES_BATCH
            for s, d in splits.items():
                params[s] = str(export_arrays(d, arrays / f"{s}.npz"))
            commands["deepctr"] = (
                [deepctr_python, str(Path(__file__).with_name("deepctr_runner.py"))], params)
        per_seed: dict[str, list] = {label: [] for label in commands}
        for seed in range(config["seed"], config["seed"] + seeds):
            for label, (argv, params) in commands.items():
                print(f"[{name}] {label} {model} seed {seed} ...", flush=True)
                run = run_json(argv + [json.dumps({**params, "seed": seed})], label,
                               timeout=6 * 3600, fork=True)
                per_seed[label].append(run)
                # Each run's figures as it ends: a long suite stopped part-way still says
                # what it measured.
                best, end = selected(run), last_epoch(run)
                print(f"[{name}] {label} {model} seed {seed}: test AUC {best['test_auc']:.4f} "
                      f"at the best validation epoch ({best['epoch']}), {end['test_auc']:.4f} "
                      f"at the last ({end['epoch']})", flush=True)
        results = {label: runs[0] for label, runs in per_seed.items()}
        entry = {"data": root, "runs": results,
                 "selected": {k: selected(v) for k, v in results.items()}}
        if seeds > 1:
            entry["seeds"] = {k: [dict(seed=config["seed"] + i, epochs=run)
                                  for i, run in enumerate(v)] for k, v in per_seed.items()}
            # Two protocols: the best validation epoch's model (a user with a validation
            # set), and the last epoch's (a fixed number of epochs).
            for key, pick in (("", selected), ("_last", last_epoch)):
                entry["over_seeds" + key] = {k: over_seeds([pick(run) for run in v])
                                             for k, v in per_seed.items()}
                if "deepctr" in per_seed:
                    means = entry["over_seeds" + key]
                    entry["minus_deepctr" + key] = {
                        k: difference(means[k], means["deepctr"])
                        for k in per_seed if k != "deepctr"}
        report["sets"][name] = entry
        print(format_set(name, entry), flush=True)
        if out:     # each set as it ends, marked incomplete until the last one has
            _write_report(out, report)
    if len(report["sets"]) > 1 and seeds > 1 and peer:
        report["suite"] = suite_summary(report)
        print(format_suite(report["suite"]), flush=True)
    report["complete"] = True
    if out:
        _write_report(out, report)
        plot_curves(report, Path(out).with_suffix(".png"))
    return report


def _write_report(out: str, report: dict) -> None:
    with staged(out, "w") as f:
        f.write(json.dumps(report, indent=2) + "\n")


def plot_curves(report: dict, path: Path) -> None:
    """Test AUC after each epoch, one line per trainer (the mean over seeds, the band their
    range), one panel per data set: where each peaks and how fast it falls after."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    sets = report["sets"]
    fig, axes = plt.subplots(1, len(sets), figsize=(6.5 * len(sets), 4.2), squeeze=False)
    for ax, (name, s) in zip(axes[0], sets.items()):
        runs = s.get("seeds") or {k: [{"epochs": v}] for k, v in s["runs"].items()}
        for label, seeds in runs.items():
            auc = np.array([[e["test"]["auc"] for e in r["epochs"]] for r in seeds])
            epochs = np.arange(1, auc.shape[1] + 1)
            line, = ax.plot(epochs, auc.mean(0), marker="o", ms=3, label=label)
            if len(seeds) > 1:
                ax.fill_between(epochs, auc.min(0), auc.max(0), color=line.get_color(), alpha=0.15)
        n = len(next(iter(runs.values())))
        ax.set_title(f"{name}: test AUC by epoch" + (f" (mean of {n} seeds, band: range)"
                                                      if n > 1 else ""), fontsize=10)
        ax.set_xlabel("epoch")
        ax.set_ylabel("test AUC")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def format_set(name: str, s: dict) -> str:
    runs = s["runs"]
    n = max(len(v) for v in runs.values())
    lines = [f"### {name}", "", "| epoch | " + " | ".join(runs) + " |",
             "|---|" + "---|" * len(runs)]
    for i in range(n):
        cells = []
        for v in runs.values():
            e = v[i] if i < len(v) else None
            cells.append(f"{e['test']['auc']:.4f} / {e['test']['logloss']:.4f}" if e else "")
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    sel = s["selected"]
    lines.append("| table_updates | " + " | ".join(
        v[-1].get("table_updates", "") for v in runs.values()) + " |")
    lines.append("| best valid epoch: test AUC | " + " | ".join(
        f"{sel[k]['test_auc']:.4f} (epoch {sel[k]['epoch']})" for k in runs) + " |")
    # Both protocols over the seeds: the best validation epoch's model, the last epoch's.
    for key, what in (("", "best valid epoch"), ("_last", "last epoch")):
        if "over_seeds" + key not in s:
            continue
        means = s["over_seeds" + key]
        lines.append(f"| {what}, mean of {len(next(iter(means.values()))['runs'])} seeds (SE) | "
                     + " | ".join(f"{means[k]['test_auc']:.4f} ({means[k]['se']:.4f})"
                                  for k in runs) + " |")
    for key, what in (("", "best valid epoch"), ("_last", "last epoch")):
        for k, d in s.get("minus_deepctr" + key, {}).items():
            lines.append(f"{what}: {k} - deepctr: {d['test_auc']:+.4f} (SE {d['se']:.4f})")
    return "\n".join(lines)


def suite_summary(report: dict) -> dict:
    """Over the sets with DeepCTR's runs, for each ctrtrain variant and each protocol (the best
    validation epoch; the last epoch): the mean over the sets of ctrtrain's mean test AUC minus
    DeepCTR's, and the sets where ctrtrain's is below DeepCTR's mean minus DeepCTR's standard
    error (the quality issue's bar)."""
    import statistics
    out = {}
    for protocol, key in (("best valid epoch", "over_seeds"), ("last epoch", "over_seeds_last")):
        per: dict[str, dict] = {}
        for name, s in report["sets"].items():
            means = s.get(key, {})
            if "deepctr" not in means:
                continue
            peer = means["deepctr"]
            for k, m in means.items():
                if k != "deepctr":
                    per.setdefault(k, {})[name] = (m["test_auc"] - peer["test_auc"], peer["se"])
        out[protocol] = {k: {"mean_minus_deepctr": statistics.fmean(d for d, _ in v.values()),
                             "below_bar": sorted(n for n, (d, se) in v.items() if d < -se),
                             "sets": len(v)} for k, v in per.items()}
    return out


def format_suite(suite: dict) -> str:
    lines = ["### the suite: ctrtrain minus DeepCTR, mean over the sets", "",
             "| protocol | variant | mean difference | sets below DeepCTR - 1 SE |", "|---|---|---|---|"]
    for protocol, variants in suite.items():
        for k, v in variants.items():
            below = ", ".join(v["below_bar"]) or "none"
            lines.append(f"| {protocol} | {k} | {v['mean_minus_deepctr']:+.4f} "
                         f"({v['sets']} sets) | {below} |")
    return "\n".join(lines)


def check_bar(report: dict, variants=("ctrtrain auto", "ctrtrain catchup"),
              reference: str = "ctrtrain dense") -> list[str]:
    """Where a variant's test AUC trails the reference's by more than BAR, at any epoch."""
    fails = []
    for name, s in report["sets"].items():
        runs = s["runs"]
        for variant in variants:
            if variant not in runs or reference not in runs:
                continue
            for a, b in zip(runs[variant], runs[reference]):
                if a["test"]["auc"] < b["test"]["auc"] - BAR:
                    fails.append(f"{variant} vs {reference}: {name} epoch {a['epoch']}: "
                                 f"{a['test']['auc']:.4f} < {b['test']['auc']:.4f} - {BAR}")
    return fails


if __name__ == "__main__":
    for line in _ctrtrain_worker(json.loads(sys.argv[1])):
        print(json.dumps(line))
