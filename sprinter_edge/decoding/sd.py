"""`sd`: standard speculative decoding (Leviathan et al. 2023; Chen et al. 2023).

Each round the draft proposes up to k tokens; the target scores all of them in one decode;
the p/q test accepts a prefix, a rejected token is replaced from the residual, and when
every draft token passes the target adds a bonus token. Lossless: the output is
distributed exactly as the target's (token-identical under greedy decoding)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..costs import Evidence
from ..costs.pricing import expected_tokens
from .context import DecodeContext
from .loop import LoopStrategy
from .proposers.base import Proposer
from .proposers.draft import DraftProposer, FixedLength
from .settings import Setting
from .strategy import Plan, PriceInputs, RoundPrice

DRAFT_LENS = (1, 2, 3, 4, 5, 6, 8)  # the draft lengths `auto` prices
ACCEPT = "sd.accept"  # P(the target accepts a drafted token): its evidence
ACCEPT_PRIOR = 0.75


class Speculative(LoopStrategy):
    name = "sd"
    about = "the draft proposes k tokens, the target verifies them (exact)"
    needs_draft = True
    uses_draft = True
    settings = (Setting("draft_len", 4, "sd: draft tokens per round", minimum=1, short="k"),)

    def plans(self, inputs: PriceInputs) -> list[Plan]:
        return [self.plan(draft_len=k) for k in DRAFT_LENS]

    def lookahead(self, values: Mapping[str, Any]) -> int:
        return int(values.get("draft_len", 0))

    def price(self, plan: Plan, inputs: PriceInputs) -> RoundPrice:
        t, d = inputs.costs.target, inputs.costs.draft
        assert d is not None
        a, k = min(inputs.evidence.rate(ACCEPT, ACCEPT_PRIOR).value, 0.999), plan.get("draft_len")
        all_pass = a ** k  # then the draft reads the last draft token and the bonus: 2 tokens
        return RoundPrice(k * d.cost(1) + all_pass * (d.cost(2) - d.cost(1)), t.cost(k + 1, k + 1),
                          expected_tokens(a, k), k + 1.0)

    def learn(self, evidence: Evidence, done: dict[str, int]) -> None:
        evidence.rate(ACCEPT, ACCEPT_PRIOR).add_counts(done["accepted"], done["resampled"])

    def evidence_priors(self) -> dict[str, float]:
        return {ACCEPT: ACCEPT_PRIOR}

    def seed_evidence(self, evidence: Evidence, acceptance: Any, calibration: Any,
                      threshold: float | None) -> None:
        if acceptance is not None:  # the pair's on-policy measurement (models/pairs.toml)
            evidence.seed(ACCEPT, acceptance.sd_accept)

    def make_proposer(self, ctx: DecodeContext, plan: Plan | None = None) -> Proposer:
        return DraftProposer(FixedLength(self.setting(ctx, plan, "draft_len")))
