"""MovieLens-100K with each user's history: 100,000 ratings (943 users, 1,682 movies), as
RecBole 1.2.1's wheel ships them (its dataset_example, RecBole's atomic files).

A rating of 4 or more is a click (featurize --label-threshold 4 on the rating). Rows are in
time order (ties in the file's order) and split by it. Per row: the user's and the movie's
fields (categorical), the movie's genres (multi-hot), three numbers -- the movie's release
year, how many ratings the user and the movie had before this one (over all rows, in time
order: what a live system would know) -- and `hist_item_id`, the movies the user clicked
before, oldest first, the most recent HISTORY (a sequence sharing item_id's ids, so DIN weighs
the history against the candidate in one embedding space). ml1m reads its files into the same
rows with `rows` below.
"""

from __future__ import annotations

import io

import pandas as pd

from . import FeaturizeOptions, QualitySet, Source, zip_member

HISTORY = 20
COLUMNS = ("timestamp", "rating", "user_id", "item_id", "age", "gender", "occupation",
           "zip_code", "release_year", "user_earlier_ratings", "item_earlier_ratings", "genres",
           "hist_item_id")
OPTIONS = FeaturizeOptions(
    label_column="rating", label_threshold=4,
    numeric=("release_year", "user_earlier_ratings", "item_earlier_ratings"),
    multi_hot=("genres",), sequence=("hist_item_id",),
    share_vocab=(("hist_item_id", "item_id"),), max_len=HISTORY,
    drop=("timestamp",))     # kept in the CSVs to show the split's order; not a feature
LICENCE = ("GroupLens MovieLens terms: research use, acknowledge the data set, do not "
           "redistribute (fetched, never committed)")


def rows(ratings, users, items, history: int = HISTORY):
    """Every rating (user_id, item_id, rating, timestamp) in time order with its user's
    (user_id, age, gender, occupation, zip_code) and movie's (item_id, release_year, genres
    joined by '|') fields, the counts of earlier ratings and the history of earlier clicks."""
    inter = ratings.copy()
    inter["timestamp"] = inter["timestamp"].astype(float).astype("int64")
    inter = inter.sort_values("timestamp", kind="stable").reset_index(drop=True)
    inter["user_earlier_ratings"] = inter.groupby("user_id").cumcount()
    inter["item_earlier_ratings"] = inter.groupby("item_id").cumcount()
    clicked: dict[str, list[str]] = {}
    hist = []
    for user, item, rating in zip(inter.user_id, inter.item_id,
                                  inter.rating.astype(float)):
        before = clicked.setdefault(user, [])
        hist.append("|".join(before[-history:]))
        if rating >= 4:             # the click is known only after this row: not in its history
            before.append(item)
    inter["hist_item_id"] = hist
    out = inter.merge(users, on="user_id", how="left").merge(items, on="item_id", how="left")
    assert len(out) == len(inter) and out.timestamp.is_monotonic_increasing
    out = out[list(COLUMNS)].fillna("").astype(str)
    # A year that is not one (RecBole writes "unkonwn" for a few movies) is missing: "".
    out["release_year"] = out.release_year.where(out.release_year.str.fullmatch(r"\d{4}"), "")
    return out


def _atomic(archive, kind: str):
    """One of RecBole's atomic files: TAB-separated, headers like `user_id:token`."""
    text = zip_member(archive, f"recbole/dataset_example/ml-100k/ml-100k.{kind}").decode("utf-8")
    d = pd.read_csv(io.StringIO(text), sep="\t", dtype=str, keep_default_na=False)
    d.columns = [c.split(":")[0] for c in d.columns]
    return d


def read(archive):
    items = _atomic(archive, "item")[["item_id", "release_year", "class"]]
    items["genres"] = items.pop("class").str.split().str.join("|")
    return rows(_atomic(archive, "inter"), _atomic(archive, "user"), items)


SET = QualitySet(
    name="ml100k", shape="user history (sequence sharing the item's ids) + multi-hot genres",
    source=Source("recbole", "1.2.1", "recbole-1.2.1-py3-none-any.whl",
                  "9c9948202011f37eb0a7c6768129313f00d6403ad221ec940d5e2d5d5f33a407"),
    licence=LICENCE, columns=COLUMNS, options=OPTIONS, split="time", read=read)
