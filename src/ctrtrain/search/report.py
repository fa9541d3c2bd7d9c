"""What a search leaves besides its trials' run directories, rewritten whole at the end of
every run of it (a resumed search's cover all its trials):

    WORK/trials.csv   a row per trial: number, state, the metric, each searched setting
                      (as the trial drew it), its run directory, a note (why it failed,
                      which trial it retries); also printed
    WORK/trials.png   the metric per trial, the best so far as a line, pruned trials marked
    WORK/best.yaml    the best trial's settings, a configuration file for
                      `ctrtrain train --config` (the given settings and the drawn ones)
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from .space import Space, setting_value

TABLE, PLOT, BEST = "trials.csv", "trials.png", "best.yaml"


def rows(study, space: Space) -> list[dict]:
    """The table's rows, by trial number."""
    out = []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        value = t.value if t.state.name in ("COMPLETE", "PRUNED") else None
        out.append({"number": t.number, "state": t.state.name, space.metric: value,
                    **{p.key: t.params.get(p.key) for p in space.params},
                    "run_dir": t.user_attrs.get("run_dir"), "note": note(t)})
    return out


def note(t) -> str:
    a = t.user_attrs
    parts = [f"retry of trial {a['retry_of']}"] if "retry_of" in a else []
    if t.state.name == "PRUNED" and a.get("evaluations"):
        parts.append(f"pruned after {evaluations(a['evaluations'])}")
    if a.get("error"):
        parts.append(a["error"])
    if a.get("interrupted"):
        parts.append(f"interrupted ({a['interrupted']}): tried again")
    return "; ".join(parts)


def evaluations(n: int) -> str:
    return f"{n} evaluation" + ("s" * (n != 1))


def best_trial(study):
    """The best complete trial, or None (Optuna's best_trial raises without one)."""
    try:
        return study.best_trial
    except ValueError:
        return None


def progress_line(study, number: int, space: Space, done: int, trials: int,
                  seconds: float) -> str:
    """The line a trial prints when it ends."""
    t = study.get_trials(deepcopy=False)[number]
    drawn = " ".join(f"{p.key}={_shown(t.params.get(p.key))}" for p in space.params)
    state = t.state.name
    if state in ("COMPLETE", "PRUNED") and t.value is not None:
        what = f"{space.metric} {t.value:.4f}"
        if state == "PRUNED":
            what += f" after {evaluations(t.user_attrs.get('evaluations', 0))}"
    else:
        what = t.user_attrs.get("error") or t.user_attrs.get("interrupted") or ""
    best = best_trial(study)
    return (f"trial {number} ({done}/{trials}): {state} {what}; "
            + (f"best {best.value:.4f} (trial {best.number}); " if best else "")
            + f"{drawn}; {seconds:.1f} s")


def write_all(study, space: Space, work: Path, settings: dict) -> list[dict]:
    """The table (printed and WORK/trials.csv), the plot and best.yaml; returns the rows."""
    table = rows(study, space)
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=list(table[0]) if table else ["number"])
    w.writeheader()
    w.writerows({k: "" if v is None else v for k, v in r.items()} for r in table)
    _write(work / TABLE, text.getvalue())
    print(format_table(table, space.metric))
    print(f"wrote {work / TABLE}")
    if table:
        plot_trials(table, space, work / PLOT)
        print(f"wrote {work / PLOT}")
    best = best_trial(study)
    if best is not None:
        path = write_best(best, space, settings, work / BEST)
        print(f"best: trial {best.number}, {space.metric} {best.value:.4f} "
              f"({best.user_attrs.get('run_dir')}); its settings: {path} (ctrtrain train "
              f"--config {path} --model-dir DIR)")
    return table


def _shown(v) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def format_table(table: list[dict], metric: str) -> str:
    """The rows as aligned columns, each note after its row."""
    if not table:
        return "no trials"
    head = [k for k in table[0] if k != "note"]
    cells = [head] + [[f"{r[k]:.4f}" if k == metric and r[k] is not None else _shown(r[k])
                       for k in head] for r in table]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(line + (f"  ({r['note']})" if r["note"] else "")
                     for line, r in zip(lines, [{"note": ""}] + table))


def plot_trials(table: list[dict], space: Space, path: Path) -> None:
    """The metric of every trial by number: complete trials as points, pruned ones as
    crosses at their last reported figure, failed ones as ticks on the axis, and the best
    complete trial so far as a step line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..data.files import write_figure
    metric, better = space.metric, max if space.direction == "maximize" else min
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for state, style in (("COMPLETE", dict(marker="o", color="tab:blue", ls="")),
                         ("PRUNED", dict(marker="x", color="tab:grey", ls=""))):
        pts = [(r["number"], r[metric]) for r in table if r["state"] == state
               and r[metric] is not None]
        if pts:
            ax.plot(*zip(*pts), label=state.lower(), **style)
    running, best = [], None
    for r in table:
        if r["state"] == "COMPLETE" and r[metric] is not None:
            best = r[metric] if best is None else better(best, r[metric])
        running.append((r["number"], best))
    running = [(n, b) for n, b in running if b is not None]
    if running:
        ax.step(*zip(*running), where="post", color="tab:orange", label="best so far")
    failed = [r["number"] for r in table if r[metric] is None]
    if failed:
        ax.plot(failed, [0] * len(failed), marker="|", ms=14, color="tab:red", ls="",
                transform=ax.get_xaxis_transform(), clip_on=False, label="failed")
    ax.set_xlabel("trial")
    ax.set_ylabel(f"{metric} ({space.direction}d)")
    ax.set_title(f"{len(table)} trials" + (f", best {metric} {running[-1][1]:.4f}"
                                           if running else ""), fontsize=10)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_figure(fig, path)


def best_settings(best, space: Space, settings: dict) -> dict:
    """The best trial's settings ({name: value}): the given ones, its drawn ones, the
    monitor it ran with."""
    drawn = {p.name: best.params[p.key] for p in space.params if p.key in best.params}
    # Each parsed again: as a file writes it (a data source of one path: the path).
    return {k: setting_value(k, v) for k, v in {**settings, **drawn,
                                                "monitor": space.figure}.items()}


def write_best(best, space: Space, settings: dict, path: Path) -> Path:
    """best_settings as a configuration file, nested by section (train/config.py's)."""
    import yaml

    from ..train.config import SECTIONS, field_named
    nested: dict = {s: {} for s in SECTIONS}
    for name, v in best_settings(best, space, settings).items():
        nested[field_named(name).metadata["section"]][name] = list(v) if isinstance(v, tuple) else v
    head = (f"# The best trial of the search {space.path} (trial {best.number}: {space.metric} "
            f"{best.value:.6g}, run {best.user_attrs.get('run_dir')}).\n"
            f"# ctrtrain train --config {path} --model-dir DIR trains it again.\n")
    _write(path, head + yaml.safe_dump({s: v for s, v in nested.items() if v}, sort_keys=False))
    return path


def _write(path: Path, text: str) -> None:
    from ..data.files import staged
    with staged(path, "w") as f:
        f.write(text)
