"""`lookup`: prompt-lookup speculation, one model. Spans of the prompt and of the reply so far
are proposed where the context matched before, priced with this machine's batch costs, and
the target checks them with the p/q test (a copied span is a point mass): exact, no draft
model, fastest on replies that copy (edits, refactors, quoting a pasted file)."""

from __future__ import annotations

from .context import DecodeContext
from .loop import LoopStrategy
from .proposers.base import Proposer
from .proposers.copy_evidence import CopyEvidence
from .proposers.prompt_lookup import PromptLookup
from .strategy import Plan, PriceInputs

# Before it has run, x ar's speed: a plain step plus proposals that pass their own cost test, so
# a little above ar on fresh text. An edit request (it carries the code or document the reply
# reworks) is a copy: lookup measured 2.3-2.5x ar on single-function edit tasks; the prior
# stays below that.
PRIOR = {"edit": 2.0, "code": 1.02, "chat": 1.02}
COPIES = "copies"  # its per-kind evidence (Evidence.of_kind), shared with staged


class Lookup(LoopStrategy):
    name = "lookup"
    needs_costs = True
    judged_by_runs = True
    stage = False  # staged.py: the draft checks each span first

    def plans(self, inputs: PriceInputs) -> list[Plan]:
        return [self.plan()]

    def prior_speedup(self, kind: str) -> float:
        return PRIOR.get(kind, 1.02)

    def make_proposer(self, ctx: DecodeContext, plan: Plan | None = None) -> Proposer:
        assert ctx.evidence is not None
        return PromptLookup(ctx.evidence.of_kind(COPIES, ctx.kind, CopyEvidence), stage=self.stage)
