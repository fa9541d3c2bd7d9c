"""MovieLens-1M with each user's history: 1,000,209 ratings (6,040 users, 3,706 movies),
GroupLens's own ml-1m.zip inside scikit-rec 0.3.0's source archive (its examples' data).

The rows, label, fields and time split are ml100k's (ml100k.rows): only the reading differs.
In -1M a user's age and occupation are GroupLens's codes (age 25 = 25-34), categorical alike,
and the release year closes the title ("Toy Story (1995)").
"""

from __future__ import annotations

import io
import tarfile
import zipfile

import pandas as pd

from ...errors import DataError
from . import QualitySet, Source
from .ml100k import COLUMNS, LICENCE, OPTIONS, rows

SOURCE = Source("scikit-rec", "0.3.0", "scikit_rec-0.3.0.tar.gz",
                "949b0ea7b79047b85e49d08466c49837fb74dd1f7d61ce6557f4caf6d680f7fd")
INNER_ZIP = "scikit_rec-0.3.0/examples/data/movielens-1m/ml-1m.zip"


def _table(z: zipfile.ZipFile, kind: str, names: list[str]):
    """A `::`-separated .dat file of ml-1m.zip (Latin-1: some titles are not UTF-8)."""
    text = z.read(f"ml-1m/{kind}.dat").decode("latin-1")
    return pd.DataFrame([line.split("::") for line in text.splitlines() if line], columns=names)


def read(archive):
    with tarfile.open(archive) as t:
        try:
            inner = t.extractfile(INNER_ZIP).read()
        except KeyError:
            raise DataError(f"holds no {INNER_ZIP}", path=str(archive)) from None
    with zipfile.ZipFile(io.BytesIO(inner)) as z:
        ratings = _table(z, "ratings", ["user_id", "item_id", "rating", "timestamp"])
        users = _table(z, "users", ["user_id", "gender", "age", "occupation", "zip_code"])
        items = _table(z, "movies", ["item_id", "title", "genres"])    # genres: "A|B" already
    items["release_year"] = items.pop("title").str.extract(r"\((\d{4})\)\s*$")[0]
    return rows(ratings, users, items)


SET = QualitySet(
    name="ml1m", shape="medium (1M rows) + user history + multi-hot genres", source=SOURCE,
    licence=LICENCE, columns=COLUMNS, options=OPTIONS, split="time", read=read)
