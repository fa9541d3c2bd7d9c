"""Criteo-like synthetic data with a known Bayes-optimal AUC.

39 fields: 13 numeric (one id each, value log1p of a heavy-tailed count, 20% missing = 0) and
26 categorical (or fewer of each: numeric_fields, categorical_fields) whose cardinalities are Criteo Kaggle's scaled to the requested feature_size,
ids Zipf-distributed within each field. With multi_hot_fields, each row also has that many bags
of 0 to multi_hot_len ids (a length drawn uniformly, 0 included) from a vocabulary of their own,
which the hidden model mean-pools into one field; with sequence_fields, that many histories of
0 to 2 x sequence_len ids of which the hidden model mean-pools the last sequence_len (the
declared max_len: a reader that kept the oldest ids instead would miss the signal). Such data
declares its fields (numeric, categorical, multi_hot, sequence: data/schema.py) and is written
as TFRecord. Labels are drawn from a hidden FM + linear model, optionally with two more parts:
third-order crosses (cross3_std: the order-3 ANOVA term, the sum over triples of categorical
fields of <t_i, t_j, t_l>, vectors of their own, what DCN-v2's second cross layer and xDeepFM's second
CIN layer are built to reach) and a candidate-dependent history (attention_std: over each
sequence's kept ids, the sum of max(0, <q_c, q_h>) with c the first categorical field, the
candidate: an item counts only where it is relevant to the candidate, and more relevant items
count more -- DIN's premise, which its unnormalized weighted sum is made for and no pooling
fixed before the candidate is seen can express). The
true click probability of every row is known, so the AUC of those probabilities on the test
split is the best any model can reach: the yardstick training is judged by. Signal fades with
an id's rarity (rare ids carry small weights), as in real logs, so enough rows make the bound
reachable. Every row depends only on (seed, row block), so output is the same for any number
of processes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np

from ..errors import DataError
from ..metrics import logloss, roc_auc
from .files import finish_output_dir, prepare_output_dir, staged
from .libsvm import Rows, format_libsvm
from .manifest import FileEntry, Manifest, sha256_file
from .parallel import processes_for, run_tasks

# Criteo Kaggle (train.txt) distinct values of C1..C26.
CRITEO_CARDINALITIES = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683,
                        8351593, 3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15,
                        286181, 105, 142572]
N_NUMERIC = 13
SPLITS = ("train", "valid", "test")
BLOCK = 50_000
SYNTH_INFO = "synth.json"


@dataclasses.dataclass
class SynthConfig:
    rows: int = 1_000_000
    feature_size: int = 1_000_000
    seed: int = 0
    zipf: float = 1.2            # exponent of the per-field id popularity
    hidden_dim: int = 4          # latent size of the hidden FM
    rarity_decay: float = 0.35   # weight scale ~ (1 + popularity rank) ** -decay
    linear_std: float = 1.0      # std of the linear part of the logit
    fm_std: float = 0.8          # std of the pairwise part of the logit
    base_rate: float = 0.25
    valid_fraction: float = 0.1
    test_fraction: float = 0.1
    files_per_split: int = 2
    numeric_fields: int = N_NUMERIC      # Criteo's 13; fewer (0) for other layouts
    categorical_fields: int = len(CRITEO_CARDINALITIES)  # the first this many of Criteo's 26
    multi_hot_fields: int = 0    # bags of ids (declared fields, TFRecord output)
    multi_hot_len: int = 5       # a bag holds 0 to this many ids
    multi_hot_vocab: int = 1000  # distinct ids of each multi_hot and sequence field
    sequence_fields: int = 0     # histories of ids (declared fields, TFRecord output)
    sequence_len: int = 10       # a history's max_len; rows hold 0 to twice as many ids
    cross3_std: float = 0.0      # std of the third-order part (categorical fields)
    attention_std: float = 0.0   # std of the histories' candidate-relevance part

    @property
    def field_size(self) -> int:
        return (self.numeric_fields + self.categorical_fields + self.multi_hot_fields
                + self.sequence_fields)

    @property
    def list_fields(self) -> int:
        return self.multi_hot_fields + self.sequence_fields

    def schema(self):
        """The declared fields (with multi_hot or sequence fields), or None: the fixed schema."""
        if not self.list_fields:
            return None
        from .schema import Field, Schema
        return Schema(tuple(
            [Field(f"I{j + 1}", "numeric") for j in range(self.numeric_fields)]
            + [Field(f"C{j + 1}") for j in range(self.categorical_fields)]
            + [Field(f"M{j + 1}", "multi_hot", self.multi_hot_len, "mean")
               for j in range(self.multi_hot_fields)]
            + [Field(f"S{j + 1}", "sequence", self.sequence_len, "mean")
               for j in range(self.sequence_fields)]))

    def cardinalities(self) -> list[int]:
        cards = self._cardinalities(self.feature_size)
        if min(cards) < 1:
            # Criteo's small fields keep their size and rounding gives each large one at least
            # 2 ids: on a small table the largest is left with nothing.
            least = next(f for f in range(self.feature_size + 1, self.feature_size + 10_000)
                         if min(self._cardinalities(f)) >= 1)
            raise DataError(f"feature_size {self.feature_size} is too small for "
                            f"{self.categorical_fields} categorical fields (it leaves one with "
                            f"no ids): {least} is the next that works", field="feature_size")
        return cards

    def _cardinalities(self, feature_size: int) -> list[int]:
        if not 0 <= self.numeric_fields <= N_NUMERIC or not (
                1 <= self.categorical_fields <= len(CRITEO_CARDINALITIES)):
            raise DataError(f"numeric_fields must be 0..{N_NUMERIC} and categorical_fields "
                            f"1..{len(CRITEO_CARDINALITIES)}", field="fields")
        if min(self.multi_hot_fields, self.sequence_fields) < 0 or self.multi_hot_len < 1 \
                or self.sequence_len < 1 or self.multi_hot_vocab < 2:
            raise DataError("multi_hot_fields and sequence_fields must be >= 0, multi_hot_len "
                            "and sequence_len >= 1, multi_hot_vocab >= 2", field="multi_hot")
        if min(self.linear_std, self.fm_std, self.cross3_std, self.attention_std) < 0:
            raise DataError("the parts' stds must be >= 0", field="std")
        if self.attention_std and not self.sequence_fields:
            raise DataError("attention_std weighs histories against the candidate: it needs "
                            "sequence_fields", field="attention_std")
        criteo = CRITEO_CARDINALITIES[:self.categorical_fields]
        budget = feature_size - self.numeric_fields - self.list_fields * self.multi_hot_vocab
        if budget < 2 * len(criteo):
            least = feature_size - budget + 2 * len(criteo)
            raise DataError(f"feature_size must be at least {least}", field="feature_size")
        small = [c for c in criteo if c <= 100]
        scale = (budget - sum(small)) / max(sum(c for c in criteo if c > 100), 1)
        cards = [c if c <= 100 else max(2, int(round(c * scale))) for c in criteo]
        cards[int(np.argmax(cards))] += budget - sum(cards)  # exact total
        return cards + [self.multi_hot_vocab] * self.list_fields

    def split_bounds(self) -> dict[str, tuple[int, int]]:
        n_test = int(round(self.rows * self.test_fraction))
        n_valid = int(round(self.rows * self.valid_fraction))
        n_train = self.rows - n_valid - n_test
        return {"train": (0, n_train), "valid": (n_train, n_train + n_valid),
                "test": (n_train + n_valid, self.rows)}


class HiddenModel:
    """The generator's FM + linear model; its parameters depend only on the config."""

    def __init__(self, cfg: SynthConfig):
        self.cfg = cfg
        self.cards = cfg.cardinalities()
        numeric = cfg.numeric_fields
        self.bases = np.cumsum([numeric] + self.cards[:-1])
        rng = np.random.default_rng([cfg.seed, 0])
        rank = np.concatenate([np.zeros(numeric)] + [np.arange(c) for c in self.cards])
        scale = (1.0 + rank) ** -cfg.rarity_decay
        self.w = rng.normal(0, 1, cfg.feature_size) * scale
        self.v = rng.normal(0, 1, (cfg.feature_size, cfg.hidden_dim)) * scale[:, None]
        # Drawn after w and v, and only when used: data without these parts stays as it was.
        self.t = rng.normal(0, 1, (cfg.feature_size, cfg.hidden_dim)) * scale[:, None] \
            if cfg.cross3_std else None
        self.q = rng.normal(0, 1, (cfg.feature_size, cfg.hidden_dim)) * scale[:, None] \
            if cfg.attention_std else None
        self.cdfs = []
        for c in self.cards:
            p = (1.0 + np.arange(c)) ** -cfg.zipf
            self.cdfs.append(np.cumsum(p / p.sum()))
        # Calibrate the parts' scales and the bias on a pilot sample.
        parts = self._parts(*self.sample_features(np.random.default_rng([cfg.seed, 1]), 20_000))
        stds = (cfg.linear_std, cfg.fm_std, cfg.cross3_std, cfg.attention_std)
        self.scales = [want / max(part.std(), 1e-9) for want, part in zip(stds, parts)]
        logit = sum(c * part for c, part in zip(self.scales, parts))
        lo, hi = -20.0, 20.0
        for _ in range(60):  # bias so that the mean click probability is base_rate
            mid = (lo + hi) / 2
            if (1 / (1 + np.exp(-(logit + mid)))).mean() < cfg.base_rate:
                lo = mid
            else:
                hi = mid
        self.bias = (lo + hi) / 2

    def sample_features(self, rng, n: int):
        """(ids [n, single fields], values, bags): bags = [(lengths [n], ids)] per multi_hot
        then sequence field, every id of the row (a sequence longer than its max_len too)."""
        numeric, cfg = self.cfg.numeric_fields, self.cfg
        single = len(self.cards) - cfg.list_fields
        ids = np.empty((n, numeric + single), np.int64)
        values = np.ones((n, numeric + single), np.float32)
        ids[:, :numeric] = np.arange(numeric)
        counts = np.floor(rng.lognormal(1.5, 1.5, (n, numeric)))
        present = rng.random((n, numeric)) >= 0.2
        values[:, :numeric] = np.where(present, np.round(np.log1p(counts), 4), 0.0)
        out_bags = []
        for j, (cdf, base) in enumerate(zip(self.cdfs, self.bases)):
            if j < single:
                r = np.minimum(np.searchsorted(cdf, rng.random(n)), len(cdf) - 1)
                ids[:, numeric + j] = base + r
            else:
                longest = cfg.multi_hot_len if j < single + cfg.multi_hot_fields \
                    else 2 * cfg.sequence_len
                lengths = rng.integers(0, longest + 1, n)
                r = np.minimum(np.searchsorted(cdf, rng.random(int(lengths.sum()))), len(cdf) - 1)
                out_bags.append((lengths, base + r))
        return ids, values, out_bags

    def _parts(self, ids, values, bags=()):
        """The logit's parts, unscaled: linear, pairwise, third-order, history relevance (0
        where not configured)."""
        x = values.astype(np.float64)
        lin = (self.w[ids] * x).sum(1)
        vx = self.v[ids] * x[..., None]
        if bags:
            # Each bag is one more field: the mean of its ids' weights and vectors (0 if empty);
            # of a sequence, the mean of its last sequence_len ids.
            bags = [b if j < self.cfg.multi_hot_fields else _last(*b, self.cfg.sequence_len)
                    for j, b in enumerate(bags)]
            pooled = [_mean_pool(self.v[bag_ids], lengths) for lengths, bag_ids in bags]
            lin = lin + sum(_mean_pool(self.w[bag_ids][:, None], lengths)[:, 0]
                            for lengths, bag_ids in bags)
            vx = np.concatenate([vx, np.stack(pooled, 1)], 1)
        fm = 0.5 * ((vx.sum(1) ** 2).sum(1) - (vx ** 2).sum((1, 2)))
        zero = np.zeros(len(ids))
        # Over the categorical fields: crosses of ids, as user x item x context (with the
        # numeric fields the part would be cubic in their heavy-tailed values).
        numeric = self.cfg.numeric_fields
        cross3 = zero if self.t is None else _anova3(self.t[ids[:, numeric:]])
        attention = zero if self.q is None else sum(
            self._relevance(ids[:, self.cfg.numeric_fields], lengths, bag_ids)
            for lengths, bag_ids in bags[self.cfg.multi_hot_fields:])
        return lin, fm, cross3, attention

    def _relevance(self, candidate, lengths, history):
        """Per row, the sum over its kept history of max(0, <q_candidate, q_item>)."""
        q_c = np.repeat(self.q[candidate], lengths, axis=0)
        score = np.maximum((q_c * self.q[history]).sum(1), 0.0)
        return _mean_pool(score[:, None], lengths)[:, 0] * lengths

    def probability(self, ids, values, bags=()) -> np.ndarray:
        logit = sum(c * part for c, part in zip(self.scales, self._parts(ids, values, bags)))
        return 1 / (1 + np.exp(-(self.bias + logit)))


