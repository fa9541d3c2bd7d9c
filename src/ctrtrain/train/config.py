"""The training configuration, in one table.

Every setting of a run is a field of `TrainConfig` with its section, default, parser and
help (`setting(...)`). From that one table come

- `ctrtrain train`'s flags, grouped by section, every default shown in `--help` (cli.py);
- the DeepFM recipe's hyperparameters, flat as SageMaker passes them (`--name value`), with
  the names the public SageMaker DeepFM sample uses accepted as aliases (recipes/deepfm.py);
- configuration files (`ctrtrain train --config train.yaml`), nested by section or flat; flags
  override the file; the resolved configuration is written to the model directory as
  `config.yaml` and re-runs the same training;
- the checks that refuse a bad value by name before anything starts (`check_config`; the
  recipe and the Python API bypass the CLI's parser, so they end here too).
"""

from __future__ import annotations

import dataclasses
import json
import math

import yaml

from ..errors import ConfigError
from ..mode import Mode
from ..models import MODELS
from ..values import boolean as _bool
from ..values import choice as _choice
from ..values import drop_rate as _drop_rate
from ..values import items, load_yaml_file, number
from .threads import ThreadConfig

SECTIONS = ("data", "model", "optimizer", "schedule", "distribution", "output")
OPTIMIZERS = ("adam", "adagrad", "ftrl", "sgd", "momentum")
TABLE_UPDATES = ("catchup", "lazy", "dense")   # models/engine/updates.py: what each means
# table_updates auto: dense (exact, every row every step) for a table of at most this many
# rows, catchup above. Measured (docs/benchmarks.md, "dense or catchup"): below it a dense
# step costs no more than catching the batch's rows up, and it is the reference's own result.
AUTO_DENSE_ROWS = 100_000
# shuffle_buffer auto: the whole training split where it holds at most AUTO_SHUFFLE_BYTES of
# records (the buffer keeps them as read, so about that much memory; gzip files are counted at
# 4x their size), else AUTO_SHUFFLE_RECORDS. Measured (docs/quality.md): on data in time
# order, as logs are written, a buffer of 10,000 records ended 0.003-0.005 test AUC below the
# whole split's on MovieLens-100K and -1M, where Keras users (DeepCTR) shuffle all of it.
AUTO_SHUFFLE_BYTES = 256 << 20
AUTO_SHUFFLE_RECORDS = 10_000
# batch_size / embedding_size auto: a training split of fewer than AUTO_SMALL_RECORDS records
# (under 100 steps an epoch at batch 1024) trains at batch 256 and width 4, DeepCTR's own
# defaults; a larger one at 1024 and 16. Measured over five real tables against DeepCTR
# (docs/quality.md, "batch 256 and width 4"): on the four small ones 256 + 4 was within one
# standard error of DeepCTR where 1024 + 16 was not (bank_small, adult); width 4 alone at
# batch 1024 lost: a small table needs the updates first.
AUTO_SMALL_RECORDS = 100 * 1024
AUTO_SMALL = {"batch_size": 256, "embedding_size": 4}
AUTO_LARGE = {"batch_size": 1024, "embedding_size": 16}
MODES = tuple(m.value for m in Mode)
# The model settings every model reads (the others: each model's `reads`, models/__init__.py).
UNIVERSAL = ("model", "l2_reg", "l2_embedding", "output_bias", "dynamic_fields",
             "dynamic_admit", "dynamic_ttl")
# The public SageMaker DeepFM sample's hyperparameter names for the same settings.
ALIASES = {"num_epochs": "epochs", "log_steps": "log_every"}


# -- parsers of the table's own kinds (values.py has the common ones) ----------------------

def _auto_or(parse):
    """`auto`, or what `parse` accepts."""
    def parse_auto(v):
        return "auto" if str(v).strip().lower() == "auto" else parse(v)
    return parse_auto


def _schedule(v):
    """Steps (`500`) or epochs (`0.5 epochs`, `1epoch`, `2e`); 0 = never."""
    text = str(v).strip().lower().replace(" ", "")
    if text == "auto":      # eval_every's default: inputs.schedule_of resolves it
        return "auto"
    for unit in ("epochs", "epoch", "e"):
        if text.endswith(unit) and text[:-len(unit)]:
            n = number(float, 0, low_open=True)(text[:-len(unit)])
            return f"{n:g} epochs"
    return number(int, 0)(v)


