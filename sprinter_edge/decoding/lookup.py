"""`lookup`: prompt-lookup speculation, one model. Spans of the prompt and of the reply so far
are proposed where the context matched before, priced with this machine's batch costs, and
the target checks them with the p/q test (a copied span is a point mass): exact, no draft
model, fastest on replies that copy (edits, refactors, quoting a pasted file)."""

from __future__ import annotations

from .base import DecodeContext
from .loop import LoopStrategy
from .proposers.base import Proposer
from .proposers.lookup import PromptLookup


class Lookup(LoopStrategy):
    name = "lookup"
    needs_planner = True
    stage = False  # staged.py: the draft checks each span first

    def target_rows(self, n_tokens: float) -> float:
        return n_tokens

    def make_proposer(self, ctx: DecodeContext) -> Proposer:
        assert ctx.planner is not None
        return PromptLookup(ctx.planner.lookup_evidence(ctx.kind), stage=self.stage)
