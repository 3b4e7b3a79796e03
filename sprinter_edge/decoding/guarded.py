"""`guarded`: SPRINTER with a copy guard. Tokens the draft copies from the prompt or the reply
so far always go to the target (the edit points SPRINTER passes); the rest is SPRINTER as it is.
Approximate, like `sprinter`: the verifier's passed tokens are never seen by the target."""

from __future__ import annotations

from .context import DecodeContext
from .proposers.base import Proposer
from .proposers.draft import CopyGuard, DraftProposer
from .sprinter import Sprinter
from .strategy import Plan, PriceInputs


class Guarded(Sprinter):
    name = "guarded"
    about = "sprinter, with the tokens the draft copies always checked by the target (approximate)"

    def plans(self, inputs: PriceInputs) -> list[Plan]:
        return []  # not a plan `auto` runs: asked for by name

    def make_proposer(self, ctx: DecodeContext, plan: Plan | None = None) -> Proposer:
        assert ctx.verifier is not None
        return DraftProposer(CopyGuard(ctx.verifier, ctx.threshold, ctx.setting("run_cap"),
                                       ctx.setting("verify_eog")))
