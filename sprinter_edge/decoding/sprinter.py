"""`sprinter`: sequential approximate verification (arXiv 2502.04557).

The draft generates one token at a time and the verifier scores each from the draft's view
(its logits or hidden state at that position). Tokens it passes are committed without the
target. When it flags a token (score < threshold), or the run reaches the run cap, the target
catches up on every pending token plus the flagged one in ONE decode call, the SD test is
applied to the flagged token only (residual resample on reject, bonus token on accept), and
both KV caches roll back to the committed sequence.

Output distribution. Let p and q be the target's and the draft's next-token distributions
after the sampling transform (temperature, top-k, top-p; greedy: one-hot argmax). When the
verifier's score does not depend on the sampled token -- true of the confidence rule and the
shipped ONNX verifier, which read the draft's max probability or hidden state at the context
-- its decision `pass` at a context is fixed before the token is drawn, and the next token is
distributed as pass * q + (1 - pass) * p (a flagged token goes through the SD test, whose
output is distributed as p; so does a token sent to the target by the run cap, a function of
the context). The distance from the target there is 1[pass] * TV(p, q), and the drift per
token is the mean of that along the output, at the sampling settings used (`sprinter-edge
bench`: "TV drift/tok"). The end-of-generation check depends on the drawn token and only
moves the end token's excess mass toward p; the accounting counts such a position as not
passed. Under greedy decoding TV(p, q) = 1[argmax differs] and the mean is
eta_FP * P(argmax differs), eta_FP the false-pass rate on the greedy label; at
temperature > 0 no such identity holds, and a verifier with eta_FP = 0 still drifts.

A verifier may also read the drawn token (features `logq_x`, `q_ratio`); then the mixture
above does not hold, and the expected false passes per token -- the mean of
1[pass] * (1 - min(1, p(x)/q(x))), what `verifier study` compares -- is the figure to read.
"""

from __future__ import annotations

from typing import Any

from ..costs import Evidence
from .context import DecodeContext
from .loop import LoopStrategy
from .proposers.base import Proposer
from .proposers.draft import RUN_END_COUNTERS, DraftProposer, VerifierRun
from .run_policy import RunPolicy
from .settings import Setting
from .strategy import Plan, PriceInputs, RoundPrice

RUN_CAPS = (4, 6, 8, 12, 16, 20, 24, 32)  # the run caps `auto` prices
# its evidence: the share of scored draft tokens the verifier flags, and how often the target
# accepts a flagged one; with their priors
FLAG_RATE, FLAGGED_ACCEPT = "sprinter.flag_rate", "sprinter.flagged_accept"
PRIORS = {FLAG_RATE: 0.2, FLAGGED_ACCEPT: 0.5}


class Sprinter(LoopStrategy):
    name = "sprinter"
    about = "the draft's tokens pass unchecked where the verifier trusts them (approximate)"
    needs_draft = True
    uses_draft = True
    needs_verifier = True
    exact = False
    counters = tuple(RUN_END_COUNTERS.values())  # flags, cap_hits, eog_checks
    settings = (
        Setting("run_cap", 20, "sprinter: longest run of tokens kept without the target (0 = no cap)",
                minimum=1, none_ok=True, short="cap"),
        Setting("verify_eog", True, "sprinter: end-of-generation tokens always go to the target",
                type=bool, cli=False),
    )

    def plans(self, inputs: PriceInputs) -> list[Plan]:
        cap = inputs.settings.get("run_cap", 20)  # the user's cap bounds the plans'
        caps = [c for c in RUN_CAPS if cap is None or c <= cap]
        if cap is not None and cap not in caps:
            caps.append(cap)
        return [self.plan(run_cap=c) for c in caps]

    def price(self, plan: Plan, inputs: PriceInputs) -> RoundPrice:
        """A mixture over run lengths: `kept` tokens kept, then one verified (flagged, or forced
        at the cap), under the decoder's own run policy (the threshold only matters through the
        flag rate)."""
        t, d, ev = inputs.costs.target, inputs.costs.draft, inputs.evidence
        assert d is not None
        d1, d2 = d.cost(1), d.cost(2)
        f = min(max(ev.rate(FLAG_RATE, PRIORS[FLAG_RATE]).value, 1e-3), 1.0)
        acc = ev.rate(FLAGGED_ACCEPT, PRIORS[FLAGGED_ACCEPT]).value
        draft_ms = target_ms = tokens = batch = 0.0
        for kept, p in RunPolicy(0.0, plan.get("run_cap")).run_lengths(f):
            steps = kept + 1
            draft_ms += p * (steps * d1 + steps * inputs.verifier_ms + acc * (d2 - d1))
            target_ms += p * t.cost(kept + 2, 2)  # pending tokens + the last committed one
            batch += p * (kept + 2)
            tokens += p * (kept + 1 + acc)
        return RoundPrice(draft_ms, target_ms, tokens, batch)

    def guarantee(self, stats: Any) -> str:
        t = stats.point.threshold
        where = f" at threshold {t:g}" if t is not None else ""
        return f"approximate: sprinter{where} ({stats.counters.kept} tokens never seen by the target)"

    def learn(self, evidence: Evidence, done: dict[str, int]) -> None:
        evidence.rate(FLAG_RATE, PRIORS[FLAG_RATE]).add_counts(done["flags"], done["kept"])
        evidence.rate(FLAGGED_ACCEPT, PRIORS[FLAGGED_ACCEPT]).add_counts(done["accepted"], done["resampled"])

    def evidence_priors(self) -> dict[str, float]:
        return dict(PRIORS)

    def seed_evidence(self, evidence: Evidence, acceptance: Any, calibration: Any,
                      threshold: float | None) -> None:
        """The pair's on-policy measurements, else the verifier's calibration table (off-policy:
        it flags more than SPRINTER's own runs do)."""
        if acceptance is not None:
            evidence.seed(FLAGGED_ACCEPT, acceptance.flagged_accept)
            if threshold is not None:
                evidence.seed(FLAG_RATE, max(acceptance.flag_rate_at(threshold), 0.01))
        elif calibration and threshold is not None:
            from ..verifiers.calibration import row_at

            evidence.seed(FLAG_RATE, max(row_at(calibration, threshold).flag_rate, 0.01))

    def make_proposer(self, ctx: DecodeContext, plan: Plan | None = None) -> Proposer:
        assert ctx.verifier is not None
        cap = self.setting(ctx, plan, "run_cap")
        return DraftProposer(VerifierRun(ctx.verifier, ctx.threshold, cap, ctx.setting("verify_eog")))
