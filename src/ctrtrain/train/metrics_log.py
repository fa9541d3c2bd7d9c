"""The run's log: metrics.jsonl (one JSON object per event), TensorBoard summaries and console
lines. Only the chief of a job writes.

TensorBoard's files are laid out as Keras's TensorBoard callback lays them out, so that
`tensorboard --logdir <model_dir>/logs` overlays the curves of one metric: a run per split,
`logs/train`, `logs/validation` and `logs/test` (the test split: its evaluations with
eval_test, and the chosen model's at the end), whose tags share names -- `loss` (the mean
log loss: the train run's over each log window, the others' over the split) and `auc`. The
x axis is the global step. The train run also holds, per log window, `examples_per_s` and
`input_bound` (the share of the window's time spent waiting for input), and `learning_rate`
where a decay on a plateau can change it. What stays constant through a run (its settings,
the data's sizes, the mode's processes) is no curve: it goes once to the hparams plugin, in
`logs` itself, where TensorBoard makes the directory one session whose metrics are the
splits' tags (the HParams tab compares runs by their settings and last figures).

With `--mlflow` the same events also go to an MLflow run (tracking.py), in the same spirit."""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path

import numpy as np

METRICS = "metrics.jsonl"
LOGS = "logs"                                           # TensorBoard's, in the model directory
RUNS = {"train": "train", "valid": "validation", "test": "test"}   # a split's run in LOGS
HPARAMS_SECTIONS = ("data", "model", "optimizer", "schedule", "distribution")
# What listens to the validation evaluations of the runs in this process (evaluation_listener).
_LISTENERS: list = []


@contextlib.contextmanager
def evaluation_listener(listener):
    """While inside, `listener(step, figures)` is called with each validation evaluation a
    run of this process logs (the chief's, which writes the log): a hyperparameter search's
    trial reports them to its pruner (search/). A text it returns asks the run to stop there,
    the text saying why: the controller stops the run as early stopping does (checkpoint,
    evaluation, export, result.json's `stopped_by`), so a stopped run is a complete one."""
    _LISTENERS.append(listener)
    try:
        yield listener
    finally:
        _LISTENERS.remove(listener)


class MetricsLog:
    """metrics.jsonl (one JSON object per event), TensorBoard summaries, console lines, and
    an MLflow run where `tracking` (tracking.plan) names one.
    settings: the run's settings for TensorBoard's hparams (run_settings)."""

    def __init__(self, model_dir: Path, console: bool, enabled: bool = True,
                 settings: dict | None = None, schedule=None, tracking=None):
        self.enabled = enabled    # only the chief of a job writes
        self.console = console and enabled
        self.schedule = schedule  # console lines say where the run is (step n/N, epoch n/N)
        self.stop_requested: str | None = None    # by an evaluation listener, and why
        self.mlflow = None
        if enabled:
            if tracking is not None:    # first: a store that refuses the run stops it here
                from .tracking import MlflowRun
                self.mlflow = MlflowRun(tracking, model_dir, self.console)
            self.f = open(model_dir / METRICS, "a")
            self.tensorboard = TensorBoardRuns(model_dir / LOGS, settings or {})

    def event(self, kind: str, step: int, **fields):
        if not self.enabled:
            return
        rec = {"event": kind, "step": step, "time": time.time(), **fields}
        self.f.write(json.dumps(rec, default=_jsonable) + "\n")
        self.f.flush()
        self.tensorboard.event(kind, step, fields)
        if self.mlflow:
            self.mlflow.event(kind, step, fields)
        if self.console:
            shown = " ".join(f"{k}={_fmt(v)}" for k, v in fields.items()
                             if not isinstance(v, dict) and v is not None)
            where = self.schedule.position(step, starting=kind == "start") if self.schedule \
                else f"step {step}"
            print(f"[{kind}] {where} {shown}".rstrip(), flush=True)
        if kind == "eval" and fields.get("split") == "valid":
            for listener in list(_LISTENERS):
                why = listener(step, fields)
                self.stop_requested = self.stop_requested or why

    def result(self, result: dict, path: Path):
        """The run's result, as written to `path` (result.json), to MLflow: its numbers and
        the file (metrics.jsonl's summary event has the headline figures)."""
        if self.mlflow:
            self.mlflow.result(result, path, result["step"])

    def close(self):
        if self.enabled:
            self.f.close()
            self.tensorboard.close()
            if self.mlflow:
                self.mlflow.close()


