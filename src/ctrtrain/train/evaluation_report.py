"""`ctrtrain evaluate`: a SavedModel's figures on labeled data, from predict's own reading
path (predict.Scorer): AUC, logloss, gAUC by a column, calibration (mean prediction against
the positive rate, ECE over equal-width bins, a reliability diagram) and the share of unknown
values per field. The arithmetic is metrics.py's (docs/evaluate.md)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..metrics import (calibration_bins, expected_calibration_error, group_auc, logloss,
                       roc_auc)
from ..progress import bar
from .predict import Scorer, raw_column, raw_header, resolve_format, vocabulary_path


def evaluate_model(model_path, inputs, *, input_format: str = "auto", vocab: str | None = None,
                   group: str | None = None, bins: int = 10, batch: int = 4096) -> dict:
    """The report of a model on labeled inputs (a JSON-ready dict, NaN as None). Every
    refusal (unlabeled input, a --group the input has no column of) comes before the model
    reads a row."""
    if bins < 1:
        raise DataError(f"--bins {bins}: give at least 1")
    scorer = Scorer(model_path, inputs, input_format=input_format, vocab=vocab, has_label=True,
                    batch=batch)
    fmt = resolve_format(scorer.inputs, input_format)
    raw_vocab = _raw_vocabulary(scorer, fmt)
    refuse_unlabeled(scorer.inputs, fmt, raw_vocab)
    grouping = _grouping(group, scorer, fmt, raw_vocab)
    unknown = UnknownCounter.of(scorer.info, scorer.export_dir, vocab)

    labels, probs, group_ids = [], [], []
    with bar(desc="evaluate", unit="rows") as pb:
        for y, p, features in scorer.blocks():
            labels.append(np.asarray(y, np.float32))
            probs.append(p)
            if grouping is not None and grouping["column"] is not None:
                group_ids.append(features["ids"][:, grouping["column"]])
            unknown.add(features)
            pb.update(len(p))
    y = np.concatenate(labels) if labels else np.zeros(0, np.float32)
    p = np.concatenate(probs) if probs else np.zeros(0, np.float32)
    where = ", ".join(scorer.inputs)
    if not y.size:
        raise DataError("no rows to evaluate", path=where)
    positives = int((y > 0.5).sum())
    if positives in (0, y.size):
        raise DataError(f"every label is {int(positives > 0)}: no AUC (unlabeled rows, or rows "
                        "of one class); evaluate needs labeled rows of both classes", path=where)

    report = {"model": scorer.export_dir, "inputs": scorer.inputs, "input_format": fmt,
              "rows": int(y.size), "positives": positives,
              "auc": roc_auc(y, p), "logloss": logloss(y, p),
              "positive_rate": float(y.mean(dtype=np.float64)),
              "mean_prediction": float(p.mean(dtype=np.float64))}
    if grouping is None:
        report["gauc"] = None
    else:
        if grouping["column"] is None:
            groups = _codes(raw_column(scorer.inputs, group, raw_vocab))
        else:
            groups = np.concatenate(group_ids)
        if groups.size != y.size:
            raise DataError(f"column {group!r} holds {groups.size:,} values for {y.size:,} "
                            "rows read", path=where)
        report["gauc"] = {"group": group, "source": grouping["source"],
                          **group_auc(y, p, groups)}
    c = calibration_bins(y, p, bins)
    report["calibration"] = {
        "mean_prediction": report["mean_prediction"],
        "positive_rate": report["positive_rate"],
        "ratio": report["mean_prediction"] / report["positive_rate"],
        "bins": bins, "ece": expected_calibration_error(y, p, bins),
        "table": [{"low": float(c["low"][b]), "high": float(c["high"][b]),
                   "count": int(c["count"][b]), "mean_prediction": float(c["mean_prediction"][b]),
                   "positive_rate": float(c["positive_rate"][b])} for b in range(bins)]}
    report["unknown_share"], report["unknown_share_note"] = unknown.result()
    return _json_ready(report)


def _raw_vocabulary(scorer: Scorer, fmt: str):
    """The vocabulary raw rows are read through (None for other formats); a missing one is
    refused as predict refuses it."""
    if fmt != "raw":
        return None
    from ..data.featurize import Vocabulary
    path = vocabulary_path(scorer.export_dir, scorer.vocab)
    if not os.path.exists(path):
        raise DataError("raw rows need the featurization vocabulary: the model has none "
                        "(pass --vocab)", path=path)
    return Vocabulary.load(path)


def refuse_unlabeled(inputs: list[str], fmt: str, raw_vocab) -> None:
    """Refuses input known to hold no labels, naming the file: a raw CSV without its label
    column, or data whose manifest (featurize --no-label) says it is unlabeled. Rows that
    carry a label field of 0 without saying so are told after reading (one class)."""
    unlabeled = unlabeled_input(inputs, fmt, raw_vocab)
    if unlabeled:
        path, why = unlabeled
        raise DataError(f"{why}: evaluate needs labeled rows", path=path)


def unlabeled_input(inputs: list[str], fmt: str, raw_vocab) -> tuple[str, str] | None:
    """(a file, why) when the input is known to be unlabeled, else None."""
    if fmt == "raw":
        from ..data.raw import LABEL_NAMES, sniff_format
        for path in inputs:
            if sniff_format(path) != "csv":
                continue        # Criteo's TSV has no header to tell
            header = raw_header(path, raw_vocab)
            label = raw_vocab.schema.label or next(
                (c for c in header if c.lower() in LABEL_NAMES), None)
            if label is None or label not in header:
                return path, (f"no label column ({label or ' or '.join(LABEL_NAMES)}) in the "
                              f"header {header[:12]}")
        return None
    from ..data.manifest import MANIFEST_NAME, read_manifest
    dirs = [p for p in inputs if os.path.isdir(p)] or \
        sorted({str(Path(p).parent) for p in inputs
                if (Path(p).parent / MANIFEST_NAME).exists()})
    for d in dirs:
        try:
            m = read_manifest(d, check=False)
        except DataError:
            continue            # an unindexed directory: reading it says what is wrong
        if m.extra.get("labeled") is False:
            return d, "the manifest says its rows are unlabeled (featurized with --no-label)"
    return None


def _grouping(group: str | None, scorer: Scorer, fmt: str, raw_vocab) -> dict | None:
    """Where --group's values come from: {"column": None, "source"} for a raw CSV column
    (read by name), {"column": i, "source"} for a categorical field's id (the batch's ids[:, i]).
    Input with no names for its columns, or no such column, is refused."""
    if group is None:
        return None
    if fmt == "raw":
        for path in scorer.inputs:
            header = raw_header(path, raw_vocab)
            if group not in header:
                raise DataError(f"--group {group!r}: no such column; the columns are "
                                f"{', '.join(header)}", path=path)
        return {"column": None, "source": "raw column"}
    declared = scorer.info.get("fields")
    if fmt == "libsvm" or not declared:
        what = "libsvm rows have" if fmt == "libsvm" else \
            "data of the fixed schema (no declared fields) has"
        raise DataError(f"--group {group!r}: {what} no column names to group by; give the raw "
                        "CSV rows, or data with declared fields (featurize --declared)",
                        path=scorer.inputs[0])
    from ..data.schema import Schema
    schema = Schema.from_json(declared)
    categorical = [f.name for f in schema.of("categorical")]
    field = next((f for f in schema.fields if f.name == group), None)
    if field is None or field.kind != "categorical":
        what = "no such field" if field is None else f"a {field.kind} field, not categorical"
        raise DataError(f"--group {group!r}: {what}; the categorical fields are "
                        f"{', '.join(categorical) or 'none'}", path=scorer.inputs[0])
    return {"column": categorical.index(group), "source": "categorical field id"}


def _codes(chunks) -> np.ndarray:
    """Integer codes of a column's values (equal values, equal codes), chunk by chunk."""
    import pandas as pd
    seen: dict = {}
    out = []
    for values in chunks:
        codes, uniques = pd.factorize(values)
        index = np.array([seen.setdefault(u, len(seen)) for u in uniques], np.int64)
        out.append(index[codes] if len(codes) else np.zeros(0, np.int64))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


