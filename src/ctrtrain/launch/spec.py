"""The job spec: a SageMaker estimator written down as YAML (docs/cluster.md), validated with
errors that name the bad key and say what is allowed. Parsed with yaml.safe_load (no code)."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path

import yaml

from ..values import load_yaml

from ..cluster.plan import Group, Topology
from ..cluster.sagemaker import HOMOGENEOUS
from ..mode import Mode
from ..errors import ConfigError

INPUT_MODES = ("File", "Pipe")
DISTRIBUTIONS = ("FullyReplicated", "ShardedByS3Key")
RECIPES = ("deepfm",)
# Framework images the launcher can run a job in (launch/images.py finds their Pythons).
FRAMEWORK_VERSIONS = ("2.21", "2.15")


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
    pipe_epochs: int | None = None     # a cap on each Pipe channel's epochs; None: none
    # The estimator's: start the job again (from its checkpoints) after a process or host
    # dies, at most this many times (SageMaker allows up to 30).
    max_retry_attempts: int = 0
    processing_mode: str = "parallel_epochs"
    spec_path: str | None = None
    min_free_disk_mb: float = 256   # refused before start when the output's disk has less
    # As a SageMaker estimator: the framework image (None: ctrtrain's own environment and
    # distribution modes), the code directory unpacked into /opt/ml/code, the distribution's
    # sagemaker_* hyperparameters, model_dir, region, log level and extra variables.
    framework_version: str | None = None
    py_version: str | None = None
    source_dir: str | None = None
    framework_params: dict = dataclasses.field(default_factory=dict)
    model_dir: str | bool | None = None   # None: the default of the job's kind (launcher)
    region: str = "us-east-1"
    container_log_level: int = 20
    environment: dict = dataclasses.field(default_factory=dict)

    @property
    def program(self) -> str:
        """The entry point as sagemaker_program names it: its path inside the code directory."""
        if self.entry_point.kind != "script":
            return self.entry_point.target
        root = self.source_dir or os.path.dirname(self.entry_point.target)
        return os.path.relpath(self.entry_point.target, root)


# Bounds on what a local launch starts: every process is a real process on this machine.
MAX_PROCESSES = 64
MAX_SPEC_BYTES = 1 << 20

_TOP_KEYS = {"name", "entry_point", "hyperparameters", "instance_groups", "distribution",
             "channels", "output_dir", "time_limit", "watchdog", "pipe_epochs", "min_free_disk_mb",
             "max_retry_attempts",
             "framework_version", "py_version", "source_dir", "model_dir", "region", "environment",
             "instance_count", "instance_type", "container_log_level"}
# The estimator's `distribution` keys (SageMaker's own semantics, run by its toolkit).
SDK_DISTRIBUTIONS = ("parameter_server", "multi_worker_mirrored_strategy", "mpi", "instance_groups")


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


def _seconds(v) -> bool:
    """A finite number as YAML gives it (not a boolean; `.inf` and `.nan` are floats)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def load_spec(path: str | os.PathLike, overrides: dict | None = None) -> JobSpec:
    path = Path(path)
    try:
        if path.stat().st_size > MAX_SPEC_BYTES:
            raise ConfigError(f"job spec {path} is over {MAX_SPEC_BYTES >> 20} MB: not a job spec")
        raw = load_yaml(path.read_text())
    except ValueError as e:     # a repeated key
        raise ConfigError(f"job spec {path}: {e}") from None
    except FileNotFoundError:
        raise ConfigError(f"job spec {path} does not exist") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"job spec {path} is not valid YAML: {e}") from None
    except RecursionError:
        raise ConfigError(f"job spec {path} is nested too deeply to be a job spec") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"job spec {path} is not UTF-8 text ({e.reason})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"job spec {path} is not a mapping of keys (name, entry_point, ...): "
                          f"it holds {type(raw).__name__ if raw is not None else 'nothing'}")
    if overrides:
        raw = {**raw, **overrides}
    return parse_spec(raw, base=path.resolve().parent, spec_path=str(path))


