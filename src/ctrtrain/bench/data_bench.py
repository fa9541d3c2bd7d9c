"""`ctrtrain bench data`: libsvm -> TFRecord conversion at several process counts, and the read
rate of the written TFRecords with TensorFlow's vectorized parse (batch, then parse_example)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from ..data.convert import libsvm_to_tfrecord
from ..data.manifest import read_manifest
from ..data.synth import SynthConfig, synthesize
from .machine import describe_machine


def _input(work: Path, rows: int) -> Path:
    src = work / f"synth-{rows}"
    if not (src / "synth.json").exists():
        synthesize(src, SynthConfig(rows=rows, valid_fraction=0.0, test_fraction=0.0),
                   overwrite=True)
    return src / "train"


def read_rate(data_dir: str, batch: int = 1024, repeats: int = 3) -> float:
    """Examples/s reading all shards: interleave, batch, vectorized parse."""
    import tensorflow as tf
    from ..data.tfrecord import feature_spec, tf_compression
    m = read_manifest(data_dir)
    spec = feature_spec(m.field_size)
    files = m.paths(data_dir)
    rates = []
    for _ in range(repeats):
        ds = tf.data.Dataset.from_tensor_slices(files).interleave(
            lambda f: tf.data.TFRecordDataset(f, compression_type=tf_compression(m.compression)),
            cycle_length=len(files), num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.batch(batch).map(lambda s: tf.io.parse_example(s, spec),
                                 num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
        t, n = time.perf_counter(), 0
        for b in ds:
            n += int(b["label"].shape[0])
        rates.append(n / (time.perf_counter() - t))
    return statistics.median(rates)


def run_data_bench(rows: int = 1_000_000, processes=(1, 2), repeats: int = 3,
                   work_dir: str = "runs/bench-data", json_path: str | None = None) -> dict:
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    src = _input(work, rows)
    m_in = read_manifest(src)
    in_bytes = sum(f.bytes for f in m_in.files)
    results = {"machine": describe_machine(), "rows": m_in.records, "input_mb": in_bytes / 1e6,
               "convert": [], "read": {}}
    out = work / "tfrecord"
    for p in processes:
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            libsvm_to_tfrecord(m_in.paths(src), out, field_size=m_in.field_size,
                               feature_size=m_in.feature_size, shards=8, processes=p,
                               overwrite=True)
            times.append(time.perf_counter() - t)
        med = statistics.median(times)
        row = {"processes": p, "seconds_median": med, "seconds_all": times,
               "rows_per_s": m_in.records / med, "mb_per_s": in_bytes / 1e6 / med}
        results["convert"].append(row)
        print(f"convert libsvm->tfrecord  processes {p}: {med:6.2f} s  "
              f"{row['rows_per_s']:>10,.0f} rows/s  {row['mb_per_s']:6.1f} MB/s (input)", flush=True)
    rate = read_rate(str(out), repeats=repeats)
    results["read"] = {"rows_per_s": rate, "batch": 1024}
    print(f"read tfrecord (interleave, batch 1024, parse_example): {rate:,.0f} rows/s")
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2) + "\n")
    return results
