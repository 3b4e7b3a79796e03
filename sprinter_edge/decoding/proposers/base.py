"""What a proposer hands the speculative loop, and the interface every proposer implements.

A proposer guesses the next few tokens cheaply (the draft model, a span of the prompt, ...);
the loop's acceptor (acceptor.py) has the target score them in one decode. A proposal carries,
for each token, the distribution it was drawn from: a probability vector, or a token id for a
point mass (a deterministic guess: a copied span, or any greedy choice). With that the p/q
test keeps the output distributed as the target's. `trusted` leading tokens are committed
without the target (SPRINTER's passed tokens): only an approximate proposer sets it. `forced`
leading tokens (before the trusted ones) are the only tokens a grammar allows where they stand:
a point mass under the masked target, so committing them untested is exact.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..context import DecodeContext

Prepared = int | np.ndarray  # a sampler-prepared distribution; an int is a point mass


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    q: list[Prepared] = field(default_factory=list)  # one per token
    trusted: int = 0  # tokens after the forced ones committed without the target (approximate)
    forced: int = 0  # leading tokens the grammar leaves no choice for: committed as they are (exact)
    grammar: int = 0  # tokens after forced + trusted that the grammar proposed (fast-forward)
    proposer: str = ""  # who proposed it: draft | lookup | staged | splice | grammar
    # for the counters (stats.Counters.add_round): tokens the draft produced, tokens a copy
    # offered (staged: before the draft's cut), and what ended a SPRINTER run
    drafted: int = 0
    copied: int = 0
    ended_by: str | None = None  # what ended an untested run (SPRINTER: flag | cap | eog)
    bumps: tuple[str, ...] = ()  # counters of the proposing method's own to add one to (Counters.extra)
    # where proposers mix (splice: the draft writes, then a copy): (proposer, tokens) in order,
    # for the tokens after the forced, trusted and grammar ones; empty: copies, then drafts
    segments: tuple[tuple[str, int], ...] = ()

    def __len__(self) -> int:
        return len(self.tokens)

    def cut(self, n: int) -> Proposal:
        """The first n tokens (a grammar refused the rest): the copies the cut drops are no longer
        offered; what the draft produced was produced all the same."""
        if n >= len(self.tokens):
            return self
        in_tokens = sum(self.proposer_of(j) == "copy" for j in range(len(self.tokens)))
        kept = sum(self.proposer_of(j) == "copy" for j in range(n))
        segments, left = [], n - self.forced - self.trusted - self.grammar
        for proposer, count in self.segments:
            if left > 0:
                segments.append((proposer, min(count, left)))
            left -= count
        return Proposal(self.tokens[:n], self.q[:n], trusted=min(self.trusted, n), proposer=self.proposer,
                        drafted=self.drafted, copied=self.copied - in_tokens + kept,
                        ended_by=self.ended_by, bumps=self.bumps, segments=tuple(segments))

    def proposer_of(self, j: int) -> str:
        """Who proposed token j: "grammar" (the fast-forward span), then "copy" (the `copied`
        tokens after it) or "draft", in the order `segments` gives where it gives one."""
        start = self.forced + self.trusted + self.grammar
        if j < start:
            return "grammar"
        if self.segments:
            for proposer, count in self.segments:
                if j < start + count:
                    return proposer
                start += count
            return "draft"
        # `copied` counts what a copy offered (staged: more than it kept); drafted tokens end it
        copies = min(self.copied, len(self.tokens) - start - self.drafted)
        return "copy" if j < start + copies else "draft"


class Proposer(ABC):
    """Guesses continuations of the committed sequence; learns from what the target kept."""

    name: str = ""
    uses_draft: bool = False
    exact: bool = True  # never sets `trusted`: the loop's output is the target's

    def begin(self, ctx: DecodeContext, prompt: list[int]) -> None:  # noqa: B027 (optional hook)
        """A reply starts from `prompt` (tokens committed before the first proposal)."""

    @abstractmethod
    def propose(self, ctx: DecodeContext, seq: list[int]) -> Proposal:
        """Tokens to follow `seq` (the committed sequence); an empty proposal is a plain step."""

    def feedback(self, ctx: DecodeContext, proposal: Proposal, accepted: int) -> None:  # noqa: B027
        """The target accepted the first `accepted` proposed tokens past the trusted ones."""


class NoProposal(Proposer):
    """Propose nothing: the loop is plain decoding (`ar`)."""

    name = "none"

    def propose(self, ctx: DecodeContext, seq: list[int]) -> Proposal:
        return Proposal()
