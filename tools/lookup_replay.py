"""Replay the prompt-lookup proposer along the target's own greedy replies, priced on this
machine's measured batch costs: how a lookup policy would do, in seconds, without decoding.

Under greedy decoding the reply is fixed (it is `ar`'s), so a proposal's accepted length is
its common prefix with what the target wrote next; each round costs one target call of
k + 1 rows (k proposed) from the cost table `doctor` measured, a round without a proposal one
plain step. The proposer is the loop's own class (decoding/proposers/prompt_lookup.py), fed the same
sequences the loop feeds it, its evidence kept across the replies as `auto` keeps it. Policy
variants are the proposer's own options. It predicts time spent in target calls only (the
bench's `time_split` puts 99.7% of lookup's decode there). It also prints the copy bound: the
speed of an oracle that copies every continuation seen before and batches every copied token at
the cheapest cost per row, the most any copying proposer can reach on these replies. Usage:

    python tools/lookup_replay.py results/bench-results-edits.json
"""

from __future__ import annotations

from edit_replies import parser, setup

from sprinter_edge.backend.llama import common_prefix
from sprinter_edge.costs.table import CostTable, machine_costs
from sprinter_edge.decoding import DecodeContext, Stats
from sprinter_edge.decoding.lookup import COPIES
from sprinter_edge.decoding.proposers import copy_evidence as evidence
from sprinter_edge.decoding.proposers import prompt_lookup as lookup
from sprinter_edge.decoding.proposers.copy_evidence import CopyEvidence
from sprinter_edge.decoding.proposers.prompt_lookup import PromptLookup
from sprinter_edge.decoding.sampling import Sampler, SamplingParams
from sprinter_edge.planning.planner import Planner

# name: (the proposer's options, constants of the lookup module or the copy evidence)
VARIANTS: dict[str, tuple[dict, dict]] = {
    "shipped": ({}, {}),
    "no-anchor": ({"anchor": False}, {}),
    "anchor-prior-0.7": ({}, {"ANCHOR_PRIOR": 0.7}),
    "anchor-prior-0.8": ({}, {"ANCHOR_PRIOR": 0.8}),
    "anchor-prior-0.9": ({}, {"ANCHOR_PRIOR": 0.9}),
    "anchor-window-16": ({}, {"ANCHOR_PRIOR": 0.8, "ANCHOR_WINDOW": 16}),
    "spec-factor-4": ({}, {"SPEC_FACTOR": 4}),
    "max-match-32": ({}, {"MAX_MATCH": 32}),
    "min-match-2": ({}, {"MIN_MATCH": 2, "COPY_BUCKETS": (2, 3, 4, 6, 10, 16),
                         "COPY_PRIOR": (0.4, 0.55, 0.7, 0.85, 0.92, 0.96), "ANCHOR": 6}),
    "min-match-1": ({}, {"MIN_MATCH": 1, "COPY_BUCKETS": (1, 2, 3, 4, 6, 10, 16),
                         "COPY_PRIOR": (0.3, 0.4, 0.55, 0.7, 0.85, 0.92, 0.96), "ANCHOR": 7}),
}


def replay(proposer: PromptLookup, planner: Planner, prompt: list[int],
           reply: list[int]) -> tuple[float, Stats]:
    """Predicted target milliseconds for `reply` and the proposer's counters."""
    stats = Stats(method="lookup")
    ctx = DecodeContext(target=None, draft=None, sampler=Sampler(SamplingParams(temperature=0.0)),
                        stats=stats, max_new_tokens=len(reply), costs=planner.costs,
                        evidence=planner.evidence, kind="edit")
    seq = list(prompt)
    proposer.begin(ctx, seq)
    ms, pos = 0.0, 0
    while pos < len(reply):
        ctx.produced = pos
        proposal = proposer.propose(ctx, seq)
        k = len(proposal)
        accepted = common_prefix(proposal.tokens, reply[pos:pos + k])
        ms += planner.target.all_rows(k + 1) if k else planner.target.cost(1)
        stats.counters.target_calls += 1
        stats.counters.target_tokens += k + 1
        stats.counters.target_sampled += k == 0
        proposer.feedback(ctx, proposal, accepted)
        n = min(accepted + 1, len(reply) - pos)
        seq.extend(reply[pos:pos + n])
        pos += n
    stats.counters.new_tokens = len(reply)
    return ms, stats


