"""The model directory of a run: its checks before training (writable, room for checkpoints,
a resumable earlier run), checkpoints that resume -- past a damaged one if need be -- and the
files a run leaves there."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

from ..errors import ConfigError, DataError, first_line
from .config import TrainConfig, embedding_width
from .metrics_log import LOGS, METRICS

RESULT = "result.json"
CONFIG = "train_config.json"
PREDICTIONS = "predictions.csv"
CONFIG_YAML = "config.yaml"
BEST = "best"           # the best evaluated model's variables and best.json, its record
WARM_START = "warm_start.json"   # the earlier run a warm-started one began from (warm_start)
VOCAB = "vocab.json"    # the training data's featurization vocabulary, kept with the model: a
                        # later run warm-started from it maps rows by value (remap.py)

RUN_FILES = ("checkpoints", LOGS, "export", BEST, METRICS, RESULT, CONFIG, CONFIG_YAML,
             PREDICTIONS, WARM_START, VOCAB)


def data_vocabulary(train_dir, manifest) -> str | None:
    """The path of the training data's featurization vocabulary, None without one (a source
    of several directories names its vocabulary by absolute path)."""
    if not manifest.vocabulary:
        return None
    v = Path(manifest.vocabulary)
    return str(v if v.is_absolute() else Path(train_dir) / v)


def prepare_model_dir(cfg: TrainConfig, feature_size: int, field_size: int,
                       write: bool = True, train_data: str | None = None,
                       fields: list | None = None, vocabulary: str | None = None) -> Path:
    """Checks that the directory can be written and that a run already in it can be resumed:
    the same shapes, and the same data position settings (batch size, seed, shuffle, mode,
    training data), without which a resumed run would skip to the wrong batches. --fresh
    removes the earlier run's files first (only those: the directory may hold others).
    Non-chief processes only read it (they restore the chief's checkpoints). `vocabulary`:
    the training data's (data_vocabulary), kept in the directory as VOCAB."""
    md = Path(cfg.model_dir)
    if not write:
        return md
    if md.exists() and not md.is_dir():
        raise ConfigError(f"model directory {md} exists and is not a directory")
    if cfg.fresh and md.is_dir():
        for name in RUN_FILES:
            target = md / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            elif target.exists() or target.is_symlink():
                target.unlink()
    try:
        md.mkdir(parents=True, exist_ok=True)
        probe = md / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"model directory {md} is not writable: {e.strerror}") from e
    # A checkpoint holds the table and its optimizer slots (up to 3 x the table) plus the MLP;
    # saving writes the new one before deleting the oldest. Refuse now rather than fail later.
    need = 2 * 3 * 4 * feature_size * (1 + embedding_width(cfg)) + (64 << 20)
    free = shutil.disk_usage(md).free
    if free < need:
        raise ConfigError(f"model directory {md} has {free / 2**20:,.0f} MB free; checkpoints of "
                          f"this model need about {need / 2**20:,.0f} MB")
    record = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("threads", "read_plan")}
    record.update(feature_size=feature_size, field_size=field_size, train_data=train_data,
                  fields=fields)
    # As JSON holds them (tuples are lists), so that a record compares with the one read back.
    record = {k: list(v) if isinstance(v, tuple) else v for k, v in record.items()}
    prev = md / CONFIG
    if prev.exists() and has_checkpoint(md):
        try:
            old = json.loads(prev.read_text())
            assert isinstance(old, dict)
        except (ValueError, AssertionError):
            raise ConfigError(f"{prev} is damaged, so the checkpoints beside it cannot be checked "
                              "before resuming; --fresh starts over") from None
        # Runs from before a setting existed trained as its first value did.
        old = {"table_updates": "lazy", "model": "deepfm", **old}
        if old["model"] == "dcn_v2":    # recorded before dcn_linear: it trained without
            old.setdefault("dcn_linear", False)
        for k in ("din_sequence", "din_target"):    # recorded as given (''), not as resolved
            if old.get(k) == "":
                old[k] = record[k]
        # The fields first: an edited declaration also changes field_size, which says less.
        _check_same_fields(md, old.get("fields"), fields)
        for k in TrainConfig.SHAPE_FIELDS + ("feature_size", "field_size") + TrainConfig.POSITION_FIELDS:
            if k in old and old[k] != record[k]:
                what = "data position" if k in TrainConfig.POSITION_FIELDS else "model"
                raise ConfigError(
                    f"{md} holds checkpoints of a run with {k}={_brief(old[k])}, not "
                    f"{_brief(record[k])}: resuming would continue at the wrong {what}. Use the "
                    "same setting, another --model-dir, or --fresh to start over")
    if cfg.warm_start and not has_checkpoint(md):
        _check_warm_start(cfg.warm_start, record, vocabulary)
    elif cfg.warm_start:
        # Resuming: only the run that started from this same model.
        warm = warm_start_record(md) or {}
        if warm.get("from") != str(_warm_start_dir(cfg.warm_start)):
            began = f"started from {warm['from']}" if warm else "did not start from it"
            raise ConfigError(f"{md} holds checkpoints of a run that {began}: warm_start "
                              f"{cfg.warm_start} would be ignored. --fresh starts this run "
                              "over from it; or give another --model-dir")
    prev.write_text(json.dumps(record, indent=2) + "\n")
    if vocabulary and Path(vocabulary).is_file():
        shutil.copyfile(vocabulary, md / VOCAB)
    from .config import resolved_yaml
    (md / CONFIG_YAML).write_text(resolved_yaml(cfg))   # `ctrtrain train --config` re-runs it
    return md


