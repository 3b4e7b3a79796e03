"""The report: the JSON-safe form of the study's result and its markdown tables."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .candidates import REFERENCE


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
