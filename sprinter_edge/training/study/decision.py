"""The study's verdict from the matched-cost comparison: which candidates beat the reference
everywhere, which also meet the target reduction, and the best of them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


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