def _anova3(vx: np.ndarray) -> np.ndarray:
    """sum over field triples i < j < l and latent d of vx[:, i, d] vx[:, j, d] vx[:, l, d],
    from the power sums (Newton's identity), O(fields) not O(fields^3)."""
    p1, p2, p3 = vx.sum(1), (vx ** 2).sum(1), (vx ** 3).sum(1)
    return ((p1 ** 3 - 3 * p1 * p2 + 2 * p3) / 6).sum(1)


def _last(lengths: np.ndarray, ids: np.ndarray, keep: int):
    """(lengths, ids) of each row's last `keep` ids."""
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    position = np.arange(len(ids)) - starts
    kept = position >= np.repeat(lengths - keep, lengths)
    return np.minimum(lengths, keep), ids[kept]


def _mean_pool(rows: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per row, the mean of its `lengths[i]` consecutive rows (0 for none)."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    sums = np.add.reduceat(np.concatenate([rows, np.zeros((1, rows.shape[1]))]),
                           np.minimum(starts, len(rows)), axis=0)[:len(lengths)]
    return np.where(lengths[:, None] > 0, sums / np.maximum(lengths, 1)[:, None], 0.0)


_MODEL_CACHE: dict = {}


def _block_rows(cfg: SynthConfig, block: int, start: int, stop: int):
    key = dataclasses.astuple(cfg)
    model = _MODEL_CACHE.get(key) or _MODEL_CACHE.setdefault(key, HiddenModel(cfg))
    rng = np.random.default_rng([cfg.seed, 2, block])
    ids, values, bags = model.sample_features(rng, BLOCK)
    p = model.probability(ids, values, bags)
    labels = (rng.random(BLOCK) < p).astype(np.float32)
    a, b = start - block * BLOCK, stop - block * BLOCK
    schema = cfg.schema()
    if schema is None:
        return Rows(labels[a:b], ids[a:b], values[a:b]), p[a:b]
    from .schema import FieldRows
    numeric = cfg.numeric_fields
    columns = {f.name: values[a:b, j] for j, f in enumerate(schema.of("numeric"))}
    columns.update({f.name: ids[a:b, numeric + j] for j, f in enumerate(schema.of("categorical"))})
    for f, (lengths, bag_ids) in zip(schema.lists(), bags):
        ends = np.cumsum(lengths)
        lo, hi = (int(ends[a - 1]) if a else 0), int(ends[b - 1])
        columns[f.name] = (lengths[a:b], bag_ids[lo:hi], None)
    return FieldRows(labels[a:b], columns), p[a:b]


