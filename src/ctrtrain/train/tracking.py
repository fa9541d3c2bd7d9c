"""Experiment tracking in MLflow (`--mlflow URI`, issue 56), so that ctrtrain's runs sit beside
a team's other runs in its tracking server and compare in its UI.

The model directory stays the record of a run (metrics.jsonl, TensorBoard's logs,
result.json); MLflow gets a copy of the same events, fed by MetricsLog as TensorBoardRuns is,
and, as there, only the chief of a job writes. What goes where:

- params: every setting of the run as config.yaml records it (`auto` made concrete, the
  chosen model's settings only), named `<section>.<setting>` (`model.embedding_size`);
- tags: `ctrtrain.model_dir` (the run's name is the directory's), and what the start found
  (`ctrtrain.records`, `ctrtrain.total_steps`, `ctrtrain.resumed_from`, ...);
- metrics against the global step: `train_loss`, `train_examples_per_s`,
  `train_input_bound` per log window, `valid_auc`, `valid_loss`, `test_auc`, `test_loss` per
  evaluation (`loss`: the mean log loss, TensorBoard's tag), `learning_rate` at the start and
  at each decay on a plateau, and every number of result.json but the windows, as
  `result.<key>` (`result.test.auc`), at the last step;
- artifacts: `model/` (the exported SavedModel), `result.json` and `config.yaml`.

Each start of `ctrtrain train` is a new MLflow run, a resumed one too (tagged with the step
it resumed from): a resumed run may change a setting (more epochs), and MLflow refuses a
param's new value in the same run.

mlflow is imported only when a URI is given. A tracking server that does not answer is
refused before TensorFlow starts (`check_reachable`), and one that refuses the run when it is
made, before the first step: a run that trained for an hour and then could not log would
lose what it was asked to record. MLflow's client retries a failed request for minutes by
default; here a few times, briefly (RETRIES: a value set in the environment stands). A call
that still fails later stops the tracking with a warning, not the training: the model
directory has everything, and the MLflow run is marked FAILED if the server takes that."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import time
from pathlib import Path

from ..errors import ConfigError, first_line

EXPERIMENT = "ctrtrain"          # the experiment when neither the setting nor the env names one
# MLflow's client defaults: 7 retries with backoff factor 2 (about 4 minutes of waiting) and
# 120 s a request. A dead server then holds a run's every log call for minutes.
RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
           "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
REACH_TIMEOUT_S = 10
PARAM_MAX = 6000                 # MLflow's limit on a param's value
KEEP_OUT = ("mlflow", "mlflow_experiment")   # not params: the URI may hold credentials
_open: list[MlflowRun] = []      # runs started and not ended: end_unfinished marks them


@dataclasses.dataclass
class Tracking:
    """What a run sends to MLflow, decided from its configuration (plan) before the chief
    starts the MLflow run (MlflowRun)."""
    uri: str
    experiment: str
    params: dict


def plan(cfg) -> Tracking | None:
    """The run's tracking (None without `mlflow`), its params as config.yaml records them:
    call once the settings are resolved (after prepare_model_dir)."""
    if not cfg.mlflow:
        return None
    from .config import model_reads, table
    reads = model_reads(cfg.model)
    params = {}
    for f in table():
        section, value = f.metadata["section"], getattr(cfg, f.name)
        if value is None or f.name in KEEP_OUT or (section == "model" and f.name not in reads):
            continue
        params[f"{section}.{f.name}"] = param_text(value)
    experiment = cfg.mlflow_experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT
    return Tracking(str(cfg.mlflow), experiment, params)


def param_text(v) -> str:
    """A setting as a param's text: a list as the flag takes it (`400,400,400`), a number or
    bool as YAML writes it, at most PARAM_MAX characters."""
    if isinstance(v, (list, tuple)) and all(isinstance(x, (int, float, str)) for x in v):
        text = ",".join(map(str, v))
    elif isinstance(v, str):
        text = v
    else:
        text = json.dumps(v, default=str)
    return text if len(text) <= PARAM_MAX else text[:PARAM_MAX - 3] + "..."


def check_reachable(cfg) -> None:
    """Refuses (ConfigError: exit 2) `mlflow` when mlflow is not installed, or when the URI
    is a server's and nothing answers there, within seconds and before TensorFlow starts. Any
    HTTP answer will do (404, or 401 where the client sends credentials this check has not):
    the run's creation, later, finds what else is wrong."""
    if not cfg.mlflow:
        return
    import importlib.util
    if importlib.util.find_spec("mlflow") is None:
        raise ConfigError("mlflow: the mlflow package is not installed (pip install mlflow)")
    uri = str(cfg.mlflow)
    if not uri.startswith(("http://", "https://")):
        return      # a database or a directory: the client reaches it itself
    import ssl
    import urllib.error
    import urllib.request
    url = uri.rstrip("/") + "/api/2.0/mlflow/experiments/get-by-name?experiment_name=ctrtrain"
    try:
        urllib.request.urlopen(url, timeout=REACH_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        if isinstance(reason, ssl.SSLError):
            return  # it answered; the client's own TLS settings (MLFLOW_TRACKING_*) decide
        raise ConfigError(f"mlflow: no tracking server answers at {uri} ({reason}): start "
                          "it, or give another --mlflow") from None


class MlflowRun:
    """The chief's MLflow run: made at the start (ConfigError if the store refuses it), fed
    MetricsLog's events, ended by close (FINISHED) or end_unfinished (FAILED, KILLED)."""

    def __init__(self, tracking: Tracking, model_dir: Path, console: bool):
        for k, v in RETRIES.items():
            os.environ.setdefault(k, v)
        # A directory store is in maintenance mode in MLflow 3 and refused unless allowed;
        # given a directory, the user asked for one.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        # The client prints the run's address when it ends; this prints it at the start.
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self.uri, self.model_dir = tracking.uri, Path(model_dir)
        self.evaluated: dict[str, set] = {}      # steps logged, per split (TensorBoardRuns')
        self.client = self.run_id = None
        try:
            from mlflow.tracking import MlflowClient
            self.client = MlflowClient(tracking_uri=self.uri)
            exp = self.client.get_experiment_by_name(tracking.experiment)
            exp_id = exp.experiment_id if exp else self.client.create_experiment(tracking.experiment)
            run = self.client.create_run(exp_id, run_name=self.model_dir.name, tags={
                "ctrtrain.model_dir": str(self.model_dir.resolve())})
            self.run_id = run.info.run_id
            self.params(tracking.params)
            from .model_dir import CONFIG_YAML
            if (self.model_dir / CONFIG_YAML).exists():
                self.client.log_artifact(self.run_id, str(self.model_dir / CONFIG_YAML))
        except Exception as e:   # the store's refusal, whatever the store: MlflowException,
            self.end("FAILED")   # requests', sqlalchemy's or an OSError
            raise ConfigError(f"mlflow: {self.uri}: the run could not be made: "
                              f"{first_line(e)}") from None
        _open.append(self)
        if console:
            where = f"{self.uri.rstrip('/')}/#/experiments/{exp_id}/runs/{self.run_id}" \
                if self.uri.startswith(("http://", "https://")) else self.uri
            print(f"mlflow: run {self.model_dir.name} ({self.run_id}) in experiment "
                  f"{tracking.experiment!r}: {where}", flush=True)

    def params(self, params: dict):
        from mlflow.entities import Param
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):          # MLflow's limit per request
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def event(self, kind: str, step: int, fields: dict):
        if self.client is None:     # tracking stopped (call)
            return
        if kind == "start":
            from mlflow.entities import RunTag
            found = {k: v for k, v in fields.items() if k not in ("resumed", "learning_rate")
                     and isinstance(v, (bool, int, float, str))}
            if fields.get("resumed"):
                found["resumed_from"] = step
            self.call("log_batch", self.run_id,
                      tags=[RunTag(f"ctrtrain.{k}", str(v)) for k, v in found.items()])
            self.metrics(step, learning_rate=fields.get("learning_rate"))
        elif kind == "lr_decay":
            self.metrics(step, learning_rate=fields["learning_rate"])
        elif kind == "train":
            self.metrics(step, train_loss=fields["loss"],
                         train_examples_per_s=fields["examples_per_s"],
                         train_input_bound=fields["input_bound"])
        elif kind == "eval":
            # As in TensorBoard: an evaluation of a step already logged is of the same model
            # (the one after an early stop, or the test split's of the best model, restored).
            done = self.evaluated.setdefault(fields["split"], set())
            if step not in done:
                done.add(step)
                split = fields["split"]
                self.metrics(step, **{f"{split}_auc": fields["auc"],
                                      f"{split}_loss": fields["logloss"]})
        elif kind == "export":
            self.call("log_artifacts", self.run_id, str(fields["path"]), "model")

    def result(self, result: dict, path: Path, step: int):
        """result.json's numbers as `result.<key>` metrics at the last step, the file itself
        as an artifact. The windows are the train_* curves already."""
        if self.client is None:
            return
        figures = {}

        def walk(prefix, v):
            if isinstance(v, dict):
                for k, x in v.items():
                    walk(f"{prefix}.{k}", x)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                figures[re.sub(r"[^\w./\- ]", "_", prefix)] = v
        for k, v in result.items():
            if k != "windows":
                walk(f"result.{k}", v)
        self.metrics(step, **figures)
        self.call("log_artifact", self.run_id, str(path))

    def metrics(self, step: int, **values):
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in values.items()
                 if v is not None and math.isfinite(v)]     # no NaN point, as TensorBoard's
        for i in range(0, len(batch), 1000):                 # MLflow's limit per request
            self.call("log_batch", self.run_id, metrics=batch[i:i + 1000])

    def call(self, method: str, *args, **kwargs):
        """One call of the client's `method`; a failure stops the tracking (a warning), not
        the training. Once stopped (self.client None), nothing more is sent."""
        if self.client is None:
            return
        try:
            getattr(self.client, method)(*args, **kwargs)
        except Exception as e:
            print(f"warning: mlflow: {self.uri}: {first_line(e)}; the run stops logging to "
                  f"MLflow here (the model directory {self.model_dir} has everything)",
                  file=sys.stderr, flush=True)
            self.end("FAILED")

    def end(self, status: str):
        """Ends the MLflow run (once; best effort: the server may be what failed)."""
        client, self.client = self.client, None
        if self in _open:
            _open.remove(self)
        if client is not None and self.run_id is not None:
            try:
                client.set_terminated(self.run_id, status)
            except Exception:
                pass

    def close(self):
        self.end("FINISHED")


def end_unfinished(error: BaseException) -> None:
    """Marks the runs a failed training left open: KILLED for a stop by a signal or Ctrl-C,
    FAILED otherwise (train's caller; an ended run is not touched)."""
    from .stop import Interrupted
    status = "KILLED" if isinstance(error, (Interrupted, KeyboardInterrupt)) else "FAILED"
    for run in list(_open):
        run.end(status)
