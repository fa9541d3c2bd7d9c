"""Batch inference (the SageMaker Batch Transform job): a SavedModel over TFRecord, libsvm,
libffm or raw Criteo/CSV rows, one output row per input row, in input order. Raw rows go
through the export's own transform (export.py raw_features, the `raw` signature's graph), so
predict scores what a served model scores; --vocab (another vocabulary) or an export without
that graph reads them through featurize instead."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..errors import DataError, first_line
from ..progress import bar
from .export import EXTRA, INFO, VOCAB, latest_export


INPUT_FORMATS = ("auto", "dir", "tfrecord", "libsvm", "libffm", "raw")


def resolve_format(inputs: list[str], input_format: str = "auto") -> str:
    """The input's format: `input_format`, or with "auto" told from the first input (a
    directory, TFRecord, libffm, libsvm, else raw rows), read through its compression: a
    gzipped CSV is raw rows (read compressed), a gzipped libsvm file is refused."""
    if input_format != "auto":
        return input_format
    from ..data.index import compressed_error, sniff, text_format
    first = inputs[0]
    if os.path.isdir(first):
        return "dir"     # with its manifest, or indexed now (data/index.py)
    fmt, comp, head = sniff(first)
    if fmt == "tfrecord":
        return "tfrecord"
    kind = text_format(head) or "raw"
    if comp is not None and kind != "raw":
        raise compressed_error(first, fmt, comp, head)
    return kind


def vocabulary_path(export_dir: str, vocab: str | None) -> str:
    """The featurization vocabulary raw rows are read through: --vocab, else the model's."""
    return vocab or os.path.join(export_dir, EXTRA, VOCAB)


def _blocks(inputs: list[str], info: dict, export_dir: str, input_format: str, vocab: str | None,
            has_label: bool, batch: int, raw_features=None):
    """Yields (labels or None, features) blocks in input order: features as the serving
    signature takes them (ids, values; with declared fields numeric, bag_ids, bag_weights).
    `raw_features`: the export's own transform of raw cells (the `raw` signature's), which
    raw rows go through unless --vocab names another vocabulary."""
    input_format = resolve_format(inputs, input_format)
    if input_format == "libffm":
        yield from _libffm_blocks(inputs, info, batch)
        return
    if input_format in ("dir", "tfrecord", "libsvm"):
        import tensorflow as tf

        from ..input.pipeline import PipelineConfig, dataset_from_dir, explain_error, make_dataset
        # Checked batches: a label other than 0/1, an id outside the model's table or a
        # value that is not finite is named (file, record), not predicted from.
        from ..data.schema import Schema
        pcfg = PipelineConfig(batch_size=batch, feature_size=info["feature_size"])
        declared = info.get("fields")
        # A dynamic field's raw keys, which the model maps onto its rows itself.
        dynamic = info.get("dynamic_fields")
        schema = Schema.from_json(declared).with_dynamic(dynamic) if declared else None
        if input_format == "dir":
            if len(inputs) != 1:
                raise DataError("give one data directory, or files", path=", ".join(inputs))
            ds, m = dataset_from_dir(inputs[0], pcfg, training=False, dynamic=dynamic)
            field_size, paths, comp, fmt, labels = (m.field_size, m.paths(inputs[0]),
                                                    m.compression, m.format, m.label_format)
            if m.fields != declared:
                raise DataError("the data declares other fields than the model was trained on "
                                "(the manifest's `fields`)", path=inputs[0])
        else:
            from ..data.index import check_readable_compression
            field_size, paths, fmt, labels = info["field_size"], inputs, input_format, "01"
            comps = {f: check_readable_compression(f)[1] for f in inputs}
            if len(set(comps.values())) > 1:     # one reader, of one compression, reads all
                raise DataError("gzipped and plain TFRecord files in one input: predict them "
                                "separately", path=", ".join(inputs[:3]))
            comp = comps[inputs[0]]
            ds = make_dataset(inputs, field_size, fmt=input_format, compression=comp, cfg=pcfg,
                              training=False, schema=schema)
        if field_size != info["field_size"]:
            raise DataError(f"input has field_size {field_size}, the model expects "
                            f"{info['field_size']}", path=inputs[0])
        if schema is not None and fmt == "tfrecord":
            # A bag the records lack would be predicted from as empty (F30).
            from ..data.validate import check_declared_keys
            for path in paths:
                check_declared_keys(path, schema, comp)
        try:
            for b in ds:
                yield b["label"].numpy(), {k: v.numpy() for k, v in b.items() if k != "label"}
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
            raise explain_error(e, paths, fmt=fmt, field_size=field_size,
                                feature_size=info["feature_size"], compression=comp,
                                label_format=labels, what="input", schema=schema) from None
        return
    if input_format != "raw":
        raise DataError(f"unknown input format {input_format!r}")
    from ..data.featurize import Vocabulary, featurize_file
    vocab_path = vocabulary_path(export_dir, vocab)
    if not os.path.exists(vocab_path):
        raise DataError("raw rows need the featurization vocabulary: the model has none "
                        "(pass --vocab)", path=vocab_path)
    v = Vocabulary.load(vocab_path)
    if v.declared and v.fields().to_json() != info.get("fields"):
        raise DataError("the vocabulary declares other fields than the model was trained on",
                        path=vocab_path)
    if raw_features is not None and vocab is None:
        yield from _raw_blocks(inputs, v, raw_features, has_label, batch)
        return
    for f in inputs:
        for rows in featurize_file(f, v, has_label=has_label):
            for a in range(0, len(rows), batch):
                labels = rows.labels[a:a + batch] if has_label else None
                if not v.declared:
                    yield labels, {"ids": rows.ids[a:a + batch], "values": rows.values[a:a + batch]}
                    continue
                # Declared fields reach the model as training read them: encoded as the
                # TFRecords featurize writes, parsed by the training pipeline's own parser.
                import tensorflow as tf

                from ..data.tfrecord import encode_field_examples
                from ..input.pipeline import parse_fields_batch
                fields = v.fields()
                part = rows.slice(a, a + batch)
                parsed = parse_fields_batch(tf.constant(encode_field_examples(part, fields)), fields)
                yield labels, {k: t.numpy() for k, t in parsed.items() if k != "label"}


