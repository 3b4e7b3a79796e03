"""One row per method: speed, work, time split, memory and quality over all prompts, and the
same per workload (`summarize_groups`: one set of rows per workload).

A row's "method" is its label (`MethodSpec.label`: "sprinter@0.5", "ar+free"), its
"base_method" the method it ran (`MethodSpec.base_method`); older bench.json files name that
"kind", and a run's "workload" "prompt_kind": read them with `base_method_of` and `workload_of`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from ..decoding import Stats
from . import quality
from .costmodel import CostModel
from .edits.tasks import check_edit_name
from .intervals import paired_difference, wilson
from .llama_server import SERVER_METHODS
from .runner import PLAIN_PEER, MethodSpec, RunRecord

# the workloads' names in the report and the plot (another workload shows as itself)
GROUP_NAMES = {"humaneval": "fresh code (HumanEval)", "edit": "edits", "file_edit": "whole-file edits",
               "chat": "chat and explanations", "long": "long-context answers",
               "structured": "structured output (JSON schema)"}
GROUP_ORDER = ("humaneval", "edit", "file_edit", "structured", "chat", "long")


def group_name(workload: str) -> str:
    return GROUP_NAMES.get(workload, workload)


def base_method_of(row: SummaryRow | dict) -> str:
    """The method a summary row ran: its "base_method" ("kind" in older bench.json files)."""
    return row["base_method"] if "base_method" in row else row["kind"]


def workload_of(run: dict) -> str:
    """A bench.json run's workload: its "workload" ("prompt_kind" in older files)."""
    return run["workload"] if "workload" in run else run["prompt_kind"]


class SummaryRow(TypedDict, total=False):
    """One method's row over a set of runs: what `summarize` writes into bench.json's "rows" and
    "groups", and what the report, the plot and tools/render_tables.py read. Older bench.json
    files lack some keys (read them with .get) and name "base_method" "kind" (`base_method_of`)."""

    method: str  # the row's label ("sprinter@0.5", "ar+free")
    base_method: str  # the method it ran
    threshold: float | None
    preset: str | None
    prompts: int
    new_tokens: int
    tokens_per_second: float  # decode, after the prompt is read
    peak_rss_mib: float
    ttft_seconds: float  # mean time to the first token
    e2e_seconds: float | None  # mean request to last token, the prompt's reading included
    # proposals (llama-server rows: from its own counters)
    target_calls_per_token: float | None
    draft_n: int
    draft_n_accepted: int
    draft_accept: float | None
    kept: int
    kept_fraction: float
    mean_run_length: float | None
    time_split: dict[str, float]  # draft, target, verifier, overhead: shares of decode time
    # the cost model's prediction (unless --no-cost-model)
    predicted_tps: float
    predicted_ratio_flat: float
    floor_ratio: float
    of_floor: float | None
    ratio_vs_ar: float | None
    ratio_vs_plain: float | None  # over the row's own plain decoding (llama-server over plain llama-server)
    # task checks (TASK_CHECKS): the rate, its prompts, and for each prefix (pass, edit, file_edit,
    # structured) {prefix}_passed, {prefix}_ci, {prefix}_diff_vs_ar, {prefix}_diff_ci
    pass_at_1: float | None
    humaneval_n: int
    edit_pass: float | None
    edit_n: int
    file_edit_pass: float | None
    file_edit_n: int
    structured_valid: float | None
    structured_n: int
    edit_by_kind: dict[str, list[int]]  # edit kind: [passed, tasks]
    structured_length: int
    structured_fenced: int
    structured_accuracy: float | None
    structured_truth_n: int
    forced_share: float | None
    grammar_ms_per_token: float | None  # the grammar's own time (Timings.grammar_seconds) per new token
    # agreement with ar
    rouge_l: float | None
    exact_match: float | None
    prefix_agreement: float | None
    mean_logprob: float | None
    greedy_agreement: float | None
    # SPRINTER's drift (`_drift`)
    eta_fp: float
    false_passes: int
    scored_tokens: int
    tv_drift: float | None
    fp_mass: float
    mean_tv: float
    p_argmax_differs: float | None
    eta_fp_x_p_differs: float | None


