"""The Python API: `ctrtrain.train(...)`, `ctrtrain.evaluate(...)`, `ctrtrain.predict(...)`
(docs/api.md). Each takes the settings of its command (`ctrtrain train`'s are the keys of a
configuration file, train/config.py), refuses a bad one as the command does, with the same
message, as an exception (errors.py: ConfigError, DataError), and returns what the command
writes: the run's result (result.json), the evaluation report, the probabilities.

Importing this module imports nothing heavy: each function imports what it runs (TensorFlow
among it) when called, after the package's `tf_start` hook (installed by `import ctrtrain`),
as a `ctrtrain` command does.
"""

from __future__ import annotations

import os
import types

from .errors import ConfigError

# train's data sources by the name of their flag too (`--train`: train_dir), as the
# README's commands give them.
FLAG_NAMES = {"train": "train_dir", "valid": "valid_dir", "test": "test_dir"}


def _start() -> None:
    """What `ctrtrain`'s main does before TensorFlow is imported: its C++ start-up chatter
    kept out (a setting the caller made stands)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def train_config(config=None, **settings):
    """The training configuration `train` runs: the defaults < the configuration file
    `config` < `settings` (by configuration key, a flag's name for the data, or an alias),
    each parsed and checked by the configuration table, a bad one a ConfigError naming it."""
    from .train.config import (TrainConfig, check_config, field_named, load_config_file,
                               parse_value)
    given: dict = {}
    for key, value in settings.items():
        name, parsed = parse_value(FLAG_NAMES.get(key, key), value)
        if name in given:
            twice = [k for k in settings if field_named(FLAG_NAMES.get(k, k)).name == name]
            raise ConfigError(f"{name}: given twice (as {' and '.join(twice)})")
        given[name] = parsed
    values = load_config_file(config) if config is not None else {}
    values.update(given)
    for name, flag in (("train_dir", "train"), ("model_dir", "model_dir")):
        if not values.get(name):
            raise ConfigError(f"{name} is required ({flag}=..., or {name} in the config file)")
    values.setdefault("progress", not values.get("quiet", False))
    cfg = TrainConfig(**values)
    check_config(cfg)
    return cfg


def train(config=None, **settings) -> dict:
    """Trains a model as `ctrtrain train` does; returns the run's result, what it writes to
    <model_dir>/result.json (steps, validation and test figures, the export's path, ...).

    `config`: a YAML configuration file (`ctrtrain train --config`); `settings`: any setting
    by its key in such a file (batch_size=1024, model="dcn_v2", epochs=2, ...), the data also
    as train=, valid=, test= (the flags' names); they override the file. train (train_dir)
    and model_dir are required. A bad setting raises ConfigError naming it; bad data
    DataError; both are CtrError."""
    cfg = train_config(config, **settings)
    _start()
    from .train import train as run
    return run(cfg)


def _checked(name: str, value, parse):
    try:
        return parse(value)
    except ValueError as e:
        raise ConfigError(f"{name}: {e}") from None


def _inputs(value) -> list[str]:
    """`input`: one path, or several (a list), as the commands' --input takes them."""
    if isinstance(value, (str, os.PathLike)):
        return [os.fspath(value)]
    paths = [os.fspath(p) for p in value] if isinstance(value, (list, tuple)) else None
    if not paths:
        raise ConfigError(f"input: {value!r}: give a path or a list of paths")
    return paths


def _reading(input_format, batch_size):
    """evaluate's and predict's common flags, checked as the commands check them (after
    `_start`: the formats' module imports TensorFlow)."""
    from .train.predict import INPUT_FORMATS
    from .values import choice, number
    return (_checked("input_format", input_format, choice(*INPUT_FORMATS)),
            _checked("batch_size", batch_size, number(int, 1)))


def evaluate(model, input, *, input_format: str = "auto", vocab=None, group: str | None = None,
             bins: int = 10, json=None, plot=None, batch_size: int = 4096) -> dict:
    """Evaluates an exported model on labeled data as `ctrtrain evaluate` does; returns the
    report (the dict `--json` writes: auc, logloss, gauc, calibration, unknown_share, ...).

    `model`: a SavedModel, or a model directory's export/ base (its newest version);
    `input`: a path or a list of paths (a data directory, TFRecord, libsvm, libffm or raw CSV
    files). The keywords are the command's flags: `json` writes the report there, `plot` the
    reliability diagram (default: beside `json`)."""
    from .values import number
    inputs = _inputs(input)
    bins = _checked("bins", bins, number(int, 1))
    _start()
    input_format, batch_size = _reading(input_format, batch_size)
    from .train.evaluation_report import (check_outputs, default_plot_path, evaluate_model,
                                          plot_reliability, write_json)
    json = os.fspath(json) if json else None
    plot = os.fspath(plot) if plot else default_plot_path(json)
    check_outputs([json, plot], inputs)
    report = evaluate_model(os.fspath(model), inputs, input_format=input_format,
                            vocab=os.fspath(vocab) if vocab else None, group=group, bins=bins,
                            batch=batch_size)
    report["plot"] = plot
    if plot:
        plot_reliability(report, plot)
    if json:
        write_json(report, json)
    return report


def predict(model, input, out=None, *, input_format: str = "auto", vocab=None,
            no_label: bool = False, batch_size: int = 4096):
    """Scores data with an exported model as `ctrtrain predict` does; returns the
    probabilities, a float32 NumPy array in input order, one per row. With `out`, also
    writes them there as the command does (CSV row,prob[,label], or JSON lines for .jsonl).

    `model`, `input`: as for evaluate; `no_label`: raw rows without a label column."""
    from .values import boolean
    inputs = _inputs(input)
    has_label = not _checked("no_label", no_label, boolean)
    _start()
    input_format, batch_size = _reading(input_format, batch_size)
    from .train.predict import predict_scored
    _, (_, probs) = predict_scored(os.fspath(model), inputs, os.fspath(out) if out else None,
                                   input_format=input_format,
                                   vocab=os.fspath(vocab) if vocab else None,
                                   has_label=has_label, batch=batch_size, keep_all=True)
    return probs


class TrainPackage(types.ModuleType):
    """The class of the `ctrtrain.train` package (set by `import ctrtrain`): called, it is
    the API's train. A function could not keep that name: importing the package (the first
    training does) sets the package's attribute `train` to it."""

    def __call__(self, config=None, **settings) -> dict:
        return train(config, **settings)

    __call__.__doc__ = train.__doc__
