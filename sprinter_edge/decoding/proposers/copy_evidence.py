"""What copies taught: per-token acceptance of copied spans by match length, and the tokens
where copies end. The copy proposers keep one per kind of request (`Evidence.of_kind`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ...costs.evidence import Rate

COPY_PRIOR_WEIGHT = 6.0  # a copy bucket's prior: a few tokens, so a reply's copies soon decide
COPY_MEMORY = 400.0

# match-length buckets of the copy evidence (a longer match is a safer copy), their priors,
# and the prior of an anchored proposal (a copy resumed after a departure: lower, never tried)
COPY_BUCKETS = (3, 4, 6, 10, 16)
COPY_PRIOR = (0.55, 0.7, 0.85, 0.92, 0.96)
ANCHOR_PRIOR = 0.7
ANCHOR = len(COPY_BUCKETS)  # the anchored proposals' slot


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
