"""The job spec: a SageMaker estimator written down as YAML (DESIGN.md 3.2), validated with
errors that name the bad key and say what is allowed. Parsed with yaml.safe_load (no code)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import yaml

from ..cluster.plan import Group, Topology
from ..mode import Mode
from ..errors import ConfigError

INPUT_MODES = ("File", "Pipe")
DISTRIBUTIONS = ("FullyReplicated", "ShardedByS3Key")
RECIPES = ("deepfm",)


@dataclasses.dataclass
class Channel:
    name: str
    path: str
    input_mode: str = "File"
    distribution: str = "FullyReplicated"

    def as_dict(self):
        return {"input_mode": self.input_mode, "distribution": self.distribution}


@dataclasses.dataclass
class EntryPoint:
    kind: str      # script | module | recipe
    target: str
    args: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class JobSpec:
    name: str
    entry_point: EntryPoint
    topology: Topology
    channels: dict[str, Channel]
    hyperparameters: dict
    output_dir: str
    time_limit: float | None = None
    watchdog: float | None = 600.0
    pipe_epochs: int = 1
    processing_mode: str = "parallel_epochs"
    spec_path: str | None = None
    min_free_disk_mb: float = 256   # refused before start when the output's disk has less


# Bounds on what a local launch starts: every process is a real process on this machine.
MAX_PROCESSES = 64
MAX_SPEC_BYTES = 1 << 20

_TOP_KEYS = {"name", "entry_point", "hyperparameters", "instance_groups", "distribution",
             "channels", "output_dir", "time_limit", "watchdog", "pipe_epochs", "min_free_disk_mb"}


def _expect(cond, key, msg):
    if not cond:
        raise ConfigError(f"job spec: {key}: {msg}")


def _show(v) -> str:
    """A bounded repr for messages: a YAML alias bomb is a small graph of shared references
    until something (repr, json) expands it, so no message may expand a value."""
    from ..data.manifest import _short
    return _short(v)


def _keys(d, allowed, where):
    _expect(isinstance(d, dict), where or "top level", f"must be a mapping, got {type(d).__name__}")
    _expect(all(isinstance(k, str) for k in d), where or "top level", "keys must be strings")
    unknown = sorted(set(d) - set(allowed))
    _expect(not unknown, f"{where + '.' if where else ''}{unknown[0] if unknown else ''}",
            f"unknown key (allowed: {', '.join(sorted(allowed))})")


def _int(d, key, where, default, minimum=1):
    v = d.get(key, default)
    _expect(isinstance(v, int) and not isinstance(v, bool) and v >= minimum, f"{where}.{key}",
            f"must be an integer >= {minimum}, got {_show(v)}")
    return v


def _simple_name(value, key) -> str:
    """Names that become directories of the run (channels, groups): one path component, so a
    spec cannot reach outside the run directory with `..` or `/`."""
    _expect(isinstance(value, str) and value and value not in (".", "..")
            and all(c.isalnum() or c in "-_." for c in value) and not value.startswith("."),
            key, f"{_show(value)} must be a simple name (letters, digits, '-', '_', '.'; no '/' or '..')")
    return value


def _safe_path(base: Path, value, key) -> str:
    _expect(isinstance(value, str) and value, key, "must be a non-empty path string")
    p = Path(value)
    return os.path.normpath(str(p if p.is_absolute() else (base / p)))


def load_spec(path: str | os.PathLike, overrides: dict | None = None) -> JobSpec:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_SPEC_BYTES:
            raise ConfigError(f"job spec {path} is over {MAX_SPEC_BYTES >> 20} MB: not a job spec")
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"job spec {path} does not exist") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"job spec {path} is not valid YAML: {e}") from None
    except RecursionError:
        raise ConfigError(f"job spec {path} is nested too deeply to be a job spec") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"job spec {path} is not UTF-8 text ({e.reason})") from None
    if overrides:
        raw = {**raw, **overrides}
    return parse_spec(raw, base=path.resolve().parent, spec_path=str(path))


def parse_spec(raw: dict, base: Path = Path("."), spec_path: str | None = None) -> JobSpec:
    _keys(raw, _TOP_KEYS, "")
    for k in ("name", "entry_point", "instance_groups", "output_dir"):
        _expect(k in raw, k, "is required")
    name = raw["name"]
    _expect(isinstance(name, str) and name.replace("-", "").replace("_", "").isalnum()
            and len(name) <= 63, "name", "letters, digits, '-' and '_' only, at most 63")

    ep = raw["entry_point"]
    _keys(ep, {"script", "module", "recipe", "args"}, "entry_point")
    kinds = [k for k in ("script", "module", "recipe") if k in ep]
    _expect(len(kinds) == 1, "entry_point", "give exactly one of script, module, recipe")
    kind = kinds[0]
    target = ep[kind]
    _expect(isinstance(target, str) and target, f"entry_point.{kind}", "must be a non-empty string")
    if kind == "script":
        target = _safe_path(base, target, "entry_point.script")
        _expect(os.path.isfile(target), "entry_point.script", f"{target} does not exist")
    if kind == "recipe":
        _expect(target in RECIPES, "entry_point.recipe", f"unknown recipe (allowed: {', '.join(RECIPES)})")
    args = ep.get("args", [])
    _expect(isinstance(args, list) and all(isinstance(a, str) for a in args), "entry_point.args",
            "must be a list of strings")

    hps = raw.get("hyperparameters", {}) or {}
    _expect(isinstance(hps, dict) and all(isinstance(k, str) for k in hps), "hyperparameters",
            "must be a mapping of names to values")
    for k, v in hps.items():
        _expect(isinstance(v, (str, int, float, bool)), f"hyperparameters.{_show(k)}",
                "must be a string, number or boolean")

    groups_raw = raw["instance_groups"]
    _expect(isinstance(groups_raw, list) and groups_raw, "instance_groups", "must be a non-empty list")
    groups, seen = [], set()
    for i, g in enumerate(groups_raw):
        where = f"instance_groups[{i}]"
        _keys(g, {"name", "hosts", "processes_per_host", "instance_type"}, where)
        _expect(isinstance(g.get("name"), str) and g["name"], f"{where}.name", "is required")
        _simple_name(g["name"], f"{where}.name")
        _expect(g["name"] not in seen, f"{where}.name", f"{g['name']!r} is used twice")
        seen.add(g["name"])
        groups.append(Group(g["name"], _int(g, "hosts", where, 1),
                            _int(g, "processes_per_host", where, 1),
                            str(g.get("instance_type", "local"))))

    dist = raw.get("distribution", {"mode": "single"}) or {"mode": "single"}
    if isinstance(dist, str):
        dist = {"mode": dist}
    _keys(dist, {"mode", "parameter_servers_per_host", "data_service"}, "distribution")
    mode = dist.get("mode", "single")
    _expect(isinstance(mode, str) and mode in tuple(Mode), "distribution.mode",
            f"{_show(mode)} is not one of {', '.join(Mode)}")
    mode = Mode(mode)
    ds = dist.get("data_service")
    ds_group, ds_workers = None, 1
    processing = mode.default_processing_mode
    if ds is not None:
        _keys(ds, {"group", "workers_per_host", "processing_mode"}, "distribution.data_service")
        ds_group = ds.get("group")
        _expect(isinstance(ds_group, str) and ds_group in seen, "distribution.data_service.group",
                f"{_show(ds_group)} is not an instance group ({', '.join(sorted(seen))})")
        ds_workers = _int(ds, "workers_per_host", "distribution.data_service", 1)
        processing = ds.get("processing_mode", processing)
        _expect(isinstance(processing, str) and processing in ("parallel_epochs", "distributed_epoch"),
                "distribution.data_service.processing_mode", "parallel_epochs or distributed_epoch")
    topo = Topology(groups, mode, _int(dist, "parameter_servers_per_host", "distribution", 1),
                    ds_group, ds_workers)
    # Refused before the plan is made: `hosts: 300` would start 300 processes (and more
    # servers) on this machine, each a TensorFlow runtime.
    hosts_total = sum(g.hosts for g in groups)
    est = sum(g.hosts * g.processes_per_host for g in groups) + hosts_total * (
        topo.parameter_servers_per_host + 2 if mode.asynchronous else 0) + \
        hosts_total * ds_workers + 2
    _expect(est <= MAX_PROCESSES, "instance_groups",
            f"this topology starts about {est} processes on this machine; a local launch allows "
            f"at most {MAX_PROCESSES} (each is a TensorFlow runtime)")
    training = topo.training_groups()
    _expect(training, "instance_groups", "no group left to train (all run the data service)")
    total_workers = sum(g.hosts * g.processes_per_host for g in training)
    if mode.one_process:
        _expect(total_workers == 1, "instance_groups",
                f"mode {mode} runs one training process (1 host x 1 process), not {total_workers}")

    channels = {}
    ch_raw = raw.get("channels", {}) or {}
    _expect(isinstance(ch_raw, dict), "channels", "must be a mapping of channel names")
    for cname, c in ch_raw.items():
        where = f"channels.{cname}"
        _simple_name(cname, where)
        if isinstance(c, str):
            c = {"path": c}
        _keys(c, {"path", "input_mode", "distribution"}, where)
        _expect("path" in c, f"{where}.path", "is required")
        for k in ("input_mode", "distribution"):
            if not isinstance(c.get(k, ""), str):
                _expect(False, f"{where}.{k}", f"must be a string, got {_show(c[k])}")
        ch = Channel(cname, _safe_path(base, c["path"], f"{where}.path"),
                     c.get("input_mode", "File"), c.get("distribution", "FullyReplicated"))
        _expect(ch.input_mode in INPUT_MODES, f"{where}.input_mode", f"one of {', '.join(INPUT_MODES)}")
        _expect(ch.distribution in DISTRIBUTIONS, f"{where}.distribution",
                f"one of {', '.join(DISTRIBUTIONS)}")
        _expect(os.path.exists(ch.path), f"{where}.path", f"{ch.path} does not exist")
        if os.path.isdir(ch.path):
            _expect(any(not f.startswith(".") for f in os.listdir(ch.path)), f"{where}.path",
                    f"{ch.path} is empty")
        channels[cname] = ch
    pipe = [c for c in channels.values() if c.input_mode == "Pipe"]
    per_host = max(g.processes_per_host for g in training)
    if pipe and per_host > 1:
        _expect(len(pipe) >= per_host, "channels",
                f"{per_host} processes per host cannot share {len(pipe)} Pipe channel(s): a FIFO has "
                "one reader; declare one Pipe channel per process (training_0, training_1, ...)")

    out = _safe_path(base, raw["output_dir"], "output_dir")
    tl = raw.get("time_limit")
    _expect(tl is None or (isinstance(tl, (int, float)) and not isinstance(tl, bool) and tl > 0),
            "time_limit", "seconds > 0")
    wd = raw.get("watchdog", 600)
    _expect(wd is None or (isinstance(wd, (int, float)) and not isinstance(wd, bool) and wd > 0),
            "watchdog", "seconds > 0 or null")
    pipe_epochs = _int(raw, "pipe_epochs", "job", 1)
    free = raw.get("min_free_disk_mb", 256)
    _expect(isinstance(free, (int, float)) and not isinstance(free, bool) and free >= 0,
            "min_free_disk_mb", "megabytes >= 0")
    return JobSpec(name, EntryPoint(kind, target, args), topo, channels, hps, out, tl, wd,
                   pipe_epochs=pipe_epochs, processing_mode=processing, spec_path=spec_path,
                   min_free_disk_mb=free)