def _path(v):
    if v is None or str(v).strip() == "":
        return None
    return str(v)


def _source(v):
    """A data source: one path, or several (a list in a config file; the flag's values when a
    shell expands `--train data/*.tfrecord`)."""
    if isinstance(v, (list, tuple)):
        paths = [p for p in map(_path, v) if p]
        return paths[0] if len(paths) == 1 else (paths or None)
    return _path(v)


def _field_name(v):
    text = str(v).strip()
    if not text:
        raise ValueError("give field names, or all")
    return text


def _field_names(v):
    """Field names (or all); none (a config file's null, an empty flag): None."""
    if v is None or (isinstance(v, str) and not v.strip()) or v == []:
        return None
    return items(_field_name)(v)


def _fields(v):
    """A stream's declared fields: a data directory or a JSON file declaring them (a path), or
    the declaration itself (a list; JSON text as a flag or a SageMaker hyperparameter)."""
    if v is None or (isinstance(v, str) and not v.strip()):
        return None
    if isinstance(v, (list, tuple)):
        return list(v)
    text = str(v).strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"is not a JSON list of field declarations ({e})") from None
    return text


def setting(default, section: str, help: str, parse=None, *, cli: bool = True, models=None):
    """A field of the table. parse=None: the runtime sets it (not a flag or hyperparameter).
    `models`: the models whose own option it is (models/__init__.py)."""
    return dataclasses.field(default=default, metadata={
        "section": section, "help": help, "parse": parse, "cli": cli and parse is not None,
        "models": models})


