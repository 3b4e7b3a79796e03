"""Training a verifier: split by prompt, fit the candidates, select, compare with the
confidence rule, calibrate on held-out prompts.

Split: 60% of prompts train, 20% validation (model selection), 20% test (the reported
numbers and the calibration table); the selected model is refit on train + validation.
A learned model is shipped only when, on the validation prompts, it matches or beats the
draft's max probability (the confidence rule) at every matched flag rate; otherwise the
shipped model is the calibrated confidence rule itself (`logreg-maxprob`).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.pipeline import Pipeline

from ..errors import SprinterError
from ..verifiers.calibration import CalibrationRow, calibration_table, presets_from_table
from .features import feature_matrix, labels, split_by_prompt
from .metrics import MATCHED_FLAG_RATES, matched_curve, summary
from .models import CANDIDATES, Candidate, candidate

log = logging.getLogger(__name__)

FALLBACK = "logreg-maxprob"
MATCH_TOLERANCE = 0.0  # a learned model must never be worse than the confidence rule at a matched flag rate


@dataclass(frozen=True)
class TrainConfig:
    label: str = "greedy"
    seed: int = 0
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)
    candidates: tuple[str, ...] | None = None  # None: all
    time_budget_s: float | None = None


@dataclass
class TrainResult:
    chosen: Candidate
    pipeline: Pipeline
    label: str
    test_x: np.ndarray
    test_scores: np.ndarray
    table: list[CalibrationRow]
    presets: dict[str, float]
    default_threshold: float
    tv_pq: float | None  # mean TV(p, q) at temperature 1 on the test prompts (None: not collected)
    report: dict[str, Any] = field(default_factory=dict)


def _scores(pipe: Pipeline, x: np.ndarray) -> np.ndarray:
    return pipe.predict_proba(x)[:, 1]


def beats_confidence(curve: list[float], conf_curve: list[float], tol: float = MATCH_TOLERANCE) -> bool:
    return all(c <= b + tol for c, b in zip(curve, conf_curve, strict=True))


def train(data: dict[str, np.ndarray], cfg: TrainConfig | None = None) -> TrainResult:
    cfg = cfg or TrainConfig()
    t0 = time.monotonic()
    y = labels(data, cfg.label)
    n_embd = int(data["hidden"].shape[1])
    tr, va, te = split_by_prompt(data["prompt_index"], cfg.fractions, cfg.seed)
    for name, m in (("train", tr), ("validation", va), ("test", te)):
        if len(np.unique(y[m])) < 2:
            raise SprinterError(f"the {name} prompts hold only one label class: collect more data")
    conf = data["max_prob"].astype(np.float64)
    conf_val = matched_curve(conf[va], y[va])
    names = cfg.candidates or tuple(c.name for c in CANDIDATES)
    rows: dict[str, dict[str, Any]] = {"confidence (draft max prob)": {
        "validation": summary(conf[va], y[va]), "test": summary(conf[te], y[te]), "layout": ["max_prob"]}}
    fitted: dict[str, tuple[float, bool]] = {}
    for name in names:
        if cfg.time_budget_s is not None and time.monotonic() - t0 > cfg.time_budget_s:
            log.warning("time budget reached: candidate %s and later ones skipped", name)
            break
        c = candidate(name)
        x = feature_matrix(data, c.layout)
        t1 = time.monotonic()
        pipe = c.build(n_embd).fit(x[tr], y[tr])
        s_va, s_te = _scores(pipe, x[va]), _scores(pipe, x[te])
        curve = matched_curve(s_va, y[va])
        ok = beats_confidence(curve, conf_val)
        rows[name] = {"validation": summary(s_va, y[va]), "test": summary(s_te, y[te]),
                      "layout": list(c.layout), "about": c.about, "fit_seconds": time.monotonic() - t1,
                      "matches_confidence_on_validation": ok}
        fitted[name] = (float(np.mean(curve)), ok)
        log.info("%s: validation AUC %.3f, mean matched eta_FP %.3f (%s)", name,
                 rows[name]["validation"]["auc"], np.mean(curve), "ok" if ok else "worse than confidence")
    eligible = {n: v for n, v in fitted.items() if v[1] and n != FALLBACK}
    if eligible:
        best = min(eligible, key=lambda n: (eligible[n][0], -rows[n]["validation"]["auc"]))
        # a learned model must also do better than the calibrated confidence rule on average
        if FALLBACK in fitted and fitted[best][0] >= fitted[FALLBACK][0]:
            best = FALLBACK
    else:
        best = FALLBACK
    chosen = candidate(best)
    x = feature_matrix(data, chosen.layout)
    trva = tr | va
    pipe = chosen.build(n_embd).fit(x[trva], y[trva])
    s_te = _scores(pipe, x[te])
    # the collected token is the draft's argmax, so label_greedy == 0 <=> the two models' argmax differ
    tv_te = data["tv"][te] if "tv" in data else None
    table = calibration_table(s_te, y[te], argmax_differs=data["label_greedy"][te] == 0, tv=tv_te)
    presets = presets_from_table(table)
    tv = float(np.mean(tv_te)) if tv_te is not None and len(tv_te) else None
    shipped = summary(s_te, y[te])
    report = {
        "label": cfg.label,
        "split": {"prompts": {k: int(len(np.unique(data["prompt_index"][m])))
                              for k, m in (("train", tr), ("validation", va), ("test", te))},
                  "tokens": {"train": int(tr.sum()), "validation": int(va.sum()), "test": int(te.sum())}},
        "candidates": rows,
        "chosen": best,
        "shipped_test": shipped,
        "confidence_test": rows["confidence (draft max prob)"]["test"],
        "matched_flag_rates": list(MATCHED_FLAG_RATES),
        "tv_pq_test_mean": tv,
        "seconds": time.monotonic() - t0,
    }
    log.info("chosen: %s (test AUC %.3f vs confidence %.3f)", best, shipped["auc"],
             report["confidence_test"]["auc"])
    return TrainResult(chosen, pipe, cfg.label, x[te], s_te, table, presets, presets["balanced"], tv, report)


def fmt(v: float) -> str:
    return "n/a" if isinstance(v, float) and math.isnan(v) else f"{v:.3f}"


def report_markdown(report: dict[str, Any]) -> str:
    """Held-out comparison tables (test prompts) as markdown."""
    fr = report["matched_flag_rates"]
    head = "| model | layout | val AUC | test AUC | test acc@0.5 | " + " | ".join(
        f"eta_FP @flag {f:.0%}" for f in fr) + " |"
    lines = [head, "|" + "---|" * (5 + len(fr))]
    for name, r in report["candidates"].items():
        t, v = r["test"], r["validation"]
        etas = " | ".join(fmt(x) for x in t["matched_eta_fp"].values())
        lines.append(f"| {name} | {'+'.join(r['layout'])} | {fmt(v['auc'])} | {fmt(t['auc'])} | "
                     f"{fmt(t['accuracy'])} | {etas} |")
    s = report["shipped_test"]
    lines.append(f"| **shipped: {report['chosen']}** (refit on train+val) | | | {fmt(s['auc'])} | "
                 f"{fmt(s['accuracy'])} | " + " | ".join(fmt(x) for x in s["matched_eta_fp"].values()) + " |")
    return "\n".join(lines)


def table_markdown(table: list[CalibrationRow], step: int = 5) -> str:
    """The calibration table: eta_FP (greedy label) and the drift per token
    (mean of 1[pass] * TV(p, q): greedy, and temperature 1 where the data holds TV)."""
    t1 = any(r.drift_t1 is not None for r in table)
    lines = ["| threshold | flag rate | eta_FP | false-flag rate | accuracy | drift/tok greedy"
             + (" | drift/tok T=1 |" if t1 else " |"),
             "|---|---|---|---|---|---|" + ("---|" if t1 else "")]
    for r in table[step - 1 :: step]:
        cells = [f"{r.threshold:.2f}", f"{r.flag_rate:.3f}", f"{r.eta_fp:.3f}", f"{r.false_flag_rate:.3f}",
                 f"{r.accuracy:.3f}", _opt(r.drift_greedy)] + ([_opt(r.drift_t1)] if t1 else [])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _opt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"