class TensorBoardRuns:
    """The TensorBoard side of the log (the module's docstring says the layout): a writer per
    run, made when its first summary comes (no validation split: no validation run)."""

    def __init__(self, logdir: Path, settings: dict):
        self.logdir, self.settings = logdir, settings
        self.writers: dict = {}
        self.evaluated: dict[str, set] = {}       # steps written, per split
        # A curve only where the rate can change during the run.
        self.learning_rate = None
        self.track_rate = bool(settings.get("lr_decay_on_plateau"))

    def event(self, kind: str, step: int, fields: dict):
        if kind == "start":
            self.learning_rate = fields.get("learning_rate")
            self.hparams(fields)
        elif kind == "lr_decay":
            self.learning_rate = fields["learning_rate"]
        elif kind == "train":
            self.scalars("train", step, loss=fields["loss"],
                         examples_per_s=fields["examples_per_s"],
                         input_bound=fields["input_bound"],
                         **({"learning_rate": self.learning_rate} if self.track_rate else {}))
        elif kind == "eval":
            # An evaluation of a step already written is of the same model: the one after an
            # early stop, or the test split's of the best model, restored, at its step.
            done = self.evaluated.setdefault(fields["split"], set())
            if step not in done:
                done.add(step)
                self.scalars(RUNS[fields["split"]], step, loss=fields["logloss"],
                             auc=fields["auc"])

    def scalars(self, run: str, step: int, **values):
        import tensorflow as tf
        if run not in self.writers:
            self.writers[run] = tf.summary.create_file_writer(str(self.logdir / run))
        with self.writers[run].as_default(step=step):
            for tag, v in values.items():
                if v is not None and math.isfinite(v):
                    tf.summary.scalar(tag, v)

    def hparams(self, start: dict):
        """The run's settings, and what the start found (sizes, processes), once a process,
        in `logs` itself: the session whose metrics are the tags of the runs below it."""
        import tensorflow as tf
        # hp.hparams of `from tensorboard.plugins.hparams import api as hp`, whose import
        # loads Keras (2 s; ctrtrain starts TensorFlow without it: tf_start.py), and boto3
        # for TensorBoard's s3 stub, which these summaries never touch.
        from ..tf_start import unimported
        with unimported("boto3"):
            from tensorboard.plugins.hparams import summary_v2 as hp
        found = {k: v for k, v in start.items() if k != "resumed" and _hparam_value(v) is not None}
        values = {**found, **{k: _hparam_value(v) for k, v in self.settings.items()
                              if _hparam_value(v) is not None}}
        writer = tf.summary.create_file_writer(str(self.logdir))
        with writer.as_default():
            hp.hparams(values)
        writer.close()

    def close(self):
        for w in self.writers.values():
            w.close()


def run_settings(cfg) -> dict:
    """The settings that shape a run, for TensorBoard's hparams: those of the data, model,
    optimizer, schedule and distribution sections (of the model settings, those the chosen
    model reads), as check_data resolved them. The output section's (model_dir, export,
    quiet, ...) change nothing of the model."""
    from ..models import MODELS
    from .config import UNIVERSAL, table
    reads = MODELS[cfg.model].reads + tuple(MODELS[cfg.model].options) + UNIVERSAL
    return {f.name: getattr(cfg, f.name) for f in table()
            if f.metadata["section"] in HPARAMS_SECTIONS
            and (f.metadata["section"] != "model" or f.name in reads)}


def _hparam_value(v):
    """A value the hparams plugin takes (bool, number, text), or None (left out)."""
    if isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)) and all(isinstance(x, (bool, int, float, str)) for x in v):
        return ",".join(map(str, v))
    return None


def _fmt(v):
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def _jsonable(v):
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    return str(v)