class UnknownCounter:
    """Per declared categorical and multi-valued field of a vocabulary-featurized model, the
    rows whose id is the field's unknown id (its first id: featurize's out-of-vocabulary
    value, data/featurize.py); for a bag, rows with at least one unknown id among the ids
    the model reads, and the share of those ids. Without a vocabulary, or with hashing, there
    is no unknown value: result() says why."""

    def __init__(self, columns: dict | None, reason: str):
        self.columns, self.reason = columns, reason     # {field: (kind, column or slice, id)}
        self.rows = 0
        self.unknown_rows = {name: 0 for name in columns or {}}
        self.unknown_ids = {name: 0 for name in columns or {}}
        self.ids = {name: 0 for name in columns or {}}

    @classmethod
    def of(cls, info: dict, export_dir: str, vocab: str | None) -> UnknownCounter:
        from ..data.featurize import Vocabulary
        path = vocabulary_path(export_dir, vocab)
        if not os.path.exists(path):
            return cls(None, "the model has no featurization vocabulary: its data was not made "
                             "by `data featurize`, so no id stands for an unknown value")
        v = Vocabulary.load(path)
        if v.mode == "hash":
            return cls(None, "the model's fields are hashed (featurize --hash-buckets): every "
                             "value has an id, none is unknown")
        s = v.schema
        bases = dict(zip(s.categorical + s.lists, v.bases()))
        if info.get("fields"):
            if not v.declared or v.fields().to_json() != info["fields"]:
                return cls(None, "the vocabulary declares other fields than the model")
            from ..data.schema import Schema
            schema = Schema.from_json(info["fields"])
            columns = {f.name: ("categorical", i, bases[f.name])
                       for i, f in enumerate(schema.of("categorical"))}
            at = 0
            for f in schema.lists():
                columns[f.name] = (f.kind, slice(at, at + f.max_len), bases[f.name])
                at += f.max_len
        else:
            if v.declared or v.field_size != info.get("field_size"):
                return cls(None, "the vocabulary's fields are not the model's")
            k = len(s.numeric)
            columns = {c: ("categorical", k + j, bases[c]) for j, c in enumerate(s.categorical)}
        return cls(columns, "per categorical field: the share of rows holding its unknown id "
                            "(a value featurize's vocabulary does not know); per multi-valued "
                            "field: the rows with at least one, and the share of its ids")

    def add(self, features: dict) -> None:
        if self.columns is None:
            return
        self.rows += len(features["ids"])
        for name, (kind, col, unknown) in self.columns.items():
            if kind == "categorical":
                self.unknown_rows[name] += int((features["ids"][:, col] == unknown).sum())
                continue
            bag = features["bag_ids"][:, col]
            hit = bag == unknown
            self.unknown_rows[name] += int(hit.any(axis=1).sum())
            self.unknown_ids[name] += int(hit.sum())
            self.ids[name] += int((bag >= 0).sum())

    def result(self) -> tuple[dict | None, str]:
        if self.columns is None:
            return None, self.reason
        out = {}
        for name, (kind, _, unknown) in self.columns.items():
            share = {"kind": kind, "unknown_id": int(unknown), "rows": self.unknown_rows[name],
                     "share": self.unknown_rows[name] / self.rows if self.rows else float("nan")}
            if kind != "categorical":
                share.update(ids=self.ids[name], unknown_ids=self.unknown_ids[name],
                             ids_share=self.unknown_ids[name] / self.ids[name] if self.ids[name]
                             else float("nan"))
            out[name] = share
        return out, self.reason


