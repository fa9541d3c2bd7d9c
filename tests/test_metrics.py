import itertools

import numpy as np

from ctrtrain.metrics import logloss, roc_auc


def brute_auc(y, s):
    pos = [a for a, l in zip(s, y) if l]
    neg = [a for a, l in zip(s, y) if not l]
    wins = sum((p > n) + 0.5 * (p == n) for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_auc_exact_with_ties():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, 300)
    s = np.round(rng.random(300), 1)  # many ties
    assert abs(roc_auc(y, s) - brute_auc(y, s)) < 1e-12
    assert roc_auc([0, 1], [0.1, 0.9]) == 1.0
    assert roc_auc([1, 0], [0.1, 0.9]) == 0.0
    assert np.isnan(roc_auc([1, 1], [0.1, 0.9]))


def test_logloss():
    assert abs(logloss([1, 0], [0.5, 0.5]) - np.log(2)) < 1e-12