def _raw_blocks(inputs: list[str], vocab, raw_features, has_label: bool, batch: int):
    """Raw rows through the model's own transform (export.py raw_features: featurize's, in
    the SavedModel's graph), the path a served model's rows take. The file is read as
    featurize reads it (labels by its rule, a cell it refuses named by file and line); a cell
    the graph refuses ("column C: record N holds ...") is named the same way."""
    import re

    import tensorflow as tf

    from ..data.raw import read_raw, sniff_format
    for f in inputs:
        for _, chunk in read_raw(f, sniff_format(f), vocab.schema, has_label=has_label,
                                 label_threshold=vocab.label_threshold, keep_cells=True):
            n = len(chunk.numeric)
            for a in range(0, n, batch):
                cells = {c: tf.constant(v[a:a + batch].astype(str))
                         for c, v in chunk.cells.items()}
                try:
                    features = raw_features(cells)
                except tf.errors.InvalidArgumentError as e:
                    # The graph's Assert: [ctrtrain: column C: record N holds ["cell"]<why>]
                    found = re.search(r'ctrtrain: column (.+?): record (\d+) holds '
                                      r'\[\\?"(.*?)\\?"\],? (.*)\]$', str(e), re.M)
                    if not found:
                        raise
                    why = found[4].strip().removeprefix("which ")
                    raise DataError(f"{found[3]!r} {why if why.startswith('is ') else 'is ' + why}",
                                    path=f, line=chunk.first_line + a + int(found[2]),
                                    field=found[1]) from None
                labels = chunk.labels[a:a + batch] if has_label else None
                yield labels, {k: t.numpy() for k, t in features.items()}


def raw_header(path: str, vocab) -> list[str]:
    """The column names of a raw file as _blocks reads it through `vocab`: a CSV's header;
    for Criteo's TSV (no header) the vocabulary's label and field names, in file order."""
    from ..data.raw import read_header, sniff_format
    if sniff_format(path) == "criteo":
        return [vocab.schema.label or "label"] + vocab.schema.fields
    return read_header(path)


def raw_column(inputs: list[str], column: str, vocab, chunk_rows: int = 200_000):
    """Yields a raw column's values (str, '' when empty) in input order, chunk by chunk:
    the rows _blocks reads from the same files (pandas' reader with the options read_raw
    uses), for a column the vocabulary need not know (one it dropped, or `id`)."""
    import pandas as pd

    from ..data.raw import open_raw, sniff_format
    for path in inputs:
        if sniff_format(path) == "criteo":
            kw = dict(sep="\t", header=None, names=raw_header(path, vocab), quoting=3)
        else:
            kw = {}
        with open_raw(path) as f:
            for frame in pd.read_csv(f, dtype=str, keep_default_na=False, na_filter=False,
                                     usecols=[column], chunksize=chunk_rows, engine="c",
                                     compression=None, **kw):
                yield frame[column].fillna("").to_numpy(object)


