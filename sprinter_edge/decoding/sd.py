"""`sd`: standard speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Each round the draft proposes up to k tokens; the target scores all of them in one decode;
the p/q test accepts a prefix, a rejected token is replaced from the residual, and when
every draft token passes the target adds a bonus token. Lossless: the output is
distributed exactly as the target's (token-identical under greedy decoding)."""

from __future__ import annotations

from ..costs import Evidence
from ..costs.pricing import expected_tokens
from .context import DecodeContext
from .loop import LoopStrategy
from .proposers.base import Proposer
from .proposers.draft import DraftProposer, FixedLength
from .strategy import Plan, PriceInputs, RoundPrice

DRAFT_LENS = (1, 2, 3, 4, 5, 6, 8)  # the draft lengths `auto` prices


class Speculative(LoopStrategy):
    name = "sd"
    needs_draft = True
    uses_draft = True

    def plans(self, inputs: PriceInputs) -> list[Plan]:
        return [Plan(self.name, draft_len=k) for k in DRAFT_LENS]

    def price(self, plan: Plan, inputs: PriceInputs) -> RoundPrice:
        t, d = inputs.costs.target, inputs.costs.draft
        assert d is not None
        a, k = min(inputs.evidence.sd_accept.value, 0.999), plan.draft_len
        all_pass = a ** k  # then the draft reads the last draft token and the bonus: 2 tokens
        return RoundPrice(k * d.cost(1) + all_pass * (d.cost(2) - d.cost(1)), t.cost(k + 1, k + 1),
                          expected_tokens(a, k), k + 1.0)

    def learn(self, evidence: Evidence, done: dict[str, int]) -> None:
        evidence.observe_sd(done["accepted"], done["resampled"])

    def make_proposer(self, ctx: DecodeContext, plan: Plan | None = None) -> Proposer:
        return DraftProposer(FixedLength(plan.draft_len if plan is not None else ctx.draft_len))
