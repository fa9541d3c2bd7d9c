"""A model's training step time on batches held in memory (no input pipeline), for comparing
two checkouts on the same data: run it with each one's src first on PYTHONPATH, alternating.
The model at `ctrtrain train`'s defaults; 10 warm-up steps, then ROUNDS x 50 steps, one step
a call; prints the median and each round in ms:

    PYTHONPATH=CHECKOUT/src .venv/bin/python scripts/step_time.py DATA_DIR MODEL [ROUNDS]
"""
import statistics
import sys
import time


def main():
    from ctrtrain.train.threads import ThreadConfig, apply_threads
    apply_threads(ThreadConfig())
    from ctrtrain.input.pipeline import PipelineConfig, dataset_from_dir
    from ctrtrain.train.config import (TrainConfig, model_config, optimizer_params,
                                       resolve_table_updates)
    from ctrtrain.train.inputs import positive_rate
    from ctrtrain.train.step import build_training
    data, model = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    ds, m = dataset_from_dir(data, PipelineConfig())
    batches = [b for _, b in zip(range(60), ds)]
    cfg = TrainConfig(train_dir=data, model_dir="unused", model=model)
    resolve_table_updates(cfg, m.feature_size)
    step = build_training(model_config(cfg, m.feature_size, m.field_size, positive_rate(m),
                                       m.schema),
                          cfg.optimizer, cfg.learning_rate, optimizer_params=optimizer_params(cfg))[2]
    for b in batches[:10]:
        step(b).numpy()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for b in batches[10:]:
            loss = step(b)
        loss.numpy()
        times.append((time.perf_counter() - t) / len(batches[10:]) * 1e3)
    print(f"{model} median {statistics.median(times):.2f} ms a step "
          f"({' / '.join(f'{x:.2f}' for x in times)})")


if __name__ == "__main__":
    main()
