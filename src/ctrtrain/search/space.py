"""The search space file of `ctrtrain tune --search`:

    metric: valid_auc              # maximized; valid_logloss (or valid_loss) is minimized
    sampler: {seed: 0, startup_trials: 10}                            # optional: TPE's
    pruner: {type: median, startup_trials: 5, warmup_evaluations: 0}  # optional; none: off
    space:
      model.embedding_size: {type: categorical, choices: [8, 16, 32]}
      optimizer.learning_rate: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}
      model.dropout: {type: float, low: 0.0, high: 0.5}
      model.deep_layers: {type: categorical, choices: ["256,128", "400,400,400"]}
      schedule.batch_size: {type: int, low: 256, high: 1024, step: 256}

A key of `space` is a setting as a configuration file names it, `section.name` (its section
checked) or the bare name; its values are what the setting takes (each bound and choice is
parsed by the setting's own parser, so a range the setting would refuse is refused here).
Everything wrong is a ConfigError naming the file and the key, before any trial runs: a trial
an hour in should not be the first to find a typo."""

from __future__ import annotations

import dataclasses
import difflib
import json
import math

from ..errors import ConfigError

# The metric a search optimizes: the validation split's figure (result.json's valid) and its
# direction. valid_loss: the name Keras users give the validation log loss.
METRICS = {"valid_auc": ("auc", "maximize"), "valid_logloss": ("logloss", "minimize"),
           "valid_loss": ("logloss", "minimize")}
# Settings a trial may not vary: the data is every trial's (their figures must compare), the
# output section is the search's (each trial's run directory), and the monitor is the metric.
FIXED = {"train_dir": "the data is the same in every trial",
         "valid_dir": "the data is the same in every trial",
         "test_dir": "the data is the same in every trial",
         "fields": "the data is the same in every trial",
         "monitor": "the search's metric is every trial's monitor"}
KINDS = {"float": {"low", "high", "log", "step"}, "int": {"low", "high", "log", "step"},
         "categorical": {"choices"}}
PRUNERS = ("median", "none")
# Other libraries' names of settings (DeepCTR's, Keras's), said when a key uses one.
ELSEWHERE = {"hidden_units": "deep_layers", "dnn_hidden_units": "deep_layers",
             "dnn_dropout": "dropout", "lr": "learning_rate", "embedding_dim": "embedding_size",
             "l2_reg_embedding": "l2_embedding", "l2_reg_dnn": "l2_dense",
             "dnn_use_bn": "batch_norm"}
# Optuna's own defaults (TPESampler, MedianPruner), so that a file without them behaves as
# an Optuna user expects.
SAMPLER = {"seed": 0, "startup_trials": 10}
PRUNER = {"type": "median", "startup_trials": 5, "warmup_evaluations": 0}


@dataclasses.dataclass(frozen=True)
class Param:
    """One searched setting: `key` as the file names it, `name` the setting."""
    key: str
    name: str
    section: str
    kind: str                       # float | int | categorical
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple = ()

    def suggest(self, trial):
        """The trial's value (Optuna's: a list choice is its text, "256,128")."""
        if self.kind == "float":
            return trial.suggest_float(self.key, self.low, self.high, log=self.log, step=self.step)
        if self.kind == "int":
            return trial.suggest_int(self.key, self.low, self.high, log=self.log,
                                     step=self.step or 1)
        return trial.suggest_categorical(self.key, list(self.choices))

    def values(self) -> tuple:
        """The values a pre-check tries: the bounds, or every choice."""
        return self.choices if self.kind == "categorical" else (self.low, self.high)