@dataclasses.dataclass
class TrainConfig:
    # data
    # A data source is one path or several (data/index.py: source_paths).
    train_dir: str | list[str] = setting(
        "", "data", "training data: a data directory, TFRecord/libsvm files or globs (File); "
        "a Pipe channel's FIFO prefix (Pipe)", _source)
    model_dir: str = setting("", "output", "checkpoints, logs, metrics and export", _path)
    valid_dir: str | list[str] | None = setting(None, "data", "validation data (as --train)",
                                                _source)
    test_dir: str | list[str] | None = setting(None, "data", "test data (as --train)", _source)
    feature_size: int | None = setting(
        None, "data", "embedding table rows (default: the data's; larger leaves room for new "
        "ids)", number(int, 1, optional=True))
    input_mode: str = setting("File", "data", "File | Pipe (set by the job)", None)
    field_size: int | None = setting(None, "data", "fields per example: Pipe only (a stream has "
                                     "no manifest)", number(int, 1, optional=True))
    fields: str | list | None = setting(
        None, "data", "Pipe only: the stream's declared fields (docs/fields.md): a data "
        "directory or manifest.json declaring them, or the JSON list itself", _fields)
    data_format: str = setting("tfrecord", "data", "Pipe only: tfrecord | libsvm",
                               _choice("tfrecord", "libsvm"))
    label_format: str = setting("01", "data", "Pipe libsvm only: 01 | pm1", _choice("01", "pm1"))
    shuffle_buffer: int | str = setting(
        "auto", "data", "records in the shuffle buffer (0: no shuffling); auto: the whole "
        "training split where it holds at most 256 MB, else 10,000", _auto_or(number(int, 0)))
    cache: bool = setting(False, "data", "parse the training records once and keep them in "
                          "memory; each epoch a new permutation of every record (the shuffle "
                          "buffer and read_block then do not apply)", _bool)
    read_block: int = setting(16, "data", "records read, shuffled and batched together "
                              "(1: one by one, the shuffle drawing single records)",
                              number(int, 1))
    parse: str = setting("vectorized", "data", "input parsing: vectorized (batch, then parse) | "
                         "scalar", _choice("vectorized", "scalar"))
    # model
    model: str = setting("deepfm", "model", "the model: " + "; ".join(
        f"{name} ({e.summary})" for name, e in MODELS.items()), _choice(*MODELS))
    embedding_size: int | str = setting(
        "auto", "model", "k, the embedding width; auto: 4 on a training split of fewer than "
        "102,400 records, else 16", _auto_or(number(int, 1)))
    embedding_init: float | None = setting(
        None, "model", "standard deviation of the embeddings' initial values, normal around 0 "
        "(default: the model's: 0.0001 as DeepCTR's and FuxiCTR's; fm and dcn_v2 0.01)",
        number(float, 0, optional=True))
    deep_layers: tuple[int, ...] = setting((256, 128, 64), "model", "MLP widths, e.g. 400,400,400",
                                           items(number(int, 1)))
    dropout: float | tuple[float, ...] = setting(
        0.0, "model", "drop rate of the deep layers' outputs: one, or one per layer "
        "(0.5,0.5,0.5). The TF1 sample's values are keep probabilities: give 1 - p",
        items(_drop_rate, allow_scalar=True))
    batch_norm: bool = setting(False, "model", "batch normalization in the MLP", _bool)
    # 3e-5: chosen over the suite of real tables against DeepCTR (docs/quality.md, "L2 3e-5 as
    # the default"): 1e-6 left Wide & Deep on KDD Cup 2004 below DeepCTR, 1e-4 cost bank 0.007.
    l2_reg: float = setting(3e-5, "model", "L2 as the SageMaker sample's: l2_reg * "
                            "tf.nn.l2_loss(w) on the embedding table (see table_updates) and "
                            "the MLP kernels", number(float, 0))
    l2_embedding: float | None = setting(None, "model", "L2 on the embedding table only "
                                         "(default: l2_reg)", number(float, 0, optional=True))
    l2_dense: float | None = setting(None, "model", "L2 on the MLP kernels only (default: "
                                     "l2_reg)", number(float, 0, optional=True))
    numeric_input: str = setting("embedding", "model", "how declared numeric fields enter the "
                                 "deep models: embedding (a row of the table times the value, "
                                 "in every block) | value (the value itself into the MLP's "
                                 "input and a weight times it into the linear part, as "
                                 "DeepCTR's DenseFeat) | both (the row times the value in "
                                 "every block, and the value into the deep part's input "
                                 "too)", _choice("embedding", "value", "both"))
    dynamic_fields: tuple[str, ...] | None = setting(
        None, "model", "hashed categorical fields (or all) read as raw values: each value "
        "claims a row of the field's buckets for itself when first seen (dynamic_admit), the "
        "least often seen give theirs back when they are all held (docs/continual.md); modes "
        "single and allreduce", _field_names)
    dynamic_admit: int = setting(1, "model", "a dynamic field's value gets a row of its own "
                                 "once seen this many times (before: a row shared by the "
                                 "field's unadmitted values)", number(int, 1))
    dynamic_ttl: int = setting(0, "model", "a dynamic field's row not seen for this many "
                               "training steps is given back before any other (0: no expiry)",
                               number(int, 0))
    output_bias: str = setting("prior", "model", "the output bias at the start: prior (the "
                               "logit of the training data's positive rate) | zero",
                               _choice("prior", "zero"))
    xla: bool = setting(False, "model", "XLA-compile the MLP (the sparse part has dynamic shapes)",
                        _bool)
    mixed_precision: bool = setting(False, "model", "bfloat16 compute of the MLP (and of "
                                   "xDeepFM's CIN), float32 weights", _bool)
    # optimizer
    optimizer: str = setting("adam", "optimizer", " | ".join(OPTIMIZERS), _choice(*OPTIMIZERS))
    learning_rate: float = setting(1e-3, "optimizer", "learning rate (0 freezes the model)",
                                   number(float, 0))
    lr_decay_on_plateau: float = setting(0.0, "optimizer", "multiply the learning rate by this "
                                         "after each evaluation of the validation split without "
                                         "a better monitored metric (FuxiCTR: 0.1; 0: off)",
                                         number(float, 0, high=0.999))
    adam_beta1: float = setting(0.9, "optimizer", "Adam's beta1", number(float, 0, high=1))
    adam_beta2: float = setting(0.999, "optimizer", "Adam's beta2", number(float, 0, high=1))
    adam_epsilon: float = setting(1e-7, "optimizer", "Adam's epsilon", number(float, 0, low_open=True))
    adagrad_initial_accumulator: float = setting(
        0.1, "optimizer", "Adagrad's (and FTRL's) initial accumulator", number(float, 0))
    ftrl_l1: float = setting(0.0, "optimizer", "FTRL's L1", number(float, 0))
    ftrl_l2: float = setting(0.0, "optimizer", "FTRL's L2", number(float, 0))
    momentum: float = setting(0.9, "optimizer", "momentum (optimizer momentum)", number(float, 0))
    table_updates: str = setting(
        "auto", "optimizer", "how the embedding table is updated: catchup (as the dense "
        "optimizer does, at the cost of the rows a batch touches) | lazy (untouched rows "
        "neither move nor decay) | dense (every row every step: the reference, O(table)) | "
        f"auto (dense for a table of at most {AUTO_DENSE_ROWS:,} rows outside parameter-server "
        "mode, catchup otherwise)",
        _choice("auto", *TABLE_UPDATES))
    fused_kernels: bool = setting(
        True, "optimizer", "run the step's sparse half (distinct ids, the block's gather, FM "
        "terms, catch-up Adam) in the fused C++ kernels where they are built (`python -m "
        "ctrtrain.kernels.build`); off: TensorFlow's ops, the reference", _bool)
    # schedule
    batch_size: int | str = setting(
        "auto", "schedule", "examples per step and replica; auto: 256 on a training split of "
        "fewer than 102,400 records (under 100 steps an epoch at 1024), else the one `ctrtrain "
        "tune` measured best on this host, else 1024",
        _auto_or(number(int, 1)))
    epochs: float = setting(1.0, "schedule", "passes over the training data",
                            number(float, 0, low_open=True))
    steps: int | None = setting(None, "schedule", "steps to train (overrides epochs)",
                                number(int, 1, optional=True))
    steps_per_execution: int = setting(
        10, "schedule", "training steps per call of the compiled step (Keras's name): its "
        "dispatch, ~1 ms, is paid once for all of them; stops, logs and checkpoints still "
        "happen at their steps", number(int, 1))
    log_every: int | str = setting(100, "schedule", "log window: steps, or '0.1 epochs'",
                                   _schedule)
    eval_every: int | str = setting("auto", "schedule", "evaluate the validation split every N "
                                    "steps or 'X epochs' (0: at the end only; auto: every epoch "
                                    "with a validation split, at the end for a Pipe stream)", _schedule)
    eval_test: bool = setting(False, "schedule", "at each evaluation also evaluate the test "
                              "split (learning curves; no decision uses it)", _bool)
    checkpoint_every: int | str = setting(1000, "schedule", "checkpoint every N steps or 'X "
                                          "epochs' (0: at the end only)", _schedule)
    checkpoint_secs: float = setting(0.0, "schedule", "also checkpoint after this many seconds "
                                     "(0: off)", number(float, 0))
    keep_checkpoints: int = setting(3, "schedule", "checkpoints kept", number(int, 1))
    early_stopping: int = setting(2, "schedule", "stop after this many evaluations of the "
                                  "validation split without a better monitored metric (0: off)",
                                  number(int, 0))
    monitor: str = setting("auc", "schedule", "the validation metric that picks the best model "
                           "and stops early: auc | logloss", _choice("auc", "logloss"))
    export_best: bool = setting(True, "schedule", "with a validation split: test and export the "
                                "best evaluated model, not the last", _bool)
    seed: int = setting(0, "schedule", "seed of initialisation and shuffling", number(int, 0))
    # distribution
    mode: str = setting("single", "distribution", "single | mirrored (the multi-process modes run "
                        "through `ctrtrain launch`, which sets them)", _choice(*MODES))
    devices: int = setting(2, "distribution", "mirrored on a CPU-only host: logical CPU devices",
                           number(int, 1))
    sparse_reduce: str = setting("gather", "distribution", "table gradients across replicas: "
                                 "gather | dense", _choice("gather", "dense"))
    scale_lr: bool = setting(False, "distribution", "multiply the learning rate by the replicas",
                             _bool)
    intra_op_threads: int = setting(0, "distribution", "TensorFlow's intra-op threads (0: "
                                    "automatic: the launcher's share of the host, the tuned "
                                    "value, else the cores)", number(int, 0))
    inter_op_threads: int = setting(0, "distribution", "TensorFlow's inter-op threads (0: "
                                    "automatic)", number(int, 0))
    data_threads: int = setting(0, "distribution", "tf.data's private thread pool (0: half the "
                                "intra-op threads)", number(int, 0))
    threads: ThreadConfig = dataclasses.field(default_factory=ThreadConfig,
                                              metadata={"section": "distribution", "cli": False})
    data_service: str | None = setting(None, "distribution", "grpc://dispatcher (set by the job)")
    processing_mode: str = setting("parallel_epochs", "distribution", "tf.data service mode "
                                   "(set by the job)")
    read_plan: object = setting(None, "distribution", "this reader's part (set by the job)")
    # output
    export: bool = setting(True, "output", "export a SavedModel at the end", _bool)
    predictions: str | None = setting(
        None, "output", "write the test split's predictions (CSV row,prob,label) to this file; "
        "'auto': <model-dir>/predictions.csv", _path)
    progress: bool = setting(True, "output", "a progress bar on a terminal", None)
    quiet: bool = setting(False, "output", "no console line per log window, evaluation or "
                          "checkpoint", _bool)
    fresh: bool = setting(False, "output", "start over: delete the model directory's earlier "
                          "run (default: resume from its last checkpoint)", _bool)
    warm_start: str | None = setting(
        None, "output", "start from the last checkpoint of an earlier run's model directory "
        "(its weights, tables and optimizer state; the same model settings and table size), "
        "on new data: the day-by-day retrain. The optimizer's step count goes on; this run's "
        "steps, schedule and learning rate are its own", _path)
    mlflow: str | None = setting(
        None, "output", "track the run in MLflow (docs/training.md): a tracking server's "
        "URI (http://host:5000), sqlite:///mlflow.db or a directory; the settings, each log "
        "window's and evaluation's metrics, the result and the exported model", _path)
    mlflow_experiment: str | None = setting(
        None, "output", "the MLflow experiment of the run, made if new (default: "
        "$MLFLOW_EXPERIMENT_NAME, else ctrtrain)", _path)

    # Fields that must match for a checkpoint to be resumed: the variables' shapes, and where
    # in the data a resumed run continues (the seeded pipeline skips the batches consumed).
    SHAPE_FIELDS = ("model", "embedding_size", "deep_layers", "batch_norm", "optimizer",
                    "table_updates", "dynamic_fields")
    # train_data first: shuffle_buffer auto follows the data, and a change of data is the news.
    POSITION_FIELDS = ("train_data", "batch_size", "seed", "shuffle_buffer", "read_block",
                       "cache", "mode")

    def __post_init__(self):
        # One name for each thread setting: the three fields above (flags, hyperparameters,
        # files); `threads` is what the runtime applies, made from them when they are set.
        given = (self.intra_op_threads, self.inter_op_threads, self.data_threads)
        if any(given):
            self.threads = ThreadConfig(*given)

    @property
    def dropout_rates(self) -> tuple[float, ...]:
        """One drop rate per deep layer."""
        d = self.dropout
        if isinstance(d, (int, float)):
            return (float(d),) * len(self.deep_layers)
        return tuple(float(x) for x in d)


