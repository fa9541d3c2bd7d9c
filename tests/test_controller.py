"""The training controller with a trainer that only counts: what happens between the steps
(windows, checkpoints, evaluation, early stopping, stop requests, bad losses, the end of the
data) is the controller's alone, the same for every mode. No TensorFlow, in milliseconds."""

import math
import os
import signal

import pytest

from ctrtrain.errors import DataError
from ctrtrain.train.controller import STOP, Controller, NonFiniteLoss, Schedule, StepStats
from ctrtrain.train.stop import Interrupted


class FakeTrainer:
    def __init__(self, aucs=(), losses=None, data_steps=None, signal_at=None):
        self.step, self.saves, self.evals, self.calls = 0, [], [], []
        self.aucs, self.losses = list(aucs), losses or {}
        self.data_steps, self.signal_at = data_steps, signal_at
        self.kept, self.earlier_best, self.lr = [], None, 1.0

    def train_steps(self, n, stop):
        self.calls.append(n)
        s = StepStats()
        for _ in range(n):
            if stop():
                break
            if self.data_steps is not None and self.step >= self.data_steps:
                s.data_ended = True
                break
            loss = self.losses.get(self.step + 1, 0.5)
            if not math.isfinite(loss):
                s.nonfinite_step, s.loss_sum = self.step + 1, loss
                break
            self.step += 1
            s.steps += 1
            s.loss_sum += loss
            s.input_wait_s += 0.001
            s.compute_s += 0.003
            if self.step == self.signal_at:
                os.kill(os.getpid(), signal.SIGTERM)
        return s

    def save(self, step):
        self.saves.append(step)

    def evaluate(self, name, step, keep=False):
        self.evals.append(step)
        return {"auc": self.aucs.pop(0)} if self.aucs else None

    def agree(self, decision):
        return decision

    def scale_learning_rate(self, factor):
        self.lr *= factor
        return self.lr

    def keep_best(self, record):
        self.kept.append(record["step"])

    def best_kept(self):
        return self.earlier_best

    def restore_best(self, record):
        raise AssertionError("the loop never restores")


class Log:
    enabled = True

    def __init__(self):
        self.events = []

    def event(self, kind, step, **fields):
        self.events.append((kind, step, fields))

    def kinds(self, kind):
        return [(s, f) for k, s, f in self.events if k == kind]


def run(trainer, **schedule):
    log = Log()
    s = Schedule(**{"total_steps": 100, "log_every": 10, **schedule})
    return Controller(trainer, s, log, global_batch=32, data_name="data").run(), log


def test_windows_checkpoints_and_evaluations_fall_on_their_steps():
    t = FakeTrainer()
    out, log = run(t, total_steps=95, log_every=20, checkpoint_every=30, eval_every=25)
    assert out.step == t.step == 95 and not out.stopped_early
    assert [s for s, _ in log.kinds("train")] == [20, 40, 60, 80, 95]
    assert t.saves == [30, 60, 90] and t.evals == [25, 50, 75]
    assert sum(w["steps"] for w in out.windows) == 95
    assert out.input_bound == pytest.approx(0.25)
    assert all(w["input_bound"] == pytest.approx(0.25) for w in out.windows)
    # The trainer is asked for exactly the steps up to the next boundary.
    assert sum(t.calls) == 95 and max(t.calls) <= 20


def test_early_stopping_after_evaluations_without_improvement():
    t = FakeTrainer(aucs=[0.70, 0.72, 0.719, 0.72, 0.80])
    out, log = run(t, eval_every=10, early_stopping=2, keep_best=True, steps_per_epoch=20)
    assert out.stopped_early and out.step == 40 and t.evals == [10, 20, 30, 40]
    assert log.kinds("early_stop") == [(40, {"best_step": 20, "best_auc": 0.72})]
    # The best model is kept at each improvement, and its record says when it was.
    assert t.kept == [10, 20]
    assert out.best == {"step": 20, "epoch": 1.0, "monitor": "auc", "valid": {"auc": 0.72}}


def test_logloss_monitored_and_a_resumed_run_compares_with_the_earlier_best():
    t = FakeTrainer()
    t.aucs = [{"auc": 0.9, "logloss": 0.50}, {"auc": 0.5, "logloss": 0.45},
              {"auc": 0.9, "logloss": 0.46}, {"auc": 0.9, "logloss": 0.47}]
    t.evaluate = lambda name, step, keep=False: (t.evals.append(step), t.aucs.pop(0))[1]
    out, log = run(t, eval_every=10, early_stopping=2, keep_best=True, monitor="logloss")
    assert out.stopped_early and t.evals == [10, 20, 30, 40] and t.kept == [10, 20]
    assert out.best["step"] == 20 and out.best["epoch"] is None   # no epoch length known
    # Resumed: the earlier run's best (logloss 0.40) is not beaten, so nothing is kept.
    t = FakeTrainer()
    t.earlier_best = {"step": 5, "epoch": None, "monitor": "logloss", "valid": {"logloss": 0.40}}
    t.aucs = [{"auc": 0.9, "logloss": 0.45}, {"auc": 0.9, "logloss": 0.41}]
    t.evaluate = lambda name, step, keep=False: (t.evals.append(step), t.aucs.pop(0))[1]
    out, log = run(t, eval_every=10, early_stopping=2, keep_best=True, monitor="logloss")
    assert out.step == 20 and out.stopped_early and t.kept == [] and out.best["step"] == 5


def test_a_loss_that_is_not_finite_stops_before_any_checkpoint_of_it():
    t = FakeTrainer(losses={37: float("nan")})
    with pytest.raises(NonFiniteLoss, match="became nan at step 37"):
        run(t, checkpoint_every=10)
    assert t.saves == [10, 20, 30]


def test_the_end_of_the_data_before_the_steps_is_an_error_and_without_steps_the_end():
    with pytest.raises(DataError, match="ended after 42 of 100 steps"):
        run(FakeTrainer(data_steps=42))
    out, log = run(FakeTrainer(data_steps=42), total_steps=None)
    assert out.step == 42 and log.kinds("train")[-1][0] == 42


def test_sigterm_saves_then_raises_interrupted():
    t = FakeTrainer(signal_at=33)
    with pytest.raises(Interrupted) as e:
        run(t, checkpoint_every=0)
    assert e.value.exit_code == 143 and e.value.step == 33 and t.saves == [33]


def test_a_rank_that_does_not_evaluate_stops_when_the_chief_decides():
    """Another rank of a multi-process job: its evaluate returns None (the chief evaluates),
    and it stops at the step the chief's decision (trainer.agree) names."""
    t = FakeTrainer()
    t.agree = lambda decision: STOP if decision == 0 and t.step == 30 else 0
    out, log = run(t, eval_every=10, early_stopping=2, keep_best=True)
    assert out.stopped_early and out.step == 30 and t.evals == [10, 20, 30]
    assert out.best is None and t.kept == [] and log.kinds("early_stop") == []


def test_the_learning_rate_decays_after_each_evaluation_without_improvement():
    t = FakeTrainer(aucs=[0.70, 0.69, 0.71, 0.70, 0.70])
    out, log = run(t, eval_every=10, early_stopping=2, lr_decay=0.1)
    assert [s for s, _ in log.kinds("lr_decay")] == [20, 40]
    assert t.lr == pytest.approx(0.01) and out.stopped_early and out.step == 50
