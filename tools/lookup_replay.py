"""Replay the prompt-lookup proposer along the target's own greedy replies, priced on this
machine's measured batch costs: how a lookup policy would do, in seconds, without decoding.

Under greedy decoding the reply is fixed (it is `ar`'s), so a proposal's accepted length is
its common prefix with what the target wrote next; each round costs one target call of
k + 1 rows (k proposed) from the cost table `doctor` measured, a round without a proposal one
plain step. The proposer is the loop's own class (decoding/proposers/lookup.py), fed the same
sequences the loop feeds it, its evidence kept across the replies as `auto` keeps it. Policy
variants are the proposer's own options. It predicts time spent in target calls only (the
bench's `time_split` puts 99.7% of lookup's decode there). Usage:

    python tools/lookup_replay.py docs/bench-results-edits.json
"""

from __future__ import annotations

from edit_replies import parser, setup

from sprinter_edge.backend.llama import common_prefix
from sprinter_edge.decoding.base import DecodeContext, Stats
from sprinter_edge.decoding.proposers import lookup
from sprinter_edge.decoding.proposers.lookup import PromptLookup
from sprinter_edge.decoding.sampling import Sampler, SamplingParams
from sprinter_edge.planning.costs import CostTable, machine_costs
from sprinter_edge.planning.planner import Planner

# name: (the proposer's options, the lookup module's constants)
VARIANTS: dict[str, tuple[dict, dict]] = {
    "shipped": ({}, {}),
    "no-anchor": ({"anchor": False}, {}),
    "anchor-prior-0.7": ({}, {"ANCHOR_PRIOR": 0.7}),
    "anchor-prior-0.8": ({}, {"ANCHOR_PRIOR": 0.8}),
    "anchor-prior-0.9": ({}, {"ANCHOR_PRIOR": 0.9}),
    "anchor-window-16": ({}, {"ANCHOR_PRIOR": 0.8, "ANCHOR_WINDOW": 16}),
    "min-match-2": ({}, {"MIN_MATCH": 2}),
    "spec-factor-4": ({}, {"SPEC_FACTOR": 4}),
    "max-match-32": ({}, {"MAX_MATCH": 32}),
}


def replay(proposer: PromptLookup, planner: Planner, prompt: list[int],
           reply: list[int]) -> tuple[float, Stats]:
    """Predicted target milliseconds for `reply` and the proposer's counters."""
    stats = Stats(method="lookup")
    ctx = DecodeContext(target=None, draft=None, sampler=Sampler(SamplingParams(temperature=0.0)),
                        stats=stats, max_new_tokens=len(reply), planner=planner, kind="edit")
    seq = list(prompt)
    proposer.begin(ctx, seq)
    ms, pos = 0.0, 0
    while pos < len(reply):
        ctx.produced = pos
        proposal = proposer.propose(ctx, seq)
        k = len(proposal)
        accepted = common_prefix(proposal.tokens, reply[pos:pos + k])
        ms += planner.target.all_rows(k + 1) if k else planner.target.cost(1)
        stats.target_calls += 1
        stats.target_tokens += k + 1
        stats.target_sampled += k == 0
        proposer.feedback(ctx, proposal, accepted)
        n = min(accepted + 1, len(reply) - pos)
        seq.extend(reply[pos:pos + n])
        pos += n
    stats.new_tokens = len(reply)
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
        saved = {k: getattr(lookup, k) for k in constants}
        for k, v in constants.items():
            setattr(lookup, k, v)
        planner = Planner(target=target)
        total, calls, plain, rows = 0.0, 0, 0, 0
        for _, prompt, reply in encoded:
            ms, stats = replay(PromptLookup(planner.lookup_evidence("edit"), **options),
                               planner, prompt, reply)
            total += ms
            calls += stats.target_calls
            plain += stats.target_sampled
            rows += stats.target_tokens
        for k, v in saved.items():
            setattr(lookup, k, v)
        print(f"{name:>18}: {tokens / total * 1000:.1f} tok/s predicted ({total / 1000:.1f} s), "
              f"{calls} target calls ({plain} plain steps), {rows} rows for {tokens} tokens")
        print("                    " + bottleneck(target, total, tokens, plain, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