@dataclasses.dataclass(frozen=True)
class Space:
    path: str
    metric: str                     # as the file names it
    figure: str                     # the validation figure: auc | logloss
    direction: str                  # maximize | minimize
    params: tuple[Param, ...]
    sampler: dict
    pruner: dict

    def draw(self, trial, base_model: str) -> dict:
        """{key: value} a trial draws (Optuna's values). A model setting is drawn only for a
        model that reads it (an Optuna conditional parameter): with `model.model` searched,
        `model.cross_layers` is drawn in DCN-v2's trials, left out of DeepFM's."""
        from ..train.config import model_reads
        out, model = {}, base_model
        for p in self.params:       # `model` first (parse_space)
            if p.name == "model":
                out[p.key] = p.suggest(trial)
                model = setting_value("model", out[p.key])
            elif p.section != "model" or p.name in model_reads(model):
                out[p.key] = p.suggest(trial)
        return out

    def describe(self) -> str:
        """The space as JSON text: a study remembers it, and a resumed search must be the
        same (the path aside: the file may move)."""
        d = dataclasses.asdict(self)
        d.pop("path")
        d["params"] = sorted(d["params"], key=lambda p: p["key"])   # the order is no difference
        return json.dumps(d, sort_keys=True)


def setting_value(name: str, value):
    """A searched setting's value as the trial's configuration takes it (parsed)."""
    from ..train.config import parse_value
    return parse_value(name, value)[1]


def load_space(path) -> Space:
    from ..values import load_yaml_file
    p = str(path)
    raw = load_yaml_file(p, "search space")
    return parse_space(raw, str(p))


def parse_space(raw, where: str) -> Space:
    def bad(key, why):
        return ConfigError(f"{where}: {key}: {why}")

    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a search space is a mapping (metric, space, sampler, pruner)")
    unknown = set(raw) - {"metric", "space", "sampler", "pruner"}
    if unknown:
        raise bad(sorted(map(str, unknown))[0], "not a key of a search space (metric, space, "
                  "sampler, pruner)")
    metric = str(raw.get("metric", "valid_auc"))
    if metric not in METRICS:
        raise bad("metric", f"{metric!r} is not one of {', '.join(METRICS)}")
    space = raw.get("space")
    if not isinstance(space, dict) or not space:
        raise bad("space", "give the settings to search, a mapping of setting: range "
                  "(e.g. optimizer.learning_rate: {type: float, low: 1.0e-4, high: 1.0e-2, "
                  "log: true})")
    params = []
    for key, spec in space.items():
        try:
            params.append(_param(str(key), spec))
        except ValueError as e:
            raise bad(f"space: {key}", str(e)) from None
    names = [p.name for p in params]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise bad(f"space: {twice[0]}", "given twice (as section.name and name?)")
    sampler = _options(raw.get("sampler"), SAMPLER, lambda k, why: bad(f"sampler: {k}", why))
    pruner_raw = raw.get("pruner")
    if isinstance(pruner_raw, str):
        pruner_raw = {"type": pruner_raw}
    pruner = _options(pruner_raw, PRUNER, lambda k, why: bad(f"pruner: {k}", why))
    if pruner["type"] not in PRUNERS:
        raise bad("pruner: type", f"{pruner['type']!r} is not one of {', '.join(PRUNERS)}")
    figure, direction = METRICS[metric]
    # The model first: which model settings a trial draws follows from it (Space.draw).
    params.sort(key=lambda p: p.name != "model")
    return Space(where, metric, figure, direction, tuple(params), sampler, pruner)


def _options(raw, defaults: dict, bad) -> dict:
    """A sampler's or pruner's mapping over its defaults: known keys, counts >= 0."""
    if raw is None:
        return dict(defaults)
    if not isinstance(raw, dict):
        raise bad("", f"give a mapping of {', '.join(defaults)}")
    out = dict(defaults)
    for k, v in raw.items():
        if k not in defaults:
            raise bad(k, f"not one of {', '.join(defaults)}")
        if k == "type":
            out[k] = str(v).strip().lower()
        elif isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise bad(k, f"{v!r} is not a whole number >= 0")
        else:
            out[k] = v
    return out