def warm_start_checkpoint(source: str) -> tuple[Path, str]:
    """(the earlier run's model directory, the prefix of its newest checkpoint) that
    --warm-start names: a model directory of `ctrtrain train` (or of a job's recipe: its
    /opt/ml/checkpoints), or its checkpoints/ directory itself."""
    import tensorflow as tf
    src = _warm_start_dir(source)
    prefix = tf.train.latest_checkpoint(str(src / "checkpoints")) if src.is_dir() else None
    if not prefix:
        raise ConfigError(f"warm_start {source}: no checkpoint there (expected the model "
                          "directory of an earlier run: its checkpoints/ and "
                          f"{CONFIG})")
    return src, prefix


def _warm_start_dir(source: str) -> Path:
    src = Path(source).resolve()
    return src.parent if src.name == "checkpoints" and not (src / "checkpoints").is_dir() \
        else src


def _check_warm_start(source: str, record: dict, vocabulary: str | None) -> None:
    """The earlier run's model has this run's variables: the same model settings and fields
    (its train_config.json against this run's record), and the same table size -- or
    vocabularies on both sides, by which the rows are moved (remap.py)."""
    src, _ = warm_start_checkpoint(source)
    old = _earlier_record(source, src)
    if old.get("fields") != record["fields"]:
        raise ConfigError(f"warm_start {source}: its training data declared other fields "
                          f"({_brief(old.get('fields'))}, now {_brief(record['fields'])}): "
                          "a warm start needs the same declaration")
    remap = _vocabularies(src, old, vocabulary)
    if remap and not _differ(*remap):
        remap = None        # the same vocabulary: the same ids, the table restored as it is
    for k in TrainConfig.SHAPE_FIELDS + ("feature_size", "field_size"):
        if k == "feature_size" and remap:
            continue
        if k in old and old[k] != record[k]:
            hint = (": featurize the new data with the earlier run's vocabulary (--vocab, "
                    "--grow to add its new values) or hash buckets") if k == "feature_size" \
                else ""
            raise ConfigError(f"warm_start {source}: its model has {k}={_brief(old[k])}, this "
                              f"run {_brief(record[k])}: a warm start needs the same variables"
                              + hint)
    if remap:
        for mode in (old.get("mode"), record["mode"]):
            if mode == "parameter_server":
                raise ConfigError(f"warm_start {source}: the vocabulary changed, and a warm "
                                  "start that moves table rows is not supported in mode "
                                  "parameter_server yet: featurize with the earlier "
                                  "vocabulary (--vocab without --grow), or warm-start in "
                                  "another mode")
        if record.get("dynamic_fields"):
            raise ConfigError(f"warm_start {source}: the vocabulary changed, and a model with "
                              "dynamic_fields keeps its rows only on the same one")


def _earlier_record(source: str, src: Path) -> dict:
    try:
        old = json.loads((src / CONFIG).read_text())
        assert isinstance(old, dict)
    except (OSError, ValueError, AssertionError):
        raise ConfigError(f"warm_start {source}: its {CONFIG} is missing or damaged, so its "
                          "model cannot be checked against this run's") from None
    return old


