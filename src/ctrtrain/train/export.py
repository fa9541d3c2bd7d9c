"""SavedModel export, loadable by TF Serving, with two signatures:

  serving_default  (ids, values) -> prob; with declared fields (data/schema.py) also numeric
                   [None, numeric fields] and bag_ids / bag_weights [None, sum of the bags'
                   max_len] (-1 ids and 0 weights pad a bag): the batch layout training reads.
  examples         serialized tf.train.Example records [None] -> prob, as the training
                   TFRecords hold them (no label needed), parsed by training's own parser:
                   a client sends records and needs to know no tensor layout.
  raw              (a model of featurized data) one string tensor [None] per raw column, named
                   as the vocabulary names it, the cells as the file holds them -> prob:
                   featurize's own transform in the graph (data/raw_graph.py), so a client
                   sends the rows it has.
Each refuses (InvalidArgumentError naming the record) what training refuses: an id outside the
table, a value that is not finite, a cell featurize refuses.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import tensorflow as tf

# A signature input's name is a graph op's: a raw signature needs its columns named so.
INPUT_NAME = r"[A-Za-z0-9.][A-Za-z0-9_.\-/]*"
EXTRA = "assets.extra"   # files TF Serving ignores but travel with the model
INFO = "ctrtrain.json"
VOCAB = "vocab.json"


class _Serving(tf.Module):
    def __init__(self, model, schema=None, vocab=None):
        """`schema`: the training data's declared fields, None for the fixed schema; `vocab`:
        its featurization vocabulary (data/featurize.py Vocabulary), for the raw signature."""
        super().__init__()
        self.model = model
        cfg = model.cfg
        single = cfg.field_size - cfg.numeric_fields - len(cfg.bags)
        spec = {"ids": tf.TensorSpec([None, single], tf.int64, name="ids"),
                "values": tf.TensorSpec([None, single], tf.float32, name="values")}
        if cfg.numeric_fields:
            spec["numeric"] = tf.TensorSpec([None, cfg.numeric_fields], tf.float32, name="numeric")
        if cfg.bags:
            width = sum(n for n, _ in cfg.bags)
            spec["bag_ids"] = tf.TensorSpec([None, width], tf.int64, name="bag_ids")
            spec["bag_weights"] = tf.TensorSpec([None, width], tf.float32, name="bag_weights")

        from ..input.pipeline import (check_request, check_request_keys, parse_fields_batch,
                                      parse_tfrecord_batch)

        def scored(features):
            """The probabilities, or InvalidArgumentError naming the first record whose score
            is not finite: a finite value too large for the model (1e30 times a weight
            overflows) would otherwise be answered NaN."""
            logits, _ = self.model(check_request(features, cfg.feature_size,
                                                 cfg.dynamic_columns), training=False)
            bad = ~tf.math.is_finite(logits)
            first = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int64)
            with tf.control_dependencies([tf.debugging.Assert(~tf.reduce_any(bad), [
                    tf.strings.format("ctrtrain: record {} of the request has a score that is not "
                                      "finite (a value too large for the model)", first)])]):
                return {"prob": tf.sigmoid(logits)}

        # The model is traced once, in serve; the other signatures call it (a function call
        # in their graphs): each trace of the model was about a tenth of a CPU-second of every
        # export, and the SavedModel holds its graph once.
        @tf.function(input_signature=[spec], autograph=False)
        def serve(features):
            return scored(features)
        self.serve = serve

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")],
                     autograph=False)
        def serve_examples(examples):
            if schema is not None:
                with tf.control_dependencies(check_request_keys(examples, schema)):
                    examples = tf.identity(examples)
            features = parse_tfrecord_batch(examples, cfg.field_size, with_label=False) \
                if schema is None else parse_fields_batch(examples, schema, with_label=False)
            return serve(features)
        self.serve_examples = serve_examples
        self.serve_raw = None
        if vocab is not None and all(re.fullmatch(INPUT_NAME, c) for c in vocab.schema.fields):
            from ..data.raw_graph import RawGraph
            from ..input.pipeline import fields_batch
            self.raw_graph = RawGraph(vocab)

            cells_spec = [{c: tf.TensorSpec([None], tf.string, name=c)
                           for c in self.raw_graph.columns}]

            @tf.function(input_signature=cells_spec, autograph=False)
            def raw_features(cells):
                """serving_default's inputs of raw cells: `ctrtrain predict` and `evaluate`
                read raw rows through it (train/predict.py), the raw signature serves it."""
                if schema is None:
                    return self.raw_graph.fixed(cells)
                return fields_batch(self.raw_graph.parsed(cells), schema, with_label=False)
            self.raw_features = raw_features

            @tf.function(input_signature=cells_spec, autograph=False)
            def serve_raw(cells):
                return serve(raw_features(cells))
            self.serve_raw = serve_raw


def export_saved_model(model, export_base, version: int, info: dict,
                       vocab_file: str | None = None, schema=None) -> str:
    """Writes <export_base>/<version>/ (TF Serving's layout) atomically, removing any higher
    version (an earlier run's, which would be served instead); returns its path.
    `schema`: the training data's declared fields (None: the fixed schema)."""
    final = Path(export_base) / str(version)
    tmp = Path(export_base) / f".{version}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    vocab = None
    if vocab_file:
        from ..data.featurize import Vocabulary
        vocab = Vocabulary.load(vocab_file)
    serving = _Serving(model, schema, vocab)
    signatures = {"serving_default": serving.serve, "examples": serving.serve_examples}
    if serving.serve_raw is not None:
        signatures["raw"] = serving.serve_raw
    from .. import kernels
    try:
        with kernels.off():    # the graph holds TensorFlow's own ops only
            tf.saved_model.save(serving, str(tmp), signatures=signatures)
    except tf.errors.OpError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        from ..errors import CtrError
        raise CtrError(f"cannot write the SavedModel in {export_base}: "
                       f"{e.message.strip().splitlines()[0] if e.message else e}") from None
    (tmp / EXTRA).mkdir(exist_ok=True)
    (tmp / EXTRA / INFO).write_text(json.dumps(info, indent=2) + "\n")
    if vocab_file:
        shutil.copy(vocab_file, tmp / EXTRA / VOCAB)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    # A higher version left by an earlier run of this model directory (a resumed run whose
    # chosen model is an earlier step) would shadow this one: TensorFlow Serving and
    # `predict --model <export base>` take the highest.
    for old in Path(export_base).glob("[0-9]*"):
        if old.name.isdigit() and int(old.name) > version:
            shutil.rmtree(old, ignore_errors=True)
    return str(final)


def latest_export(path) -> str:
    """A SavedModel directory, or the highest version under an export base."""
    p = Path(path)
    if (p / "saved_model.pb").exists():
        return str(p)
    versions = sorted((int(d.name), d) for d in p.glob("[0-9]*") if d.name.isdigit() and (d / "saved_model.pb").exists()) \
        if p.is_dir() else []
    if not versions:
        from ..errors import DataError
        raise DataError("no SavedModel here (expected saved_model.pb or numbered versions)",
                        path=str(p))
    return str(versions[-1][1])
