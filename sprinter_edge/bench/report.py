"""The report: everything as JSON, the summary as a Markdown table."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .summary import SummaryRow

COLUMNS = (
    ("method", "method", "{}"),
    ("tokens_per_second", "tok/s", "{:.2f}"),
    ("ttft_seconds", "TTFT s", "{:.2f}"),
    ("e2e_seconds", "end-to-end s", "{:.2f}"),
    ("ratio_vs_ar", "vs ar", "{:.2f}x"),
    ("ratio_vs_plain", "vs own plain", "{:.2f}x"),
    ("of_floor", "of floor", "{:.0%}"),
    ("predicted_tps", "pred tok/s", "{:.2f}"),
    ("predicted_ratio_flat", "flat-cost pred", "{:.2f}x"),
    ("target_calls_per_token", "tgt calls/tok", "{:.3f}"),
    ("draft_accept", "draft acc", "{:.2f}"),
    ("kept", "kept", "{}"),
    ("mean_run_length", "run len", "{:.1f}"),
    ("time_split", "time d/t/v/o %", "split"),
    ("peak_rss_mib", "peak RSS MiB", "{:.0f}"),
    ("pass_at_1", "pass@1", "{:.2f}"),
    ("pass_ci", "pass@1 95% CI", "interval"),
    ("pass_diff", "vs ar, points (95% CI)", "diff"),
    ("edit_pass", "edit pass", "{:.2f}"),
    ("edit_done", "edits done", "count"),
    ("edit_ci", "edit 95% CI", "interval"),
    ("edit_diff", "edit vs ar, points (95% CI)", "diff"),
    ("file_edit_pass", "file edit pass", "{:.2f}"),
    ("file_edit_done", "file edits done", "count"),
    ("file_edit_ci", "file edit 95% CI", "interval"),
    ("file_edit_diff", "file edit vs ar, points (95% CI)", "diff"),
    ("structured_valid", "schema-valid", "{:.2f}"),
    ("structured_done", "valid/tasks", "count"),
    ("structured_length", "cut by length", "{}"),
    ("structured_fenced", "valid in a code block", "{}"),
    ("structured_accuracy", "field accuracy", "{:.2f}"),
    ("forced_share", "grammar-given share", "{:.2f}"),
    ("grammar_ms_per_token", "grammar ms/tok", "{:.2f}"),
    ("rouge_l", "ROUGE-L vs ar", "{:.3f}"),
    ("exact_match", "exact vs ar", "{:.2f}"),
    ("mean_logprob", "tgt logprob/tok", "{:.3f}"),
    ("eta_fp", "eta_FP", "{:.3f}"),
    ("tv_drift", "TV drift/tok", "{:.4f}"),
    ("fp_mass", "FP mass/tok", "{:.4f}"),
    ("eta_fp_x_p_differs", "eta_FP x P(diff), greedy", "{:.4f}"),
)

# columns shown only when some row has this key (the edit tasks are off by default)
_SHOWN_WITH = {f"{p}_{c}": f"{p}_n" for p in ("edit", "file_edit") for c in ("pass", "done", "ci", "diff")}
_SHOWN_WITH.update({k: "structured_n" for k in ("structured_valid", "structured_done", "structured_length",
                                                "structured_fenced", "structured_accuracy", "forced_share",
                                                "grammar_ms_per_token")})

# What the quality columns of SPRINTER rows mean (written under the table).
COLUMN_HELP = (
    "eta_FP: kept draft tokens that are not the target's greedy choice, over those plus the "
    "draft tokens the target replaced (the greedy label, whatever the temperature). "
    "TV drift/tok: mean over generated tokens of 1[kept] * TV(p, q), p and q the target's and the "
    "draft's next-token distributions at the sampling settings of the run (greedy: one-hot argmax, "
    "so TV = 1[argmax differs]), re-scored after the timed decode: the verifier's score does not "
    "depend on the sampled token, so at each context SPRINTER samples from "
    "pass * q + (1 - pass) * p and is 1[pass] * TV(p, q) away from the target. "
    "FP mass/tok: mean of 1[kept] * (1 - min(1, p(x)/q(x))), x the generated token: the SD test's "
    "rejection probability of the tokens kept without it; for any verifier (also one that reads x, "
    "as the hidden-state option and the oracle do) it bounds the drift from the target, and for "
    "one that does not it equals TV drift in expectation: compare verifiers by it at "
    "temperature > 0. "
    "eta_FP x P(diff), greedy: eta_FP times the share of tokens where the two models' argmax "
    "differ; shown for greedy decoding only, where it estimates the same drift (at temperature > 0 "
    "a verifier with eta_FP = 0 still drifts). Per-token raw values: runs[].false_pass.per_token "
    "in bench.json."
)


# the per-workload tables: speed, first token, work and the task-level quality columns
# (a column no row of the group has is left out)
GROUP_COLUMNS = tuple(c for c in COLUMNS if c[0] in (
    "method", "tokens_per_second", "ratio_vs_ar", "ratio_vs_plain", "of_floor", "ttft_seconds", "e2e_seconds",
    "target_calls_per_token", "draft_accept", "pass_at_1", "pass_ci", "pass_diff", "edit_pass",
    "edit_done", "edit_ci", "file_edit_pass", "file_edit_done", "file_edit_ci", "structured_done",
    "structured_length", "structured_accuracy", "forced_share", "rouge_l", "exact_match"))

# the structured-output section: per method, validity, accuracy, speed and what the grammar gave
STRUCTURED_COLUMNS = tuple(c for c in COLUMNS if c[0] in (
    "method", "structured_done", "structured_length", "structured_fenced", "structured_accuracy",
    "tokens_per_second", "ratio_vs_ar", "ttft_seconds", "forced_share", "grammar_ms_per_token"))
STRUCTURED_HELP = (
    "valid/tasks: replies whose whole text is one JSON value the task's schema accepts "
    "(bench/structured.py; a reply cut by --max-tokens is never valid and is counted under cut by "
    "length). valid in a code block: replies that are not bare JSON but whose first code block is "
    "schema-valid (what a free reply usually is). field accuracy: share of the truth fields right "
    "(name, parameter names, defaults, returns_value, raises) on the extraction tasks, read from "
    "the reply's JSON or its code block. grammar-given share: (forced + accepted fast-forward "
    "tokens) / new tokens: tokens the grammar gave without a target step of their own. "
    "grammar ms/tok: the grammar's own time (masks, consuming tokens, fast-forward, rollback) "
    "per new token, inside the decode time. "
    "Rows marked +free decode without the schema; llama-server rows send it as `json_schema`; "
    "llama-cpp-python rows are left out of structured prompts. Why each reply failed: "
    "runs[].structured.why."
)


def _cell(value: object, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "interval":
        lo, hi = value  # type: ignore[misc]
        return f"{lo:.2f}-{hi:.2f}"
    if fmt == "count":
        k, n = value  # type: ignore[misc]
        return f"{k}/{n}"
    if fmt == "diff":
        d, lo, hi = value  # type: ignore[misc]
        return f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
    if fmt == "split":
        s = value  # type: ignore[assignment]
        return "/".join(f"{100 * s[k]:.0f}" for k in ("draft", "target", "verifier", "overhead"))  # type: ignore[index]
    return fmt.format(value)


def _value(row: SummaryRow, key: str) -> object:
    if key in ("pass_diff", "edit_diff", "file_edit_diff"):  # the point difference with its interval
        prefix = key.removesuffix("_diff")
        ci, d = row.get(f"{prefix}_diff_ci"), row.get(f"{prefix}_diff_vs_ar")
        return None if ci is None or d is None else (d, *ci)
    if key in ("edit_done", "file_edit_done", "structured_done"):  # tasks passed / tasks run
        prefix = key.removesuffix("_done")
        k, n = row.get(f"{prefix}_passed"), row.get(f"{prefix}_n")
        return None if k is None or not n else (k, n)
    return row.get(key)


def markdown_table(rows: Sequence[SummaryRow], columns: Sequence[tuple[str, str, str]] = COLUMNS,
                   *, drop_empty: bool = False) -> str:
    columns = [c for c in columns if c[0] not in _SHOWN_WITH or any(r.get(_SHOWN_WITH[c[0]]) for r in rows)]
    if drop_empty:
        columns = [c for c in columns if c[0] == "method" or any(_value(r, c[0]) is not None for r in rows)]
    head = "| " + " | ".join(h for _, h, _ in columns) + " |"
    sep = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(_cell(_value(r, k), f) for k, _, f in columns) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def group_tables(groups: dict[str, list[SummaryRow]]) -> list[str]:
    """One section per workload (bench.md), when the run has more than one."""
    from .summary import group_name

    if len(groups) < 2:
        return []
    lines = ["## by workload", ""]
    for workload, rows in groups.items():
        n = max((r.get("prompts", 0) for r in rows), default=0)
        prompts = f"{n} prompt{'s' if n != 1 else ''}"
        lines += [f"### {group_name(workload)} ({prompts}, workload `{workload}`)", "",
                  markdown_table(rows, GROUP_COLUMNS, drop_empty=True), ""]
    return lines


def _floor_text(rows: Sequence[SummaryRow]) -> str:
    floor = next((r["floor_ratio"] for r in rows if r.get("floor_ratio")), None)
    return f"{floor:.2f}x ar on these replies" if floor else "not priced: no cost table"


def write_report(out: Path, data: dict, rows: Sequence[SummaryRow]) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "bench.json", out / "bench.md"
    json_path.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    lines = ["# sprinter-edge bench", "", f"command: `{data.get('command', '')}`", "",
             f"machine: {data.get('machine', {}).get('description', '')}", "",
             f"decoding: {_decoding(data.get('config', {}))}", "",
             markdown_table(rows), "",
             "time split: share of decode time in draft / target / verifier / other (prefill "
             "excluded). pred tok/s: the cost model from this machine's measured decode costs "
             "and the method's counters; flat-cost pred: an UPPER bound on the speed vs ar, if a "
             "batch of any size cost what one token costs (not a prediction for any machine: "
             "check `sprinter-edge doctor`'s cost table). vs own plain: a peer row against its "
             "own plain decoding (llama-server rows against plain llama-server, llama-cpp-python "
             "rows against llama-cpp). TTFT: time to the first token, the prompt read by every "
             "model the method uses (llama-cpp rows: the client's time to the first streamed token; "
             "llama-server rows: its timings.prompt_ms). end-to-end s: mean seconds from the request "
             "to the last token, the prompt read included. "
             "draft acc: llama-server's draft_n_accepted / draft_n. of floor: vs ar over the "
             "floor's ratio, the floor being every token one row of the cheapest all-rows call at "
             "its depth on this machine's cost table (the most an exact method can reach here; "
             f"{_floor_text(rows)}).",
             "", COLUMN_HELP, "", *group_tables(data.get("groups") or {})]
    if any(r.get("edit_by_kind") for r in rows):
        lines += ["## edit tasks passed, by kind", "",
                  "An edit task passes when the reply's code block parses, makes the requested change "
                  "and passes the problem's tests (bench/edits/functions.py); a whole-file edit (file:*, "
                  "bench/edits/files.py) when its code parses, makes the change and behaves as the "
                  "original module on every call of its check; why each failed: runs[].edit.why.",
                  "", edit_kind_table(rows), ""]
    shaped = (data.get("groups") or {}).get("structured") or [r for r in rows if r.get("structured_n")]
    if shaped:
        lines += ["## structured output", "", STRUCTURED_HELP, "",
                  markdown_table(shaped, STRUCTURED_COLUMNS, drop_empty=True), ""]
    if data.get("cost_model"):
        lines += ["## decode cost (ms per call)", "", cost_table(data["cost_model"]), ""]
    if data.get("notes"):
        lines += ["## notes", "", *[f"- {n}" for n in data["notes"]], ""]
    md_path.write_text("\n".join(lines), encoding="utf-8")
    return json_path, md_path


def _decoding(config: dict) -> str:
    t = config.get("temperature") or 0.0
    how = ("greedy" if t <= 0 else f"sampled at temperature {t:g} (top-k, top-p off; seed "
           f"{config.get('seed', 0)} + prompt index)")
    return f"{how}; up to {config.get('max_tokens', '?')} new tokens"


def edit_kind_table(rows: Sequence[SummaryRow]) -> str:
    """passed/tasks per edit (bench/edits/functions.py; file:*: bench/edits/files.py), one row
    per method."""
    kinds = sorted({k for r in rows for k in r.get("edit_by_kind") or {}})
    head = "| method | " + " | ".join(kinds) + " |"
    sep = "|---|" + "|".join("---" for _ in kinds) + "|"
    body = []
    for r in rows:
        by = r.get("edit_by_kind") or {}
        cells = [f"{by[k][0]}/{by[k][1]}" if k in by else "-" for k in kinds]
        body.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    return "\n".join([head, sep, *body])


def cost_table(cost: dict) -> str:
    models = [(k, v) for k, v in cost.items() if v]
    sizes = sorted({int(n) for _, v in models for n in v["last_row_ms"]})
    head = "| model | rows | " + " | ".join(f"n={n}" for n in sizes) + " |"
    sep = "|---|---|" + "|".join("---" for _ in sizes) + "|"
    body = []
    for name, v in models:
        for key, label in (("last_row_ms", "last row"), ("all_rows_ms", "all rows")):
            cells = [f"{v[key][str(n)]:.0f}" if str(n) in v[key] else "-" for n in sizes]
            body.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
    return "\n".join([head, sep, *body])
