"""The search: an Optuna study of training runs, in this process, one at a time.

Where things are (WORK: --work-dir):

    WORK/study.db       the study (SQLite): every trial's parameters, state, intermediate
                        and final values. The same command run again resumes it.
    WORK/trial-NNN/     trial NNN's run directory, as `ctrtrain train --model-dir` leaves it
    WORK/trials.csv     WORK/trials.png   WORK/best.yaml      (report.py)

The sampler is TPE (Optuna's default), seeded. The pruner is Optuna's MedianPruner: a trial
stops at an evaluation whose figure is worse than the median of the completed trials' at the
same evaluation. Median rather than Hyperband: it works from a handful of trials (a search
on one host runs tens, where Hyperband's brackets want many), needs no maximum resource (the
number of evaluations is each trial's schedule's, which the space may change: epochs), and
prunes the same trials for the same completed ones.

Each validation evaluation of a trial's run reaches the trial through the run's log
(train/metrics_log.evaluation_listener): reported at its index (0, 1, ...: trials whose
batch sizes differ evaluate at different global steps but at the same epochs), and when the
pruner says so the run stops there as early stopping stops it -- final checkpoint,
evaluation, result.json (`stopped_by: pruned`) -- and the trial is PRUNED. What a trial
reports is the figure its run would end with if stopped there (report_figure), so that a
pruned trial's value (Optuna keeps its last report) is its result.json's, as a completed
trial's is.

Resuming: trials COMPLETE, PRUNED, or FAIL as an outcome of their parameters (a diverged
run, a combination the settings refuse) count towards --trials; a trial found RUNNING (its
process was killed) or stopped by an error or a signal is marked FAIL and its parameters are
tried again in a new trial, from the start. A lock file keeps a second search out of the
same WORK.
"""

from __future__ import annotations

import fcntl
import math
import os
import time
from pathlib import Path

from ..errors import ConfigError, first_line
from ..train.config import model_reads
from .space import Space, load_space, setting_value

STUDY_NAME = "ctrtrain-search"
PRUNED_BY = "pruned"        # result.json's stopped_by of a pruned trial's run


def import_optuna():
    try:
        import optuna
    except ImportError:
        raise ConfigError("--search needs Optuna: pip install optuna (requirements/main.txt "
                          "pins it)") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)   # a line per trial is ours
    return optuna


def run_search(space_path, settings: dict, trials: int, work_dir) -> list[dict]:
    """Runs the search of `space_path` until `trials` trials are done (those of earlier runs
    counted); `settings`: every trial's training settings ({name: value}, parsed: the flags
    and --config of `train`). Returns the rows of the trials' table."""
    from . import report
    space = load_space(space_path)
    base = trial_base(settings, space)
    check_space(space, base)            # all of it, before any trial or any file is written
    optuna = import_optuna()
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    with _locked(work / "search.lock"):
        study = open_study(optuna, space, work, settings)
        done = len(counted(optuna, study))
        print(f"search: {space.metric} ({space.direction}d) over {len(space.params)} settings, "
              f"{trials} trials" + (f" ({done} done: resuming)" if done else "")
              + f"; pruner {space.pruner['type']}; in {work}", flush=True)
        for _ in range(max(0, trials - done)):
            t0 = time.perf_counter()
            trial = study.ask()
            run_trial(optuna, study, trial, space, base, work)
            done += 1
            print(report.progress_line(study, trial.number, space, done, trials,
                                       time.perf_counter() - t0), flush=True)
        return report.write_all(study, space, work, settings)


def trial_base(settings: dict, space: Space) -> dict:
    """Every trial's settings but the searched ones and its run directory: the given ones,
    quiet unless they say otherwise (a line per trial is the search's), the monitor the
    search's metric (the run's best model and early stopping judge what the search does)."""
    if not settings.get("train_dir"):
        raise ConfigError("--train is required (a flag, or train_dir in the --config file)")
    if not settings.get("valid_dir"):
        raise ConfigError("--valid is required with --search: trials are compared on the "
                          "validation split")
    if "model_dir" in settings:
        raise ConfigError("--model-dir: each trial's run directory is <work-dir>/trial-NNN "
                          "(--work-dir)")
    if settings.get("monitor", space.figure) != space.figure:
        raise ConfigError(f"monitor {settings['monitor']}: the search's metric {space.metric} "
                          f"is every trial's monitor (leave monitor out)")
    base = {**settings, "monitor": space.figure}
    base.setdefault("quiet", True)
    base.setdefault("progress", False)
    return base


