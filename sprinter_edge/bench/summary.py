"""One row per method: speed, work, time split, memory and quality over all prompts."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..decoding.base import Stats
from .costmodel import CostModel
from .runner import MethodSpec, RunRecord

_SUMMED = [f.name for f in dataclasses.fields(Stats) if f.type in ("int", "float")]


def sum_stats(items: Sequence[Stats]) -> Stats:
    total = Stats(method=items[0].method if items else "")
    for st in items:
        for name in _SUMMED:
            setattr(total, name, getattr(total, name) + getattr(st, name))
    return total


def _mean(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def summarize(records: Sequence[RunRecord], specs: Sequence[MethodSpec],
              cost: CostModel | None = None) -> list[dict]:
    rows = []
    for spec in specs:
        recs = [r for r in records if r.method == spec.label]
        if not recs:
            continue
        dec = sum(r.decode_seconds for r in recs)
        timed = sum(r.tokens_per_second * r.decode_seconds for r in recs)
        new = sum(r.new_tokens for r in recs)
        row: dict = {"method": spec.label, "kind": spec.kind, "threshold": spec.threshold,
                     "prompts": len(recs), "new_tokens": new,
                     "tokens_per_second": timed / dec if dec > 0 else 0.0,
                     "peak_rss_mib": max(r.peak_rss_mib for r in recs)}
        stats = [r._stats for r in recs if r._stats is not None]
        if stats:
            st = sum_stats(stats)
            d = max(st.decode_seconds, 1e-9)
            row.update(
                target_calls_per_token=st.target_calls_per_token, kept=st.kept,
                kept_fraction=st.kept / max(1, st.new_tokens),
                mean_run_length=st.mean_run_length if spec.engine_method == "sprinter" else None,
                time_split={"draft": st.draft_seconds / d, "target": st.target_seconds / d,
                            "verifier": st.verifier_seconds / d, "overhead": st.overhead_seconds / d},
            )
            if cost is not None:
                row["predicted_tps"] = cost.predict_tps(st)
                row["predicted_ratio_flat"] = cost.predict_tps(st, flat=True) / cost.ar_tps()
        he = [r.humaneval for r in recs if r.humaneval is not None]
        row.update(
            pass_at_1=sum(h["passed"] for h in he) / len(he) if he else None,
            humaneval_n=len(he),
            rouge_l=_mean([r.rouge_l for r in recs]),
            exact_match=_mean([float(r.exact_match) for r in recs if r.exact_match is not None]),
            prefix_agreement=_mean([r.prefix_agreement for r in recs]),
            mean_logprob=_weighted([(r.mean_logprob, r.new_tokens) for r in recs]),
            greedy_agreement=_weighted([(r.greedy_agreement, r.new_tokens) for r in recs]),
        )
        fps = [r.false_pass for r in recs if r.false_pass is not None]
        if fps:
            fp = sum(f["false_pass"] for f in fps)
            rej = sum(f["rejected"] for f in fps)
            eta = fp / (fp + rej) if fp + rej else 0.0
            mean_tv = _mean([f["mean_tv"] for f in fps]) or 0.0
            row.update(eta_fp=eta, false_passes=fp, mean_tv=mean_tv, tv_bound=eta * mean_tv)
        rows.append(row)
    ar = next((r for r in rows if r["kind"] == "ar"), None)
    for r in rows:
        r["ratio_vs_ar"] = r["tokens_per_second"] / ar["tokens_per_second"] \
            if ar and ar["tokens_per_second"] else None
    return rows


def _weighted(pairs: Sequence[tuple[float | None, int]]) -> float | None:
    num = sum(v * n for v, n in pairs if v is not None)
    den = sum(n for v, n in pairs if v is not None)
    return num / den if den else None
