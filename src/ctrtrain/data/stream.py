"""A stream of days with a known Bayes-optimal AUC each: the data continual training is
measured on (`ctrtrain data synth --days D`).

Production CTR logs are not one table: each day brings ids nobody has seen (new ads, users,
items), others stop appearing, and what an id means drifts. The stream simulates that over
`categorical_fields` fields whose day-0 sizes follow Criteo's (StreamConfig.sizes), `ids` in
all. In a field of more than 100 ids (the small ones, like an hour or a device kind, keep
their values), every day retires a share `death` of its live ids -- never seen again -- and
births a share `birth` of new ones, each with a popularity drawn as the day-0 ids' were (a
Zipf rank) and weights of their own; and every live id's weights drift, a share `drift` of
their variance renewed a day. Labels come from a hidden FM + linear model over the fields (as
data/synth.py's, its scales and bias calibrated on day 0 and then fixed), so each day's
Bayes-optimal AUC is known: the yardstick of a model trained on the days before it.

An id's raw value is its serial number within its field, as a string: unique for ever, so a
table keyed by raw ids never confuses two. Each day is a data directory of declared fields
hashed at training time (data/schema.py: each field's `hash_buckets`, `bucket_ratio` (2)
times its day-0 ids unless set), which a fixed table reads as it is. Everything depends only on the
configuration: the same seed, the same stream.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from ..errors import DataError
from ..metrics import logloss, roc_auc
from .files import finish_output_dir, prepare_output_dir
from .manifest import FileEntry, Manifest, sha256_file
from .synth import CRITEO_CARDINALITIES

STREAM_INFO = "stream.json"
CHURN_ABOVE = 100      # fields with more day-0 ids than this churn; smaller ones keep theirs


@dataclasses.dataclass
class StreamConfig:
    days: int = 14
    rows: int = 100_000          # per day
    ids: int = 100_000           # live ids on day 0, over all fields
    categorical_fields: int = 8  # the first this many of Criteo's 26 (sizes)
    seed: int = 0
    zipf: float = 1.2            # exponent of an id's popularity by its rank
    birth: float = 0.05          # a day's new ids, as a share of a churning field's live ids
    death: float = 0.05          # a day's retired ids, as a share of them
    drift: float = 0.02          # share of every live id's weights' variance renewed a day
    hash_buckets: int = 0        # each field's declared buckets; 0: bucket_ratio x its day-0 ids
    bucket_ratio: float = 2.0    # (at least 2 buckets a field)
    hidden_dim: int = 4
    rarity_decay: float = 0.35   # an id's weight scale ~ (1 + popularity rank) ** -decay
    linear_std: float = 1.0
    fm_std: float = 0.8
    base_rate: float = 0.25

    def check(self) -> None:
        if self.days < 1 or self.rows < 10:
            raise DataError("days must be >= 1 and rows (a day's) >= 10", field="days")
        if not 1 <= self.categorical_fields <= len(CRITEO_CARDINALITIES):
            raise DataError(f"categorical_fields must be 1..{len(CRITEO_CARDINALITIES)}",
                            field="categorical_fields")
        if self.bucket_ratio <= 0:
            raise DataError("bucket_ratio must be above 0", field="bucket_ratio")
        for name in ("birth", "death", "drift"):
            if not 0 <= getattr(self, name) <= 1:
                raise DataError(f"{name} must be a share of the live ids, 0 to 1", field=name)

    def sizes(self) -> list[int]:
        """Each field's day-0 ids: Criteo's small fields (at most CHURN_ABOVE values) as they
        are, the large ones c as round(c ** a), `a` chosen to make `ids` in all: Criteo's 10
        million-id field stays the largest without leaving the others a handful."""
        criteo = np.array(CRITEO_CARDINALITIES[:self.categorical_fields], np.float64)
        large = criteo > CHURN_ABOVE
        budget = self.ids - criteo[~large].sum()
        if not large.any():
            return [int(c) for c in criteo]
        if budget < 2 * large.sum():
            raise DataError(f"ids must be at least {int(criteo[~large].sum()) + 2 * large.sum()} "
                            f"for {self.categorical_fields} fields", field="ids")
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if (criteo[large] ** mid).sum() < budget else (lo, mid)
        sizes = np.where(large, np.maximum(2, np.round(criteo ** lo)), criteo).astype(int)
        sizes[int(np.argmax(sizes))] += self.ids - int(sizes.sum())   # exact total
        return [int(c) for c in sizes]


class _Field:
    """One field's ids: every id ever born (its popularity rank, weights, whether alive)."""

    def __init__(self, rng, size: int, cfg: StreamConfig, churns: bool):
        self.cfg, self.size, self.churns = cfg, size, churns
        self.rank = rng.permutation(size).astype(np.float64)
        self.w = rng.normal(0, 1, size)
        self.v = rng.normal(0, 1, (size, cfg.hidden_dim))
        self.alive = np.ones(size, bool)
        self.seen = np.zeros(size, bool)

    @property
    def born(self) -> int:
        return len(self.rank)

    def scale(self, ids):
        return (1.0 + self.rank[ids]) ** -self.cfg.rarity_decay

    def next_day(self, rng) -> tuple[int, int]:
        """Retires, births and drifts, as a new day begins; returns (born, retired)."""
        cfg, born, retired = self.cfg, 0, 0
        if self.churns:
            live = np.flatnonzero(self.alive)
            retired = int(round(cfg.death * len(live)))
            self.alive[rng.choice(live, retired, replace=False)] = False
            born = int(round(cfg.birth * len(live)))
            self.rank = np.concatenate([self.rank, rng.integers(0, self.size, born).astype(np.float64)])
            self.w = np.concatenate([self.w, rng.normal(0, 1, born)])
            self.v = np.concatenate([self.v, rng.normal(0, 1, (born, cfg.hidden_dim))])
            self.alive = np.concatenate([self.alive, np.ones(born, bool)])
            self.seen = np.concatenate([self.seen, np.zeros(born, bool)])
        if cfg.drift:
            keep, renew = np.sqrt(1 - cfg.drift), np.sqrt(cfg.drift)
            live = self.alive
            self.w[live] = keep * self.w[live] + renew * rng.normal(0, 1, int(live.sum()))
            self.v[live] = keep * self.v[live] + renew * rng.normal(0, 1, (int(live.sum()),
                                                                          cfg.hidden_dim))
        return born, retired

    def sample(self, rng, n: int) -> np.ndarray:
        """n ids of the live ones, each as likely as its popularity."""
        live = np.flatnonzero(self.alive)
        p = (1.0 + self.rank[live]) ** -self.cfg.zipf
        cdf = np.cumsum(p / p.sum())
        return live[np.minimum(np.searchsorted(cdf, rng.random(n)), len(live) - 1)]


