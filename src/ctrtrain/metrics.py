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


def group_auc(labels, scores, groups) -> dict:
    """gAUC: the impression-weighted mean of per-group AUCs, Σ_g n_g·AUC_g / Σ_g n_g, over
    the groups that hold both classes (n_g: the group's rows), as in the DIN paper and
    FuxiCTR's gAUC. A group of one class has no AUC and is skipped (counted in
    `skipped_all_negative` / `skipped_all_positive`). Each AUC is exact, tied scores counting
    half, as roc_auc's. Returns {gauc (NaN when no group counts), groups, groups_counted,
    rows_counted, skipped_all_negative, skipped_all_positive}."""
    y = np.asarray(labels, dtype=np.float64).ravel() > 0.5
    s = np.asarray(scores, dtype=np.float64).ravel()
    g = np.asarray(groups).ravel()
    if not (y.size == s.size == g.size):
        raise ValueError(f"labels, scores and groups differ in length ({y.size}, {s.size}, "
                         f"{g.size})")
    empty = {"gauc": float("nan"), "groups": 0, "groups_counted": 0, "rows_counted": 0,
             "skipped_all_negative": 0, "skipped_all_positive": 0}
    if y.size == 0:
        return empty
    _, codes = np.unique(g, return_inverse=True)
    codes = codes.ravel()
    order = np.lexsort((s, codes))          # by group, then by score within it
    gs, ss, ys = codes[order], s[order], y[order]
    n = gs.size
    group_start = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
    sizes = np.diff(np.r_[group_start, n])
    # Runs of equal scores within a group share their average rank (1-based, in the group).
    run_start = np.flatnonzero(np.r_[True, (gs[1:] != gs[:-1]) | (ss[1:] != ss[:-1])])
    run_end = np.r_[run_start[1:], n]
    first_of_run = np.repeat(group_start, sizes)[run_start]
    run_rank = (run_start + run_end + 1) / 2.0 - first_of_run
    ranks = np.repeat(run_rank, run_end - run_start)
    k = group_start.size
    pos = np.bincount(gs, weights=ys, minlength=k)
    neg = sizes - pos
    pos_ranks = np.bincount(gs, weights=ranks * ys, minlength=k)
    both = (pos > 0) & (neg > 0)
    auc = np.full(k, np.nan)
    auc[both] = (pos_ranks[both] - pos[both] * (pos[both] + 1) / 2.0) / (pos[both] * neg[both])
    rows = int(sizes[both].sum())
    return {"gauc": float((sizes[both] * auc[both]).sum() / rows) if rows else float("nan"),
            "groups": int(k), "groups_counted": int(both.sum()), "rows_counted": rows,
            "skipped_all_negative": int((pos == 0).sum()),
            "skipped_all_positive": int((neg == 0).sum())}


def calibration_bins(labels, probs, bins: int = 10) -> dict:
    """Equal-width bins over [0, 1] (bin b holds b/bins <= p < (b+1)/bins, the last also
    p = 1): per bin its edges, row count, mean prediction and positive rate (NaN when empty)."""
    if bins < 1:
        raise ValueError(f"bins must be at least 1, not {bins}")
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.asarray(probs, dtype=np.float64).ravel()
    b = np.clip(np.floor(p * bins).astype(np.int64), 0, bins - 1)
    count = np.bincount(b, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_prob = np.bincount(b, weights=p, minlength=bins) / count
        rate = np.bincount(b, weights=y, minlength=bins) / count
    edges = np.arange(bins + 1) / bins
    return {"low": edges[:-1], "high": edges[1:], "count": count, "mean_prediction": mean_prob,
            "positive_rate": rate}


def expected_calibration_error(labels, probs, bins: int = 10) -> float:
    """ECE over equal-width bins (calibration_bins): Σ_b |B_b|/N · |mean prediction in B_b -
    positive rate in B_b|; empty bins add nothing. NaN for no rows."""
    c = calibration_bins(labels, probs, bins)
    n = c["count"].sum()
    if n == 0:
        return float("nan")
    full = c["count"] > 0
    gap = np.abs(c["mean_prediction"][full] - c["positive_rate"][full])
    return float((c["count"][full] / n * gap).sum())