def _with_model_options(base):
    """The table above plus each model's own options (models/__init__.py MODELS), in section
    `model`: one definition makes the flag, the hyperparameter and the config file key. An
    option two models share is one row."""
    owners: dict[str, list[str]] = {}
    for model, entry in MODELS.items():
        for name in entry.options:
            owners.setdefault(name, []).append(model)
    rows = []
    for name, models in owners.items():
        opt = MODELS[models[0]].options[name]
        rows.append((name, object, setting(opt.default, "model", f"{', '.join(models)}: {opt.help}",
                                           opt.parse, models=tuple(models))))
    cls = dataclasses.make_dataclass("TrainConfig", rows, bases=(base,))
    cls.__module__, cls.__doc__ = base.__module__, base.__doc__
    # A model's options shape its variables: a checkpoint resumes only under the same ones.
    cls.SHAPE_FIELDS = base.SHAPE_FIELDS + tuple(owners)
    return cls


TrainConfig = _with_model_options(TrainConfig)


def table() -> list[dataclasses.Field]:
    """The settings a user gives (flags, hyperparameters, config files), in table order."""
    return [f for f in dataclasses.fields(TrainConfig) if f.metadata.get("cli")]


def field_named(name: str) -> dataclasses.Field:
    name = ALIASES.get(name, name)
    for f in table():
        if f.name == name:
            return f
    known = ", ".join(f.name for f in table())
    raise ConfigError(f"unknown setting {name!r} (known: {known}; aliases: "
                      f"{', '.join(f'{a}={b}' for a, b in ALIASES.items())})")


