"""`splice`: prompt lookup whose departures the draft model writes, copy and draft in one
proposal (proposers/splice.py). For edits that rewrite many lines (type hints, f-strings,
docstrings): where the copy has nothing to give, the draft writes until the source resumes and
the target checks what it wrote and the copy after it in one call. Exact: every proposed token
is a point mass for the p/q test (greedy: identical to ar)."""

from __future__ import annotations

from ..backend.llama import LlamaModel
from .context import DecodeContext
from .lookup import COPIES, Lookup
from .proposers.base import Proposer
from .proposers.copy_evidence import CopyEvidence
from .proposers.splice import Splice as SpliceProposer
from .proposers.splice import WriteEvidence
from .settings import Setting
from .strategy import Plan

# x ar's speed before it has run: below lookup's and staged's. It is lookup plus writing that
# pays only where a draft step and a row cost well under a target step (where they do not, it
# runs slower than lookup: docs/journal.md, "The measurements behind the constants"), so `auto`
# probes it only where what lookup and staged measured leaves room (untried, it is priced no
# faster than lookup's estimate plus a draft row a token: Lookup.prior_ms)
PRIOR = {"edit": 1.2, "code": 1.0, "chat": 1.0}
WRITES = "writes"  # its per-kind evidence (Evidence.of_kind): what written tokens earned


class Splice(Lookup):
    name = "splice"
    about = "copies, and the draft writing where a copy departs (exact)"
    needs_draft = True
    uses_draft = True
    kept_over_ar = frozenset()  # the draft reads every token: not free where nothing is copied
    settings = (Setting("write_len", 8, "splice: most tokens the draft writes where the reply departs "
                        "from its source", minimum=1, short="w"),)
    counters = ("writes", "resumed")  # proposals the draft wrote into; of those, followed by a copy

    def prior_speedup(self, kind: str) -> float:
        return PRIOR.get(kind, 1.0)

    def prefill_models(self, ctx: DecodeContext) -> list[LlamaModel]:
        """The target and the draft (loaded now: it writes at the first departure)."""
        models = [ctx.target] if ctx.target is not None else []
        return models + ([ctx.load_draft()] if ctx.has_draft else [])

    def make_proposer(self, ctx: DecodeContext, plan: Plan | None = None) -> Proposer:
        assert ctx.evidence is not None
        return SpliceProposer(ctx.evidence.of_kind(COPIES, ctx.kind, CopyEvidence),
                              ctx.evidence.of_kind(WRITES, ctx.kind, WriteEvidence),
                              write_len=self.setting(ctx, plan, "write_len"), copy_policy=self.copy_policy)