class HiddenStream:
    """The fields and the labels' model, advanced a day at a time."""

    def __init__(self, cfg: StreamConfig):
        cfg.check()
        self.cfg = cfg
        self.sizes = cfg.sizes()
        rng = np.random.default_rng([cfg.seed, 0])
        self.fields = [_Field(rng, s, cfg, s > CHURN_ABOVE) for s in self.sizes]
        lin, fm = self._parts(self.sample(np.random.default_rng([cfg.seed, 1]), 20_000))
        self.scales = (cfg.linear_std / max(lin.std(), 1e-9), cfg.fm_std / max(fm.std(), 1e-9))
        logit = self.scales[0] * lin + self.scales[1] * fm
        lo, hi = -20.0, 20.0
        for _ in range(60):    # the bias that makes day 0's mean click probability base_rate
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if (1 / (1 + np.exp(-(logit + mid)))).mean() < cfg.base_rate \
                else (lo, mid)
        self.bias = (lo + hi) / 2

    def sample(self, rng, n: int) -> np.ndarray:
        return np.stack([f.sample(rng, n) for f in self.fields], 1)

    def _parts(self, ids: np.ndarray):
        lin = np.zeros(len(ids))
        vx = np.empty((len(ids), len(self.fields), self.cfg.hidden_dim))
        for j, f in enumerate(self.fields):
            s = f.scale(ids[:, j])
            lin += f.w[ids[:, j]] * s
            vx[:, j] = f.v[ids[:, j]] * s[:, None]
        fm = 0.5 * ((vx.sum(1) ** 2).sum(1) - (vx ** 2).sum((1, 2)))
        return lin, fm

    def probability(self, ids: np.ndarray) -> np.ndarray:
        lin, fm = self._parts(ids)
        return 1 / (1 + np.exp(-(self.bias + self.scales[0] * lin + self.scales[1] * fm)))

    def day(self, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict]:
        """(ids [rows, fields], labels, true probabilities, the day's record) of day d; days
        are drawn in order (each changes the fields for the next)."""
        rng = np.random.default_rng([self.cfg.seed, 2, d])
        born = retired = 0
        if d:
            for f in self.fields:
                b, r = f.next_day(rng)
                born, retired = born + b, retired + r
        ids = self.sample(rng, self.cfg.rows)
        p = self.probability(ids)
        labels = (rng.random(len(p)) < p).astype(np.float32)
        new = 0
        for j, f in enumerate(self.fields):
            day_ids = np.unique(ids[:, j])
            new += int((~f.seen[day_ids]).sum())
            f.seen[day_ids] = True
        record = {"day": d, "rows": int(len(labels)), "positive_rate": float(labels.mean()),
                  "bayes_auc": roc_auc(labels, p), "bayes_logloss": logloss(labels, p),
                  "live_ids": int(sum(f.alive.sum() for f in self.fields)), "born": born,
                  "retired": retired, "ids_ever": int(sum(f.born for f in self.fields)),
                  "new_ids_seen": new}
        return ids, labels, p, record