def _libffm_blocks(inputs: list[str], info: dict, batch: int):
    """libffm lines into the model's declared fields as `data convert` reads them (a line
    that does not fit is an error naming it), parsed by the training pipeline's parser."""
    import tensorflow as tf

    from ..data.files import Segment, count_lines, read_line_blocks
    from ..data.libffm import check_declaration, parse_libffm, to_field_rows
    from ..data.schema import Schema
    from ..data.tfrecord import encode_field_examples
    from ..input.pipeline import parse_fields_batch
    if not info.get("fields"):
        raise DataError("is libffm text, but the model was trained on the fixed schema (libffm "
                        "trains as the declared fields `data convert` makes of it)", path=inputs[0])
    from ..data.index import check_readable_compression
    schema = Schema.from_json(info["fields"])
    check_declaration(schema, "the model's fields")
    for path in inputs:     # all before any row is read: libffm is read as plain text
        check_readable_compression(path)
    for path in inputs:
        seg = Segment(path, 0, count_lines(path), 0)
        for first, text in read_line_blocks(seg, batch):
            block, bad = parse_libffm(text, path=path, first_line=first + 1,
                                      feature_size=info["feature_size"])
            rows, unfit, _ = to_field_rows(block, schema, path)
            if bad or unfit:
                raise min(bad + unfit, key=lambda b: b.line).as_error()
            parsed = parse_fields_batch(tf.constant(encode_field_examples(rows, schema)), schema)
            yield rows.labels, {k: t.numpy() for k, t in parsed.items() if k != "label"}


def load_serving(export_dir: str):
    """The export's record (assets.extra), serving function and its transform of raw cells
    (None if it has none). A damaged export (a file cut short, an empty saved_model.pb) or an
    unreadable one is refused naming it and what is wrong, not a traceback; an unreadable file
    TensorFlow names in its message."""
    import tensorflow as tf
    from google.protobuf.message import DecodeError
    record = Path(export_dir) / EXTRA / INFO
    try:
        info = json.loads(record.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"the export's record is damaged ({e})", path=str(record)) from None
    try:
        loaded = tf.saved_model.load(export_dir)
        serve = loaded.signatures["serving_default"]
    except (tf.errors.OpError, ValueError, IndexError, KeyError, DecodeError) as e:
        reason = first_line(e)
        if "0 MetaGraphs" in reason:
            reason = "saved_model.pb holds no model (empty or cut short)"
        raise DataError(f"not a usable SavedModel, damaged or unreadable: {reason}",
                        path=str(export_dir)) from None
    return info, serve, getattr(loaded, "raw_features", None)


def check_inputs(inputs) -> list[str]:
    """The input paths as strings; each must exist, and a file must not be empty."""
    inputs = [str(p) for p in ([inputs] if isinstance(inputs, (str, os.PathLike)) else inputs)]
    for p in inputs:
        if not os.path.exists(p):
            raise DataError("no such file or directory", path=p)
        if os.path.isfile(p) and os.path.getsize(p) == 0:    # no format to tell, no row
            raise DataError("is empty: no rows to predict", path=p)
    return inputs


class Scorer:
    """A SavedModel over inputs: the one reading path of `predict` and `evaluate`. Made
    eagerly (inputs checked, the export loaded), so that a refusal comes before any output;
    blocks() then scores the input in order."""

    def __init__(self, model_path, inputs, *, input_format: str = "auto",
                 vocab: str | None = None, has_label: bool = True, batch: int = 4096):
        self.inputs = check_inputs(inputs)
        self.export_dir = latest_export(model_path)
        self.info, self.serve, self.raw_features = load_serving(self.export_dir)
        self.input_format, self.vocab = input_format, vocab
        self.has_label, self.batch = has_label, batch

    def blocks(self):
        """Yields (labels or None, probabilities float32, features) per block, in input order."""
        import re

        import tensorflow as tf
        done = 0
        for labels, features in _blocks(self.inputs, self.info, self.export_dir,
                                        self.input_format, self.vocab, self.has_label, self.batch,
                                        self.raw_features):
            try:
                probs = self.serve(**{k: tf.constant(v) for k, v in features.items()})["prob"]
            except tf.errors.InvalidArgumentError as e:
                # The signature's own refusal ("record N of the request has ..."), as a row of
                # the input (a score that is not finite: a value the model overflows on).
                found = re.search(r"record (\d+) of the request (has [^\]\n]*)", str(e))
                if not found:
                    raise
                raise DataError(f"row {done + int(found[1]) + 1} (1-based, in input order) "
                                f"{found[2]}", path=", ".join(self.inputs[:3])) from None
            done += len(probs)
            yield labels, probs.numpy(), features