def _setting(key: str):
    """The settings table's field a space key names (`section.name` or `name`), or
    ValueError."""
    from ..train.config import ALIASES, SECTIONS, table
    section, _, name = key.rpartition(".")
    fields = {f.name: f for f in table()}
    name = ALIASES.get(name, name)
    if name not in fields:
        close = [ELSEWHERE[name]] if name in ELSEWHERE else \
            difflib.get_close_matches(name, list(fields), n=3)
        raise ValueError(f"unknown setting {name!r}" + (f" (did you mean {', '.join(close)}?)"
                                                        if close else "")
                         + "; the settings are train's, `ctrtrain train --help`")
    f = fields[name]
    if section and section not in SECTIONS:
        raise ValueError(f"unknown section {section!r} (the sections: {', '.join(SECTIONS)})")
    if section and section != f.metadata["section"]:
        raise ValueError(f"{name} belongs in section {f.metadata['section']} "
                         f"({f.metadata['section']}.{name}), not {section}")
    if name in FIXED or f.metadata["section"] == "output":
        raise ValueError(f"{name} cannot be searched: "
                         + FIXED.get(name, "the output is the search's (each trial's run "
                                           "directory)"))
    return f


def _param(key: str, spec) -> Param:
    """One entry of `space`, or ValueError saying what is wrong with it."""
    f = _setting(key)
    if isinstance(spec, list):                      # a bare list: the choices
        spec = {"type": "categorical", "choices": spec}
    if not isinstance(spec, dict) or "type" not in spec:
        raise ValueError("give a mapping with a type: float {low, high[, log, step]}, int "
                         "{low, high[, log, step]} or categorical {choices}")
    kind = str(spec["type"]).strip().lower()
    if kind not in KINDS:
        raise ValueError(f"type {spec['type']!r} is not one of {', '.join(KINDS)}")
    extra = sorted(set(spec) - KINDS[kind] - {"type"})
    if extra:
        raise ValueError(f"{extra[0]!r} is not a key of type {kind} "
                         f"({', '.join(sorted(KINDS[kind]))})")
    parse = f.metadata["parse"]

    def accepts(what, value):
        try:
            parse(value)
        except ValueError as e:
            raise ValueError(f"{what} {value!r}: {e}") from None

    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ValueError("choices: give a list of one or more values")
        # Optuna's choices are numbers, text, booleans or null: a list (MLP widths) as the
        # text the setting also reads ("256,128").
        choices = tuple(",".join(map(str, c)) if isinstance(c, list) else c for c in choices)
        for c in choices:
            if c is not None and not isinstance(c, (bool, int, float, str)):
                raise ValueError(f"choice {c!r}: give numbers, text, true/false or a list")
            accepts("choice", c)
        parsed = [parse(c) for c in choices]
        if len({json.dumps(v, default=str) for v in parsed}) < len(parsed):
            raise ValueError("choices: a value is given twice")
        return Param(key, f.name, f.metadata["section"], kind, choices=choices)
    bounds = {end: _number(end, spec.get(end), kind) for end in ("low", "high")}
    low, high = bounds["low"], bounds["high"]
    if not low < high:
        raise ValueError(f"low {low} must be below high {high}")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ValueError(f"log: {log!r} is not true or false")
    step = None if spec.get("step") is None else _number("step", spec["step"], kind)
    if step is not None and step <= 0:
        raise ValueError(f"step: {step} is not above 0")
    if step is not None and log:
        raise ValueError("step and log: give one (Optuna draws a log range without steps)")
    if log and low <= 0:
        raise ValueError(f"log: low {low} must be above 0")
    if kind == "float":
        try:    # a value between the bounds, as a trial draws it (int settings refuse 0.5)
            parse(low + (high - low) / 3)
        except ValueError:
            try:
                parse(int(low))
            except ValueError:
                pass        # refused for another reason: said below, by the bound
            else:
                raise ValueError(f"{f.name} takes whole numbers: give type int") from None
    for end in ("low", "high"):
        accepts(end, bounds[end])
    return Param(key, f.name, f.metadata["section"], kind, low, high, log, step)


def _number(what: str, v, kind: str):
    """A bound or step of a range: a number of the range's kind. YAML reads 1e-4 (no dot) as
    text: such text is taken as the number it spells."""
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            pass
    whole = kind == "int"
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or \
            not math.isfinite(v) or (whole and v != int(v)):
        raise ValueError(f"{what}: {v!r} is not {'an integer' if whole else 'a number'}")
    return int(v) if whole else float(v)