def trial_config(base: dict, values: dict, run_dir):
    """The TrainConfig of a trial: `values` ({setting: value}, parsed) over `base`, into
    `run_dir`, fresh (a directory left by an earlier study of the same WORK is replaced)."""
    from ..train.config import TrainConfig, check_config
    cfg = TrainConfig(**{**base, **values, "model_dir": str(run_dir), "fresh": True})
    check_config(cfg)
    return cfg


def check_space(space: Space, base: dict) -> None:
    """Each searched setting at each of its bounds or choices, over the given settings:
    refused naming the file and the key, before anything runs, when no other searched
    setting's bound or choice makes it valid either (a dropout per layer is checked against
    every searched deep_layers; a model's option against every searched model, as the trial
    of a model that does not read it leaves it out: Space.draw). Other combinations are the
    trials' to find."""
    trial_config(base, {}, "unused")
    for p in space.params:
        others = [{}] + [{q.name: setting_value(q.name, w)} for q in space.params
                         if q is not p for w in q.values()]
        if p.section == "model" and p.name != "model":    # tried with models that read it
            others = [o for o in others
                      if p.name in model_reads(o.get("model", given_model(base)))]
        for v in p.values():
            errors = []
            for other in others:
                try:
                    trial_config(base, {**other, p.name: setting_value(p.name, v)}, "unused")
                    break
                except ConfigError as e:
                    errors.append(e)
            else:
                why = errors[0] if errors else \
                    f"model {given_model(base)} does not use it, nor any model searched " \
                    "(model.model)"
                raise ConfigError(f"{space.path}: space: {p.key}: {v!r}: {why}") from None


def given_model(base: dict) -> str:
    """The model of the trials that do not draw one."""
    from ..train.config import field_named
    return base.get("model") or field_named("model").default


def open_study(optuna, space: Space, work: Path, settings: dict):
    """The study of WORK, created or resumed; a WORK holding the search of another space is
    refused (its trials would not compare) before anything in it changes."""
    storage = optuna.storages.RDBStorage(f"sqlite:///{(work / 'study.db').resolve()}")
    try:
        study_id = storage.get_study_id_from_name(STUDY_NAME)
    except KeyError:        # a new study
        study_id = None
    interrupted = []
    if study_id is not None:
        earlier = storage.get_study_user_attrs(study_id)
        if earlier.get("space") != space.describe():
            raise ConfigError(f"{work}: holds the search of another space (started with "
                              f"{earlier.get('space_file')}): give the same space to resume "
                              "it, or another --work-dir")
        interrupted = fail_running(optuna, storage, study_id)
    pruner = optuna.pruners.NopPruner() if space.pruner["type"] == "none" else \
        optuna.pruners.MedianPruner(n_startup_trials=space.pruner["startup_trials"],
                                    n_warmup_steps=space.pruner["warmup_evaluations"])
    study = optuna.create_study(study_name=STUDY_NAME, storage=storage, pruner=pruner,
                                direction=space.direction, load_if_exists=True)
    if study_id is None:
        study.set_user_attr("space", space.describe())
        study.set_user_attr("space_file", str(space.path))
        study.set_user_attr("settings", {k: list(v) if isinstance(v, tuple) else v
                                         for k, v in settings.items()})
    for t in interrupted:       # tried again first (study.ask takes queued trials first)
        study.enqueue_trial(t.params, user_attrs={"retry_of": t.number})
    # Seeded, and seeded differently when resuming: a sampler seeded as before would draw the
    # first trials' parameters again in its random start-up trials.
    study.sampler = optuna.samplers.TPESampler(
        seed=space.sampler["seed"] + len(study.trials),
        n_startup_trials=space.sampler["startup_trials"])
    return study


def fail_running(optuna, storage, study_id: int) -> list:
    """The trials still RUNNING in the study at the start (the lock says no search runs):
    their process was killed. Marked FAIL (interrupted); returned, to be tried again."""
    S = optuna.trial.TrialState
    running = storage.get_all_trials(study_id, deepcopy=False, states=(S.RUNNING,))
    for t in running:
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
        storage.set_trial_user_attr(trial_id, "interrupted", "its process ended mid-trial")
        storage.set_trial_state_values(trial_id, S.FAIL)
    return running