def day_name(d: int) -> str:
    return f"day-{d:03d}"


def synthesize_days(out_dir, cfg: StreamConfig = StreamConfig(), *, overwrite: bool = False,
                    on_day=None) -> dict:
    """Writes <out>/day-000/ ... one data directory a day (declared fields, TFRecord, hashed at
    training time) and <out>/stream.json with each day's record; returns that summary.
    `on_day(record)` is called as each day is written."""
    from .schema import Field, FieldRows, Schema
    from .tfrecord import ShardWriter
    stream = HiddenStream(cfg)     # validates the configuration before anything is written
    buckets = [cfg.hash_buckets or max(2, round(cfg.bucket_ratio * s)) for s in stream.sizes]
    bases = np.concatenate([[0], np.cumsum(buckets)[:-1]]).astype(int)
    schema = Schema(tuple(Field(f"C{j + 1}", "categorical", hash_buckets=int(h),
                                hash_base=int(b)) for j, (h, b) in enumerate(zip(buckets, bases))))
    out = prepare_output_dir(out_dir, overwrite)
    summary = {"config": dataclasses.asdict(cfg), "field_sizes": stream.sizes,
               "hash_buckets": buckets, "feature_size": int(sum(buckets)), "days": []}
    for d in range(cfg.days):
        ids, labels, _, record = stream.day(d)
        directory = out / day_name(d)
        directory.mkdir()
        path = directory / "part-00000.tfrecord"
        rows = FieldRows(labels, {f.name: ids[:, j].astype(str).astype(object)
                                  for j, f in enumerate(schema.fields)})
        writer = ShardWriter(str(path))
        writer.write_rows(rows, schema)
        writer.commit()
        Manifest("tfrecord", len(schema.fields), int(sum(buckets)),
                 [FileEntry(path.name, len(labels), path.stat().st_size, sha256_file(path))],
                 positives=int(labels.sum()), extra={"stream_day": d},
                 fields=schema.to_json()).write(directory)
        summary["days"].append(record)
        if on_day:
            on_day(record)
    (out / STREAM_INFO).write_text(json.dumps(summary, indent=2) + "\n")
    finish_output_dir(out)
    return summary
