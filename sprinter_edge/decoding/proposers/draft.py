"""The draft model as proposer: it drafts one token at a time until its stop rule says so.

Stop rules:
- `FixedLength(k)`: k tokens a round (`sd`).
- `MinProb(p_min, n_max)`: until the draft's top probability falls below p_min (llama.cpp's
  `--spec-draft-p-min`), at most n_max tokens; the unsure token is not proposed.
- `VerifierRun`: SPRINTER. A verifier scores each drafted token from the draft's view; passed
  tokens are trusted (committed without the target) until one is flagged, the run cap is
  reached or an end token is drawn: that last token goes to the target. Approximate.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from ...numerics import confidence
from ...verifiers.base import DraftFeatures, Verifier
from ..run_policy import RunPolicy, Verdict
from ..sampling import masked
from .base import Prepared, Proposal, Proposer
from .prompt_lookup import SuffixIndex

if TYPE_CHECKING:
    from ...backend.llama import DecodeOutput
    from ..context import DecodeContext


class Decision(Enum):
    """A stop rule's word on the token just drafted."""

    CONTINUE = "continue"  # draft another
    STOP = "stop"  # propose what is drafted
    DROP_AND_STOP = "drop"  # propose what is drafted, less this token


class StopRule(ABC):
    needs_hidden: bool = False
    exact: bool = True

    def begin(self) -> None:  # noqa: B027 (optional hook)
        """A new reply starts."""

    @abstractmethod
    def after(self, ctx: DecodeContext, out: DecodeOutput, token: int, drafted: int,
              context: list[int]) -> Decision:
        """The decision on the `drafted`-th token of this round, `token`. `context` is the
        committed sequence and the drafted tokens, `token` last."""

    @property
    def trusted(self) -> int:
        """Leading tokens of the round just drafted to commit without the target."""
        return 0

    @property
    def ended_by(self) -> str | None:
        """What ended the round just drafted, for the counters (SPRINTER: flag | cap | eog)."""
        return None

    def feedback(self, accepted: bool) -> None:  # noqa: B027 (optional hook)
        """The target's test on the first untrusted token."""


# SPRINTER's own counters (Sprinter.counters): what ended each untested run
RUN_END_COUNTERS = {"flag": "flags", "cap": "cap_hits", "eog": "eog_checks"}


@dataclass
class FixedLength(StopRule):
    k: int = 4

    def after(self, ctx: DecodeContext, out: DecodeOutput, token: int, drafted: int,
              context: list[int]) -> Decision:
        done = drafted >= min(self.k, max(1, ctx.remaining)) or ctx.text_eog(token)
        return Decision.STOP if done else Decision.CONTINUE


@dataclass
class MinProb(StopRule):
    """Draft while the draft's top probability stays at p_min or above (llama.cpp's
    `--spec-draft-p-min`), at most n_max tokens."""

    p_min: float = 0.75
    n_max: int = 16

    def after(self, ctx: DecodeContext, out: DecodeOutput, token: int, drafted: int,
              context: list[int]) -> Decision:
        if drafted > 1 and confidence(out.logits[0])[0] < self.p_min:
            return Decision.DROP_AND_STOP
        if drafted >= min(self.n_max, max(1, ctx.remaining)) or ctx.text_eog(token):
            return Decision.STOP
        return Decision.CONTINUE