def _vocabularies(src: Path, old: dict, vocabulary: str | None):
    """(the earlier run's vocabulary, this run's) when both are known, else None: the
    earlier one kept in its model directory (VOCAB), or, for a run from before that, the
    one its training data's manifest names."""
    if not vocabulary or not Path(vocabulary).is_file():
        return None
    earlier = src / VOCAB
    if not earlier.is_file() and old.get("train_dir") and isinstance(old["train_dir"], str):
        try:
            from ..data.manifest import read_manifest
            earlier = Path(data_vocabulary(old["train_dir"], read_manifest(
                old["train_dir"], check=False)) or src / VOCAB)
        except Exception:       # moved or gone: no vocabulary to map by
            return None
    return (str(earlier), vocabulary) if earlier.is_file() else None


def _differ(a: str, b: str) -> bool:
    return Path(a).read_bytes() != Path(b).read_bytes()


def warm_start_record(md: Path) -> dict | None:
    """The earlier run this model directory's run started from ({"from", "checkpoint",
    "step"}), or None."""
    try:
        return json.loads((md / WARM_START).read_text())
    except (OSError, ValueError):
        return None


def _warm_start(source: str, md: Path, ckpt, opt, write: bool, vocabulary: str | None,
                feature_size: int) -> None:
    """Restores the earlier run's newest checkpoint (model and optimizer) as this run's start
    and records it. The optimizer's step count goes on from there -- Adam's bias correction and
    the tables' catch-up read it -- while this run counts its own steps from 0 (checkpoint
    numbers, schedule, evaluation); its learning-rate scale starts again at 1. When the
    training data's vocabulary is not the earlier run's (grown: `featurize --grow`), each
    value keeps its row where its id is now (remap.py)."""
    src, prefix = warm_start_checkpoint(source)
    old = _earlier_record(source, src)
    remap = _vocabularies(src, old, vocabulary)
    moved = None
    try:
        if remap and _differ(*remap):
            from ..data.featurize import Vocabulary
            from .remap import restore_remapped
            earlier, now = (Vocabulary.load(p) for p in remap)
            moved = restore_remapped(ckpt, prefix, now.ids_from(earlier),
                                     int(old["feature_size"]), feature_size)
        else:
            ckpt.restore(prefix).assert_existing_objects_matched()
    except ConfigError as e:
        raise ConfigError(f"warm_start {source}: {e}") from None
    except Exception as e:
        raise ConfigError(f"warm_start {source}: {Path(prefix).name} does not restore into "
                          f"this model ({first_line(e)[:160]})") from None
    if hasattr(opt, "lr_scale"):
        opt.lr_scale.assign(1.0)
    record = {"from": str(src), "checkpoint": Path(prefix).name,
              "step": int(opt.iterations.numpy())}
    if moved is not None:
        record["vocabulary"] = {"earlier": remap[0], "rows_kept": moved,
                                "feature_size": [int(old["feature_size"]), feature_size]}
    if write:
        (md / WARM_START).write_text(json.dumps(record, indent=2) + "\n")


def _check_same_fields(md: Path, old: list | None, new: list | None) -> None:
    """A declaration edited between runs (a field's pooling, max_len or kind; a field added,
    removed or moved) reads the same files into other tensors: the checkpoints' model would be
    trained on, and exported for, data that predict and --valid then refuse. Refused, saying
    in plain words what changed. (Runs from before this was recorded: None.)"""
    if old is None or old == new:
        return
    before = {f["name"]: f for f in old}
    after = {f["name"]: f for f in new or []}
    edited = [n for n in before if n in after and before[n] != after[n]]
    gone = [n for n in before if n not in after]
    added = [n for n in after if n not in before]
    changes = [f"field {n} was declared {_declared(before[n])} at the checkpoint, now "
               f"{_declared(after[n])}" for n in edited[:3]]
    if not new:
        changes.append("the data now declares no fields (the fixed schema)")
    elif gone:
        changes.append(f"field{'s' * (len(gone) > 1)} {_names(gone)} "
                       f"{'are' if len(gone) > 1 else 'is'} no longer declared")
    if added:
        changes.append(f"field{'s' * (len(added) > 1)} {_names(added)} "
                       f"{'are' if len(added) > 1 else 'is'} declared now, not at the checkpoint")
    if not changes:     # the same fields, in another order: their ids and slots move
        changes.append(f"the fields are declared in another order: {_names(list(before))} at "
                       f"the checkpoint, now {_names(list(after))}")
    raise ConfigError(f"{md} holds checkpoints of a run whose training data declared other "
                      f"fields: {'; '.join(changes)}. The same files would be read into another "
                      "model: use the same declaration, another --model-dir, or --fresh to "
                      "start over")


