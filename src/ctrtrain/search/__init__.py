"""Hyperparameter search: `ctrtrain tune --search space.yaml --trials N` (docs/training.md,
"Hyperparameter search").

- space.py: the space file (the metric, the settings searched and their ranges), checked
  whole before any trial runs;
- study.py: the Optuna study (TPE, a median pruner fed by each validation evaluation through
  train/metrics_log.evaluation_listener), each trial a training run in this process in
  WORK/trial-NNN, kept in an SQLite file so that the same command resumes it;
- report.py: what a search leaves: the trials' table (stdout, trials.csv), their plot
  (trials.png) and the best trial's settings as a configuration file (best.yaml).

Optuna is imported when a search starts, never by `import ctrtrain` or the CLI's parser.
"""

from __future__ import annotations


def run_search(space_path, settings: dict, trials: int, work_dir) -> list[dict]:
    """The search `ctrtrain tune --search` runs (study.run_search); returns the trials' rows."""
    from .study import run_search as run
    return run(space_path, settings, trials, work_dir)
