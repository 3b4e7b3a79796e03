"""What the replies so far showed, kept across replies: acceptance rates with priors.

One evidence type, `Rate`: a running mean that starts from a prior worth `weight` observations
and forgets: once it holds `memory` observations, older ones are scaled down so recent replies
weigh more (the kind of text changes between requests). The planner keeps the pair's rates
with it (how often the target accepts a drafted token, how often the verifier flags one); the
copy proposers keep one rate per match length (`CopyEvidence`), per kind of request.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

PLAN_PRIOR_WEIGHT = 32.0  # a planner's prior counts as this many observed tokens
PLAN_MEMORY = 512.0  # ... and it remembers at most this many
COPY_PRIOR_WEIGHT = 6.0  # a copy bucket's prior: a few tokens, so a reply's copies soon decide
COPY_MEMORY = 400.0

# match-length buckets of the copy evidence (a longer match is a safer copy), their priors,
# and the prior of an anchored proposal (a copy resumed after a departure: lower, never tried)
COPY_BUCKETS = (3, 4, 6, 10, 16)
COPY_PRIOR = (0.55, 0.7, 0.85, 0.92, 0.96)
ANCHOR_PRIOR = 0.7
ANCHOR = len(COPY_BUCKETS)  # the anchored proposals' slot


@dataclass
class Rate:
    """A running mean with a prior worth `weight` observations and at most `memory` of them."""

    value: float
    weight: float = PLAN_PRIOR_WEIGHT
    memory: float = PLAN_MEMORY

    def add(self, value: float, n: float) -> None:
        """`n` observations whose mean is `value`."""
        if n <= 0:
            return
        self.weight = min(self.weight, self.memory)
        self.value = (self.value * self.weight + value * n) / (self.weight + n)
        self.weight += n

    def add_run(self, accepted: int, stopped: bool) -> None:
        """A geometric run: `accepted` tokens passed, then one was refused (`stopped`) or the
        proposal ended. The rate is accepted tokens over accepted tokens plus refusals."""
        n = accepted + (1 if stopped else 0)
        if n:
            self.add(accepted / n, n)


def bucket_of(match: int) -> int:
    """The copy evidence's bucket for a match of `match` tokens."""
    b = 0
    for i, lo in enumerate(COPY_BUCKETS):
        if match >= lo:
            b = i
    return b


@dataclass
class CopyEvidence:
    """Per-token acceptance of copied spans, per match-length bucket, plus the anchored slot;
    and, per source token, how often the target copied it and how often it refused it.

    A token the target refuses more often than it copies is where copies end: the closing
    code fence of a pasted file is one (the prompt spells it `` + `\n\n`, a reply ```), a
    word kept in prose but renamed in code another. A proposal stops before it; the target
    writes that token itself, and copying it there counts for it."""

    rates: list[Rate] = field(default_factory=lambda: [
        Rate(p, COPY_PRIOR_WEIGHT, COPY_MEMORY) for p in (*COPY_PRIOR, ANCHOR_PRIOR)])
    copied: Counter[int] = field(default_factory=Counter)
    refused: Counter[int] = field(default_factory=Counter)

    def rate(self, b: int) -> float:
        return self.rates[b].value

    def add(self, b: int, accepted: int, stopped: bool) -> None:
        self.rates[b].add_run(accepted, stopped)

    def stops_at(self, token: int) -> bool:
        """The target refused this token more often than it copied it."""
        return self.refused[token] > self.copied[token]


@dataclass
class Evidence:
    """Everything learned from replies that a proposer or the planner reads: the pair's
    acceptance rates and, per kind of request, the copy evidence."""

    sd_accept: Rate = field(default_factory=lambda: Rate(0.75))
    flag_rate: Rate = field(default_factory=lambda: Rate(0.2))
    flagged_accept: Rate = field(default_factory=lambda: Rate(0.5))
    copies: dict[str, CopyEvidence] = field(default_factory=dict)

    def copy(self, kind: str) -> CopyEvidence:
        return self.copies.setdefault(kind, CopyEvidence())

    def observe_sd(self, accepted: int, rejected: int) -> None:
        """Drafted tokens the p/q test accepted and rejected."""
        n = accepted + rejected
        if n:
            self.sd_accept.add(accepted / n, n)

    def observe_sprinter(self, kept: int, flagged: int, accepted: int, rejected: int) -> None:
        """Drafted tokens the verifier kept and flagged, and the flagged tokens' test outcomes."""
        scored = kept + flagged
        if scored:
            self.flag_rate.add(flagged / scored, scored)
        n = accepted + rejected
        if n:
            self.flagged_accept.add(accepted / n, n)