def _declared(f: dict) -> str:
    """A field's declaration in words: `multi_hot (max_len 4, pooling sum, weighted false)`."""
    def word(v):
        return json.dumps(v) if isinstance(v, bool) else \
            str(v) if isinstance(v, (str, int, float)) else _brief(v)
    rest = [f"{k} {word(v)}" for k, v in f.items() if k not in ("name", "kind")]
    return f.get("kind", "categorical") + (f" ({', '.join(rest)})" if rest else "")


def _names(names: list[str]) -> str:
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def _brief(v) -> str:
    text = repr(v)
    return text if len(text) <= 24 else text[:20] + "..."


def has_checkpoint(md: Path) -> bool:
    return any((md / "checkpoints").glob("ckpt-*.index"))


def data_fingerprint(m) -> str | None:
    """Identity of the training data a data position refers to: its files' names, record
    counts and checksums (None for a Pipe stream, which has no files to name)."""
    import hashlib
    if not m.files:
        return None
    text = json.dumps(sorted((Path(f.path).name, f.records, f.sha256) for f in m.files))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def announce_resume(log, md: Path, start_step: int, total_steps) -> None:
    """A re-run that resumes says so, loudly: it may train no step at all. A warm start says
    where it started from."""
    warm = warm_start_record(md)
    if warm and not start_step and log.enabled:
        print(f"warm start from {warm['from']} ({warm['checkpoint']}: its model and optimizer "
              f"state, the optimizer at step {warm['step']})", flush=True)
    if start_step and log.enabled:
        left = "" if total_steps is None else (
            f"; {max(0, total_steps - start_step)} of {total_steps} steps left"
            + (" (nothing to train: evaluating and exporting again)" if start_step >= total_steps else ""))
        print(f"resuming from the checkpoint at step {start_step} in {md}{left}. "
              "--fresh starts over", flush=True)


def restore_checkpoint(cfg: TrainConfig, md: Path, model, opt, write: bool = True,
                       vocabulary: str | None = None, feature_size: int = 0):
    """(CheckpointManager over md/checkpoints, step to start from): the newest checkpoint that
    restores, else step 0 when there is none. A damaged state file (`checkpoint`) is set aside
    and the checkpoints are found by name; a damaged newest checkpoint falls back to the one
    before it, loudly. Checkpoints that exist but none of which restores are an error, never
    a silent restart from step 0. Without checkpoints, a warm start (cfg.warm_start) starts
    from the earlier run's: `vocabulary` and `feature_size` are this run's data's, by which
    a changed vocabulary's rows are moved."""
    import tensorflow as tf
    ckpt_dir = md / "checkpoints"
    state = ckpt_dir / "checkpoint"
    if state.exists():
        try:
            # TensorFlow logs a text proto that does not parse and returns None.
            problem = None if tf.train.get_checkpoint_state(str(ckpt_dir)) else "does not parse"
        except Exception as e:
            problem = str(e).splitlines()[0][:80]
        if problem:
            aside = state.with_name(f"checkpoint.damaged-{int(time.time())}")
            os.replace(state, aside)
            print(f"warning: {state} is damaged ({problem}); set aside as {aside.name}, "
                  "checkpoints found by name instead", flush=True)
    remove_partial_checkpoints(ckpt_dir)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
    manager = tf.train.CheckpointManager(ckpt, str(ckpt_dir), max_to_keep=cfg.keep_checkpoints)
    candidates = sorted(((int(p.name[5:-6]), str(p)[:-6]) for p in ckpt_dir.glob("ckpt-*.index")
                         if p.name[5:-6].isdigit()), reverse=True)
    failures = []
    for step, prefix in candidates:
        try:
            ckpt.restore(prefix).assert_existing_objects_matched()
        except Exception as e:  # a cut or corrupted data file, a missing shard
            failures.append(f"{Path(prefix).name}: {str(e).strip().splitlines()[0][:120]}")
            continue
        if failures:
            print(f"warning: could not restore {'; '.join(failures)}; resumed from "
                  f"{Path(prefix).name} instead", flush=True)
            # The damaged ones are kept, renamed, out of every later restore's way.
            for bad_step, bad_prefix in candidates:
                if bad_step > step:
                    for part in ckpt_dir.glob(f"{Path(bad_prefix).name}.*"):
                        os.replace(part, part.with_name("damaged-" + part.name))
        if manager.latest_checkpoint != prefix:
            # Make the state file name the checkpoint in use, so later saves follow it.
            kept = [p for s, p in sorted(candidates) if s <= step]
            tf.compat.v1.train.update_checkpoint_state(str(ckpt_dir), prefix,
                                                       all_model_checkpoint_paths=kept)
            manager = tf.train.CheckpointManager(ckpt, str(ckpt_dir),
                                                 max_to_keep=cfg.keep_checkpoints)
        return manager, int(opt.iterations.numpy()) - _warm_start_step(md)
    if failures:
        raise DataError("no checkpoint restores (" + "; ".join(failures) + "); move the "
                        "directory aside or train with --fresh", path=str(ckpt_dir))
    if cfg.warm_start:
        _warm_start(cfg.warm_start, md, ckpt, opt, write, vocabulary, feature_size)
    return manager, 0


