"""Milliseconds a call of an export's `raw` signature takes (a serving client's raw rows, through
featurize's transform in the graph: data/raw_graph.py), on the rows of a raw file repeated to
ROWS: median of 7 rounds of 20 calls.

    .venv/bin/python scripts/raw_signature_speed.py MODEL_DIR/export RAW_FILE [ROWS]

RAW_FILE as featurize read it (Criteo's tab-separated lines, or a CSV with a header), its
columns named by the export's vocabulary (assets.extra/vocab.json).
"""
import csv
import json
import statistics
import sys
import time

import tensorflow as tf

from ctrtrain.train.export import latest_export


def main(export: str, raw: str, rows: int = 1000) -> None:
    path = latest_export(export)
    schema = json.load(open(f"{path}/assets.extra/vocab.json"))["schema"]
    columns = schema["numeric"] + schema["categorical"] + schema["multi_hot"] + schema["sequence"]
    with open(raw, newline="") as f:
        if raw.endswith(".csv"):
            table = list(csv.DictReader(f))
        else:   # Criteo's layout: the label, then the columns in the vocabulary's order
            names = [schema["label"]] + schema["numeric"] + schema["categorical"]
            table = [dict(zip(names, (line.rstrip("\n").split("\t") + [""] * len(names))))
                     for line in f]
    table = (table * (rows // len(table) + 1))[:rows]
    cells = {c: tf.constant([r.get(c, "") for r in table]) for c in columns}
    serve = tf.saved_model.load(path).signatures["raw"]
    serve(**cells)
    rounds = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(20):
            serve(**cells)
        rounds.append((time.perf_counter() - t) / 20 * 1000)
    print(f"{path}: {statistics.median(rounds):.2f} ms a call of {rows} raw rows "
          f"(rounds: {' '.join(f'{r:.2f}' for r in rounds)})")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:4]))
