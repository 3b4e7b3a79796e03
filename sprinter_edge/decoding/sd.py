"""`sd`: standard speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Each round the draft proposes up to k tokens; the target scores all of them in one decode;
the p/q test accepts a prefix, a rejected token is replaced from the residual, and when
every draft token passes the target adds a bonus token. Lossless: the output is
distributed exactly as the target's (token-identical under greedy decoding)."""

from __future__ import annotations

from .base import DecodeContext
from .loop import LoopStrategy
from .proposers.base import Proposer
from .proposers.draft import DraftProposer, FixedLength


class Speculative(LoopStrategy):
    name = "sd"
    needs_draft = True
    uses_draft = True

    def target_rows(self, n_tokens: float) -> float:
        return n_tokens  # every drafted token plus the bonus row

    def make_proposer(self, ctx: DecodeContext) -> Proposer:
        return DraftProposer(FixedLength(ctx.draft_len))
