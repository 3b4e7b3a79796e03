"""`ar`: the target alone, one token per decode (the baseline a user has today): the loop
with no proposer."""

from __future__ import annotations

from .context import DecodeContext
from .loop import LoopStrategy
from .proposers.base import NoProposal, Proposer
from .strategy import Plan, PriceInputs, RoundPrice


class Autoregressive(LoopStrategy):
    name = "ar"
    about = "the target alone, one token per call (exact)"
    judged_by_runs = True

    def plans(self, inputs: PriceInputs) -> list[Plan]:
        return [self.plan()]

    def price(self, plan: Plan, inputs: PriceInputs) -> RoundPrice:
        return RoundPrice(0.0, inputs.costs.target.cost(1), 1.0, 1.0)

    def make_proposer(self, ctx: DecodeContext, plan: Plan | None = None) -> Proposer:
        return NoProposal()