@dataclass
class VerifierRun(StopRule):
    """SPRINTER's rule. The run history (tokens since the last flag, the last catch-up's
    outcome) is a feature some verifiers read. `on_drafted(features, scored, passed)` sees every
    drafted token with what the verifier read (the on-policy collector records them)."""

    verifier: Verifier
    threshold: float
    run_cap: int | None = 20
    verify_eog: bool = True
    on_drafted: Callable[[DraftFeatures, bool, bool], None] | None = None
    exact = False

    def __post_init__(self) -> None:
        self.needs_hidden = self.verifier.needs_hidden or self.on_drafted is not None
        # a verifier rising in the draft's max probability alone decides by that probability
        # outside a narrow band around its cut: the same decisions, a model run only inside
        self._band = self.verifier.max_prob_band(self.threshold)
        self.run_policy = RunPolicy(self.threshold, self.run_cap)
        self.begin()

    def begin(self) -> None:
        self.since_flag = 0
        self.last_outcome = 0  # 0 none yet, 1 accepted, 2 rejected
        self._passed = 0
        self._ended: str | None = None

    def after(self, ctx: DecodeContext, out: DecodeOutput, token: int, drafted: int,
              context: list[int]) -> Decision:
        timings, sampler = ctx.stats.timings, ctx.sampler
        features = DraftFeatures(
            hidden=out.hidden[0] if out.hidden is not None else None,
            logits=out.logits[0], token=token, run_position=drafted - 1,
            output_position=ctx.produced + drafted - 1,
            temperature=0.0 if sampler.params.greedy else sampler.params.temperature,
            since_flag=self.since_flag, last_outcome=self.last_outcome)

        def score() -> float:
            t0 = ctx.clock()
            if self._band is not None and not self._band[0] <= features.max_prob < self._band[1]:
                value = math.inf if features.max_prob >= self._band[1] else -math.inf
            else:
                value = self.verifier.score(features)
            timings.verifier_seconds += ctx.clock() - t0
            return value

        judged = not (self.verify_eog and ctx.text_eog(token))
        verdict = self.run_policy.verdict(drafted, score if judged else None)
        passed = verdict is Verdict.KEPT
        self.since_flag = 0 if verdict is Verdict.FLAGGED else self.since_flag + 1
        self._ended = _ENDED_BY.get(verdict)
        if self.on_drafted is not None:
            self.on_drafted(features, verdict in (Verdict.KEPT, Verdict.FLAGGED), passed)
        if passed and drafted < ctx.remaining:
            return Decision.CONTINUE
        self._passed = drafted if passed else drafted - 1  # all passed: the budget ended the run
        return Decision.STOP

    @property
    def trusted(self) -> int:
        return self._passed

    @property
    def ended_by(self) -> str | None:
        return self._ended

    def feedback(self, accepted: bool) -> None:  # noqa: B027 (optional hook)
        self.last_outcome = 1 if accepted else 2


class CopyGuard(VerifierRun):
    """SPRINTER whose copies always go to the target: a drafted token that continues a verbatim
    span of the prompt or the reply (the lookup matcher's continuation, a match of at least 3
    tokens) is flagged whatever the verifier says. In an edit the draft copies the input with
    high confidence exactly where the target changes it; this sends those tokens to the test."""

    def begin(self) -> None:
        super().begin()
        self.index = SuffixIndex()

    def after(self, ctx: DecodeContext, out: DecodeOutput, token: int, drafted: int,
              context: list[int]) -> int:
        decision = super().after(ctx, out, token, drafted, context)
        passed = decision is Decision.CONTINUE or self._passed == drafted  # (the budget may end the run)
        if not passed:
            return decision
        self.index.extend(context[:-1])
        match, end = self.index.match()
        if match and end < len(self.index.seq) and self.index.seq[end] == token:
            self._ended = "flag"
            self.since_flag = 0
            self._passed = drafted - 1
            return Decision.STOP
        return decision


_ENDED_BY = {Verdict.FLAGGED: "flag", Verdict.CAPPED: "cap", Verdict.UNSCORED: "eog"}


class DraftProposer(Proposer):
    name = "draft"
    uses_draft = True

    def __init__(self, rule: StopRule):
        self.rule = rule
        self.exact = rule.exact

    def begin(self, ctx: DecodeContext, prompt: list[int]) -> None:
        self.rule.begin()

    def propose(self, ctx: DecodeContext, seq: list[int]) -> Proposal:
        sampler, grammar = ctx.sampler, ctx.grammar
        tokens: list[int] = []
        qs: list[Prepared] = []
        moved = 0  # tokens consumed into the grammar, rolled back before returning
        try:
            while True:
                context = seq + tokens
                out = ctx.draft_step(context, hidden=self.rule.needs_hidden)
                row = out.logits[0]
                if grammar is not None:  # q is the draft's masked distribution, as p is the target's
                    row = masked(row, grammar.mask())
                q = sampler.prepare(row, context)
                token = sampler.draw(q)
                if grammar is not None:
                    moved += grammar.consume([token])
                tokens.append(token)
                qs.append(q)
                decision = self.rule.after(ctx, out, token, len(tokens), context + [token])
                if decision is Decision.CONTINUE:
                    continue
                if decision is Decision.DROP_AND_STOP:
                    tokens.pop()
                    qs.pop()
                break
        finally:
            if grammar is not None:
                grammar.rollback(moved)
        ended = self.rule.ended_by
        return Proposal(tokens, qs, trusted=self.rule.trusted, proposer="draft", drafted=len(tokens),
                        ended_by=ended, bumps=(RUN_END_COUNTERS[ended],) if ended else ())

    def feedback(self, ctx: DecodeContext, proposal: Proposal, accepted: int) -> None:
        if len(proposal) > proposal.trusted:
            self.rule.feedback(accepted > 0)
