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


def bucket_of(match: int, buckets: tuple[int, ...] = COPY_BUCKETS) -> int:
    """The copy evidence's bucket for a match of `match` tokens (`buckets`: where each starts)."""
    b = 0
    for i, lo in enumerate(buckets):
        if match >= lo:
            b = i
    return b


def _rates(prior: tuple[float, ...], anchor_prior: float) -> list[Rate]:
    return [Rate(p, COPY_PRIOR_WEIGHT, COPY_MEMORY) for p in (*prior, anchor_prior)]


@dataclass
class CopyEvidence:
    """Per-token acceptance of copied spans, per match-length bucket, plus the anchored slot;
    and, per source token, how often the target followed a copy there and how often it refused it.

    A token the target refuses more often than it copies is where copies end: the closing
    code fence of a pasted file is one (the prompt spells it `` + `\n\n`, a reply ```), a
    word kept in prose but renamed in code another. A proposal stops before it; the target
    writes that token itself, and copying it there counts for it."""

    rates: list[Rate] = field(default_factory=lambda: _rates(COPY_PRIOR, ANCHOR_PRIOR))
    followed: Counter[int] = field(default_factory=Counter)  # the target wrote it where a copy had it
    refused: Counter[int] = field(default_factory=Counter)
    buckets: tuple[int, ...] = COPY_BUCKETS  # the match length each bucket of `rates` starts at

    @classmethod
    def with_priors(cls, buckets: tuple[int, ...] = COPY_BUCKETS, prior: tuple[float, ...] = COPY_PRIOR,
                    anchor_prior: float = ANCHOR_PRIOR) -> CopyEvidence:
        """Evidence over other match-length buckets or priors (a policy tried in a replay:
        tools/replay.py); `prior[i]` is bucket i's, `anchor_prior` the anchored slot's."""
        if len(prior) != len(buckets) or list(buckets) != sorted(buckets) or buckets[0] < 1:
            raise ValueError(f"one prior per bucket, buckets ascending from 1 or more: {buckets}, {prior}")
        return cls(_rates(tuple(prior), anchor_prior), buckets=tuple(buckets))

    def bucket(self, match: int) -> int:
        """This evidence's bucket for a match of `match` tokens."""
        return bucket_of(match, self.buckets)

    @property
    def anchor_slot(self) -> int:
        """The anchored proposals' slot (ANCHOR with the shipped buckets)."""
        return len(self.buckets)

    def rate(self, b: int) -> float:
        return self.rates[b].value

    def add(self, b: int, accepted: int, stopped: bool) -> None:
        self.rates[b].add_run(accepted, stopped)

    def stops_at(self, token: int) -> bool:
        """The target refused this token more often than it copied it."""
        return self.refused[token] > self.followed[token]
