"""Fitting a candidate on the train groups of one temperature regime: the regime's target
(hard greedy label, or the soft acceptance probability), a grid chosen by grouped
cross-validation, and the final fit."""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import log_loss
from sklearn.model_selection import GroupKFold, ParameterGrid
from sklearn.pipeline import Pipeline

from ...errors import SprinterError
from .candidates import StudyCandidate, candidate
from .data import REGIMES, _regime_mask, matrix_of

log = logging.getLogger(__name__)


def _final_step(est: Any) -> tuple[str | None, Any]:
    return (est.steps[-1][0], est.steps[-1][1]) if isinstance(est, Pipeline) else (None, est)


def _fit_params(est: Any, w: np.ndarray | None, groups: np.ndarray | None) -> dict[str, Any]:
    name, final = _final_step(est)
    accepted = inspect.signature(final.fit).parameters
    params = {}
    if w is not None:
        params["sample_weight"] = w
    if groups is not None and "groups" in accepted:
        params["groups"] = groups
    return {(f"{name}__{k}" if name else k): v for k, v in params.items()}


def _accepts_weights(est: Any) -> bool:
    return "sample_weight" in inspect.signature(_final_step(est)[1].fit).parameters


def _training_rows(data: Mapping[str, np.ndarray], rows: np.ndarray, regime: str, weighted: bool,
                   seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(row indices, labels, weights). Greedy: `label_greedy`. Sampled: the soft target
    `accept_prob` as a row with y = 1 (weight a) and a copy with y = 0 (weight 1 - a) --
    rows with a in {0, 1} once -- or, for an estimator without sample weights, y ~ Bernoulli(a)."""
    if regime == "greedy":
        return rows, np.asarray(data["label_greedy"])[rows].astype(np.int64), None
    a = np.clip(np.asarray(data["accept_prob"], np.float64)[rows], 0.0, 1.0)
    if not weighted:
        rng = np.random.default_rng(seed)
        return rows, (rng.random(len(rows)) < a).astype(np.int64), None
    frac = (a > 0) & (a < 1)
    idx = np.concatenate([rows, rows[frac]])
    y = np.concatenate([(a > 0).astype(np.int64), np.zeros(int(frac.sum()), np.int64)])
    w = np.concatenate([np.where(frac, a, 1.0), 1.0 - a[frac]])
    return idx, y, w


def _select(cand: StudyCandidate, x: np.ndarray, y: np.ndarray, w: np.ndarray | None, groups: np.ndarray,
            n_hidden: int, seed: int) -> dict[str, Any]:
    """Grid parameters with the lowest held-out (weighted) log loss over 3 grouped folds."""
    combos = list(ParameterGrid(cand.grid or {}))
    if len(combos) <= 1:
        return combos[0] if combos else {}
    k = min(3, len(np.unique(groups)))
    if k < 2:
        return combos[len(combos) // 2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # the final fit reports convergence
        losses = _cv_losses(cand, combos, x, y, w, groups, k, n_hidden, seed)
    best = int(np.argmin(losses))
    log.info("%s: grouped CV log loss %s -> %s", cand.name,
             ", ".join(f"{c}: {v / k:.4f}" for c, v in zip(combos, losses, strict=True)), combos[best])
    return combos[best]


def _cv_losses(cand: StudyCandidate, combos: list[dict[str, Any]], x: np.ndarray, y: np.ndarray,
               w: np.ndarray | None, groups: np.ndarray, k: int, n_hidden: int, seed: int) -> np.ndarray:
    losses = np.zeros(len(combos))
    for tr, va in GroupKFold(n_splits=k).split(x, y, groups):
        est = cand.build(n_hidden, seed)  # one estimator per fold: warm starts along the grid
        for i, params in enumerate(combos):
            est.set_params(**params)
            est.fit(x[tr], y[tr], **_fit_params(est, None if w is None else w[tr], groups[tr]))
            p = np.clip(est.predict_proba(x[va])[:, 1], 1e-7, 1 - 1e-7)
            losses[i] += log_loss(y[va], p, sample_weight=None if w is None else w[va], labels=[0, 1])
    return losses


def _fit(cand: StudyCandidate, data: Mapping[str, np.ndarray], rows: np.ndarray, regime: str,
         seed: int) -> tuple[Any, dict[str, Any]]:
    """Fit one candidate on `rows` (data row indices) of one regime."""
    n_hidden = int(np.asarray(data["hidden"]).shape[1]) if "hidden" in data else 0
    est = cand.build(n_hidden, seed)
    idx, y, w = _training_rows(data, rows, regime, _accepts_weights(est), seed)
    if len(np.unique(y)) < 2:
        raise SprinterError(f"the {regime} training rows hold one label class only: collect more data")
    x = matrix_of(data, cand.layout, idx)
    groups = np.asarray(data["group"])[idx]
    params = _select(cand, x, y, w, groups, n_hidden, seed)
    est = cand.build(n_hidden, seed).set_params(**params)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        est.fit(x, y, **_fit_params(est, w, groups))
    converged = not any(issubclass(c.category, ConvergenceWarning) for c in caught)
    for c in caught:
        if not issubclass(c.category, ConvergenceWarning):
            log.warning("%s (%s): %s", cand.name, regime, c.message)
    if not converged:
        log.warning("%s (%s): the solver did not converge", cand.name, regime)
    info = {"params": {k: float(v) if isinstance(v, float) else v for k, v in params.items()},
            "converged": converged, "train_rows": int(len(rows)), "fit_rows": int(len(idx)),
            "soft_target": "weighted duplicates" if w is not None else
            ("bernoulli" if regime == "sampled" else "none")}
    return est, info


def fit_final(data: Mapping[str, np.ndarray], name: str | StudyCandidate,
              masks: tuple[np.ndarray, np.ndarray, np.ndarray], regime: str = "greedy", *,
              seed: int = 0) -> Any:
    """The candidate fitted as in the study (train groups of one temperature regime, grouped CV
    for its grid), for export: the calibration and test groups stay held out for the presets
    and their check."""
    if regime not in REGIMES:
        raise SprinterError(f"unknown regime {regime!r}; choose from {', '.join(REGIMES)}")
    rows = np.flatnonzero(masks[0] & _regime_mask(data, regime))
    if len(rows) == 0:
        raise SprinterError(f"no {regime} training rows")
    est, _ = _fit(candidate(name), data, rows, regime, seed)
    return est