@dataclass(frozen=True)
class TaskCheck:
    """A per-run pass/fail check (a RunRecord field holding a dict with "passed") and the row
    keys its pass rate goes under: `rate`, `n`, and {prefix}_passed, {prefix}_ci (95% Wilson),
    {prefix}_diff_vs_ar with {prefix}_diff_ci (paired with ar over the same prompts).
    `workloads`: only the runs of these workloads (empty: any)."""

    field: str
    rate: str
    n: str
    prefix: str
    workloads: tuple[str, ...] = ()

    def result(self, rec: RunRecord) -> dict | None:
        """The run's check, None when it has none (or is of another workload)."""
        if self.workloads and rec.workload not in self.workloads:
            return None
        return getattr(rec, self.field)


# the edit field holds both edit workloads' checks: each gets its own pass rate
TASK_CHECKS = (TaskCheck("humaneval", "pass_at_1", "humaneval_n", "pass"),
               TaskCheck("edit", "edit_pass", "edit_n", "edit", ("edit",)),
               TaskCheck("edit", "file_edit_pass", "file_edit_n", "file_edit", ("file_edit",)),
               # structured output: passed = the reply is schema-valid
               TaskCheck("structured", "structured_valid", "structured_n", "structured"))


def sum_stats(items: Sequence[Stats]) -> Stats:
    return Stats.total(items)


