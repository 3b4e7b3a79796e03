"""Replay the lookup proposer along the recorded greedy replies of a whole-file edit bench run:
the share of proposed tokens the target would accept, and where the rest are wasted.

Under greedy decoding the reply is fixed (`ar`'s tokens; `auto`'s equal them), so a proposal's
accepted length is its common prefix with what the target wrote next, and the target's own
token follows. The prompts are rebuilt as the bench built them (`file_edit_prompts`, encoded
with the chat template by the engine: the model is loaded to tokenize, never to generate), the
proposer is the loop's own class, its copy evidence kept across the tasks in the bench's order,
and proposal lengths are priced from this machine's cached cost table (a fixed table when there
is none: nothing is timed). `--trace TASK` prints every refused proposal of the tasks whose id
contains TASK, with the edit memory's substitutions at the end. Usage:

    python tools/rename_replay.py results/bench-results-file-edits.json --trace stat
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from sprinter_edge import Engine, Hardware
from sprinter_edge.backend.llama import common_prefix
from sprinter_edge.bench.edits_files import file_edit_prompts
from sprinter_edge.costs import Costs, CostTable, Evidence
from sprinter_edge.costs.table import _digest, cache_dir, cost_key
from sprinter_edge.decoding import DecodeContext, Stats
from sprinter_edge.decoding.lookup import COPIES
from sprinter_edge.decoding.proposers.copy_evidence import CopyEvidence
from sprinter_edge.decoding.proposers.prompt_lookup import PromptLookup
from sprinter_edge.decoding.sampling import Sampler, SamplingParams

# used when this machine has no cached table: a 64-row call costs what 8 single steps cost
FALLBACK = CostTable(last={1: 10.0, 64: 80.0}, full={1: 10.0, 64: 80.0})


def cached_costs(model: Any) -> CostTable | None:
    """The cost table `machine_costs` would read, or None (never measures)."""
    path = cache_dir() / f"{_digest(cost_key(model))}.json"
    if not path.is_file():
        return None
    table = CostTable.from_dict(json.loads(path.read_text())["costs"])
    table.make_monotone()
    return table


def replay(proposer: PromptLookup, costs: Costs, evidence: Evidence, prompt: list[int],
           reply: list[int], max_tokens: int, trace: Any = None) -> tuple[int, int, int, float]:
    """(tokens proposed, accepted, target calls, predicted target ms) along `reply`;
    `trace(pos, proposal, ok)` is called on every refused proposal."""
    ctx = DecodeContext(target=None, draft=None, sampler=Sampler(SamplingParams(temperature=0.0)),
                        stats=Stats(method="lookup"), max_new_tokens=max_tokens, costs=costs,
                        evidence=evidence, kind="edit")
    seq = list(prompt)
    proposer.begin(ctx, seq)
    proposed = accepted = calls = pos = 0
    ms = 0.0
    while pos < len(reply):
        ctx.produced = pos
        proposal = proposer.propose(ctx, seq)
        k = len(proposal)
        table = costs.at(len(seq)).target
        ms += table.all_rows(k + 1) if k else table.cost(1)
        ok = common_prefix(proposal.tokens, reply[pos:pos + k])
        if trace is not None and ok < k:
            trace(pos, proposal, ok)
        proposer.feedback(ctx, proposal, ok)
        proposed, accepted, calls = proposed + k, accepted + ok, calls + 1
        n = min(ok + 1, len(reply) - pos)
        seq.extend(reply[pos:pos + n])
        pos += n
    return proposed, accepted, calls, ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench_json", type=Path)
    ap.add_argument("--method", default="auto", help="the row whose lookup stats are compared")
    ap.add_argument("--trace", default=None, help="print refused proposals of tasks containing this")
    ap.add_argument("--no-memory", action="store_true", help="replay without the edit memory")
    ap.add_argument("--fresh", action="store_true",
                    help="copy evidence from its priors for each task (no carry-over between tasks)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    data = json.loads(args.bench_json.read_text())
    max_tokens = data["config"]["max_tokens"]
    ids = data["config"]["prompts"]
    prompts = {p.id: p for p in file_edit_prompts(len(ids))}
    ar = {r["prompt_id"]: r["tokens"] for r in data["runs"] if r["method"] == "ar"}
    bench = {r["prompt_id"]: r["stats"] for r in data["runs"] if r["method"] == args.method}
    engine = Engine.from_pair("default", offline=True, method="lookup",
                              hardware=Hardware(n_threads=data["config"].get("threads", 2), n_ctx=4096))
    encoded = {pid: engine.encode(prompts[pid].text) for pid in ids}
    table = cached_costs(engine.target)
    model = engine.text_model
    print(f"costs: {'cached table' if table else 'fixed fallback table'}")
    costs, evidence = Costs(table or FALLBACK), Evidence()
    total = [0, 0, 0.0]
    for pid in ids:
        prompt, reply = encoded[pid], ar[pid]
        st = bench.get(pid, {})
        if st.get("prompt_tokens") not in (None, len(prompt)):
            print(f"  {pid}: prompt has {len(prompt)} tokens, the bench's {st['prompt_tokens']}")
        if args.fresh:
            evidence = Evidence()
        copies = evidence.of_kind(COPIES, "edit", CopyEvidence)
        proposer = PromptLookup(copies, learn_edits=not args.no_memory)
        trace = None
        if args.trace and args.trace in pid:
            def trace(pos: int, proposal: Any, ok: int, reply: list[int] = reply,
                      proposer: PromptLookup = proposer) -> None:
                k = len(proposal)
                by = proposer._by[ok] if ok < len(proposer._by) else -1
                got, want = proposal.tokens[ok], reply[pos + ok]
                before = show_span(model, reply[max(pos + ok - 6, 0):pos + ok])
                print(f"    @{pos:5d} +{ok:2d}/{k:2d} wasted {k - ok:2d}  after {before}: proposed "
                      f"{show_span(model, [got])} ({'sub' if by >= 0 else 'copy'}), "
                      f"wrote {show_span(model, [want])}")
        proposed, accepted, calls, ms = replay(proposer, costs, evidence, prompt, reply, max_tokens, trace)
        total[0] += proposed
        total[1] += accepted
        total[2] += ms
        # the counters' names before and after their rename (archived runs have the old ones)
        got = st.get("copied_accepted", st.get("lookup_accepted"))
        offered = st.get("copied_tokens", st.get("lookup_tokens"))
        b = f"{got}/{offered} = {got / max(offered, 1):.3f}" if offered is not None else "-"
        print(f"{pid:48s} replay {accepted:4d}/{proposed:4d} = {accepted / max(proposed, 1):.3f} "
              f"({calls:3d} calls, {ms / 1000:5.1f} s predicted)   bench {b}")
        if trace is not None:
            for sub in proposer.memory.subs.values():
                print(f"      sub {show_span(model, sub.key)} -> {show_span(model, sub.value)} "
                      f"{'ctx' if sub.contextual else '   '} +{sub.accepted} -{sub.refused}")
    print(f"{'all':48s} replay {total[1]:4d}/{total[0]:4d} = {total[1] / max(total[0], 1):.3f} "
          f"({total[2] / 1000:.1f} s predicted)")
    engine.close()
    return 0


def show_span(model: Any, tokens: Any) -> str:
    """Tokens as their text pieces, `|` between them, newlines shown."""
    return "|".join(model.detokenize([t]) for t in tokens).replace("\n", "\\n")


if __name__ == "__main__":
    raise SystemExit(main())
