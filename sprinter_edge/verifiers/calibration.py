"""Turning an operating point (a preset or a maximum false-pass rate) into a threshold, and
what a threshold costs in drift from the target.

A calibration table is measured on held-out prompts: for each threshold t, the fraction of
tokens flagged (score < t) and eta_FP, the fraction of tokens the target would NOT have
produced (greedy label: draft argmax != target argmax) that the verifier passes
(score >= t). Presets and `--max-fp-rate` pick thresholds by eta_FP.

eta_FP is not the drift. The verifiers here score the context (the draft's max probability or
hidden state), not the sampled token, so at each context SPRINTER samples from
pass * q + (1 - pass) * p (p, q: the target's and the draft's distributions after the user's
sampling transform) and its distance from the target there is 1[score >= t] * TV(p, q). The
table therefore also holds, where the data has what they need, the mean drift per token:

* `drift_greedy`: mean of 1[score >= t] * 1[argmax differs], the drift under greedy
  decoding (one-hot p and q); with the greedy label it equals eta_FP * P(argmax differs) on
  these tokens, and only there is eta_FP a drift figure;
* `drift_t1`: mean of 1[score >= t] * TV(p, q) with p, q at temperature 1 (no top-k/top-p).

At other settings the drift differs (`sprinter-edge bench` measures it at the settings used);
at temperature > 0 a verifier with eta_FP = 0 still drifts. Tables written before these
columns existed load with them missing (None).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

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
    # mean per token of 1[score >= threshold] * TV(p, q): greedy (TV = 1[argmax differs]) and
    # temperature 1; None when the data (or an older table) lacks what they need
    drift_greedy: float | None = None
    drift_t1: float | None = None


def calibration_table(scores: np.ndarray, labels: np.ndarray,
                      thresholds: Sequence[float] | None = None, *,
                      argmax_differs: np.ndarray | None = None,
                      tv: np.ndarray | None = None) -> list[CalibrationRow]:
    """Rows for each threshold (default: `DEFAULT_THRESHOLDS`).

    `argmax_differs` (per token: the draft's and the target's argmax differ) gives
    `drift_greedy`; `tv` (per token: TV(p, q) at temperature 1) gives `drift_t1`."""
    scores = np.asarray(scores, np.float64)
    labels = np.asarray(labels).astype(bool)
    if thresholds is None:
        thresholds = DEFAULT_THRESHOLDS
    n = len(scores)
    differs = None if argmax_differs is None else np.asarray(argmax_differs).astype(bool)
    tv_ = None if tv is None else np.asarray(tv, np.float64)
    for name, arr in (("argmax_differs", differs), ("tv", tv_)):
        if arr is not None and arr.shape != scores.shape:
            raise ValueError(f"{name} has shape {arr.shape}, scores {scores.shape}")
    n_neg = max(int((~labels).sum()), 1)
    n_pos = max(int(labels.sum()), 1)
    rows = []
    for t in thresholds:
        passed = scores >= t
        rows.append(CalibrationRow(
            threshold=float(t),
            flag_rate=float((~passed).mean()) if n else 0.0,
            eta_fp=float((passed & ~labels).sum() / n_neg),
            false_flag_rate=float((~passed & labels).sum() / n_pos),
            accuracy=float((passed == labels).mean()) if n else 0.0,
            drift_greedy=float((passed & differs).sum() / n) if differs is not None and n else None,
            drift_t1=float(tv_[passed].sum() / n) if tv_ is not None and n else None,
        ))
    return rows


def table_to_json(rows: Sequence[CalibrationRow]) -> list[dict[str, float]]:
    """The table as JSON rows; a column that is None is left out."""
    return [{k: round(v, 6) for k, v in asdict(r).items() if v is not None} for r in rows]


def table_from_json(data: Sequence[dict[str, float]]) -> list[CalibrationRow]:
    """Rows from JSON; tables written before the drift columns existed load without them."""
    try:
        return [CalibrationRow(**{k: float(v) for k, v in row.items()}) for row in data]
    except (TypeError, ValueError) as exc:
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


def with_greedy_drift(rows: Sequence[CalibrationRow]) -> list[CalibrationRow]:
    """Rows of a greedy-label table with `drift_greedy` filled in where it is missing.

    With the greedy label on draft-greedy data, label 0 is "argmax differs", so
    drift_greedy = eta_FP * P(label 0), and P(label 0) follows from any row with
    eta_FP != false-flag rate: accuracy = (1 - ff) - P0 * (eta_FP - ff). For tables written
    before the column existed; exact up to the table's 6-decimal rounding. Only call it for a
    table whose label rule is `greedy`."""
    if not rows or all(r.drift_greedy is not None for r in rows):
        return list(rows)
    ref = max(rows, key=lambda r: abs(r.eta_fp - r.false_flag_rate))
    if abs(ref.eta_fp - ref.false_flag_rate) < 1e-3:
        return list(rows)
    p0 = min(max((1 - ref.false_flag_rate - ref.accuracy) / (ref.eta_fp - ref.false_flag_rate), 0.0), 1.0)
    return [r if r.drift_greedy is not None else replace(r, drift_greedy=r.eta_fp * p0) for r in rows]


def drift_line(row: CalibrationRow, tv_pq: float | None = None) -> str:
    """One line on what a table row means for the output's distance from the target: the mean
    per token of 1[pass] * TV(p, q) on the held-out tokens, where the table has it."""
    head = (f"threshold {row.threshold:g}: drift from the target per token, mean of 1[pass] * TV(p, q) "
            "on held-out prompts")
    parts = []
    if row.drift_greedy is not None:
        parts.append(f"greedy {row.drift_greedy:.4f} (TV = 1[argmax differs]; with the greedy label "
                     "this is eta_FP * P(argmax differs))")
    if row.drift_t1 is not None:
        parts.append(f"temperature 1 {row.drift_t1:.4f}")
    elif tv_pq is not None:
        parts.append("temperature 1 not in this table, at most the draft alone's mean "
                     f"TV(p, q) = {tv_pq:.3f}")
    if row.drift_greedy is None and row.drift_t1 is None:
        parts.insert(0, "not in this table (made before the drift columns: retrain with "
                        "`sprinter-edge verifier train`)")
    return (f"{head}: " + "; ".join(parts) + ". Other sampling settings: measure with "
            "`sprinter-edge bench`; at temperature > 0, eta_FP alone does not bound the drift.")
