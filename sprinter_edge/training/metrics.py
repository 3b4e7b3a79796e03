"""Held-out metrics for verifier scores: AUC, eta_FP and flag rates, matched comparisons."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.metrics import roc_auc_score

MATCHED_FLAG_RATES = (0.05, 0.10, 0.15, 0.20, 0.30)


def auc(scores: np.ndarray, y: np.ndarray) -> float:
    if len(np.unique(y)) < 2:
        return float("nan")
    return float(roc_auc_score(y, scores))


def accuracy(scores: np.ndarray, y: np.ndarray, threshold: float) -> float:
    return float(((scores >= threshold) == (y == 1)).mean())


def eta_fp_at_flag_rate(scores: np.ndarray, y: np.ndarray, flag_rate: float) -> float:
    """eta_FP when the lowest-scored `flag_rate` of tokens are flagged (ties broken by order)."""
    n = len(scores)
    n_flag = int(round(flag_rate * n))
    order = np.argsort(scores, kind="stable")
    passed = np.ones(n, bool)
    passed[order[:n_flag]] = False
    neg = y == 0
    return float((passed & neg).sum() / max(int(neg.sum()), 1))


def matched_curve(scores: np.ndarray, y: np.ndarray,
                  flag_rates: Sequence[float] = MATCHED_FLAG_RATES) -> list[float]:
    return [eta_fp_at_flag_rate(scores, y, f) for f in flag_rates]


def summary(scores: np.ndarray, y: np.ndarray, threshold: float = 0.5) -> dict[str, object]:
    return {
        "auc": auc(scores, y),
        "accuracy": accuracy(scores, y, threshold),
        "matched_eta_fp": dict(zip([str(f) for f in MATCHED_FLAG_RATES], matched_curve(scores, y),
                                   strict=True)),
        "n": int(len(y)),
        "positive_rate": float(np.mean(y)) if len(y) else float("nan"),
    }
