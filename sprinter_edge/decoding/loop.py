"""One speculative loop: a proposer guesses, the acceptor has the target score the guess.

Every target-using method is a configuration of this loop (decoding/__init__.py):
`ar` proposes nothing, `sd` drafts k tokens, `sprinter` drafts until its verifier flags a
token and trusts the rest, `lookup` copies spans of the prompt and the reply so far, `staged`
has the draft check such a span in one batch first. A new way to propose is one file in
proposers/.

With a grammar (`ctx.grammar`) every proposer runs wrapped in `Constrained` (forced tokens,
the grammar's fast-forward span, the proposal cut to what the grammar allows), the acceptor
masks the target's rows, and each round's committed tokens move the grammar on.

A proposer only makes the reply faster: where one fails (a bug, not a user-facing error), the
rest of the reply is the target's own steps, still exact, and the failure is logged. The tests
set SPRINTER_EDGE_STRICT=1, where it is raised instead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from functools import partial
from typing import TypeVar

from ..errors import SprinterError
from .acceptor import accept
from .context import DecodeContext, Step
from .proposers.base import Proposal, Proposer
from .proposers.grammar import Constrained
from .strategy import Plan, Strategy

log = logging.getLogger(__name__)
STRICT_ENV = "SPRINTER_EDGE_STRICT"  # "1": a proposer's failure is raised (the test suite)
T = TypeVar("T")


def _call_proposer(proposer: Proposer, call: Callable[[], T]) -> tuple[T | None, bool]:
    """(what `call` returned, True), or (None, False) where the proposer failed and is given
    up for this reply. User-facing errors (a context overflow, a grammar's) go on up."""
    try:
        return call(), True
    except SprinterError:
        raise
    except Exception as exc:
        if os.environ.get(STRICT_ENV) == "1":
            raise
        log.error("the %s proposer failed (%s: %s); the rest of this reply is the target's own "
                  "steps (exact, slower)", getattr(proposer, "name", "") or type(proposer).__name__,
                  type(exc).__name__, exc)
        log.debug("the proposer's failure", exc_info=True)
        return None, False


def run_loop(ctx: DecodeContext, prompt: list[int], proposer: Proposer) -> Iterator[Step]:
    grammar = ctx.grammar
    if grammar is not None:
        proposer = Constrained(proposer)
    seq = list(prompt)
    proposer.begin(ctx, seq)
    alive = True  # the proposer has not failed in this reply
    while True:
        proposal: Proposal | None = None
        if alive:
            proposal, alive = _call_proposer(proposer, partial(proposer.propose, ctx, seq))
        if proposal is None:
            proposal = Proposal()  # the target's own step
        done = accept(ctx, seq, proposal)
        ctx.stats.counters.add_round(proposal, done.tested, done.accepted)
        if alive:
            _, alive = _call_proposer(proposer, partial(proposer.feedback, ctx, proposal, done.accepted))
        committed = [t for t, _ in done.step]
        if grammar is not None and grammar.consume(committed) != len(committed):
            raise RuntimeError(f"the grammar rejects committed tokens {committed} ({proposal.proposer})")
        seq.extend(committed)
        yield done.step


class LoopStrategy(Strategy):
    """A strategy that is the loop with the proposer `make_proposer` builds."""

    def make_proposer(self, ctx: DecodeContext, plan: Plan | None = None) -> Proposer:
        """The proposer for `plan` (None: this strategy's settings in `ctx`)."""
        raise NotImplementedError

    def run(self, ctx: DecodeContext, prompt: list[int]) -> Iterator[Step]:
        return run_loop(ctx, prompt, self.make_proposer(ctx))