def parse_spec(raw: dict, base: Path = Path("."), spec_path: str | None = None) -> JobSpec:
    _keys(raw, _TOP_KEYS, "")
    for k in ("name", "entry_point", "output_dir"):
        _expect(k in raw, k, "is required")
    name = raw["name"]
    _expect(isinstance(name, str) and name.replace("-", "").replace("_", "").isalnum()
            and len(name) <= 63, "name", "letters, digits, '-' and '_' only, at most 63")

    source_dir = None
    if raw.get("source_dir") is not None:
        source_dir = _safe_path(base, raw["source_dir"], "source_dir")
        _expect(os.path.isdir(source_dir), "source_dir", f"{source_dir} is not a directory")
    ep = raw["entry_point"]
    if isinstance(ep, str):
        # The estimator's form: a script inside source_dir (or beside the spec).
        ep = {"script": ep if os.path.isabs(ep) else os.path.join(source_dir or str(base), ep)}
    _keys(ep, {"script", "module", "recipe", "args"}, "entry_point")
    kinds = [k for k in ("script", "module", "recipe") if k in ep]
    _expect(len(kinds) == 1, "entry_point", "give exactly one of script, module, recipe")
    kind = kinds[0]
    target = ep[kind]
    _expect(isinstance(target, str) and target, f"entry_point.{kind}", "must be a non-empty string")
    if kind == "script":
        target = _safe_path(base, target, "entry_point.script")
        _expect(os.path.isfile(target), "entry_point.script", f"{target} does not exist")
        _expect(source_dir is None or os.path.commonpath([target, source_dir]) == source_dir,
                "entry_point", f"{target} is not inside source_dir {source_dir}")
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

    if "instance_count" in raw or "instance_type" in raw:
        # The estimator's homogeneous form.
        _expect("instance_groups" not in raw, "instance_count",
                "give instance_count/instance_type or instance_groups, not both")
        raw = {**raw, "instance_groups": [{"name": HOMOGENEOUS,
                                           "hosts": _int(raw, "instance_count", "job", 1),
                                           "instance_type": raw.get("instance_type", "local")}]}
    _expect("instance_groups" in raw, "instance_groups",
            "is required (or the estimator's instance_count and instance_type)")
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

    framework_version = raw.get("framework_version")
    if framework_version is not None:
        # YAML reads an unquoted 2.10 as the number 2.1: a number is refused, not guessed at.
        _expect(isinstance(framework_version, str), "framework_version",
                f"{_show(framework_version)} is a number: quote it ('2.10'), as YAML reads "
                "2.10 as 2.1")
        # Whether pip can install it here is checked at launch (image_build.py). The SDK's
        # patch versions (2.9.1) name their series' image, which holds its newest patch.
        series = re.fullmatch(r"(2\.\d+)(\.\d+)?", framework_version)
        _expect(series is not None, "framework_version",
                f"{_show(framework_version)} is not a TensorFlow 2 release such as "
                f"{' or '.join(FRAMEWORK_VERSIONS)} (or 2.14.1)")
        framework_version = series.group(1)
    dist = raw.get("distribution", {"mode": "single"}) or {"mode": "single"}
    if isinstance(dist, str):
        dist = {"mode": dist}
    framework_params = {}
    if isinstance(dist, dict) and any(k in dist for k in SDK_DISTRIBUTIONS):
        framework_params = _sdk_distribution(dist, seen)
        _expect(framework_version is not None, "framework_version",
                "is required with SageMaker's distribution keys (the toolkit of that image runs them)")
        dist = {"mode": "single"}
    elif framework_version is not None:
        _expect(dist.get("mode", "single") == "single" and set(dist) <= {"mode"}, "distribution",
                "a framework image job takes SageMaker's distribution keys (parameter_server, "
                "multi_worker_mirrored_strategy, mpi, instance_groups); ctrtrain's own modes run "
                "without framework_version")
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
    est += hosts_total * framework_params.get("sagemaker_mpi_num_of_processes_per_host", 0)
    _expect(est <= MAX_PROCESSES, "instance_groups",
            f"this topology starts about {est} processes on this machine; a local launch allows "
            f"at most {MAX_PROCESSES} (each is a TensorFlow runtime)")
    training = topo.training_groups()
    _expect(training, "instance_groups", "no group left to train (all run the data service)")
    total_workers = sum(g.hosts * g.processes_per_host for g in training)
    if mode.one_process and framework_version is None:
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
    _expect(tl is None or (_seconds(tl) and tl > 0), "time_limit", "a finite number of seconds > 0")
    wd = raw.get("watchdog", 600)
    _expect(wd is None or (_seconds(wd) and wd > 0), "watchdog",
            "a finite number of seconds > 0, or null")
    # SageMaker serves as many Pipe epochs as a script reads; a cap is optional.
    pipe_epochs = None if raw.get("pipe_epochs") is None else _int(raw, "pipe_epochs", "job", 1)
    retries = _int(raw, "max_retry_attempts", "job", 0, minimum=0)
    _expect(retries <= 30, "job.max_retry_attempts", f"at most 30 (SageMaker's limit), got {retries}")
    free = raw.get("min_free_disk_mb", 256)
    _expect(_seconds(free) and free >= 0, "min_free_disk_mb", "a finite number of megabytes >= 0")
    model_dir = raw.get("model_dir")
    _expect(model_dir in (None, False) or (isinstance(model_dir, str) and model_dir), "model_dir",
            "a path, or false to pass none (as the estimator's model_dir=False)")
    region = raw.get("region", "us-east-1")
    _expect(isinstance(region, str) and region, "region", "a region name")
    environment = raw.get("environment", {}) or {}
    _expect(isinstance(environment, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                  for k, v in environment.items()),
            "environment", "a mapping of variable names to strings")
    py_version = raw.get("py_version")
    _expect(py_version is None or (isinstance(py_version, str) and py_version.startswith("py")),
            "py_version", "like py311")
    return JobSpec(name, EntryPoint(kind, target, args), topo, channels, hps, out, tl, wd,
                   pipe_epochs=pipe_epochs, max_retry_attempts=retries,
                   processing_mode=processing, spec_path=spec_path,
                   min_free_disk_mb=free, framework_version=framework_version,
                   py_version=py_version, source_dir=source_dir, framework_params=framework_params,
                   model_dir=model_dir, region=region,
                   container_log_level=_int(raw, "container_log_level", "job", 20, minimum=0),
                   environment=environment)


