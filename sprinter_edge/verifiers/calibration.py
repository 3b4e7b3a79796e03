"""Turning an operating point (a preset or a maximum false-pass rate) into a threshold.

A calibration table is measured on held-out prompts: for each threshold t, the fraction of
tokens flagged (score < t) and eta_FP, the fraction of tokens the target would NOT have
produced that the verifier passes (score >= t). SPRINTER's output then satisfies
TV(p, p_sprinter) = eta_FP * TV(p, q) (arXiv 2502.04557), so a bound on eta_FP bounds the
drift from the target's distribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import VerifierError

# Presets as maximum false-pass rates on held-out prompts; their names, in order of speed.
PRESET_MAX_FP = {"quality": 0.10, "balanced": 0.25, "fast": 0.50}
PRESETS = tuple(PRESET_MAX_FP)


# 0.02 .. 0.90 in steps of 0.02, then 0.905 .. 1.0 in steps of 0.005: calibrated accept
# probabilities crowd near 1, where the operating points are.
DEFAULT_THRESHOLDS = tuple([round(0.02 * i, 3) for i in range(1, 46)]
                           + [round(0.9 + 0.005 * i, 3) for i in range(1, 21)])


@dataclass(frozen=True)
class CalibrationRow:
    threshold: float
    flag_rate: float  # fraction of tokens sent to the target (score < threshold)
    eta_fp: float  # fraction of label-0 tokens passed (score >= threshold)
    false_flag_rate: float  # fraction of label-1 tokens flagged
    accuracy: float


def calibration_table(scores: np.ndarray, labels: np.ndarray,
                      thresholds: Sequence[float] | None = None) -> list[CalibrationRow]:
    """Rows for each threshold (default: `DEFAULT_THRESHOLDS`)."""
    scores = np.asarray(scores, np.float64)
    labels = np.asarray(labels).astype(bool)
    if thresholds is None:
        thresholds = DEFAULT_THRESHOLDS
    n_neg = max(int((~labels).sum()), 1)
    n_pos = max(int(labels.sum()), 1)
    rows = []
    for t in thresholds:
        passed = scores >= t
        rows.append(CalibrationRow(
            threshold=float(t),
            flag_rate=float((~passed).mean()) if len(scores) else 0.0,
            eta_fp=float((passed & ~labels).sum() / n_neg),
            false_flag_rate=float((~passed & labels).sum() / n_pos),
            accuracy=float((passed == labels).mean()) if len(scores) else 0.0,
        ))
    return rows


def table_to_json(rows: Sequence[CalibrationRow]) -> list[dict[str, float]]:
    return [{k: round(v, 6) for k, v in asdict(r).items()} for r in rows]


def table_from_json(data: Sequence[dict[str, float]]) -> list[CalibrationRow]:
    try:
        return [CalibrationRow(**{k: float(v) for k, v in row.items()}) for row in data]
    except TypeError as exc:
        raise VerifierError(f"malformed calibration table: {exc}") from exc


def threshold_for_max_fp(rows: Sequence[CalibrationRow], max_fp: float) -> float:
    """The lowest threshold (fewest target calls) whose held-out eta_FP <= max_fp."""
    if not 0 <= max_fp <= 1:
        raise VerifierError("--max-fp-rate must be in [0, 1]")
    if not rows:
        raise VerifierError("this verifier has no calibration table")
    ok = [r for r in rows if r.eta_fp <= max_fp + 1e-12]
    if not ok:
        best = max(rows, key=lambda r: r.threshold)
        raise VerifierError(
            f"no calibrated threshold reaches eta_FP <= {max_fp:g} (the strictest, "
            f"{best.threshold:g}, gives {best.eta_fp:.3f})")
    return min(ok, key=lambda r: r.threshold).threshold


def row_at(rows: Sequence[CalibrationRow], threshold: float) -> CalibrationRow:
    """The table row closest to a threshold."""
    return min(rows, key=lambda r: abs(r.threshold - threshold))


def presets_from_table(rows: Sequence[CalibrationRow]) -> dict[str, float]:
    return {name: threshold_for_max_fp(rows, fp) for name, fp in PRESET_MAX_FP.items()}


def tv_bound_line(eta_fp: float, tv_pq: float | None) -> str:
    if tv_pq is None:
        return f"TV(p, p_sprinter) <= eta_FP * TV(p, q) = {eta_fp:.3f} * TV(p, q)"
    return (f"TV(p, p_sprinter) <= eta_FP * TV(p, q) = {eta_fp:.3f} * {tv_pq:.3f} = "
            f"{eta_fp * tv_pq:.4f}  (TV(p, q): mean per-token estimate on held-out prompts)")