def bottleneck(target: CostTable, total_ms: float, tokens: int, plain: int, rows: int) -> str:
    """Where the time goes against the ceiling (every token one row of the cheapest call per
    row: a full, fully accepted batch): plain steps, rejected rows, calls smaller than that."""
    best_n = min(range(2, 33), key=lambda n: target.all_rows(n) / n)
    floor = target.all_rows(best_n) / best_n
    batched_ms = total_ms - plain * target.cost(1)
    batched_rows, batched_tokens = rows - plain, tokens - plain
    per_row = batched_ms / max(batched_rows, 1)
    parts = {"plain steps": plain * (target.cost(1) - floor),
             "rejected rows": (batched_rows - batched_tokens) * per_row,
             "smaller calls": batched_tokens * (per_row - floor)}
    return (f"ceiling {1000 / floor:.1f} tok/s ({floor:.1f} ms a row at {best_n} rows); over it: "
            + ", ".join(f"{k} {v / 1000:.1f} s" for k, v in parts.items()))


def forced_one_token_calls(prompt: list[int], reply: list[int], n: int = lookup.MIN_MATCH) -> int:
    """One-token target calls no copy can avoid: a reply token is copyable when the n tokens
    before it occurred earlier in the prompt or the reply followed by it (an oracle that always
    picks the right earlier occurrence). A run of m tokens none copies costs m - 1 such calls at
    the least (its first token is the target's own token at the end of the call before)."""
    seen: set[tuple[int, ...]] = set()
    seq = list(prompt)
    for end in range(n + 1, len(seq) + 1):
        seen.add(tuple(seq[end - n - 1:end]))
    forced, run = 0, 0
    for token in reply:
        gram = tuple(seq[-n:]) + (token,) if len(seq) >= n else None
        if gram is not None and gram in seen:
            run = 0
        else:
            forced += run > 0  # the second and later tokens of a novel run
            run += 1
        seq.append(token)
        if len(seq) > n:
            seen.add(tuple(seq[-n - 1:]))
    return forced


def copy_bound(target: CostTable, encoded: list[tuple[str, list[int], list[int]]], n: int) -> str:
    """The fastest any exact decoding that proposes copies can be: the forced plain steps at
    c(1) each and every other token one row of the cheapest call per row."""
    best_n = min(range(2, 33), key=lambda k: target.all_rows(k) / k)
    floor = target.all_rows(best_n) / best_n
    tokens = sum(len(reply) for _, _, reply in encoded)
    forced = sum(forced_one_token_calls(prompt, reply, n) for _, prompt, reply in encoded)
    ms = forced * target.cost(1) + (tokens - forced) * floor
    return (f"copy bound (an oracle copying every {n}-gram continuation seen before): {forced} forced "
            f"one-token calls, {tokens / ms * 1000:.1f} tok/s at best ({ms / 1000:.1f} s)")


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"from: {', '.join(VARIANTS)}")
    args = ap.parse_args()
    data, replies, engine = setup(args, "lookup")
    measured = {r["prompt_id"]: r for r in data["runs"] if r["method"] == "lookup"}
    encoded = [(r.task, engine.encode(r.text), r.reply) for r in replies]
    target = machine_costs(engine.target)
    engine.close()
    tokens = sum(len(reply) for _, _, reply in encoded)
    if measured:
        seconds = sum(measured[pid]["decode_seconds"] for pid, _, _ in encoded if pid in measured)
        print(f"measured lookup: {tokens / seconds:.1f} tok/s ({seconds:.1f} s decode)")
    for name in args.variants.split(","):
        options, constants = VARIANTS[name]
        modules = [(m, k) for k in constants for m in (lookup, evidence) if hasattr(m, k)]
        saved = [(m, k, getattr(m, k)) for m, k in modules]
        for m, k in modules:
            setattr(m, k, constants[k])
        planner = Planner.of(target=target)
        total, calls, plain, rows = 0.0, 0, 0, 0
        for _, prompt, reply in encoded:
            copies = planner.evidence.of_kind(COPIES, "edit", CopyEvidence)
            ms, stats = replay(PromptLookup(copies, **options),
                               planner, prompt, reply)
            total += ms
            calls += stats.counters.target_calls
            plain += stats.counters.target_sampled
            rows += stats.counters.target_tokens
        for m, k, v in saved:
            setattr(m, k, v)
        print(f"{name:>18}: {tokens / total * 1000:.1f} tok/s predicted ({total / 1000:.1f} s), "
              f"{calls} target calls ({plain} plain steps), {rows} rows for {tokens} tokens")
        print("                    " + bottleneck(target, total, tokens, plain, rows))
    for n in (lookup.MIN_MATCH, 1):
        print(copy_bound(target, encoded, n))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
