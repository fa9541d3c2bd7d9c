"""What the training input pipeline costs in CPU per batch, alone (issue 27): the trainer's
pipeline (input/pipeline.py) over `bench train`'s reference TFRecords, batches of 1,024, read
as fast as it goes; CPU time of the whole process (all of tf.data's threads) per batch, which
on a 2-core machine is taken from the training step.

    .venv/bin/python scripts/input_cpu.py [DATA_DIR]

Variants, each in its own process, alternated over 3 rounds, medians printed: the default
(records moved in blocks of 16; vectorized tf.io.parse_example after batching; the files
interleaved by one thread on a machine of up to 4 cores), records moved one by one, the files
interleaved by tf.data's threads or by one, parsing record by record, the default without
the shuffle buffer, and `cache` (every record parsed once before the first batch, outside the
measured batches; each batch then gathered from memory).
"""
import json
import resource
import statistics
import subprocess
import sys
import time

DATA = "runs/bench-train/ref-1000000-1000000-zipf0.7/tfrecord/train"
VARIANTS = {"default": {},
            "records one by one": {"read_block": 1},
            "files read by threads": {"read_threads": True},
            "files read in one thread": {"read_threads": False},
            "parse record by record": {"parse": "scalar"},
            "no shuffle buffer": {"shuffle_buffer": 0},
            "cache": {"cache": True}}


def measure(data: str, settings: dict, batches: int = 300) -> dict:
    from ctrtrain.input.pipeline import PipelineConfig, dataset_from_dir
    from ctrtrain.train.threads import ThreadConfig, apply_threads
    apply_threads(ThreadConfig())
    ds, _ = dataset_from_dir(data, PipelineConfig(**settings))
    it = iter(ds)
    for _ in range(20):
        next(it)
    r0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(batches):
        next(it)
    r1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    return {"cpu_ms": 1000 * cpu / batches, "wall_ms": 1000 * wall / batches}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(json.dumps(measure(sys.argv[2], json.loads(sys.argv[3]))))
        return
    data = sys.argv[1] if len(sys.argv) > 1 else DATA
    got = {name: [] for name in VARIANTS}
    for _ in range(3):
        for name, settings in VARIANTS.items():
            out = subprocess.run([sys.executable, __file__, "--one", data, json.dumps(settings)],
                                 capture_output=True, text=True, check=True).stdout
            got[name].append(json.loads(out.strip().splitlines()[-1]))
    for name, runs in got.items():
        cpu = statistics.median(r["cpu_ms"] for r in runs)
        wall = statistics.median(r["wall_ms"] for r in runs)
        each = " / ".join(f"{r['cpu_ms']:.2f}" for r in runs)
        print(f"{name:28s} CPU {cpu:5.2f} ms per batch (runs {each}), wall {wall:5.2f} ms")


if __name__ == "__main__":
    main()