def _json_ready(x):
    """NaN and infinities as None (JSON has none); NumPy scalars as Python's."""
    if isinstance(x, dict):
        return {k: _json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_ready(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def default_plot_path(json_path: str | None) -> str | None:
    """The reliability diagram beside the JSON: report.json -> report.png."""
    if not json_path:
        return None
    p = Path(json_path)
    return str(p.with_suffix(".png") if p.suffix == ".json" else Path(f"{json_path}.png"))


def check_outputs(paths: list[str | None], inputs: list[str]) -> None:
    """Refuses, before anything is read, an output that would overwrite an input, is a
    directory or lies in a directory that does not exist, or two outputs at one path."""
    from ..data.files import check_not_input
    given = [p for p in paths if p]
    if len({os.path.abspath(p) for p in given}) < len(given):
        raise DataError("--json and --plot name the same file", path=given[0])
    for p in given:
        check_not_input(p, inputs, "output")
        if os.path.isdir(p):
            raise DataError("is a directory; give a file name", path=p)
        parent = os.path.dirname(os.path.abspath(p))
        if not os.path.isdir(parent):
            raise DataError("the output's directory does not exist", path=parent)


def write_json(report: dict, path: str) -> None:
    from ..data.files import staged
    with staged(path, "w") as f:
        f.write(json.dumps(report, indent=2, allow_nan=False) + "\n")


def plot_reliability(report: dict, path: str) -> None:
    """The reliability diagram: per bin the mean prediction against the positive rate (the
    diagonal is perfect calibration), and below it the rows of each bin. Written atomically."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..data.files import write_figure
    cal = report["calibration"]
    table = [b for b in cal["table"] if b["count"]]
    fig, (top, low) = plt.subplots(2, 1, figsize=(5.5, 6.5), sharex=True,
                                   gridspec_kw={"height_ratios": [3, 1]})
    top.plot([0, 1], [0, 1], color="grey", ls="--", lw=1, label="perfect calibration")
    top.plot([b["mean_prediction"] for b in table], [b["positive_rate"] for b in table],
             marker="o", label="model")
    top.set_ylabel("positive rate")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.set_title(f"reliability: ECE {cal['ece']:.4f} over {cal['bins']} bins, "
                  f"{report['rows']:,} rows", fontsize=10)
    top.legend(loc="upper left", fontsize=8)
    width = 1 / cal["bins"]
    low.bar([b["low"] for b in cal["table"]], [b["count"] for b in cal["table"]], width=width,
            align="edge", color="tab:blue", alpha=0.6)
    low.set_yscale("symlog")
    low.set_xlabel("mean prediction (bins of equal width)")
    low.set_ylabel("rows")
    fig.tight_layout()
    write_figure(fig, path)


def format_report(report: dict) -> str:
    """The readable table `ctrtrain evaluate` prints."""
    def num(x, fmt=".4f"):
        return "n/a" if x is None else format(x, fmt)
    cal = report["calibration"]
    lines = [f"evaluate: {report['rows']:,} rows ({report['input_format']}) of "
             f"{', '.join(report['inputs'])}",
             f"  {'AUC':<22}{num(report['auc'])}",
             f"  {'logloss':<22}{num(report['logloss'])}"]
    g = report["gauc"]
    if g is not None:
        skipped = g["skipped_all_negative"] + g["skipped_all_positive"]
        lines.append(f"  {'gAUC (' + g['group'] + ')':<22}{num(g['gauc'])}   over "
                     f"{g['groups_counted']:,} of {g['groups']:,} groups ({g['rows_counted']:,} "
                     f"rows; {skipped:,} of one class skipped)")
    lines += [f"  {'positive rate':<22}{num(report['positive_rate'])}",
              f"  {'mean prediction':<22}{num(report['mean_prediction'])}   "
              f"(x{num(cal['ratio'], '.3f')} the positive rate)",
              f"  {'ECE (' + str(cal['bins']) + ' bins)':<22}{num(cal['ece'])}"]
    shares = report["unknown_share"]
    if shares is None:
        lines.append(f"unknown values: not counted: {report['unknown_share_note']}")
    else:
        lines.append("unknown values (share of rows holding the field's unknown id)")
        for name, s in shares.items():
            extra = "" if s["kind"] == "categorical" else \
                f"   ({num(s['ids_share'])} of its {s['ids']:,} ids)"
            lines.append(f"  {name:<22}{num(s['share'])}{extra}")
    return "\n".join(lines)


def headline(labels, probs) -> str:
    """predict's line on labeled input: rows, AUC, logloss."""
    y = np.asarray(labels)
    n = int(y.size)
    positives = int((y > 0.5).sum())
    if positives in (0, n):
        return (f"labeled rows: {n:,}, every label {int(positives > 0)}: AUC undefined, "
                f"logloss {logloss(labels, probs):.4f}")
    return f"labeled rows: {n:,}  AUC {roc_auc(labels, probs):.4f}  logloss " \
           f"{logloss(labels, probs):.4f}"