def _enabled(dist: dict, key: str) -> bool:
    v = dist[key]
    _keys(v, {"enabled", "processes_per_host", "custom_mpi_options"} if key == "mpi"
          else {"enabled"}, f"distribution.{key}")
    _expect(isinstance(v.get("enabled", False), bool), f"distribution.{key}.enabled",
            "true or false")
    return v.get("enabled", False)


def _sdk_distribution(dist: dict, groups: set) -> dict:
    """The estimator's `distribution` as the SDK turns it into sagemaker_* hyperparameters."""
    _keys(dist, set(SDK_DISTRIBUTIONS), "distribution")
    out = {}
    if "instance_groups" in dist:
        names = dist["instance_groups"]
        _expect(isinstance(names, list) and all(n in groups for n in names),
                "distribution.instance_groups", f"names of instance groups ({', '.join(sorted(groups))})")
        out["sagemaker_distribution_instance_groups"] = names
    if "parameter_server" in dist:
        out["sagemaker_parameter_server_enabled"] = _enabled(dist, "parameter_server")
    if "mpi" in dist:
        out["sagemaker_mpi_enabled"] = _enabled(dist, "mpi")
        mpi = dist["mpi"]
        if mpi.get("processes_per_host"):
            out["sagemaker_mpi_num_of_processes_per_host"] = _int(
                mpi, "processes_per_host", "distribution.mpi", 1)
        options = mpi.get("custom_mpi_options", "")
        _expect(isinstance(options, str), "distribution.mpi.custom_mpi_options", "a string")
        out["sagemaker_mpi_custom_mpi_options"] = options
    if "multi_worker_mirrored_strategy" in dist:
        out["sagemaker_multi_worker_mirrored_strategy_enabled"] = _enabled(
            dist, "multi_worker_mirrored_strategy")
    if out.get("sagemaker_distribution_instance_groups") and not out.get("sagemaker_mpi_enabled"):
        # What the SDK itself refuses.
        _expect(False, "distribution.instance_groups",
                "Don't set training instance groups while no distribution strategies enabled! "
                "(the SDK's words: instance groups go with mpi or smdistributed)")
    return out