def _mean(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def summarize(records: Sequence[RunRecord], specs: Sequence[MethodSpec],
              cost: CostModel | None = None) -> list[SummaryRow]:
    rows = []
    for spec in specs:
        recs = [r for r in records if r.method == spec.label]
        if not recs:
            continue
        dec = sum(r.decode_seconds for r in recs)
        timed = sum(r.tokens_per_second * r.decode_seconds for r in recs)
        new = sum(r.new_tokens for r in recs)
        row: SummaryRow = {"method": spec.label, "base_method": spec.base_method, "threshold": spec.threshold,
                     "preset": spec.preset,
                     "prompts": len(recs), "new_tokens": new,
                     "tokens_per_second": timed / dec if dec > 0 else 0.0,
                     "peak_rss_mib": max(r.peak_rss_mib for r in recs)}
        stats = [r.engine_stats for r in recs if r.engine_stats is not None]
        peer_stats = [r.stats for r in recs if r.engine_stats is None and r.stats]
        if peer_stats:  # llama-cpp-python and llama-server: time to the first streamed token
            row["ttft_seconds"] = sum(s.get("prefill_seconds", 0.0) for s in peer_stats) / len(peer_stats)
        # end to end: request to last token, the prompt read included (every row's stats carry it)
        row["e2e_seconds"] = _mean([r.stats.get("total_seconds") for r in recs if r.stats])
        if spec.base_method in SERVER_METHODS and peer_stats:
            calls = sum(s.get("target_calls", 0) for s in peer_stats)
            drafted = sum(s.get("draft_n", 0) for s in peer_stats)
            accepted = sum(s.get("draft_n_accepted", 0) for s in peer_stats)
            produced = sum(s.get("predicted_n", 0) for s in peer_stats)
            row.update(target_calls_per_token=calls / produced if produced else None,
                       draft_n=drafted, draft_n_accepted=accepted,
                       draft_accept=accepted / drafted if drafted else None)
        if stats:
            st = sum_stats(stats)
            t = st.timings
            d = max(t.decode_seconds, 1e-9)
            row.update(
                target_calls_per_token=st.target_calls_per_token, kept=st.counters.kept,
                ttft_seconds=t.first_token_seconds / len(stats),  # mean time to first token
                kept_fraction=st.counters.kept / max(1, st.new_tokens),
                mean_run_length=st.mean_run_length if spec.uses_verifier else None,
                time_split={"draft": t.draft_seconds / d, "target": t.target_seconds / d,
                            "verifier": t.verifier_seconds / d, "overhead": t.overhead_seconds / d},
            )
            if cost is not None:
                row["predicted_tps"] = cost.predict_tps(stats)
                row["predicted_ratio_flat"] = cost.predict_tps(stats, flat=True) / cost.ar_tps()
        for check in TASK_CHECKS:
            done = [d for r in recs if (d := check.result(r)) is not None]
            by_name = cast(dict[str, Any], row)  # a check's keys are its own (TaskCheck)
            by_name[check.rate] = sum(d["passed"] for d in done) / len(done) if done else None
            by_name[check.n] = len(done)
        shaped = [r for r in recs if r.structured is not None]
        if shaped:
            row.update(_structured(shaped))
        edits = [r.edit for r in recs if r.edit is not None]
        if edits:  # [passed, tasks] per edit (old results name it "kind")
            names = [check_edit_name(e) for e in edits]
            row["edit_by_kind"] = {k: [sum(e["passed"] for e, n in zip(edits, names, strict=True) if n == k),
                                       names.count(k)] for k in sorted(set(names))}
        row.update(
            rouge_l=_mean([r.rouge_l for r in recs]),
            exact_match=_mean([float(r.exact_match) for r in recs if r.exact_match is not None]),
            prefix_agreement=_mean([r.prefix_agreement for r in recs]),
            mean_logprob=_weighted([(r.mean_logprob, r.new_tokens) for r in recs]),
            greedy_agreement=_weighted([(r.greedy_agreement, r.new_tokens) for r in recs]),
        )
        fps = [r.false_pass for r in recs if r.false_pass is not None]
        if fps:
            row.update(_drift(fps, spec))
        rows.append(row)
    for check in TASK_CHECKS:
        _pass_intervals(rows, records, check)
    ar = next((r for r in rows if r["method"] == "ar"), None)  # not ar+free nor ar+prediction
    plain_rows = {base_method_of(r): r for r in rows if r["method"] == base_method_of(r)}
    for r in rows:
        r["ratio_vs_ar"] = r["tokens_per_second"] / ar["tokens_per_second"] \
            if ar and ar["tokens_per_second"] else None
        plain = plain_rows.get(PLAIN_PEER.get(base_method_of(r), ""))
        r["ratio_vs_plain"] = r["tokens_per_second"] / plain["tokens_per_second"] \
            if plain and plain["tokens_per_second"] else None
    floor = _floor(records, cost)
    if floor is not None:
        for r in rows:
            r["floor_ratio"] = floor
            r["of_floor"] = r["ratio_vs_ar"] / floor if r["ratio_vs_ar"] is not None else None
    return rows


def _floor(records: Sequence[RunRecord], cost: CostModel | None) -> float | None:
    """The floor's ratio over ar on ar's replies (CostModel.floor_ratio); None without costs."""
    replies = [(r.engine_stats.prompt_tokens, r.engine_stats.new_tokens) for r in records
               if r.method == "ar" and r.engine_stats is not None]
    return cost.floor_ratio(replies) if cost is not None and replies else None


def summarize_groups(records: Sequence[RunRecord], specs: Sequence[MethodSpec],
                     cost: CostModel | None = None) -> dict[str, list[SummaryRow]]:
    """`summarize` per workload, the known ones first in GROUP_ORDER."""
    workloads = sorted({r.workload for r in records},
                       key=lambda w: (GROUP_ORDER.index(w) if w in GROUP_ORDER else len(GROUP_ORDER), w))
    return {w: summarize([r for r in records if r.workload == w], specs, cost) for w in workloads}


def _pass_intervals(rows: list[SummaryRow], records: Sequence[RunRecord], check: TaskCheck) -> None:
    """A pass rate's 95% Wilson interval, and the paired difference from ar on the same prompts."""
    passed = {(r.method, r.prompt_id): bool(d["passed"]) for r in records
              if (d := check.result(r)) is not None}
    ar = next((r["method"] for r in rows if r["method"] == "ar"), None)
    for row in cast(list[dict[str, Any]], rows):  # a check's keys are its own (TaskCheck)
        n = row.get(check.n) or 0
        if not n:
            continue
        k = round(row[check.rate] * n)
        row[f"{check.prefix}_passed"] = k
        row[f"{check.prefix}_ci"] = list(wilson(k, n))
        if ar is None or row["method"] == ar:
            continue
        ids = sorted(p for m, p in passed if m == row["method"] and (ar, p) in passed)
        diff, lo, hi = paired_difference([passed[(row["method"], p)] for p in ids],
                                         [passed[(ar, p)] for p in ids])
        row[f"{check.prefix}_diff_vs_ar"] = diff
        row[f"{check.prefix}_diff_ci"] = [lo, hi]


def _structured(recs: Sequence[RunRecord]) -> SummaryRow:
    """A row's structured-output columns: replies cut by max_tokens, replies whose code block
    alone is schema-valid, mean field accuracy over the tasks with a truth, and the share of
    its tokens the grammar gave for free (forced, or fast-forward tokens the target accepted),
    and the grammar's own milliseconds (masks, consuming, fast-forward, rollback) per new token."""
    checks = [r.structured for r in recs if r.structured is not None]
    accuracy = [c["accuracy"] for c in checks if c["accuracy"] is not None]
    new = sum(r.new_tokens for r in recs)
    engine = [r.stats for r in recs if r.engine_stats is not None]
    free = sum(s.get("forced", 0) + s.get("grammar_accepted", 0) for s in engine)
    grammar = sum(s.get("grammar_seconds", 0.0) for s in engine)
    return {"structured_length": sum(c["length"] for c in checks),
            "structured_fenced": sum(c["fenced"] for c in checks),
            "structured_accuracy": sum(accuracy) / len(accuracy) if accuracy else None,
            "structured_truth_n": len(accuracy),
            "forced_share": free / new if engine and new else None,
            "grammar_ms_per_token": 1e3 * grammar / new if engine and new else None}


def _drift(fps: Sequence[dict], spec: MethodSpec) -> SummaryRow:
    """eta_FP on the greedy label, and the drift from the target per token, over all runs
    of a SPRINTER row (`quality.FalsePass`; token-weighted):

    * tv_drift: mean of 1[kept] * TV(p, q), p and q at the sampling settings the runs used;
    * fp_mass: mean of 1[kept] * (1 - min(1, p(x)/q(x))), a bound on the drift for any
      verifier, the same in expectation as tv_drift for one that does not read the token x;
    * eta_fp_x_p_differs: eta_FP * P(argmax differs), shown for greedy decoding only, where
      it estimates the same quantity as tv_drift (P(pass | argmax differs) * P(argmax differs)).

    The oracle verifier's score depends on the sampled token (it compares it with ar's
    output), so the mixture argument behind tv_drift holds for it only under greedy decoding,
    where the token is a function of the context: at temperature > 0 its drift is omitted."""
    fp = sum(f["false_pass"] for f in fps)
    rej = sum(f["rejected"] for f in fps)
    eta = fp / (fp + rej) if fp + rej else 0.0
    tot = quality.tv_totals(fps)
    drift = tot["tv_drift"] if tot["greedy"] or spec.base_method != "oracle" else None
    p_diff = tot["p_argmax_differs"]
    return {"eta_fp": eta, "false_passes": fp, "scored_tokens": tot["tokens"], "tv_drift": drift,
            "fp_mass": tot["fp_mass"],
            "mean_tv": tot["mean_tv"], "p_argmax_differs": p_diff,
            "eta_fp_x_p_differs": eta * p_diff if tot["greedy"] and p_diff is not None else None}


def _weighted(pairs: Sequence[tuple[float | None, int]]) -> float | None:
    num = sum(v * n for v, n in pairs if v is not None)
    den = sum(n for v, n in pairs if v is not None)
    return num / den if den else None
