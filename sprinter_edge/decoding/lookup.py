"""`lookup`: prompt-lookup speculation, one model. Spans of the prompt and of the reply so far
are proposed where the context matched before, priced with this machine's batch costs, and
the target checks them with the p/q test (a copied span is a point mass): exact, no draft
model, fastest on replies that copy (edits, refactors, quoting a pasted file)."""

from __future__ import annotations

from collections.abc import Mapping

from .context import DecodeContext
from .loop import LoopStrategy
from .proposers.base import Proposer
from .proposers.copy_evidence import CopyEvidence
from .proposers.prompt_lookup import SHIPPED, CopyPolicy, PromptLookup, StagedLookup
from .strategy import Plan, PriceInputs

# Before it has run, x ar's speed: a plain step plus proposals that pass their own cost test, so
# a little above ar on fresh text. An edit request (it carries the code or document the reply
# reworks) is a copy: the prior stays below what lookup measured on edits (docs/journal.md,
# "The measurements behind the constants").
PRIOR = {"edit": 2.0, "code": 1.02, "chat": 1.02}
COPIES = "copies"  # its per-kind evidence (Evidence.of_kind), shared with staged
# a drafting variant's draft reads the reply in calls of about this many tokens, every row
DRAFT_READ = 24


class Lookup(LoopStrategy):
    name = "lookup"
    about = "spans of the prompt and the reply proposed for free, one model (exact)"
    needs_costs = True
    judged_by_runs = True
    # a copy it is unsure of is not proposed: on an edit, a slow start (a preamble, the file's
    # name and fence) is no reason to stop copying for the rest of the reply
    kept_over_ar = frozenset({"edit"})
    stage = False  # staged.py: the draft checks each span first
    # how its copy behaves (internal tuning, not a knob: CONTRIBUTING.md, "A new method")
    copy_policy: CopyPolicy = SHIPPED

    def plans(self, inputs: PriceInputs) -> list[Plan]:
        return [self.plan()]

    def prior_speedup(self, kind: str) -> float:
        return PRIOR.get(kind, 1.02)

    def prior_ms(self, kind: str, ar_ms: float, inputs: PriceInputs, known: Mapping[str, float]) -> float:
        """A drafting variant (staged, splice) is this copy plus the draft, whose cache follows
        every token the reply commits: before it has run it is no faster than what the copy is
        known to do on this kind plus a draft row a token (the rows it might save are not
        credited untried): a draft row is a fifth of a target step deep in a file, and a drafting
        variant probed on a fixed prior paid more in draft reads than the copy alone saved
        (docs/journal.md, "The measurements behind the constants")."""
        own = super().prior_ms(kind, ar_ms, inputs, known)
        copy, draft = known.get(Lookup.name), inputs.costs.draft
        if not self.uses_draft or copy is None or draft is None:
            return own
        return max(own, copy + draft.cost(DRAFT_READ, DRAFT_READ) / DRAFT_READ)

    def make_proposer(self, ctx: DecodeContext, plan: Plan | None = None) -> Proposer:
        assert ctx.evidence is not None
        copy = StagedLookup if self.stage else PromptLookup
        return copy(ctx.evidence.of_kind(COPIES, ctx.kind, CopyEvidence), copy_policy=self.copy_policy)
