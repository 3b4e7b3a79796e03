"""Candidate verifier models: scikit-learn pipelines over one feature layout each.

Every candidate reads the raw feature vector of its layout (what `feature_vector` builds at
run time), so the whole pipeline -- scaling, PCA of the hidden state -- is exported to ONNX.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sklearn.base import ClassifierMixin
from sklearn.compose import ColumnTransformer
from sklearn.decomposition import PCA
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

CONF = ("max_prob", "entropy")
HIDDEN_CONF = ("hidden", "max_prob", "entropy")


@dataclass(frozen=True)
class Candidate:
    name: str
    layout: tuple[str, ...]
    build: Callable[[int], Pipeline]  # n_embd -> unfitted pipeline
    about: str


def _pca_conf(n_embd: int, k: int) -> ColumnTransformer:
    """PCA of the hidden-state columns, confidence columns passed through."""
    return ColumnTransformer(
        [("pca", PCA(n_components=k, random_state=0), list(range(n_embd))),
         ("conf", "passthrough", [n_embd, n_embd + 1])],
    )


def _hgb(seed: int = 0) -> ClassifierMixin:
    return HistGradientBoostingClassifier(max_iter=150, learning_rate=0.06, max_leaf_nodes=15,
                                          min_samples_leaf=40, l2_regularization=1.0,
                                          random_state=seed)


CANDIDATES: tuple[Candidate, ...] = (
    Candidate("logreg-maxprob", ("max_prob",),
              lambda d: Pipeline([("scale", StandardScaler()), ("clf", LogisticRegression())]),
              "the confidence rule, calibrated: a monotone map of the draft's max probability"),
    Candidate("logreg-conf", CONF,
              lambda d: Pipeline([("scale", StandardScaler()), ("clf", LogisticRegression())]),
              "logistic regression on max probability and entropy"),
    Candidate("hgb-conf", CONF, lambda d: Pipeline([("clf", _hgb())]),
              "gradient-boosted trees on max probability and entropy"),
    Candidate("logreg-hidden", ("hidden",),
              lambda d: Pipeline([("scale", StandardScaler()),
                                  ("clf", LogisticRegression(C=0.01, max_iter=1000))]),
              "the paper's verifier: linear on the draft's hidden state (standardised, L2)"),
    Candidate("logreg-pca16-conf", HIDDEN_CONF,
              lambda d: Pipeline([("feat", _pca_conf(d, 16)), ("scale", StandardScaler()),
                                  ("clf", LogisticRegression(max_iter=1000))]),
              "logistic regression on 16 PCA components of the hidden state + confidence"),
    Candidate("hgb-pca16-conf", HIDDEN_CONF,
              lambda d: Pipeline([("feat", _pca_conf(d, 16)), ("clf", _hgb())]),
              "gradient-boosted trees on 16 PCA components of the hidden state + confidence"),
    Candidate("mlp-pca32-conf", HIDDEN_CONF,
              lambda d: Pipeline([("feat", _pca_conf(d, 32)), ("scale", StandardScaler()),
                                  ("clf", MLPClassifier((32,), alpha=1e-2, max_iter=300,
                                                        early_stopping=True, random_state=0))]),
              "small MLP (32 units) on 32 PCA components of the hidden state + confidence"),
)


def candidate(name: str) -> Candidate:
    for c in CANDIDATES:
        if c.name == name:
            return c
    raise KeyError(name)
