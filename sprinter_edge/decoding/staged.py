"""`staged`: a prompt-lookup span is checked by the draft in one batched decode and cut at its
first disagreement before the target scores it. Exact (the cut is a function of the context,
so every proposal is a point mass for the p/q test); it trades a draft batch for target rows
that would have been rejected."""

from __future__ import annotations

from .base import DecodeContext
from .loop import LoopStrategy
from .proposers.base import Proposer
from .proposers.lookup import PromptLookup


class Staged(LoopStrategy):
    name = "staged"
    needs_draft = True
    uses_draft = True
    needs_planner = True

    def target_rows(self, n_tokens: float) -> float:
        return n_tokens

    def make_proposer(self, ctx: DecodeContext) -> Proposer:
        assert ctx.planner is not None
        return PromptLookup(ctx.planner.lookup_evidence(ctx.kind), stage=True)
