"""Does a verifier that reads the draft's hidden state beat the calibrated confidence rule?

The decision metric is the one that matters at run time: false passes at equal target cost.
Every candidate's scores are replayed along the collected SPRINTER trajectories through the
decoder's own run policy (`decoding.run_policy`: run counter, run cap, unscored tokens), each
target call priced by a cost model (milliseconds per catch-up of n tokens). At the confidence
rule's reference operating points, every other candidate gets the threshold that costs the
same target milliseconds per token on the same test rows (matching uses no labels), and the
two are compared by the expected false passes per token (sum of 1 - accept_prob over kept
tokens). Confidence intervals come from a bootstrap over test groups, so near-duplicate
prompts never count as independent evidence.

Data: one row per drafted token (`training.onpolicy`), split by prompt group, stratified by
domain. One model per temperature regime: greedy rows (temperature 0, target `label_greedy`)
and sampled rows (temperature > 0, soft target `accept_prob` via duplicated weighted rows).
"""

from __future__ import annotations

import inspect
import logging
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss, roc_auc_score
from sklearn.model_selection import GroupKFold, KFold, ParameterGrid
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler, TargetEncoder

from ..decoding.run_policy import RunPolicy, Verdict
from ..errors import SprinterError
from ..verifiers.calibration import DEFAULT_THRESHOLDS, PRESET_MAX_FP

log = logging.getLogger(__name__)

SCALARS = ("max_prob", "entropy", "margin", "logq_x", "q_ratio", "run_position", "since_flag",
           "last_accepted", "last_rejected", "output_position")
# Study features no run-time verifier reads yet: "token" (the drawn token's id, read only through
# a learned token table, TargetEncoder) and "embedding" (the draft's input-embedding row of the
# drawn token, added from the draft GGUF by `training.embeddings`; absent: its candidates skip)
FEATURE_NAMES = ("hidden", *SCALARS, "token", "embedding")
DOMAINS = {0: "code", 1: "chat"}
REGIMES = ("greedy", "sampled")
# regime -> the label AUC is reported on (context only, not the decision)
AUC_LABEL = {"greedy": "label_greedy", "sampled": "label_paper"}

# Measured ms per target call of n tokens (last rows only) on the reference machine.
DEFAULT_COST_MS = {1: 68.0, 2: 108.0, 4: 164.0, 8: 368.0, 16: 493.0, 24: 866.0}
# Thresholds on the confidence rule's calibrated score that define the reference operating points.
REFERENCE_THRESHOLDS = {"quality": 0.90, "balanced": 0.74, "fast": 0.46}
REFERENCE = "confidence"


# --------------------------------------------------------------------------- features, split


def _matrix(data: Mapping[str, np.ndarray], layout: Sequence[str],
            rows: np.ndarray | None = None) -> np.ndarray:
    """Columns of `layout` side by side (float32), like `features.feature_matrix`: "hidden"
    expands to its d columns, every other name is one column."""
    missing = [name for name in layout if name not in data]
    unknown = [name for name in layout if name not in FEATURE_NAMES]
    if unknown:
        raise SprinterError(f"unknown feature(s) {', '.join(unknown)}; known: {', '.join(FEATURE_NAMES)}")
    if missing:
        raise SprinterError(f"the data has no column(s) {', '.join(missing)}")
    parts = []
    for name in layout:
        col = np.asarray(data[name]) if rows is None else np.asarray(data[name])[rows]
        parts.append(col.reshape(len(col), -1).astype(np.float32, copy=False))
    return np.ascontiguousarray(np.concatenate(parts, axis=1), dtype=np.float32)