def _warm_start_step(md: Path) -> int:
    """The optimizer's step count at a warm start (0 without one): a resumed warm-started
    run's own step is the count less that."""
    record = warm_start_record(md)
    return int(record["step"]) if record else 0


def remove_partial_checkpoints(ckpt_dir: Path) -> None:
    """TensorFlow writes a checkpoint's shards under `ckpt-N_temp/` and merges them into
    `ckpt-N.*` when all are written: a save cut short (a full disk, a killed process)
    leaves that directory, never a checkpoint any restore reads. Removed after a failed
    save and before a run restores (no save is under way then)."""
    for part in ckpt_dir.glob("ckpt-*_temp*"):
        if part.is_dir():
            shutil.rmtree(part, ignore_errors=True)


def write_checkpoint(manager, step: int) -> None:
    """manager.save, with TensorFlow's write errors (a full disk, a vanished directory) named
    as the user's to fix instead of a traceback; the earlier checkpoints stay as they were."""
    import tensorflow as tf
    try:
        manager.save(checkpoint_number=step)
    except tf.errors.OpError as e:
        remove_partial_checkpoints(Path(manager.directory))
        from ..errors import CtrError
        raise CtrError(f"cannot write the checkpoint of step {step} in {manager.directory}: "
                       f"{first_line(e)}") from None


def saved_at(manager, step: int) -> bool:
    """Whether the latest checkpoint is of this step (the final save would repeat it)."""
    latest = manager.latest_checkpoint
    return latest is not None and int(latest.rsplit("-", 1)[1]) == step


def write_best(model, md: Path, record: dict) -> None:
    """The model's variables (not the optimizer's: nothing trains on from them) as the best
    evaluated so far, then best.json naming them, written whole or not at all: a run killed
    in between keeps the earlier best. Older best models are removed after."""
    import tensorflow as tf
    best = md / BEST
    best.mkdir(exist_ok=True)
    name = _best_name(record)
    try:
        tf.train.Checkpoint(model=model).write(str(best / name))
    except tf.errors.OpError as e:
        from ..errors import CtrError
        raise CtrError(f"cannot write the best model (step {record['step']}) in {best}: "
                       f"{first_line(e)}") from None
    tmp = best / "best.json.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, best / "best.json")
    for old in best.glob("model-*"):
        if not old.name.startswith(name + "."):
            old.unlink()


def read_best(md: Path, monitor: str) -> dict | None:
    """The best model's record (write_best) a resumed run continues from, if it was chosen by
    the same metric and its variables are there; else None (the comparison starts afresh)."""
    try:
        record = json.loads((md / BEST / "best.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("monitor") != monitor or \
            not isinstance(record.get("step"), int) or \
            not (md / BEST / f"{_best_name(record)}.index").exists():
        return None
    return record


def _best_name(record: dict) -> str:
    return f"model-{record['step']}"


def restore_best(model, md: Path, record: dict) -> None:
    """The model's variables as they were at the best evaluation."""
    import tensorflow as tf
    status = tf.train.Checkpoint(model=model).read(str(md / BEST / _best_name(record)))
    status.assert_existing_objects_matched()
