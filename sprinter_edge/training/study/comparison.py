"""False passes at equal target cost: the reference at its operating points fixes a target
cost, every other candidate is matched to it on the same test rows, and the reduction in
false passes gets a paired bootstrap interval over test groups. AUC is reported as context."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from sklearn.metrics import roc_auc_score

from ...errors import SprinterError
from .bootstrap import _boot_weights, _interval, _ratio
from .candidates import REFERENCE
from .data import _domain_masks
from .replay import _match, _ordered, _Walk, table_cost

# Thresholds on the confidence rule's calibrated score that define the reference operating points.
REFERENCE_THRESHOLDS = {"quality": 0.90, "balanced": 0.74, "fast": 0.46}


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