def split_by_group(group: np.ndarray, domain: np.ndarray,
                   fractions: tuple[float, float, float] = (0.6, 0.2, 0.2),
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Boolean row masks (train, calib, test). Groups, not prompts, are split (near-duplicate
    prompts share a group), separately within each domain so both parts see both domains; a
    group spanning domains goes with the domain most of its rows have."""
    group = np.asarray(group)
    domain = np.asarray(domain)
    if group.shape != domain.shape:
        raise SprinterError(f"group {group.shape} and domain {domain.shape} differ in shape")
    if abs(sum(fractions) - 1) > 1e-6 or min(fractions) <= 0:
        raise SprinterError(f"split fractions must be positive and sum to 1, got {fractions}")
    groups, g_idx = np.unique(group, return_inverse=True)
    doms = np.unique(domain)
    counts = np.zeros((len(groups), len(doms)), np.int64)
    np.add.at(counts, (g_idx, np.searchsorted(doms, domain)), 1)
    majority = doms[np.argmax(counts, axis=1)]  # ties: the lower domain code
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[], [], []]
    for d in doms:
        gs = groups[majority == d]
        if len(gs) == 0:
            continue
        gs = gs[rng.permutation(len(gs))]
        n = len(gs)
        n_cal = max(1, round(n * fractions[1]))
        n_test = max(1, round(n * fractions[2]))
        if n - n_cal - n_test < 1:
            raise SprinterError(f"domain {DOMAINS.get(int(d), d)} has {n} prompt groups: too few for a "
                                "train/calibration/test split (need at least 3)")
        n_train = n - n_cal - n_test
        for k, chunk in enumerate((gs[:n_train], gs[n_train:n_train + n_cal], gs[n_train + n_cal:])):
            parts[k].append(chunk)
    masks = tuple(np.isin(group, np.concatenate(p)) for p in parts)
    return masks  # type: ignore[return-value]


# --------------------------------------------------------------------------- cost, simulation


def table_cost(table: Mapping[int, float] | None = None) -> Callable[[float], float]:
    """ms per target call of n tokens: linear between the table's rows, linear extrapolation
    beyond either end (from the two outermost rows)."""
    tab = dict(DEFAULT_COST_MS if table is None else table)
    if len(tab) < 2:
        raise SprinterError("a cost table needs at least two rows")
    xs = np.array(sorted(tab), np.float64)
    ys = np.array([tab[k] for k in sorted(tab)], np.float64)

    def cost(n: float) -> float:
        if n < xs[0]:
            return float(ys[0] + (n - xs[0]) * (ys[1] - ys[0]) / (xs[1] - xs[0]))
        if n > xs[-1]:
            return float(ys[-1] + (n - xs[-1]) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
        return float(np.interp(n, xs, ys))

    return cost


class _Walk:
    """The rows of a mask in runtime order, ready to be replayed at any threshold through the
    decoder's own run policy (decoding/run_policy.py): run counter, run cap, tokens the decoder
    never scores."""

    def __init__(self, data: Mapping[str, np.ndarray], mask: np.ndarray, cap: int | None,
                 cost: Callable[[float], float]) -> None:
        if cap is not None and cap < 1:
            raise SprinterError("the run cap must be at least 1")
        idx = np.flatnonzero(mask)
        order = np.lexsort((data["output_position"][idx], data["temperature"][idx],
                            data["prompt_index"][idx]))
        self.rows = idx[order]
        n = len(self.rows)
        self.n = n
        p, t = data["prompt_index"][self.rows], data["temperature"][self.rows]
        self.start = np.ones(n, bool)
        self.start[1:] = (p[1:] != p[:-1]) | (t[1:] != t[:-1])
        self.scored = np.asarray(data["scored"])[self.rows].astype(bool)
        self.miss = 1.0 - np.clip(np.asarray(data["accept_prob"], np.float64)[self.rows], 0.0, 1.0)
        self.miss_scored = float(self.miss[self.scored].sum())
        self.groups, self.group = np.unique(np.asarray(data["group"])[self.rows], return_inverse=True)
        self.cap = cap
        self._starts = self.start.tolist()
        # ms per call of k tokens, k = 0 .. longest possible catch-up (any callable works)
        starts = np.flatnonzero(self.start)
        longest_traj = int(np.max(np.diff(np.append(starts, n)))) if n else 0
        longest = (cap + 1) if cap is not None else (longest_traj + 2)
        self.lut = np.array([float(cost(k)) for k in range(longest + 2)], np.float64)

    def replay(self, s: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
        """(kept, call_ms) per row for scores `s` in walk order: a row is either kept or sent
        to the target, and call_ms is what that target call costs (the run's kept tokens, this
        one and the previous call's bonus token)."""
        scores = [v if ok else None for v, ok in zip(s.tolist(), self.scored.tolist(), strict=True)]
        walked = list(RunPolicy(threshold, self.cap).walk(scores, self._starts))
        verdicts = np.fromiter((v for v, _ in walked), np.int8, self.n)
        run = np.fromiter((r for _, r in walked), np.int64, self.n)
        kept = verdicts == Verdict.KEPT
        call_ms = np.where(kept, 0.0, self.lut[np.minimum(run + 2, len(self.lut) - 1)])
        return kept, call_ms

    def totals(self, s: np.ndarray, threshold: float) -> dict[str, float]:
        kept, call_ms = self.replay(s, threshold)
        n = max(self.n, 1)
        fp = float(self.miss[kept].sum())
        calls = int(self.n - kept.sum())
        n_scored = max(int(self.scored.sum()), 1)
        flagged = int((self.scored & ~(s >= threshold)).sum())
        return {
            "tokens": int(self.n), "target_calls": calls, "target_ms": float(call_ms.sum()),
            "false_passes": fp, "kept": int(kept.sum()),
            "target_calls_per_token": calls / n, "target_ms_per_token": float(call_ms.sum()) / n,
            "false_pass_per_token": fp / n,
            "eta_fp": fp / self.miss_scored if self.miss_scored > 0 else float("nan"),
            "flag_rate": flagged / n_scored,
        }

    def group_sums(self, s: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
        """Per test group: (false passes, target ms) -- what the bootstrap reweights."""
        kept, call_ms = self.replay(s, threshold)
        g = len(self.groups)
        return (np.bincount(self.group, weights=self.miss * kept, minlength=g),
                np.bincount(self.group, weights=call_ms, minlength=g))


def _ordered(scores: np.ndarray, walk: _Walk, n_data: int) -> np.ndarray:
    """Scores in walk order; `scores` holds either one value per data row or per masked row."""
    scores = np.asarray(scores, np.float64)
    if len(scores) == n_data:
        return scores[walk.rows]
    if len(scores) == walk.n:  # aligned with the mask's rows in data order
        return scores[np.argsort(np.argsort(walk.rows))]
    raise SprinterError(f"{len(scores)} scores for {n_data} rows ({walk.n} in the mask)")


def simulate(scores: np.ndarray, data: Mapping[str, np.ndarray], mask: np.ndarray, threshold: float,
             cost: Callable[[float], float] | None = None, cap: int | None = 16) -> dict[str, float]:
    """Replay SPRINTER along every (prompt_index, temperature) trajectory in `mask`.

    Per drafted token, with r tokens kept since the last target call: r + 1 >= cap or
    scored == 0 -> the target is called; score >= threshold -> kept (false pass 1 - accept_prob);
    else flagged -> the target is called. A call costs cost(r + 2) ms (r pending tokens, the
    flagged one, the previous step's bonus token) and resets r. `scores` has one value per
    data row (or per masked row, in data order)."""
    walk = _Walk(data, np.asarray(mask, bool), cap, cost or table_cost())
    return walk.totals(_ordered(scores, walk, len(mask)), threshold)


# --------------------------------------------------------------------------- candidates


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
    x = _matrix(data, cand.layout, idx)
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


def _regime_mask(data: Mapping[str, np.ndarray], regime: str) -> np.ndarray:
    t = np.asarray(data["temperature"])
    return t == 0 if regime == "greedy" else t > 0


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


# --------------------------------------------------------------------------- comparison


def _domain_masks(data: Mapping[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    dom = np.asarray(data["domain"])
    out = {DOMAINS.get(int(d), str(int(d))): mask & (dom == d) for d in np.unique(dom[mask])}
    return out | {"all": mask}


def _boot_weights(n_groups: int, n_boot: int, seed: int) -> np.ndarray:
    """Group resampling with replacement as multinomial counts (B x G)."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=n_boot).astype(np.float64)


def _interval(samples: np.ndarray) -> list[float | None]:
    ok = samples[np.isfinite(samples)]
    if len(ok) < 0.5 * len(samples) or len(ok) == 0:
        return [None, None]
    return [float(np.percentile(ok, 2.5)), float(np.percentile(ok, 97.5))]


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def _match(walk: _Walk, s: np.ndarray, target_ms: float) -> float:
    """The threshold whose target ms (total over the walk) is closest to `target_ms`: bisection
    over the candidate's sorted distinct scores (cost grows with the threshold)."""
    cands = np.append(np.unique(s[walk.scored & np.isfinite(s)]), np.inf)
    memo: dict[int, float] = {}

    def ms(k: int) -> float:
        if k not in memo:
            memo[k] = float(walk.replay(s, cands[k])[1].sum())
        return memo[k]

    lo, hi = 0, len(cands) - 1
    if ms(lo) >= target_ms:
        return float(cands[lo])
    if ms(hi) <= target_ms:
        return float(cands[hi])
    while hi - lo > 1:  # invariant: ms(lo) < target <= ms(hi)
        mid = (lo + hi) // 2
        if ms(mid) >= target_ms:
            hi = mid
        else:
            lo = mid
    return float(cands[lo] if abs(ms(lo) - target_ms) <= abs(ms(hi) - target_ms) else cands[hi])


def compare(scores: Mapping[str, np.ndarray], data: Mapping[str, np.ndarray], test_mask: np.ndarray, *,
            reference: str = REFERENCE, reference_thresholds: Mapping[str, float] | None = None,
            cost: Callable[[float], float] | None = None, cap: int | None = 16, n_boot: int = 1000,
            seed: int = 0) -> dict[str, Any]:
    """False passes at equal target cost, per domain (and all) and reference operating point.

    `scores`: candidate name -> one score per data row (the reference among them). The
    reference at each threshold of `reference_thresholds` fixes a target ms per token on the
    test rows; every other candidate is matched to it, and the reduction
    1 - FP_cand / FP_ref gets a 95% percentile interval from a paired bootstrap over test
    groups (thresholds fixed; both sides' false passes and costs re-summed per resample)."""
    if reference not in scores:
        raise SprinterError(f"the reference candidate {reference!r} has no scores")
    ref_thr = dict(REFERENCE_THRESHOLDS if reference_thresholds is None else reference_thresholds)
    cost = cost or table_cost()
    n_data = len(test_mask)
    out: dict[str, Any] = {}
    for d_i, (dom, m) in enumerate(_domain_masks(data, np.asarray(test_mask, bool)).items()):
        if not m.any():
            continue
        walk = _Walk(data, m, cap, cost)
        ordered = {name: _ordered(s, walk, n_data) for name, s in scores.items()}
        boot = _boot_weights(len(walk.groups), n_boot, seed + 1000 * d_i)
        dom_out: dict[str, Any] = {}
        for op, thr in ref_thr.items():
            ref = walk.totals(ordered[reference], thr)
            ref_fp_g, ref_ms_g = walk.group_sums(ordered[reference], thr)
            ref_fp_b, ref_ms_b = boot @ ref_fp_g, boot @ ref_ms_g
            cands: dict[str, Any] = {}
            for name, s in ordered.items():
                if name == reference:
                    continue
                t = _match(walk, s, ref["target_ms"])
                tot = walk.totals(s, t)
                fp_g, ms_g = walk.group_sums(s, t)
                ref_fp, ref_ms = ref["false_passes"], ref["target_ms"]
                red = 1 - tot["false_passes"] / ref_fp if ref_fp > 0 else float("nan")
                cands[name] = {
                    "threshold": t,
                    "target_ms_per_token": tot["target_ms_per_token"],
                    "target_calls_per_token": tot["target_calls_per_token"],
                    "false_pass_per_token": tot["false_pass_per_token"],
                    "eta_fp": tot["eta_fp"],
                    "flag_rate": tot["flag_rate"],
                    "cost_ratio": tot["target_ms"] / ref_ms if ref_ms > 0 else float("nan"),
                    "cost_ratio_ci": _interval(_ratio(boot @ ms_g, ref_ms_b)),
                    "reduction": red,
                    "reduction_ci": _interval(1 - _ratio(boot @ fp_g, ref_fp_b)),
                }
            # nothing to compare where the reference keeps no token or passes nothing false
            degenerate = ref["kept"] == 0 or ref["false_passes"] <= 0
            dom_out[op] = {"reference": {"threshold": thr, "degenerate": degenerate} | {k: ref[k] for k in (
                "target_ms_per_token", "target_calls_per_token", "false_pass_per_token", "eta_fp",
                "flag_rate", "kept")}, "candidates": cands}
        out[dom] = {"tokens": walk.n, "groups": len(walk.groups), "operating_points": dom_out}
    return out


def auc_by_domain(scores: np.ndarray, data: Mapping[str, np.ndarray], mask: np.ndarray,
                  label: str = "label_greedy") -> dict[str, float]:
    """AUC of the scores on scored rows, per domain and all (context, not the decision)."""
    out = {}
    for dom, m in _domain_masks(data, mask & np.asarray(data["scored"]).astype(bool)).items():
        y = np.asarray(data[label])[m]
        out[dom] = float(roc_auc_score(y, scores[m])) if len(np.unique(y)) == 2 else float("nan")
    return out


def presets_by_domain(scores: np.ndarray, data: Mapping[str, np.ndarray], cal_mask: np.ndarray,
                      targets: Mapping[str, float] | None = None, *, test_mask: np.ndarray | None = None,
                      thresholds: Sequence[float] | None = None, cost: Callable[[float], float] | None = None,
                      cap: int | None = 16, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Per domain: the lowest threshold (of `thresholds`, default the runtime calibration grid)
    whose eta_FP on the calibration rows is <= each target (default `PRESET_MAX_FP`), and, with
    `test_mask`, the eta_FP measured there on the test rows with a bootstrap interval over test
    groups. eta_FP = false passes / sum over scored tokens of (1 - accept_prob), replayed with
    the run cap like `simulate`."""
    targets = dict(PRESET_MAX_FP if targets is None else targets)
    grid = np.asarray(DEFAULT_THRESHOLDS if thresholds is None else thresholds, np.float64)
    cost = cost or table_cost()
    n_data = len(cal_mask)
    test_doms = _domain_masks(data, np.asarray(test_mask, bool)) if test_mask is not None else {}
    out: dict[str, Any] = {}
    for d_i, (dom, m) in enumerate(_domain_masks(data, np.asarray(cal_mask, bool)).items()):
        if not m.any():
            continue
        wc = _Walk(data, m, cap, cost)
        sc = _ordered(scores, wc, n_data)
        etas = np.array([wc.totals(sc, t)["eta_fp"] for t in grid])
        wt = _Walk(data, test_doms[dom], cap, cost) if dom in test_doms and test_doms[dom].any() else None
        st = _ordered(scores, wt, n_data) if wt is not None else None
        boot = _boot_weights(len(wt.groups), n_boot, seed + 1000 * d_i) if wt is not None else None
        den_g = (np.bincount(wt.group, weights=wt.miss * wt.scored, minlength=len(wt.groups))
                 if wt is not None else None)  # per group: sum over scored tokens of 1 - a
        dom_out = {}
        for preset, target in targets.items():
            ok = np.flatnonzero(etas <= target + 1e-12)
            row: dict[str, Any] = {"target": float(target), "threshold": None, "eta_fp_calib": None}
            if len(ok):
                i = int(ok[0])
                row |= {"threshold": float(grid[i]), "eta_fp_calib": float(etas[i])}
                if wt is not None and boot is not None and st is not None and den_g is not None:
                    tot = wt.totals(st, grid[i])
                    fp_g, _ = wt.group_sums(st, grid[i])
                    row |= {"eta_fp_test": tot["eta_fp"],
                            "eta_fp_test_ci": _interval(_ratio(boot @ fp_g, boot @ den_g)),
                            "target_ms_per_token_test": tot["target_ms_per_token"],
                            "flag_rate_test": tot["flag_rate"]}
            dom_out[preset] = row
        out[dom] = dom_out
    return out


# --------------------------------------------------------------------------- the study


@dataclass(frozen=True)
class StudyConfig:
    seed: int = 0
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)
    cap: int | None = 16
    cost: Callable[[float], float] | None = None  # None: `table_cost()` (DEFAULT_COST_MS)
    reference_thresholds: dict[str, float] = field(default_factory=lambda: dict(REFERENCE_THRESHOLDS))
    preset_targets: dict[str, float] | None = None  # None: PRESET_MAX_FP
    n_boot: int = 1000
    candidates: tuple[str | StudyCandidate, ...] | None = None  # None: all of CANDIDATES
    time_budget_s: float | None = None  # later candidates are skipped once it is spent
    target_reduction: float = 0.20  # "meets target": point reduction at least this everywhere
    n_threads: int | None = None  # BLAS/OpenMP threads (None: library default)
    timing_rows: int = 2000  # test rows timed for the per-row scoring cost


def _split_summary(data: Mapping[str, np.ndarray], masks: Sequence[np.ndarray]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part, m in zip(("train", "calib", "test"), masks, strict=True):
        out[part] = {dom: {"groups": int(len(np.unique(data["group"][dm]))),
                           "prompts": int(len(np.unique(data["prompt_index"][dm]))),
                           "tokens": int(dm.sum())}
                     for dom, dm in _domain_masks(data, m).items()}
    return out


def _score_timing(est: Any, x: np.ndarray) -> dict[str, float]:
    if len(x) == 0:
        return {"batch_us_per_row": float("nan"), "single_row_us": float("nan")}
    t0 = time.perf_counter()
    est.predict_proba(x)
    batch = (time.perf_counter() - t0) / len(x) * 1e6
    single = []
    for i in range(min(20, len(x))):  # one row per call, as at run time (sklearn overhead included)
        t0 = time.perf_counter()
        est.predict_proba(x[i : i + 1])
        single.append(time.perf_counter() - t0)
    return {"batch_us_per_row": batch, "single_row_us": float(np.median(single)) * 1e6}


def _decide(comparison: Mapping[str, Any], names: Sequence[str], target: float,
            hidden: Sequence[str] = ()) -> dict[str, Any]:
    """Per regime, and over all regimes: a candidate wins where the reduction's CI lower bound
    is > 0 at every reference operating point in every domain (not only pooled); it meets the
    target where, in addition, every point reduction is >= `target`. Operating points where the
    reference keeps nothing or passes nothing false (`degenerate`) decide nothing and are
    listed instead. `best`: of those meeting
    the target in every regime (else winning), the largest worst-case point reduction;
    `best_hidden`: the same ranking among the `hidden` candidates, win or not (for export)."""
    per: dict[str, Any] = {}
    for regime, by_dom in comparison.items():
        wins, meets, worst = [], [], {}
        degenerate = [f"{dom}/{op_name}" for dom, d in by_dom.items() if dom != "all"
                      for op_name, op in d["operating_points"].items() if op["reference"]["degenerate"]]
        for name in names:
            cells = [op["candidates"][name] for dom, d in by_dom.items() if dom != "all"
                     for op in d["operating_points"].values()
                     if name in op["candidates"] and not op["reference"]["degenerate"]]
            if not cells:
                continue
            lows = [c["reduction_ci"][0] for c in cells]
            points = [c["reduction"] for c in cells]
            won = all(lo is not None and lo > 0 for lo in lows)
            worst[name] = min((p for p in points if not math.isnan(p)), default=float("nan"))
            if won:
                wins.append(name)
                if all(not math.isnan(p) and p >= target for p in points):
                    meets.append(name)
        per[regime] = {"wins": wins, "meets_target": meets, "worst_point_reduction": worst,
                       "degenerate_points": degenerate}
    regimes = list(per)
    every = [n for n in names if regimes and all(n in per[r]["wins"] for r in regimes)]
    every_meet = [n for n in names if regimes and all(n in per[r]["meets_target"] for r in regimes)]

    def worst_all(n: str) -> float:
        vals = [per[r]["worst_point_reduction"].get(n, float("nan")) for r in regimes]
        return min(vals) if vals and not any(math.isnan(v) for v in vals) else float("-inf")

    pool = every_meet or every
    return {"by_regime": per, "wins_all_regimes": every, "meets_target_all_regimes": every_meet,
            "best": max(pool, key=worst_all) if pool else None,
            "best_hidden": max(hidden, key=worst_all) if hidden else None}


def _clean(obj: Any) -> Any:
    """JSON-safe: numpy scalars to Python, NaN/inf to None."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def run_study(data: Mapping[str, np.ndarray], cfg: StudyConfig | None = None) -> dict[str, Any]:
    """Split, fit every candidate per temperature regime on the train groups, compare at
    matched target cost on the test groups, derive presets on the calibration groups and check
    them on the test groups. Returns a JSON-serialisable report (see `report_markdown`)."""
    cfg = cfg or StudyConfig()
    if cfg.n_threads is not None:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(cfg.n_threads):
            return _run(data, cfg)
    return _run(data, cfg)


def _skip_reason(cand: StudyCandidate, data: Mapping[str, np.ndarray], cfg: StudyConfig,
                 elapsed_s: float) -> str | None:
    """Why `cand` cannot run now (None: it can): the time budget is spent (never for the
    reference), or the data lacks a column it reads."""
    if cand.name != REFERENCE and cfg.time_budget_s is not None and elapsed_s > cfg.time_budget_s:
        return "time budget"
    absent = [name for name in cand.layout if name not in data]
    return f"no {', '.join(absent)} in the data" if absent else None


def _run(data: Mapping[str, np.ndarray], cfg: StudyConfig) -> dict[str, Any]:
    t_start = time.monotonic()
    cost = cfg.cost or table_cost()
    cands = [candidate(c) for c in (cfg.candidates or tuple(c.name for c in CANDIDATES))]
    if REFERENCE not in [c.name for c in cands]:
        cands.insert(0, candidate(REFERENCE))
    cands.sort(key=lambda c: c.name != REFERENCE)  # the reference first: it is never skipped
    masks = split_by_group(data["group"], data["domain"], cfg.fractions, cfg.seed)
    train, calib, test = masks
    regimes = [r for r in REGIMES if _regime_mask(data, r).any()]
    n = len(data["group"])
    report: dict[str, Any] = {
        "config": {"seed": cfg.seed, "fractions": list(cfg.fractions), "cap": cfg.cap, "n_boot": cfg.n_boot,
                   "reference": REFERENCE, "reference_thresholds": dict(cfg.reference_thresholds),
                   "preset_targets": dict(cfg.preset_targets or PRESET_MAX_FP),
                   "target_reduction": cfg.target_reduction,
                   "cost_ms": {k: cost(k) for k in (1, 2, 4, 8, 16, 24)},
                   "hidden_width": int(np.asarray(data["hidden"]).shape[1]) if "hidden" in data else 0},
        "split": _split_summary(data, masks),
        "regimes": {r: {"tokens": int(_regime_mask(data, r).sum()), "auc_label": AUC_LABEL[r]}
                    for r in regimes},
        "candidates": {}, "comparison": {}, "presets": {}, "skipped_why": {},
    }
    scores: dict[str, dict[str, np.ndarray]] = {r: {} for r in regimes}
    for cand in cands:
        why = _skip_reason(cand, data, cfg, time.monotonic() - t_start)
        if why:
            log.warning("candidate %s skipped: %s", cand.name, why)
            report["skipped_why"][cand.name] = why
            continue
        entry: dict[str, Any] = {"layout": list(cand.layout), "about": cand.about,
                                 "exportable": cand.exportable, "regimes": {}}
        for regime in regimes:
            rm = _regime_mask(data, regime)
            tr_rows = np.flatnonzero(train & rm)
            ev_rows = np.flatnonzero((calib | test) & rm)
            log.info("fitting %s (%s): %d train rows", cand.name, regime, len(tr_rows))
            t0 = time.monotonic()
            est, info = _fit(cand, data, tr_rows, regime, cfg.seed)
            fit_s = time.monotonic() - t0
            x_ev = _matrix(data, cand.layout, ev_rows)
            s = np.full(n, np.nan)
            s[ev_rows] = est.predict_proba(x_ev)[:, 1]
            test_pos = np.flatnonzero(test[ev_rows])[: cfg.timing_rows]
            timing = _score_timing(est, x_ev[test_pos])
            scores[regime][cand.name] = s
            entry["regimes"][regime] = info | {
                "fit_seconds": fit_s, "score_us": timing,
                "auc": auc_by_domain(s, data, test & rm, AUC_LABEL[regime])}
            report["presets"].setdefault(regime, {})[cand.name] = presets_by_domain(
                s, data, calib & rm, cfg.preset_targets, test_mask=test & rm, cost=cost, cap=cfg.cap,
                n_boot=cfg.n_boot, seed=cfg.seed)
            log.info("%s (%s): fit %.1f s, test AUC %s", cand.name, regime, fit_s,
                     {k: round(v, 3) for k, v in entry["regimes"][regime]["auc"].items()})
        report["candidates"][cand.name] = entry
    for regime in regimes:
        log.info("comparing at matched target cost (%s)", regime)
        report["comparison"][regime] = compare(
            scores[regime], data, test & _regime_mask(data, regime), reference=REFERENCE,
            reference_thresholds=cfg.reference_thresholds, cost=cost, cap=cfg.cap, n_boot=cfg.n_boot,
            seed=cfg.seed)
    report["skipped"] = list(report["skipped_why"])  # in the order they were skipped
    others = [c for c in report["candidates"] if c != REFERENCE]
    hidden = [c for c in others if "hidden" in report["candidates"][c]["layout"]
              and report["candidates"][c]["exportable"]]
    report["decision"] = _decide(report["comparison"], others, cfg.target_reduction, hidden)
    report["seconds"] = time.monotonic() - t_start
    log.info("study done in %.1f s: winners %s", report["seconds"], report["decision"]["wins_all_regimes"])
    return _clean(report)


# --------------------------------------------------------------------------- markdown


def _f(v: float | None, spec: str = ".3f") -> str:
    return "n/a" if v is None else format(v, spec)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:+.0f}%"


def report_markdown(report: Mapping[str, Any]) -> str:
    """Compact tables: split, candidates, matched-cost comparison, presets, decision."""
    lines = ["## Split (groups / prompts / tokens)", "", "| part | domain | groups | prompts | tokens |",
             "|---|---|---|---|---|"]
    for part, by_dom in report["split"].items():
        for dom, c in by_dom.items():
            lines.append(f"| {part} | {dom} | {c['groups']} | {c['prompts']} | {c['tokens']} |")
    lines += ["", "## Candidates", "",
              "| candidate | reads | regime | fit s | params | us/row (batch, single) | test AUC (all) |",
              "|---|---|---|---|---|---|---|"]
    for name, c in report["candidates"].items():
        for regime, r in c["regimes"].items():
            us = r["score_us"]
            lines.append(f"| {name} | {c['about']} | {regime} | {r['fit_seconds']:.1f} | "
                         f"{r['params'] or '-'} | {_f(us['batch_us_per_row'], '.1f')}, "
                         f"{_f(us['single_row_us'], '.0f')} | {_f(r['auc'].get('all'))} |")
    if report.get("skipped"):
        why = report.get("skipped_why", {})
        lines.append("\nSkipped: " + ", ".join(f"{n} ({why.get(n, 'time budget')})"
                                               for n in report["skipped"]))
    lines += ["", "## False passes at matched target cost (test groups)", "",
              "Reduction = 1 - FP_cand / FP_confidence, 95% CI over test groups; cost = candidate / "
              "reference target ms; * = the reference keeps nothing or passes nothing false there.", ""]
    for regime, by_dom in report["comparison"].items():
        ops = list(next(iter(by_dom.values()))["operating_points"]) if by_dom else []
        lines += [f"### {regime}", "", "| candidate | domain | " + " | ".join(ops) + " |",
                  "|---|---|" + "---|" * len(ops)]
        refs = []
        for dom, d in by_dom.items():
            refs.append(f"| *{REFERENCE}* (ms/tok, FP/tok) | {dom} | " + " | ".join(
                f"{_f(o['reference']['target_ms_per_token'], '.1f')}, "
                f"{_f(o['reference']['false_pass_per_token'], '.4f')}"
                + ("*" if o["reference"]["degenerate"] else "")
                for o in d["operating_points"].values()) + " |")
        lines += refs
        names = list(dict.fromkeys(n for d in by_dom.values() for o in d["operating_points"].values()
                                   for n in o["candidates"]))
        for name in names:
            for dom, d in by_dom.items():
                cells = []
                for o in d["operating_points"].values():
                    c = o["candidates"].get(name)
                    if c is None:
                        cells.append("-")
                        continue
                    lo, hi = c["reduction_ci"]
                    cells.append(f"{_pct(c['reduction'])} [{_pct(lo)}, {_pct(hi)}] "
                                 f"(cost {_f(c['cost_ratio'], '.2f')})")
                lines.append(f"| {name} | {dom} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Presets (calibration groups) and their check (test groups)", "",
              "| regime | candidate | domain | preset | max eta_FP | threshold | eta_FP calib "
              "| eta_FP test [95% CI] |", "|---|---|---|---|---|---|---|---|"]
    for regime, by_cand in report["presets"].items():
        for name, by_dom in by_cand.items():
            for dom, by_preset in by_dom.items():
                for preset, p in by_preset.items():
                    ci = p.get("eta_fp_test_ci") or [None, None]
                    lines.append(f"| {regime} | {name} | {dom} | {preset} | {p['target']:.2f} | "
                                 f"{_f(p['threshold'])} | {_f(p['eta_fp_calib'])} | "
                                 f"{_f(p.get('eta_fp_test'))} [{_f(ci[0])}, {_f(ci[1])}] |")
    dec = report["decision"]
    lines += ["", "## Decision", ""]
    for regime, d in dec["by_regime"].items():
        lines.append(f"- {regime}: wins over {REFERENCE}: {', '.join(d['wins']) or 'none'}; "
                     f"meets the target reduction: {', '.join(d['meets_target']) or 'none'}")
    lines.append(f"- every regime: wins {', '.join(dec['wins_all_regimes']) or 'none'}; meets target "
                 f"{', '.join(dec['meets_target_all_regimes']) or 'none'}; best {dec['best'] or 'none'}; "
                 f"best hidden-state model {dec.get('best_hidden') or 'none'}")
    lines.append(f"\n_{report['seconds']:.0f} s_")
    return "\n".join(lines)
