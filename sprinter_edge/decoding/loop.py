"""One speculative loop: a proposer guesses, the acceptor has the target score the guess.

Every target-using method is a configuration of this loop (decoding/__init__.py):
`ar` proposes nothing, `sd` drafts k tokens, `sprinter` drafts until its verifier flags a
token and trusts the rest, `lookup` copies spans of the prompt and the reply so far, `staged`
has the draft check such a span in one batch first. A new way to propose is one file in
proposers/.

With a grammar (`ctx.grammar`) every proposer runs wrapped in `Constrained` (forced tokens,
the grammar's fast-forward span, the proposal cut to what the grammar allows), the acceptor
masks the target's rows, and each round's committed tokens move the grammar on.
"""

from __future__ import annotations

from collections.abc import Iterator

from .acceptor import accept
from .context import DecodeContext, Step
from .proposers.base import Proposer
from .proposers.grammar import Constrained
from .strategy import Plan, Strategy


def run_loop(ctx: DecodeContext, prompt: list[int], proposer: Proposer) -> Iterator[Step]:
    grammar = ctx.grammar
    if grammar is not None:
        proposer = Constrained(proposer)
    seq = list(prompt)
    proposer.begin(ctx, seq)
    while True:
        proposal = proposer.propose(ctx, seq)
        done = accept(ctx, seq, proposal)
        ctx.stats.counters.add_round(proposal, done.tested, done.accepted)
        proposer.feedback(ctx, proposal, done.accepted)
        committed = [t for t, _ in done.step]
        if grammar is not None and grammar.consume(committed) != len(committed):
            raise RuntimeError(f"the grammar rejects committed tokens {committed} ({proposal.source})")
        seq.extend(committed)
        yield done.step


class LoopStrategy(Strategy):
    """A strategy that is the loop with the proposer `make_proposer` builds."""

    def make_proposer(self, ctx: DecodeContext, plan: Plan | None = None) -> Proposer:
        """The proposer for `plan` (None: this strategy's settings in `ctx`)."""
        raise NotImplementedError

    def run(self, ctx: DecodeContext, prompt: list[int]) -> Iterator[Step]:
        return run_loop(ctx, prompt, self.make_proposer(ctx))
