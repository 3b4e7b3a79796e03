"""`ar`: the target alone, one token per decode (the baseline a user has today): the loop
with no proposer."""

from __future__ import annotations

from .base import DecodeContext
from .loop import LoopStrategy
from .proposers.base import NoProposal, Proposer


class Autoregressive(LoopStrategy):
    name = "ar"

    def make_proposer(self, ctx: DecodeContext) -> Proposer:
        return NoProposal()
