"""`ctrtrain bench continual`: a model retrained day by day, judged on the next day.

Over a stream of days (data/stream.py, `data synth --days`), each arm trains after every day
but the last and is tested on the day after it -- what a model in production meets:

    dynamic  as warm, every field dynamic (`train --dynamic-fields all`): each raw value
             claims a row of its field's buckets, the same memory as warm's fixed table
    warm     the day's data, starting from yesterday's model (`train --warm-start`)
    scratch  every day so far, from nothing (the retrain that forgets nothing, at a cost that
             grows with the days)
    day      the day's data alone, from nothing (what the others must beat)

(day 0 is one run for the fixed-table arms, another for dynamic: the first day, from
nothing). Per day: each arm's test AUC beside
the next day's Bayes-optimal AUC, its seconds of training
and examples/s, and its table's rows and bytes (with the optimizer's slots). Every arm uses
the same settings; runs are forked from one server (bench/runner.py) and read their figures
from result.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import ConfigError

ARMS = ("dynamic", "warm", "scratch", "day")
# What the dynamic arm's map adds per pool row: the key, count, last-seen step and queue
# variables (int64 each) and the hash table's key and slot (at most one entry a row; the
# hash map's own overhead not counted).
MAP_BYTES_PER_ROW = 6 * 8
SLOTS = {"adam": 2, "adagrad": 1, "ftrl": 2, "sgd": 0, "momentum": 1}


def run_continual_bench(stream: str | None, work_dir: str, *, days: int | None = None,
                        arms=ARMS[1:], epochs: int = 1, settings: dict | None = None,
                        json_path: str | None = None, synth: dict | None = None) -> dict:
    """Runs the arms over the stream's days (or its first `days`) and returns the report; a
    stream is synthesized in work_dir (with `synth`'s StreamConfig settings) when none is
    given."""
    from ..data.stream import STREAM_INFO, StreamConfig, day_name, synthesize_days
    from .runner import run_json
    work = Path(work_dir)
    if stream is None:
        stream = work / "stream"
        if not (stream / STREAM_INFO).exists():
            print(f"[continual] synthesizing a stream in {stream} ...", flush=True)
            synthesize_days(stream, StreamConfig(**(synth or {})), overwrite=True)
    stream = Path(stream)
    try:
        info = json.loads((stream / STREAM_INFO).read_text())
    except (OSError, ValueError):
        raise ConfigError(f"--stream {stream}: no {STREAM_INFO} (write one with `ctrtrain "
                          "data synth --days D`)") from None
    total = len(info["days"]) if days is None else min(days, len(info["days"]))
    if total < 2:
        raise ConfigError(f"--stream {stream}: {total} day(s); a model is tested on the day "
                          "after its training, so at least 2 are needed")
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise ConfigError(f"--arms: {', '.join(unknown) or 'none'}: choose from {', '.join(ARMS)}")
    # Fixed for every arm: `auto` would size the model by the rows a run trains on, and the
    # scratch arm, on every day so far, would train a wider one than the others.
    # A log window every 20 steps: examples/s after the first window (tracing) is measured.
    settings = {"batch_size": 1024, "embedding_size": 16, "log_every": 20, **(settings or {})}
    flags = [f for k, v in settings.items() for f in (f"--{k.replace('_', '-')}", str(v))]
    rows = []
    # On day 0 the fixed-table arms are the same run (the first day, from nothing): run once.
    fixed_first = next((a for a in arms if a != "dynamic"), None)

    def owner(arm, d):
        return arm if arm == "dynamic" or d else fixed_first

    for d in range(total - 1):
        test = stream / day_name(d + 1)
        bayes = info["days"][d + 1]["bayes_auc"]
        for arm in arms:
            md = work / "runs" / owner(arm, d) / day_name(d)
            read = list(range(d + 1)) if arm == "scratch" else [d]   # the days it trains on
            train = [stream / day_name(k) for k in read]
            cmd = [sys.executable, "-m", "ctrtrain.cli", "train", "--quiet", "--fresh",
                   "--model-dir", str(md), "--test", str(test), "--epochs", str(epochs),
                   "--no-export", *flags, "--train", *map(str, train)]
            if arm in ("warm", "dynamic") and d:
                earlier = work / "runs" / owner(arm, d - 1) / day_name(d - 1)
                cmd += ["--warm-start", str(earlier)]
            if arm == "dynamic":
                cmd += ["--dynamic-fields", "all"]
            if arm == owner(arm, d):
                run_json(cmd, f"{arm} {day_name(d)}", timeout=6 * 3600, fork=True)
            r = json.loads((md / "result.json").read_text())
            cfg = json.loads((md / "train_config.json").read_text())
            width = _table_width(cfg)
            table_rows = int(cfg["feature_size"])
            row = {"day": d, "arm": arm, "test_day": d + 1, "test_auc": r["test"]["auc"],
                   "test_logloss": r["test"]["logloss"], "bayes_auc": bayes,
                   "train_rows": sum(info["days"][k]["rows"] for k in read),
                   "train_s": r["phases_s"]["training"],
                   "examples_per_s": r.get("examples_per_s"), "table_rows": table_rows,
                   "held_rows": (r.get("dynamic_rows") or {}).get("held"),
                   "table_bytes": table_rows * width * 4 * (1 + SLOTS.get(cfg["optimizer"], 2))
                   + (table_rows * MAP_BYTES_PER_ROW if arm == "dynamic" else 0)}
            rows.append(row)
            print(f"[continual] {day_name(d)} {arm:7s} test on {day_name(d + 1)}: AUC "
                  f"{row['test_auc']:.4f} (Bayes {bayes:.4f}), {row['train_s']:.1f} s of "
                  f"training on {row['train_rows']:,} rows", flush=True)
    report = {"stream": str(stream), "days": total, "arms": list(arms), "epochs": epochs,
              "settings": settings, "rows": rows, "summary": summarize(rows, arms)}
    print(table(report))
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
        plot(report, Path(json_path).with_suffix(".png"))
    return report


def _table_width(cfg: dict) -> int:
    """Floats a table row holds: the embedding and the linear weight beside it."""
    return int(cfg["embedding_size"]) + 1


def summarize(rows: list[dict], arms) -> dict:
    """Per arm: mean next-day AUC, its mean gap to the Bayes-optimal AUC, total seconds of
    training, the median of its runs' examples/s, and the table's bytes."""
    import statistics
    out = {}
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        speeds = [r["examples_per_s"] for r in mine if r["examples_per_s"]]
        out[arm] = {"mean_test_auc": sum(r["test_auc"] for r in mine) / len(mine),
                    "mean_gap_to_bayes": sum(r["bayes_auc"] - r["test_auc"] for r in mine) / len(mine),
                    "train_s": sum(r["train_s"] for r in mine),
                    "examples_per_s": statistics.median(speeds) if speeds else None,
                    "table_bytes": max(r["table_bytes"] for r in mine)}
    return out


def table(report: dict) -> str:
    arms = report["arms"]
    lines = ["| day (tested on the next) | Bayes AUC | " + " | ".join(
        f"{a} AUC | {a} s" for a in arms) + " |", "|---" * (2 + 2 * len(arms)) + "|"]
    by = {(r["day"], r["arm"]): r for r in report["rows"]}
    for d in sorted({r["day"] for r in report["rows"]}):
        cells = [f"{by[d, a]['test_auc']:.4f} | {by[d, a]['train_s']:.1f}" for a in arms]
        lines.append(f"| {d} | {by[d, arms[0]]['bayes_auc']:.4f} | " + " | ".join(cells) + " |")
    s = report["summary"]
    lines.append("| mean / total | | " + " | ".join(
        f"{s[a]['mean_test_auc']:.4f} | {s[a]['train_s']:.1f}" for a in arms) + " |")
    return "\n".join(lines)


def plot(report: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (auc, secs) = plt.subplots(1, 2, figsize=(11, 4))
    days = sorted({r["day"] for r in report["rows"]})
    first = report["arms"][0]
    auc.plot(days, [r["bayes_auc"] for r in report["rows"] if r["arm"] == first], "k--",
             label="Bayes-optimal")
    for arm in report["arms"]:
        mine = [r for r in report["rows"] if r["arm"] == arm]
        auc.plot(days, [r["test_auc"] for r in mine], "o-", label=arm)
        secs.plot(days, [r["train_s"] for r in mine], "o-", label=arm)
    auc.set(xlabel="trained through day", ylabel="test AUC on the next day",
            title="Next-day AUC")
    secs.set(xlabel="trained through day", ylabel="seconds of training",
             title="Training time a day")
    for ax in (auc, secs):
        ax.set_xticks(days)
    auc.legend(fontsize=8)
    secs.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
