"""Per-domain presets: the threshold meeting each false-pass target on the calibration
groups, checked on the test groups with a bootstrap interval."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ...verifiers.calibration import DEFAULT_THRESHOLDS, PRESET_MAX_FP
from .bootstrap import _boot_weights, _interval, _ratio
from .data import _domain_masks
from .replay import _ordered, _Walk, table_cost


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