def predict(model_path, inputs, out_path, *, input_format: str = "auto", vocab: str | None = None,
            has_label: bool = True, batch: int = 4096, out_format: str | None = None) -> int:
    """Writes one prediction per input row (CSV `prob[,label]` or JSON lines); returns the count."""
    return predict_scored(model_path, inputs, out_path, input_format=input_format, vocab=vocab,
                          has_label=has_label, batch=batch, out_format=out_format)[0]


def predict_scored(model_path, inputs, out_path, *, input_format: str = "auto",
                   vocab: str | None = None, has_label: bool = True, batch: int = 4096,
                   out_format: str | None = None, keep_all: bool = False):
    """predict(), returning (the count, (labels, probabilities) or None): the labels and
    probabilities of every row when the input is labeled (for the headline figures); with
    `keep_all` (the Python API's predict) the probabilities whatever the input, the labels
    None when it has none. `out_path` None: nothing is written (keep_all only)."""
    scorer = Scorer(model_path, inputs, input_format=input_format, vocab=vocab,
                    has_label=has_label, batch=batch)
    inputs = scorer.inputs
    if out_path is None and not keep_all:
        raise ValueError("predict_scored: no output and nothing kept")
    if out_path is not None:
        out_format = out_format or ("jsonl" if str(out_path).endswith((".jsonl", ".json"))
                                    else "csv")
        if out_format not in ("csv", "jsonl"):
            raise DataError(f"output format must be csv or jsonl, not {out_format!r}")
        from ..data.files import check_not_input
        check_not_input(out_path, inputs, "--out")
        check_not_input(str(out_path) + ".tmp", inputs, "--out")
        if os.path.isdir(out_path):
            raise DataError("--out is a directory; give a file name", path=str(out_path))
    n = 0
    kept_labels, kept_probs = [], []
    with _output(out_path) as out, bar(desc="predict", unit="rows") as pb:
        if out is not None and out_format == "csv":
            out.write("row,prob" + (",label" if has_label else "") + "\n")
        for labels, probs, _ in scorer.blocks():
            labeled = has_label and labels is not None
            if labeled:
                kept_labels.append(np.asarray(labels, np.float32))
            if labeled or keep_all:
                kept_probs.append(probs)
            if out is not None:
                _write_rows(out, out_format, n, probs, labels if labeled else None)
            n += len(probs)
            pb.update(len(probs))
        if n == 0:      # a CSV of its header only, an empty gzip: no prediction is no result
            raise DataError("holds no rows: nothing to predict", path=", ".join(inputs[:3]))
    labels = np.concatenate(kept_labels) if kept_labels else None
    if keep_all:
        return n, (labels, np.concatenate(kept_probs))
    return n, None if labels is None else (labels, np.concatenate(kept_probs))


def _write_rows(out, out_format: str, first: int, probs, labels) -> None:
    """Rows `first`, `first` + 1, ... of predict's output."""
    rows = np.arange(first, first + len(probs))
    if out_format == "csv":
        # Full float32 precision (9 significant digits): rounding makes ties
        # that change the AUC on low-CTR data.
        cols = [rows.astype(str), np.char.mod("%.9g", probs)]
        if labels is not None:
            cols.append(labels.astype(np.int64).astype(str))
        out.write("".join(",".join(r) + "\n" for r in zip(*cols)))
    else:
        for i, p in zip(rows.tolist(), probs.tolist()):
            rec = {"row": i, "prob": p}
            out.write(json.dumps(rec) + "\n")


def _output(out_path):
    """The output file, written whole or not at all; None for none."""
    import contextlib

    from ..data.files import staged
    return contextlib.nullcontext() if out_path is None else staged(out_path, "w")