def _write_file(task):
    """Worker: rows [start, stop) into one libsvm file (TFRecord for declared fields);
    returns its entry and (labels, probs)."""
    cfg, path, start, stop = task
    labels, probs = [], []
    schema = cfg.schema()
    if schema is not None:
        from .tfrecord import ShardWriter
        writer = ShardWriter(path)
    with staged(path) if schema is None else _closing_writer(writer) as f:
        for block in range(start // BLOCK, (stop - 1) // BLOCK + 1):
            lo, hi = max(start, block * BLOCK), min(stop, (block + 1) * BLOCK)
            rows, p = _block_rows(cfg, block, lo, hi)
            if schema is None:
                f.write(format_libsvm(rows))
            else:
                writer.write_rows(rows, schema)
            labels.append(rows.labels)
            probs.append(p)
    if schema is not None:
        writer.commit()
    entry = FileEntry(os.path.basename(path), stop - start, os.path.getsize(path), sha256_file(path))
    return entry, np.concatenate(labels), np.concatenate(probs)


class _closing_writer:
    """A ShardWriter as a context: aborted (its .tmp removed) if the block raises."""
    def __init__(self, writer):
        self.writer = writer

    def __enter__(self):
        return self.writer

    def __exit__(self, kind, *_):
        if kind is not None:
            self.writer.abort()


def synthesize(out_dir, cfg: SynthConfig = SynthConfig(), *, processes: int | None = None,
               overwrite: bool = False) -> dict:
    """Writes <out>/{train,valid,test}/ libsvm data directories (TFRecord with declared fields
    when there are bags) and <out>/synth.json with the Bayes-optimal AUC and logloss of every
    split. Returns that summary."""
    if cfg.rows < 10:
        raise DataError("rows must be at least 10", field="rows")
    model = HiddenModel(cfg)  # validates the config before anything is written
    out = prepare_output_dir(out_dir, overwrite)
    tasks, owners = [], []
    for split, (lo, hi) in cfg.split_bounds().items():
        (out / split).mkdir()
        k = min(cfg.files_per_split, hi - lo)  # an empty split gets no files
        for i in range(k):
            a, b = lo + (hi - lo) * i // k, lo + (hi - lo) * (i + 1) // k
            suffix = ".libsvm" if cfg.schema() is None else ".tfrecord"
            tasks.append((cfg, str(out / split / f"part-{i:05d}{suffix}"), a, b))
            owners.append(split)
    try:
        results = list(run_tasks(_write_file, tasks, processes_for(cfg.rows, processes), "synth",
                                  [t[3] - t[2] for t in tasks]))
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    summary = {"config": dataclasses.asdict(cfg), "field_size": cfg.field_size,
               "feature_size": cfg.feature_size, "cardinalities": model.cards, "splits": {}}
    for split in SPLITS:
        mine = [r for r, o in zip(results, owners) if o == split]
        labels = np.concatenate([r[1] for r in mine] or [np.zeros(0, np.float32)])
        probs = np.concatenate([r[2] for r in mine] or [np.zeros(0)])
        schema = cfg.schema()
        m = Manifest(format="libsvm" if schema is None else "tfrecord",
                     field_size=summary["field_size"],
                     feature_size=cfg.feature_size, files=[r[0] for r in mine],
                     positives=int(labels.sum()), extra={"synth_split": split},
                     fields=None if schema is None else schema.to_json())
        m.write(out / split)
        summary["splits"][split] = {"rows": int(labels.size)}
        if labels.size:
            summary["splits"][split].update(
                positive_rate=float(labels.mean()), bayes_auc=roc_auc(labels, probs),
                bayes_logloss=logloss(labels, probs))
    (out / SYNTH_INFO).write_text(json.dumps(summary, indent=2) + "\n")
    finish_output_dir(out)
    return summary


def synthesize_tfrecord(root, cfg: SynthConfig = SynthConfig(), *, tfrecord_dir: str = "tf",
                        shards: dict[str, int] | None = None, processes: int | None = None,
                        overwrite: bool = False) -> dict:
    """Synthesized splits as libsvm (<root>/raw/<split>) and TFRecord shards
    (<root>/<tfrecord_dir>/<split>) for every split that has rows: the one place the
    quickstart, the benchmarks and the tests make their data. Returns synthesize()'s summary."""
    from pathlib import Path

    from .convert import libsvm_to_tfrecord
    from .manifest import read_manifest
    root = Path(root)
    shards = {"train": 8, "valid": 2, "test": 2, **(shards or {})}
    s = synthesize(root / "raw", cfg, processes=processes, overwrite=overwrite)
    for split in SPLITS:
        if not s["splits"][split]["rows"]:
            continue
        m = read_manifest(root / "raw" / split)
        libsvm_to_tfrecord(m.paths(root / "raw" / split), root / tfrecord_dir / split,
                           field_size=m.field_size, feature_size=m.feature_size,
                           shards=shards[split], processes=processes, overwrite=overwrite)
    return s
