"""The benchmark matrix's report: every cell as JSON and CSV, a Markdown ranking with costs and
a recommendation, and PNG plots (throughput per cell; input wait against compute per step)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from .cost import cost

INPUT_BOUND = 0.3   # above this share of step time waiting for input, a cell is input-bound


def price_cells(report: dict, prices: dict) -> list[dict]:
    """Adds `cost` to every successful cell; returns them ranked fastest first."""
    ok = [c for c in report["cells"] if "examples_per_s" in c]
    for c in ok:
        c["cost"] = cost(c["cell"], c["examples_per_s"], prices, report["train_examples"])
    return sorted(ok, key=lambda c: -c["examples_per_s"])


def _why(c: dict) -> str:
    ib = c.get("input_bound")
    if ib is None:
        return "asynchronous steps (input time is not measured on the chief)"
    if ib > INPUT_BOUND:
        return (f"input-bound ({ib:.0%} of step time waiting for data): offload input "
                "(tf.data service on CPU hosts), add data threads or cache")
    return f"compute-bound ({ib:.0%} of step time waiting for data): the model's compute sets the pace"


def recommend(ranked: list[dict]) -> dict:
    """The fastest and the cheapest cell, each with its margin over the runner-up."""
    if not ranked:
        return {"text": "no cell succeeded"}
    fastest = ranked[0]
    by_cost = sorted(ranked, key=lambda c: c["cost"]["usd_per_million_examples"])
    cheapest = by_cost[0]
    out = {"fastest": fastest["cell"]["name"], "cheapest": cheapest["cell"]["name"]}
    lines = []
    if len(ranked) > 1:
        margin = fastest["examples_per_s"] / ranked[1]["examples_per_s"] - 1
        out["fastest_margin"] = margin
        lines.append(f"Fastest: **{fastest['cell']['name']}**, {fastest['examples_per_s']:,.0f} "
                     f"examples/s, {margin:.0%} ahead of {ranked[1]['cell']['name']}; {_why(fastest)}.")
    else:
        lines.append(f"Fastest: **{fastest['cell']['name']}** (the only cell); {_why(fastest)}.")
    priced = [c for c in by_cost if c["cost"]["usd_per_hour"] > 0]
    if priced:
        cheapest = priced[0]
        out["cheapest"] = cheapest["cell"]["name"]
        cpm = cheapest["cost"]["usd_per_million_examples"]
        if len(priced) > 1:
            nxt = priced[1]["cost"]["usd_per_million_examples"]
            out["cheapest_margin"] = 1 - cpm / nxt
            lines.append(f"Cheapest: **{cheapest['cell']['name']}**, ${cpm:.5f} per million examples, "
                         f"{1 - cpm / nxt:.0%} cheaper than {priced[1]['cell']['name']}; "
                         f"{_why(cheapest)}.")
        else:
            lines.append(f"Cheapest: **{cheapest['cell']['name']}**, ${cpm:.5f} per million examples.")
    out["text"] = " ".join(lines)
    return out


COLUMNS = ["name", "mode", "hosts", "processes_per_host", "instance_type", "batch_size",
           "intra_op_threads", "inter_op_threads", "format", "parse", "cache", "mixed_precision",
           "xla", "examples_per_s", "step_ms", "input_bound", "auc", "peak_rss_mb",
           "usd_per_hour", "usd_per_million_examples", "hours_to_train", "usd_to_train", "error"]


def _row(c: dict) -> dict:
    cell = c["cell"]
    row = {k: cell.get(k) for k in COLUMNS if k in cell}
    row.update({k: c.get(k) for k in ("examples_per_s", "step_ms", "input_bound", "auc",
                                       "peak_rss_mb", "error")})
    row.update(c.get("cost") or {})
    return row


def markdown(report: dict, ranked: list[dict], rec: dict, prices: dict) -> str:
    m = report["machine"]
    out = ["# Benchmark matrix", "",
           f"Machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('memory_gib')} GiB, "
           f"TensorFlow {m.get('tensorflow', '?')}. Every cell trained on the same "
           f"{report['data'].get('rows', '?')} synthesized rows for {report['budget']:,} examples "
           f"(median of {report['repeats']} run(s)); all processes of a cell share this machine, "
           "so multi-process cells show overheads, and their costs are those of the instances "
           "named at this machine's throughput.", "",
           f"Prices: {prices.get('region', '')} on-demand, {prices.get('date', '')} "
           f"({prices.get('currency', 'USD')}); time and cost to train "
           f"{report['train_examples']:,} examples.", "",
           "## Recommendation", "", rec["text"], "",
           "## Ranking (fastest first)", "",
           "| # | cell | examples/s | step ms | input-bound | test AUC | peak RSS MB | $/h | $ per M examples | hours to train | $ to train |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, c in enumerate(ranked, 1):
        k = c["cost"]
        ib = "–" if c.get("input_bound") is None else f"{c['input_bound']:.1%}"
        auc = "–" if c.get("auc") is None else f"{c['auc']:.4f}"
        out.append(f"| {i} | {c['cell']['name']} | {c['examples_per_s']:,.0f} | {c['step_ms']:.1f} | "
                   f"{ib} | {auc} | {c.get('peak_rss_mb') or '–'} | {k['usd_per_hour']:.3f} | "
                   f"{k['usd_per_million_examples']:.5f} | {k['hours_to_train']:.2f} | "
                   f"{k['usd_to_train']:.2f} |")
    failed = [c for c in report["cells"] if "error" in c]
    if failed:
        out += ["", "## Failed cells", ""]
        out += [f"- {c['cell']['name']}: {c['error']}" for c in failed]
    out += ["", "![throughput](matrix-throughput.png)", "", "![input vs compute](matrix-time.png)", ""]
    return "\n".join(out)


def plots(ranked: list[dict], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [c["cell"]["name"] for c in ranked]
    modes = sorted({c["cell"]["mode"] for c in ranked})
    colours = {m: plt.cm.tab10(i) for i, m in enumerate(modes)}
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.5))
    ax.barh(names[::-1], [c["examples_per_s"] for c in ranked][::-1],
            color=[colours[c["cell"]["mode"]] for c in ranked][::-1])
    ax.set_xlabel("examples / s (global)")
    ax.set_title("Throughput by cell (colour: mode)")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colours[m]) for m in modes], labels=modes,
              loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "matrix-throughput.png", dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(names) + 1.5))
    wait = [c["step_ms"] * (c.get("input_bound") or 0.0) for c in ranked][::-1]
    comp = [c["step_ms"] * (1 - (c.get("input_bound") or 0.0)) for c in ranked][::-1]
    ax.barh(names[::-1], comp, label="compute")
    ax.barh(names[::-1], wait, left=comp, label="waiting for input")
    ax.set_xlabel("ms per step (global batch)")
    ax.set_title("Step time: compute and input wait")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "matrix-time.png", dpi=100)
    plt.close(fig)


def write_report(report: dict, prices: dict, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    ranked = price_cells(report, prices)
    rec = recommend(ranked)
    report["recommendation"] = rec
    report["prices"] = prices
    (out / "matrix.json").write_text(json.dumps(report, indent=2) + "\n")
    with open(out / "matrix.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for c in report["cells"]:
            w.writerow(_row(c))
    (out / "matrix.md").write_text(markdown(report, ranked, rec, prices))
    if ranked:
        plots(ranked, out)
    return rec
