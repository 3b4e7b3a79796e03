"""The candidate verifiers the study compares: what each reads, how it is built, and its grid
of hyperparameters. The first, the calibrated confidence rule, is the reference."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GroupKFold, KFold
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler, TargetEncoder

from ...errors import SprinterError
from .data import SCALARS

# The candidate every other one is compared with: run first, never skipped by the time budget.
REFERENCE = "confidence"


@dataclass(frozen=True)
class StudyCandidate:
    name: str
    layout: tuple[str, ...]
    build: Callable[[int, int], Any]  # (hidden width, seed) -> unfitted classifier
    about: str
    grid: dict[str, list[Any]] | None = None  # chosen by grouped 3-fold CV on the train groups
    exportable: bool = True  # plain sklearn pipeline that skl2onnx converts


class ProjectedHGB(ClassifierMixin, BaseEstimator):
    """Gradient boosting on a supervised projection: a logistic regression on the hidden
    columns (the first `n_hidden`) gives one score, appended to the other columns, and
    gradient-boosted trees read them. The score the trees train on is cross-fitted over
    groups, so they do not learn to trust an overfitted projection."""

    def __init__(self, n_hidden: int = 0, C: float = 1e-2, n_splits: int = 3, seed: int = 0) -> None:
        self.n_hidden = n_hidden
        self.C = C
        self.n_splits = n_splits
        self.seed = seed

    def _projection(self) -> Pipeline:
        return Pipeline([("scale", StandardScaler()), ("clf", LogisticRegression(C=self.C, max_iter=300))])

    def fit(self, X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None,
            groups: np.ndarray | None = None) -> ProjectedHGB:
        X = np.asarray(X, np.float32)
        h = X[:, : self.n_hidden]
        w = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, np.float64)
        groups = np.arange(len(y)) if groups is None else np.asarray(groups)
        oof = np.empty(len(y), np.float64)
        k = min(self.n_splits, len(np.unique(groups)))
        if k < 2:
            raise SprinterError("the projection needs rows from at least 2 groups")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            for tr, va in GroupKFold(n_splits=k).split(h, y, groups):
                proj = self._projection().fit(h[tr], y[tr], clf__sample_weight=w[tr])
                oof[va] = proj.predict_proba(h[va])[:, 1]
            self.projection_ = self._projection().fit(h, y, clf__sample_weight=w)
        self.hgb_ = _hgb(self.seed).fit(np.column_stack([X[:, self.n_hidden:], oof]), y, sample_weight=w)
        self.classes_ = self.hgb_.classes_
        return self

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, np.float32)
        proj = self.projection_.predict_proba(X[:, : self.n_hidden])[:, 1]
        return self.hgb_.predict_proba(np.column_stack([X[:, self.n_hidden:], proj]))

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]


def _hgb(seed: int) -> HistGradientBoostingClassifier:
    return HistGradientBoostingClassifier(max_iter=300, learning_rate=0.06, max_depth=5, max_leaf_nodes=15,
                                          min_samples_leaf=40, l2_regularization=1.0, early_stopping=True,
                                          validation_fraction=0.15, n_iter_no_change=20, random_state=seed)


def _logreg(max_iter: int = 300) -> Pipeline:
    # warm_start: the grouped CV fits C in increasing order, each from the previous solution
    return Pipeline([("scale", StandardScaler()),
                     ("clf", LogisticRegression(max_iter=max_iter, warm_start=True))])


CANDIDATES: tuple[StudyCandidate, ...] = (
    StudyCandidate(REFERENCE, ("max_prob",), lambda d, s: _logreg(),
                   "the calibrated confidence rule: logistic regression on the draft's max probability"),
    StudyCandidate("logreg-scalars", SCALARS, lambda d, s: _logreg(1000),
                   "logistic regression on all scalar features (distribution shape, drawn token, run state)",
                   grid={"clf__C": [1e-3, 1e-2, 1e-1, 1.0, 10.0]}),
    StudyCandidate("hgb-scalars", SCALARS, lambda d, s: Pipeline([("clf", _hgb(s))]),
                   "gradient-boosted trees on all scalar features"),
    StudyCandidate("logreg-token-scalars", ("token", *SCALARS),
                   lambda d, s: Pipeline([
                       ("tok", ColumnTransformer(
                           [("table", TargetEncoder(cv=KFold(5, shuffle=True, random_state=s)), [0])],
                           remainder="passthrough")),
                       ("scale", StandardScaler()),
                       ("clf", LogisticRegression(max_iter=1000))]),
                   "logistic regression on all scalars + a learned token table (the drawn token's "
                   "cross-fitted, smoothed acceptance rate on the train groups)",
                   exportable=False),
    StudyCandidate("logreg-embed-scalars", ("embedding", *SCALARS), lambda d, s: _logreg(300),
                   "logistic regression on the draft's input-embedding row of the drawn token + all "
                   "scalar features",
                   grid={"clf__C": [1e-4, 1e-3, 1e-2, 1e-1]}, exportable=False),
    StudyCandidate("logreg-hidden-embed-scalars", ("hidden", "embedding", *SCALARS),
                   lambda d, s: _logreg(300),
                   "logistic regression on the full hidden state + the drawn token's input-embedding "
                   "row + all scalar features",
                   grid={"clf__C": [1e-4, 1e-3, 1e-2, 1e-1]}, exportable=False),
    StudyCandidate("logreg-hidden-scalars", ("hidden", *SCALARS), lambda d, s: _logreg(300),
                   "logistic regression on the full hidden state + all scalar features",
                   grid={"clf__C": [1e-4, 1e-3, 1e-2, 1e-1]}),
    StudyCandidate("mlp-hidden-scalars", ("hidden", *SCALARS),
                   lambda d, s: Pipeline([("scale", StandardScaler()),
                                          ("clf", MLPClassifier((64,), alpha=1e-2, max_iter=200,
                                                                early_stopping=True, random_state=s))]),
                   "MLP (64 units) on the full hidden state + all scalar features"),
    StudyCandidate("hgb-proj-scalars", ("hidden", *SCALARS),
                   lambda d, s: Pipeline([("clf", ProjectedHGB(n_hidden=d, seed=s))]),
                   "gradient-boosted trees on all scalars + a cross-fitted logistic score of the hidden "
                   "state",
                   exportable=False),
)


def candidate(name: str | StudyCandidate) -> StudyCandidate:
    if isinstance(name, StudyCandidate):
        return name
    for c in CANDIDATES:
        if c.name == name:
            return c
    raise SprinterError(f"unknown study candidate {name!r}; known: {', '.join(c.name for c in CANDIDATES)}")
