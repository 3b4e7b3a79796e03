"""The study end to end: split, fit every candidate per temperature regime, compare at
matched target cost, derive and check presets, decide, and assemble the report."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...verifiers.calibration import PRESET_MAX_FP
from .candidates import CANDIDATES, REFERENCE, StudyCandidate, candidate
from .comparison import REFERENCE_THRESHOLDS, auc_by_domain, compare
from .data import AUC_LABEL, REGIMES, _domain_masks, _regime_mask, matrix_of, split_by_group
from .decision import _decide
from .fitting import _fit
from .presets import presets_by_domain
from .replay import table_cost
from .report import _clean

log = logging.getLogger(__name__)


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
            x_ev = matrix_of(data, cand.layout, ev_rows)
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
