"""Exact evaluation metrics on NumPy arrays (no histogram approximations)."""

from __future__ import annotations

import numpy as np


def roc_auc(labels, scores) -> float:
    """Exact ROC AUC (Mann-Whitney U with average ranks for tied scores)."""
    labels = np.asarray(labels, dtype=np.float64).ravel() > 0.5
    scores = np.asarray(scores, dtype=np.float64).ravel()
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # Average rank (1-based) of each run of equal scores.
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], sorted_scores.size]
    run_rank = (starts + ends + 1) / 2.0
    ranks = np.empty_like(scores)
    ranks[order] = np.repeat(run_rank, ends - starts)
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def logloss(labels, probs, eps: float = 1e-7) -> float:
    labels = np.asarray(labels, dtype=np.float64).ravel()
    p = np.clip(np.asarray(probs, dtype=np.float64).ravel(), eps, 1 - eps)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))