def parse_value(name: str, value):
    """A setting's value from text or a native value, or a ConfigError naming it."""
    f = field_named(name)
    try:
        return f.name, f.metadata["parse"](value)
    except ValueError as e:
        raise ConfigError(f"{f.name}: {e}") from None


def settings_from_mapping(raw: dict, where: str) -> dict:
    """{name: value} from a config file's mapping: nested by section or flat."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a configuration is a mapping of settings")
    out = {}
    for key, value in raw.items():
        if key in SECTIONS and isinstance(value, dict):
            for k, v in value.items():
                name, parsed = parse_value(str(k), v)
                if field_named(name).metadata["section"] != key:
                    raise ConfigError(f"{where}: {k} belongs in section "
                                      f"{field_named(name).metadata['section']}, not {key}")
                out[name] = parsed
        else:
            name, parsed = parse_value(str(key), value)
            out[name] = parsed
    return out


def load_config_file(path) -> dict:
    p = str(path)
    raw = load_yaml_file(p, "configuration file")
    return settings_from_mapping(raw or {}, str(p))


def resolved_yaml(cfg: TrainConfig) -> str:
    """The configuration as a file that re-runs it (`--config`), nested by section: every
    setting but the model settings the chosen model does not read (other models' options),
    each as the run resolved it (`auto` made concrete, DIN's fields named)."""
    out: dict = {s: {} for s in SECTIONS}
    reads = model_reads(cfg.model)
    for f in table():
        if f.metadata["section"] == "model" and f.name not in reads:
            continue
        v = getattr(cfg, f.name)
        v = list(v) if isinstance(v, tuple) else str(v) if isinstance(v, str) else v
        out[f.metadata["section"]][f.name] = v
    return yaml.safe_dump(out, sort_keys=False)


def check_config(cfg: TrainConfig):
    """Every setting in range before anything starts: each is parsed again by its own parser
    (the Python API can put anything in a field), then the cross-field rules."""
    for f in table():
        v = getattr(cfg, f.name)
        if v is None and f.default is None:
            continue
        try:
            f.metadata["parse"](list(v) if isinstance(v, tuple) else v)
        except ValueError as e:
            raise ConfigError(f"{f.name}: {e}") from None
    _check_model_settings(cfg)
    if cfg.log_every == 0:
        raise ConfigError("log_every: give steps >= 1 or epochs")
    if isinstance(cfg.dropout, tuple) and len(cfg.dropout) != len(cfg.deep_layers):
        raise ConfigError(f"dropout: {len(cfg.dropout)} rates for {len(cfg.deep_layers)} deep "
                          "layers (give one, or one per layer)")
    if cfg.input_mode not in ("File", "Pipe"):
        raise ConfigError(f"input_mode must be File or Pipe, not {cfg.input_mode!r}")
    # Adam's and Adagrad's catch-up read the learning rate at each step; these hold it (in a
    # closed form, or in the weights FTRL rebuilds from its slots).
    if cfg.lr_decay_on_plateau and cfg.optimizer in ("momentum", "sgd", "ftrl") and \
            cfg.table_updates not in ("dense", "lazy"):
        raise ConfigError(f"lr_decay_on_plateau: optimizer {cfg.optimizer}'s catch-up of the "
                          "table's skipped steps holds the learning rate; use table_updates "
                          "dense or lazy, or optimizer adam or adagrad")
    for name in ("train_dir", "valid_dir", "test_dir"):
        if isinstance(getattr(cfg, name), (list, tuple)):   # one path in a list: that path
            setattr(cfg, name, _source(getattr(cfg, name)))
    if cfg.fields and cfg.input_mode != "Pipe":
        raise ConfigError("fields is for a Pipe channel: File data declares its fields in its "
                          "manifest")
    if cfg.cache and cfg.data_service:
        raise ConfigError("cache: through tf.data service the service's workers read and parse "
                          "the data, not this process; use one or the other")
    if cfg.input_mode == "Pipe":
        if not isinstance(cfg.train_dir, str):
            raise ConfigError(f"Pipe channel: one FIFO prefix, not {len(cfg.train_dir)} paths")
        if not ((cfg.field_size or cfg.fields) and cfg.feature_size):
            raise ConfigError(f"Pipe channel {cfg.train_dir}: a stream carries no manifest; "
                              "give field_size and feature_size (or, for declared fields, "
                              "fields and feature_size)")
        if cfg.fields and cfg.data_format != "tfrecord":
            raise ConfigError("fields: declared fields are streamed as TFRecord, not "
                              f"{cfg.data_format}")
        if Mode.parse(cfg.mode).asynchronous:
            raise ConfigError("mode parameter_server reads File channels: the chief defines "
                              "every worker's dataset as a graph, and a Pipe channel's FIFO "
                              "(read in Python, on one host) cannot run on a worker")
        if cfg.data_service:
            raise ConfigError("a Pipe channel cannot be read through tf.data service (its FIFO "
                              "is on the training host, read in this process)")
        if cfg.cache:
            raise ConfigError("cache: a Pipe channel streams every epoch anew (a FIFO per "
                              "epoch); use a File channel to cache the data in memory")
        if not cfg.steps and cfg.epochs != int(cfg.epochs):
            raise ConfigError(f"epochs {cfg.epochs:g}: a Pipe stream is read in whole epochs "
                              "(a FIFO each); give whole epochs, or steps")
        for name in ("log_every", "eval_every", "checkpoint_every"):
            if isinstance(getattr(cfg, name), str) and getattr(cfg, name) != "auto":
                raise ConfigError(f"{name}: a Pipe stream has no known epoch length; give steps")


def _check_model_settings(cfg: TrainConfig):
    """A model setting the chosen model does not read (models/__init__.py MODELS: the shared
    ones it reads, its own options) is refused by name when given a value other than its
    default: it would change nothing."""
    entry = MODELS[cfg.model]
    reads = entry.reads + tuple(entry.options)
    for f in table():
        if f.metadata["section"] != "model" or f.name in model_reads(cfg.model):
            continue
        if getattr(cfg, f.name) != f.default:
            has = ", ".join(reads) or "none but " + ", ".join(UNIVERSAL)
            raise ConfigError(f"{f.name}: model {cfg.model} does not use it (its model "
                              f"settings: {has})")


def resolve_table_updates(cfg: TrainConfig, feature_size: int) -> str:
    """`auto` made concrete from the table's size (the same on every rank: it depends only
    on the configuration and the data's manifest). Trainers call it once, before the model
    directory records the run's settings."""
    if cfg.table_updates == "auto":
        # Under parameter servers a dense update would ship the whole table's gradient to
        # the servers every step: there the update stays sparse.
        small = feature_size <= AUTO_DENSE_ROWS and cfg.mode != Mode.PARAMETER_SERVER
        cfg.table_updates = "dense" if small else "catchup"
    return cfg.table_updates


def resolve_shuffle_buffer(cfg: TrainConfig, m) -> int:
    """`auto` made concrete from the training data's manifest `m` (the same on every rank);
    a Pipe stream, whose size is not known ahead, gets AUTO_SHUFFLE_RECORDS. Trainers call it
    once, before the model directory records the run's settings."""
    if cfg.shuffle_buffer == "auto":
        held = sum(f.bytes for f in m.files) * (4 if m.compression else 1)
        whole = m.files and held <= AUTO_SHUFFLE_BYTES
        cfg.shuffle_buffer = max(m.records, 1) if whole else AUTO_SHUFFLE_RECORDS
    return cfg.shuffle_buffer


def resolve_model_options(cfg: TrainConfig, m) -> None:
    """The chosen model's own options as it uses them on the training data `m` (its declared
    fields): DIN's history and candidate fields where the options leave them to the data.
    Trainers call it once, before the model directory records the run's settings, so
    config.yaml names what was used; a missing field is refused here, before anything is
    built."""
    from ..models import resolve_options
    names = tuple(MODELS[cfg.model].options)
    fields = tuple((f.name, f.kind) for f in m.schema.fields) if m.schema is not None else ()
    resolved = resolve_options(cfg.model, {n: getattr(cfg, n) for n in names}, fields)
    for name in names:
        setattr(cfg, name, resolved[name])


def model_reads(model: str) -> tuple[str, ...]:
    """The model settings (section `model`) model `model` reads: the universal ones, the
    shared ones it reads, its own options."""
    entry = MODELS[model]
    return UNIVERSAL + entry.reads + tuple(entry.options)


def resolve_table_scale(cfg: TrainConfig, m) -> None:
    """batch_size and embedding_size `auto` made concrete from the training split's records
    (the manifest's, the same on every rank and whatever the replicas: the mode does not
    change the model). A Pipe stream, whose size is not known ahead, gets the large table's.
    Trainers call it once, before the model directory records the run's settings. A model
    without embeddings (lr) keeps embedding_size `auto`: a width there would be a setting it
    refuses when the recorded configuration is run again."""
    for name, value in table_scale(m.records).items():
        if getattr(cfg, name) == "auto" and (name == "batch_size"
                                             or name in MODELS[cfg.model].reads):
            setattr(cfg, name, value)


def embedding_width(cfg: TrainConfig) -> int:
    """k as the model is built with it (0 for a model that reads no embedding_size)."""
    return cfg.embedding_size if "embedding_size" in MODELS[cfg.model].reads else 0


def table_scale(records: int) -> dict:
    """What batch_size and embedding_size `auto` are for a training split of `records`
    (0: unknown, a stream). A large one's batch is the one `ctrtrain tune` measured fastest
    on this host where it ran: tune measures speed, which is what a large table is bound by;
    a small one's is chosen for its AUC. A table smaller than the small batch trains in one
    batch of all its records (as DeepCTR's fit does), not a refusal."""
    if 0 < records < AUTO_SMALL_RECORDS:
        return {**AUTO_SMALL, "batch_size": min(AUTO_SMALL["batch_size"], records)}
    from .tuned import tuned_settings
    return {**AUTO_LARGE, **{k: v for k, v in tuned_settings().items() if k == "batch_size"}}


def optimizer_params(cfg: TrainConfig) -> dict:
    """The chosen optimizer's own settings, and how it updates the table."""
    own = {"adam": {"beta1": cfg.adam_beta1, "beta2": cfg.adam_beta2, "epsilon": cfg.adam_epsilon},
           "adagrad": {"initial_accumulator": cfg.adagrad_initial_accumulator},
           "ftrl": {"l1": cfg.ftrl_l1, "l2": cfg.ftrl_l2,
                    "initial_accumulator": cfg.adagrad_initial_accumulator},
           "momentum": {"momentum": cfg.momentum}, "sgd": {}}[cfg.optimizer]
    l2e = cfg.l2_reg if cfg.l2_embedding is None else cfg.l2_embedding
    if cfg.table_updates not in TABLE_UPDATES:
        raise ValueError(f"table_updates {cfg.table_updates!r}: resolve_table_updates first")
    return {**own, "table_updates": cfg.table_updates, "table_l2": l2e}


def run_schema(cfg: TrainConfig, m):
    """The training data's declared fields as this run's model reads them: its dynamic
    fields marked (data/schema.py Schema.with_dynamic); None for the fixed schema."""
    if m.schema is None:
        if cfg.dynamic_fields:
            raise ConfigError("dynamic_fields: the data declares no fields (the fixed schema "
                              "has no hashed categorical field; docs/fields.md)")
        return None
    return m.schema.with_dynamic(cfg.dynamic_fields)


def model_config(cfg: TrainConfig, feature_size: int, field_size: int,
                 positive_rate: float | None = None, schema=None):
    """`positive_rate`: the training data's (manifest), for output_bias prior; `schema`: its
    declared fields as the run reads them (run_schema), None for the fixed schema."""
    from ..models.base import ModelConfig
    l2d = cfg.l2_reg if cfg.l2_dense is None else cfg.l2_dense
    bias = 0.0
    if cfg.output_bias == "prior" and positive_rate is not None and 0 < positive_rate < 1:
        bias = math.log(positive_rate / (1 - positive_rate))
    return ModelConfig(feature_size, field_size, embedding_width(cfg), tuple(cfg.deep_layers),
                        cfg.dropout_rates, cfg.batch_norm, l2_dense=l2d,
                        embedding_init=cfg.embedding_init,
                        mixed_precision=cfg.mixed_precision, xla=cfg.xla, seed=cfg.seed,
                        initial_bias=bias,
                        numeric_fields=len(schema.of("numeric")) if schema else 0,
                        numeric_input=cfg.numeric_input
                        if "numeric_input" in MODELS[cfg.model].reads else "embedding",
                        bags=tuple((f.max_len, f.pooling) for f in schema.lists())
                        if schema else (),
                        fields=tuple((f.name, f.kind) for f in schema.fields) if schema else (),
                        dynamic=schema.dynamic_pools() if schema else (),
                        dynamic_admit=cfg.dynamic_admit, dynamic_ttl=cfg.dynamic_ttl,
                        model=cfg.model,
                        options={name: getattr(cfg, name) for name in MODELS[cfg.model].options})
