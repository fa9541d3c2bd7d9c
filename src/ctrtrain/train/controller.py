"""The one training loop. A controller owns the outer loop -- log windows, checkpoints,
evaluation and early stopping, stop requests, the end of the data -- and asks a trainer to
run N steps at a time (the shape of TensorFlow Model Garden's `orbit`). Each distribution
mode brings a trainer (sync.py: single, mirrored, allreduce, horovod; ps.py: parameter
servers); what happens between and after the steps is written once, here, so every option
means the same in every mode.

A trainer runs steps and reports what they cost:

    trainer.step                      the global step reached
    trainer.train_steps(n, stop)      -> StepStats (stops early when stop() or the data ends)
    trainer.save(step)                a checkpoint (the chief's; others do nothing)
    trainer.evaluate(name, step)      -> {"auc", "logloss", ...} of the valid/test split, or None
                                      (no split, or not the chief)
    trainer.agree(decision)           -> the chief's decision (STOP | DECAY), on every process
    trainer.scale_learning_rate(f)    multiplies the learning rate by f (a decay on a plateau)
    trainer.keep_best(record)         keeps the model as the best evaluated (model_dir.BEST)
    trainer.best_kept()               -> that record, from an earlier run a resumed one continues
    trainer.restore_best(record)      the model's variables as they were at that evaluation

The controller keeps the best model by the monitored validation metric (FuxiCTR's and Keras's
`save_best_only` + `restore_best_weights`) and stops after `early_stopping` evaluations
without a better one. After the loop, `finish` does what every run does at its end, also once
for every mode: the final checkpoint (the last state: a resumed run continues from it), the
validation split's evaluation, the best model restored if the last is not better, the test
split's evaluation of it, its SavedModel export, the test set's predictions, result.json and a
one-line summary.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Callable, Protocol

from .. import heartbeat
from ..errors import DataError
from ..progress import bar
from . import model_dir
from .stop import Interrupted, StopRequests


class NonFiniteLoss(DataError):
    pass


@dataclasses.dataclass
class StepStats:
    """What a run of steps did: how many, their summed loss, time waiting for input and
    computing (a trainer measures both its own way), and whether the data ran out."""
    steps: int = 0
    loss_sum: float = 0.0
    input_wait_s: float = 0.0
    compute_s: float = 0.0
    data_ended: bool = False
    nonfinite_step: int | None = None     # the first step whose loss was inf or nan


class Trainer(Protocol):
    step: int

    def train_steps(self, n: int, stop: Callable[[], bool]) -> StepStats: ...

    def save(self, step: int) -> None: ...

    def evaluate(self, name: str, step: int, keep: bool = False) -> dict | None: ...

    def agree(self, decision: int) -> int: ...

    def scale_learning_rate(self, factor: float) -> float: ...

    def keep_best(self, record: dict) -> None: ...

    def best_kept(self) -> dict | None: ...

    def restore_best(self, record: dict) -> None: ...


class ChiefActions:
    """What the trainers share around their steps: the final checkpoint and the evaluation of
    a split (the chief's). A trainer sets cfg, manager, predict, log, feature_size, save() and
    settle() (brings every table row to the current step: a catch-up optimizer's rows are
    otherwise current only as of their last update; see models/engine/updates.py)."""

    def save_final(self, step: int) -> None:
        from .model_dir import saved_at
        self.settle()    # the last checkpoint and the export hold the dense-equivalent table
        if not saved_at(self.manager, step):
            self.save(step)

    def evaluate(self, name: str, step: int, keep: bool = False):
        from .evaluate import evaluate_split
        self.settle()
        split_dir = self.cfg.valid_dir if name == "valid" else self.cfg.test_dir
        return evaluate_split(split_dir, name, self.predict, self.log, step, self.feature_size,
                              keep=keep, dynamic=self.cfg.dynamic_fields)

    def agree(self, decision: int) -> int:
        return decision     # one process decides

    def scale_learning_rate(self, factor: float) -> float:
        """The learning rate times `factor` from the next step on (every row was settled by
        the evaluation just before: the catch-up stays exact); returns the new rate."""
        self.opt.lr_scale.assign(self.opt.lr_scale * factor)
        return float(self.opt.learning_rate.numpy())

    def keep_best(self, record: dict) -> None:
        model_dir.write_best(self.model, Path(self.cfg.model_dir), record)

    def best_kept(self) -> dict | None:
        return model_dir.read_best(Path(self.cfg.model_dir), self.cfg.monitor)

    def restore_best(self, record: dict) -> None:
        model_dir.restore_best(self.model, Path(self.cfg.model_dir), record)


@dataclasses.dataclass
class Schedule:
    """When things happen, in steps (0 = never)."""
    total_steps: int | None        # None: until the data ends (a Pipe stream)
    log_every: int
    checkpoint_every: int = 0
    checkpoint_secs: float = 0.0
    eval_every: int = 0
    early_stopping: int = 0        # evaluations without a better monitored metric: stop
    eval_test: bool = False        # evaluate the test split beside the validation split
    monitor: str = "auc"           # the validation metric that picks the best model
    lr_decay: float = 0.0          # the learning rate's factor after an evaluation without one
    keep_best: bool = False        # keep the best model's variables (the trainer's keep_best)
    steps_per_epoch: float | None = None   # to say at which epoch the best model was
    epochs: float | None = None    # the epochs the run trains, when it counts them (not steps)

    def position(self, step: int, starting: bool = False) -> str:
        return position(step, self.total_steps, self.epochs, starting)

    def next_boundary(self, step: int) -> int:
        """The next step at which the controller must act."""
        cands = [step + every - step % every
                 for every in (self.log_every, self.checkpoint_every, self.eval_every) if every]
        if self.total_steps is not None:
            cands.append(self.total_steps)
        return min(cands)


def position(step: int, total_steps: int | None, epochs: float | None,
             starting: bool = False) -> str:
    """Where a run is, for a person: `step 450/900 (epoch 2/3)` when it counts epochs,
    `step 450/900` when it trains a number of steps, `step 450` when its length is unknown
    (a Pipe stream). At a step that ends an epoch that epoch is named, unless `starting` (the
    next one begins there: a run's start). Fractional epochs are shown as fractions
    (`epoch 0.25/0.5`)."""
    if not total_steps:
        return f"step {step}"
    epoch = epoch_of(step, total_steps, epochs, starting)
    return f"step {step}/{total_steps}" + (f" (epoch {epoch})" if epoch else "")


def epoch_of(step: int, total_steps: int | None, epochs: float | None,
             starting: bool = False) -> str | None:
    """`2/3` (position's), or None for a run that does not count epochs."""
    if not (total_steps and epochs):
        return None
    per = total_steps / epochs       # the planned steps of one epoch
    if epochs != int(epochs):
        return f"{step / per:.2g}/{epochs:g}"
    n = math.floor(step / per + 1e-9) + 1 if starting else math.ceil(step / per - 1e-9)
    return f"{min(max(n, 1), int(epochs))}/{int(epochs)}"


@dataclasses.dataclass
class Outcome:
    step: int
    stopped_early: bool
    windows: list
    input_wait_s: float
    compute_s: float
    best: dict | None = None       # the best evaluation's record: step, epoch, monitor, valid
    schedule: Schedule | None = None
    ended: float = dataclasses.field(default_factory=time.perf_counter)   # the loop's end
    # Why the run stopped before its end: early_stopping, or what an evaluation listener
    # said (a search's pruner: "pruned"); None when it ran to its end.
    stopped_by: str | None = None

    @property
    def input_bound(self) -> float:
        busy = self.input_wait_s + self.compute_s
        return self.input_wait_s / busy if busy else 0.0


class Controller:
    def __init__(self, trainer: Trainer, schedule: Schedule, log, *, global_batch: int,
                 data_name: str, progress: bool = False):
        self.trainer, self.schedule, self.log = trainer, schedule, log
        self.global_batch, self.data_name, self.progress = global_batch, data_name, progress

    def run(self) -> Outcome:
        s, t = self.schedule, self.trainer
        start = t.step
        best, stopped_early, stopped_by = t.best_kept(), False, None
        bad_evals = evaluations_since(s, best["step"], start) if best else 0
        windows, totals = [], StepStats()
        window, window_t = StepStats(), time.perf_counter()
        last_ckpt = time.monotonic()

        def flush(step):
            nonlocal window, window_t
            if not window.steps:
                return
            now = time.perf_counter()
            busy = window.input_wait_s + window.compute_s
            w = {"step": step, "loss": window.loss_sum / window.steps, "steps": window.steps,
                 "seconds": now - window_t,
                 "examples_per_s": window.steps * self.global_batch / (now - window_t),
                 "input_wait_s": window.input_wait_s, "compute_s": window.compute_s,
                 "input_bound": window.input_wait_s / busy if busy else 0.0}
            windows.append(w)
            self.log.event("train", **w)
            epoch = epoch_of(step, s.total_steps, s.epochs)
            pb.set_postfix(loss=f"{w['loss']:.4f}", **({"epoch": epoch} if epoch else {}))
            window, window_t = StepStats(), now

        with bar(total=s.total_steps, desc="train", unit="step",
                 disable=None if self.progress else True) as pb, StopRequests() as stop:
            pb.update(start)
            heartbeat.beat(force=True)
            while s.total_steps is None or t.step < s.total_steps:
                if stop.signum is not None:
                    flush(t.step)
                    t.save(t.step)
                    self.log.event("stopped", step=t.step, signal=stop.signum)
                    raise Interrupted(stop.signum, t.step, saved=self.log.enabled)
                r = t.train_steps(s.next_boundary(t.step) - t.step,
                                  lambda: stop.signum is not None)
                if r.nonfinite_step is not None or not math.isfinite(r.loss_sum):
                    at = f"at step {r.nonfinite_step}" if r.nonfinite_step else f"by step {t.step}"
                    raise NonFiniteLoss(
                        f"the training loss became {r.loss_sum} {at}: the model diverged "
                        "(learning rate too high?) or the data holds extreme values; nothing of "
                        "it was checkpointed (the last checkpoint is intact)", path=self.data_name)
                pb.update(r.steps)
                for k in ("steps", "loss_sum", "input_wait_s", "compute_s"):
                    setattr(window, k, getattr(window, k) + getattr(r, k))
                    setattr(totals, k, getattr(totals, k) + getattr(r, k))
                if r.data_ended:
                    flush(t.step)
                    if s.total_steps is not None:
                        raise DataError(f"the training data ended after {t.step} of "
                                        f"{s.total_steps} steps (a Pipe channel whose "
                                        "stream stopped: the job's pipe_epochs cap?)",
                                        path=self.data_name)
                    break
                if t.step % s.log_every == 0 or t.step == s.total_steps:
                    flush(t.step)
                if s.eval_every and t.step % s.eval_every == 0 and t.step != s.total_steps:
                    r_eval = t.evaluate("valid", t.step)      # the chief's; None elsewhere
                    if s.eval_test:
                        t.evaluate("test", t.step)
                    decision = 0
                    if r_eval is not None and improves(r_eval, best, s.monitor):
                        best, bad_evals = best_record(s, t.step, r_eval), 0
                        if s.keep_best:
                            t.keep_best(best)
                    elif r_eval is not None:
                        bad_evals += 1
                        if s.early_stopping and bad_evals >= s.early_stopping:
                            decision = STOP
                        elif s.lr_decay:
                            decision = DECAY
                    # A listener of the evaluation (metrics_log.evaluation_listener: a search's
                    # pruner) stops the run the way early stopping does.
                    requested = getattr(self.log, "stop_requested", None)
                    if r_eval is not None and requested:
                        decision |= STOP
                    decision = t.agree(decision)     # every process acts at the same step
                    if decision & DECAY and not decision & STOP:
                        lr = t.scale_learning_rate(s.lr_decay)
                        self.log.event("lr_decay", step=t.step, learning_rate=lr)
                    if decision & STOP:
                        stopped_early = True
                        stopped_by = requested or "early_stopping"
                        if requested:
                            self.log.event("stop_requested", step=t.step, reason=requested)
                        elif best is not None:
                            self.log.event("early_stop", step=t.step, best_step=best["step"],
                                           **{f"best_{s.monitor}": best["valid"][s.monitor]})
                        break
                # After the evaluation of the same step: a checkpoint holds what it decided
                # (a learning-rate decay; evaluations_since counts it on resume).
                if (s.checkpoint_every and t.step % s.checkpoint_every == 0) or \
                        (s.checkpoint_secs and time.monotonic() - last_ckpt >= s.checkpoint_secs):
                    t.save(t.step)
                    last_ckpt = time.monotonic()
        flush(t.step)
        return Outcome(t.step, stopped_early, windows, totals.input_wait_s, totals.compute_s,
                       best, s, stopped_by=stopped_by)


def evaluations_since(s: Schedule, best_step: int, step: int) -> int:
    """How many evaluations the schedule made after the best one, up to `step`: a resumed
    run's count of evaluations without improvement, so that it stops where the run would
    have stopped undisturbed. Each evaluation runs before the checkpoint of its step."""
    if not s.eval_every:
        return 0
    return max(0, step // s.eval_every - best_step // s.eval_every)


STOP, DECAY = 1, 2      # what an evaluation decides (Controller.run; trainer.agree)


def improves(figures: dict, best: dict | None, monitor: str) -> bool:
    """Whether a validation evaluation beats the best so far by the monitored metric (by more
    than float noise: a plateau is not an improvement). A first evaluation always does."""
    if best is None:
        return True
    new, old = figures[monitor], best["valid"][monitor]
    if not math.isfinite(old):
        return math.isfinite(new)
    return new > old + 1e-5 if monitor == "auc" else new < old - 1e-5


def best_record(s: Schedule, step: int, figures: dict) -> dict:
    epoch = round(step / s.steps_per_epoch, 2) if s.steps_per_epoch else None
    return {"step": step, "epoch": epoch, "monitor": s.monitor,
            "valid": {k: v for k, v in figures.items() if k not in ("labels", "probs")}}


def finish(cfg, trainer, log, outcome: Outcome, *, manifest, feature_size: int, model_dir,
           result: dict) -> dict:
    """The chief's end of a run: final checkpoint (unless the last one is of this step),
    evaluation, export, test predictions, result.json and the summary line."""
    import json
    from pathlib import Path

    from .export import export_saved_model
    from .model_dir import PREDICTIONS, RESULT, data_vocabulary, warm_start_record
    md = Path(model_dir)
    clock = Phases(outcome)
    trainer.save_final(outcome.step)
    clock.lap("final_checkpoint")
    result = {"step": outcome.step, **result, "stopped_early": outcome.stopped_early,
              "stopped_by": outcome.stopped_by,
              "input_wait_s": outcome.input_wait_s, "compute_s": outcome.compute_s,
              "input_bound": outcome.input_bound, "windows": outcome.windows,
              "examples_per_s": steady_throughput(outcome.windows),
              "epochs": outcome.schedule.epochs if outcome.schedule else None,
              "warm_start": warm_start_record(md), **dynamic_record(trainer.model)}
    result["valid"] = trainer.evaluate("valid", outcome.step)
    selected = choose_model(cfg, trainer, outcome, result["valid"], log)
    if selected:
        result["selected"] = selected
        result["valid"] = selected["valid"]
    model_step = selected["step"] if selected else outcome.step
    result["test"] = trainer.evaluate("test", model_step, keep=bool(cfg.predictions))
    clock.lap("evaluation")
    if result["test"] is not None and cfg.predictions:
        labels, probs = result["test"].pop("labels"), result["test"].pop("probs")
        result["predictions"] = write_predictions(
            md / PREDICTIONS if cfg.predictions == "auto" else Path(cfg.predictions), probs, labels)
    if cfg.export:
        vocab = data_vocabulary(cfg.train_dir, manifest)
        from .config import run_schema
        schema = run_schema(cfg, manifest)
        dynamic = [f.name for f in schema.fields if f.dynamic] if schema else []
        # Named after the step of the model it holds (the best one, if restored).
        result["export"] = export_saved_model(
            trainer.model, md / "export", model_step,
            {"model": cfg.model, "field_size": manifest.field_size, "feature_size": feature_size,
             **({"fields": manifest.fields} if manifest.fields else {}),
             **({"dynamic_fields": dynamic} if dynamic else {}),
             **({"numeric_input": trainer.model.cfg.numeric_input}
                if trainer.model.cfg.numeric_fields else {}),
             "step": model_step, "trained_steps": outcome.step, "test": result["test"],
             "valid": result["valid"], "mode": cfg.mode}, vocab, schema=schema)
        log.event("export", step=outcome.step, path=result["export"], model_step=model_step)
    clock.lap("export")
    result["phases_s"] = clock.phases
    (md / RESULT).write_text(json.dumps(result, indent=2) + "\n")
    log.result(result, md / RESULT)
    log.event("summary", step=outcome.step, **summary_fields(result))
    heartbeat.finishing()
    log.close()
    return result


def dynamic_record(model) -> dict:
    """A model with dynamic fields: its pools' rows and how many values hold one now."""
    if getattr(model, "dynamic", None) is None:
        return {}
    return {"dynamic_rows": {"pool": sum(r for _, r in model.dynamic.pools),
                             "held": int(model.dynamic.live())}}


def announce_model_choice(log, cfg, schedule: Schedule) -> None:
    """Says once, at the start, when no validation evaluation can choose the exported model."""
    if not log.console:
        return
    if not cfg.valid_dir:
        print("no validation set: the last model is exported; `ctrtrain data split` makes one",
              flush=True)
    elif cfg.export_best and not schedule.eval_every:
        why = "eval_every 0" if cfg.eval_every != "auto" else "a Pipe stream has no known epoch"
        print(f"validation set evaluated at the end only ({why}): the last model is exported",
              flush=True)


def choose_model(cfg, trainer, outcome: Outcome, last_valid: dict | None, log) -> dict | None:
    """With a validation split: the model a run tests and exports, as a record (step, epoch,
    monitor, valid; `best`: whether it is the best evaluated; `last`: the last model's step
    and figures): the best evaluated one, its variables restored, unless the last is at
    least as good or export_best is off (then the last). None without a validation split:
    nothing can choose."""
    if last_valid is None:
        return None
    last = {"step": outcome.step, "valid": last_valid}
    best = outcome.best
    last_is_best = best is None or best["step"] == outcome.step or \
        improves(last_valid, best, cfg.monitor)
    if last_is_best or not cfg.export_best:
        return {**best_record(outcome.schedule, outcome.step, last_valid),
                "best": last_is_best, "last": last}
    trainer.restore_best(best)
    log.event("restore_best", step=outcome.step, best_step=best["step"],
              **{f"best_{cfg.monitor}": best["valid"][cfg.monitor]})
    return {**best, "best": True, "last": last}


class Phases:
    """Seconds of a process's life by phase: start-up (interpreter, imports, data checks,
    model build, restore: process start to the first step), training, then each after-training
    action -- where small runs spend their time (docs/benchmarks.md)."""

    def __init__(self, outcome: Outcome):
        start = process_start_time()
        training = sum(w["seconds"] for w in outcome.windows)
        self.phases = {"startup": round(max(0.0, time.time() - start - training
                                            - (time.perf_counter() - outcome.ended)), 3),
                       "training": round(training, 3)}
        self._t = time.perf_counter()
        self.phases["after_loop"] = round(self._t - outcome.ended, 3)

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = round(now - self._t, 3)
        self._t = now


def process_start_time() -> float:
    """Wall-clock time this process started (Linux: /proc/self/stat's start time)."""
    import os
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


def steady_throughput(windows: list) -> float | None:
    """Examples/s after warm-up: the windows after the first (which pays for tracing and the
    first batches); None with a single window (log more often to see it)."""
    use = windows[1:]
    seconds = sum(w["seconds"] for w in use)
    return sum(w["examples_per_s"] * w["seconds"] for w in use) / seconds if seconds else None


def summary_fields(result: dict) -> dict:
    out = {"examples_per_s": result.get("examples_per_s"), "input_bound": result["input_bound"]}
    if result.get("selected"):      # the model tested and exported
        out.update(model_step=result["selected"]["step"], model_epoch=result["selected"]["epoch"])
    for split in ("valid", "test"):
        if result.get(split):
            out[f"{split}_auc"] = result[split]["auc"]
            out[f"{split}_logloss"] = result[split]["logloss"]
    return out


def write_predictions(path, probs, labels) -> str:
    """CSV `row,prob,label` at full float32 precision, written whole or not at all."""
    import os

    import numpy as np
    tmp = f"{path}.tmp"
    rows = np.arange(len(probs)).astype(str)
    with open(tmp, "w") as f:
        f.write("row,prob,label\n")
        f.write("".join(f"{r},{p},{int(y)}\n" for r, p, y in
                        zip(rows, np.char.mod("%.9g", probs), labels)))
    os.replace(tmp, path)
    return str(path)