def counted(optuna, study) -> list:
    """The trials that count towards --trials: complete, pruned, or failed as an outcome of
    their parameters (a diverged run, a combination the settings refuse), not because their
    run was interrupted."""
    S = optuna.trial.TrialState
    return [t for t in study.get_trials(deepcopy=False) if t.state in (S.COMPLETE, S.PRUNED)
            or (t.state == S.FAIL and "interrupted" not in t.user_attrs)]


def run_trial(optuna, study, trial, space: Space, base: dict, work: Path) -> None:
    """Trains the trial's run and tells the study how it ended."""
    from ..train import train
    from ..train.controller import NonFiniteLoss
    from ..train.metrics_log import evaluation_listener
    FAIL = optuna.trial.TrialState.FAIL
    run_dir = work / f"trial-{trial.number:03d}"
    names = {p.key: p.name for p in space.params}
    drawn = {names[k]: setting_value(names[k], v)
             for k, v in space.draw(trial, given_model(base)).items()}
    reporter = Reporter(trial, space.figure, drawn.get("export_best",
                                                       base.get("export_best", True)))
    cfg = None
    try:
        cfg = trial_config(base, drawn, run_dir)
        trial.set_user_attr("run_dir", str(run_dir))    # none for a refused combination
        with evaluation_listener(reporter):
            result = train(cfg)
    except BaseException as e:
        if is_outcome(e, NonFiniteLoss, cfg):
            # An answer about these parameters, not the search's end.
            trial.set_user_attr("error", first_line(e))
            study.tell(trial, state=FAIL)
            return
        # Bad data, a signal, a bug: the search stops with the error; the trial is tried
        # again, with its parameters, when the search is resumed.
        trial.set_user_attr("interrupted", first_line(e) if str(e) else type(e).__name__)
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        study.tell(trial, state=FAIL)
        raise
    trial.set_user_attr("evaluations", reporter.index + 1)
    if result.get("stopped_by") == PRUNED_BY:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)   # value: its last report
        return
    value = result["valid"][space.figure]
    if math.isfinite(value):
        study.tell(trial, value)
    else:       # AUC without both labels in the validation split
        trial.set_user_attr("error", f"validation {space.figure} {value}")
        study.tell(trial, state=FAIL)


def is_outcome(e: BaseException, diverged: type, cfg) -> bool:
    """Whether a trial's error is an answer about its parameters: its run diverged (a
    learning rate too high), or the settings refused the drawn combination before the run
    started (cfg None; check_space tries each setting against the others' bounds and
    choices one at a time, not every combination)."""
    return isinstance(e, diverged) or (isinstance(e, ConfigError) and cfg is None)


class Reporter:
    """The evaluation listener of a trial's run (train/metrics_log.evaluation_listener):
    reports each validation evaluation to the trial at its index, and asks the run to stop
    when the pruner says so."""

    def __init__(self, trial, figure: str, export_best: bool):
        self.trial, self.figure, self.export_best = trial, figure, export_best
        self.index, self.step, self.best = -1, None, None

    def __call__(self, step: int, figures: dict):
        if step == self.step:   # the model evaluated again at the end (after a stop)
            return None
        self.step, self.index = step, self.index + 1
        value = self.report_figure(figures)
        self.trial.report(value, self.index)
        return PRUNED_BY if self.trial.should_prune() else None

    def report_figure(self, figures: dict) -> float:
        """The figure the run would end with if it stopped at this evaluation: its best
        evaluation's by the monitor (the search's metric) when it exports the best model,
        as controller.choose_model chooses it; else this one's."""
        from ..train.controller import improves
        if not self.export_best or improves(figures, self.best and {"valid": self.best},
                                            self.figure):
            self.best = figures
        return float(self.best[self.figure])


class _locked:
    """An exclusive lock on a file for the search's duration: a second search of the same
    WORK is refused (the first one's RUNNING trials are not interrupted ones)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.f = open(self.path, "w")
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.f.close()
            raise ConfigError(f"{self.path.parent}: another search is running there (it holds "
                              f"{self.path})") from None
        self.f.write(f"{os.getpid()}\n")
        self.f.flush()
        return self

    def __exit__(self, *exc):
        self.f.close()      # and the lock with it
        return False
