"""The copy proposer alone, with no model: a context for it and a replay of a known reply
(tests/test_edit_memory.py, test_layout.py)."""

from __future__ import annotations

from sprinter_edge.backend.llama import common_prefix
from sprinter_edge.costs import Costs, CostTable, Evidence
from sprinter_edge.decoding import DecodeContext, Stats
from sprinter_edge.decoding.proposers.prompt_lookup import PromptLookup
from sprinter_edge.decoding.sampling import Sampler, SamplingParams

# a 64-row call costs what 8 single steps cost: long proposals pay when they are right
TABLE = CostTable(last={1: 10.0, 64: 80.0}, full={1: 10.0, 64: 80.0})


def edit_context(max_new_tokens: int) -> DecodeContext:
    """A context for a proposer alone: no model, TABLE's costs, an edit request."""
    return DecodeContext(target=None, draft=None, sampler=Sampler(SamplingParams()), stats=Stats(),
                         max_new_tokens=max_new_tokens, costs=Costs(TABLE), evidence=Evidence(), kind="edit")


def replay(proposer: PromptLookup, prompt: list[int], reply: list[int],
           max_new_tokens: int | None = None, model=None) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    """(tokens proposed, accepted, target calls) when the target writes `reply` (`model`: whose
    tokenizer spells renames; None: no respelling)."""
    ctx = DecodeContext(target=model, draft=None, sampler=Sampler(SamplingParams()), stats=Stats(),
                        max_new_tokens=max_new_tokens or len(reply) + 1, costs=Costs(TABLE),
                        evidence=Evidence(), kind="edit")
    seq = list(prompt)
    proposer.begin(ctx, seq)
    proposed = accepted = calls = pos = 0
    while pos < len(reply):
        ctx.produced = pos
        proposal = proposer.propose(ctx, seq)
        k = len(proposal)
        ok = common_prefix(proposal.tokens, reply[pos:pos + k])
        proposer.feedback(ctx, proposal, ok)
        proposed, accepted, calls = proposed + k, accepted + ok, calls + 1
        n = min(ok + 1, len(reply) - pos)
        seq.extend(reply[pos:pos + n])
        pos += n
    return proposed, accepted, calls
