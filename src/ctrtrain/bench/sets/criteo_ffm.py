"""Real Criteo display-ad rows, already hashed: the 400 rows (200 + 200) of xlearn 0.40a1's CTR
demo (its source archive's compile/demo/classification/criteo_ctr/small_{train,test}.txt).

They are libffm text (`label field:id:value ...`, 18 fields, ids hashed below FEATURE_SIZE,
each row's values scaled to unit length), not CSV, so they are not featurized: the pooled rows
are shuffled (seed 0), split 80/10/10 and written as out/{train,valid,test}.txt, which
`ctrtrain data convert` turns into TFRecord data directories of declared fields, the training
split declaring them and valid and test converted --like it (as a user converts libffm
splits). No value is 1, so every field is a weighted multi-hot bag (data/libffm.py). The set
is too small to rank models; it is here for the format and its hashed ids.
"""

from __future__ import annotations

import tarfile

import pandas as pd

from ...errors import DataError
from . import ConvertOptions, QualitySet, Source

FEATURE_SIZE = 10_000     # the demo's ids are below 10,000 (the largest is 9,990)
DEMO = "xlearn-0.40a1/compile/demo/classification/criteo_ctr"


def read(archive):
    lines = []
    with tarfile.open(archive) as t:
        for name in ("small_train.txt", "small_test.txt"):
            try:
                text = t.extractfile(f"{DEMO}/{name}").read().decode("utf-8")
            except KeyError:
                raise DataError(f"holds no {DEMO}/{name}", path=str(archive)) from None
            lines += [line.strip() for line in text.splitlines() if line.strip()]
    return pd.DataFrame({"line": lines})


SET = QualitySet(
    name="criteo_ffm", shape="hashed ids (libffm), tiny",
    source=Source("xlearn", "0.40a1", "xlearn-0.40a1.tar.gz",
                  "fb2291653864c6dbd25440886144e6602a6280ab79b5eab7ae567e34a83177cc"),
    licence="Criteo's Kaggle display-advertising challenge data (2014), Criteo's terms: "
            "non-commercial research use; xlearn (Apache-2.0) ships this sample",
    columns=("line",), options=ConvertOptions(feature_size=FEATURE_SIZE), split="shuffle",
    read=read)
