"""Constrained decoding in the speculative loop: the grammar proposes what it alone decides.

`Constrained(inner)` wraps whatever proposer a strategy builds when the reply has a grammar
(`ctx.grammar`, loop.py). Each round's proposal is, in order:

1. forced tokens: where the mask allows exactly one token (or, once the grammar is done, only
   end-of-generation), that token is committed without a target test. Under the masked target
   it has probability 1, so this is exact, and it costs no target call when nothing follows.
   With logprobs on, a forced token needs the target's row: it joins the span below instead;
2. the grammar's fast-forward tokens (llguidance's canonical tokenization of text the grammar
   forces, which the target need not choose): a deterministic span, checked by the p/q test
   like a lookup span;
3. the inner proposer's proposal from there, cut at the first token the grammar rejects
   (a copied span; a draft proposal is drawn from the draft's masked distribution already).

An approximate inner proposer (SPRINTER: trusted tokens must lead the tested ones) gets the
forced tokens only, then its own proposal.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .base import Prepared, Proposal, Proposer

if TYPE_CHECKING:
    from ...grammar.engine import Matcher
    from ..context import DecodeContext

log = logging.getLogger(__name__)


class Constrained(Proposer):
    """Forced tokens, the grammar's fast-forward span, then `inner`'s proposal (see above)."""

    def __init__(self, inner: Proposer):
        self.inner = inner
        self.name = inner.name
        self.uses_draft = inner.uses_draft
        self.exact = inner.exact
        self._inner_proposal: Proposal | None = None  # what `inner` proposed this round (cut)
        self._span = 0  # grammar tokens tested before the inner proposal this round

    def begin(self, ctx: DecodeContext, prompt: list[int]) -> None:
        self.inner.begin(ctx, prompt)

    def propose(self, ctx: DecodeContext, seq: list[int]) -> Proposal:
        grammar = ctx.grammar
        assert grammar is not None, "Constrained runs only with a grammar on the context"
        self._inner_proposal, self._span = None, 0
        room = max(ctx.remaining, 1)
        moved = 0  # consumed into the grammar this round: rolled back before returning
        try:
            forced = self._forced(ctx, grammar, room)
            moved += len(forced)
            if forced and ctx.text_eog(forced[-1]):
                return Proposal(forced, list(forced), forced=len(forced), proposer="grammar")
            span: list[int] = []
            if self.inner.exact:
                span = self._span_tokens(ctx, grammar, room - len(forced) - 1)
                moved += len(span)
            prefix = forced + span
            inner = Proposal()
            if room > len(prefix) and not grammar.done() and not (span and ctx.text_eog(span[-1])):
                inner = self._inner(ctx, grammar, seq + prefix, len(prefix))
            self._inner_proposal, self._span = inner, len(span)
            qs: list[Prepared] = list(prefix)
            return Proposal(prefix + inner.tokens, qs + inner.q, trusted=inner.trusted,
                            forced=len(forced), grammar=len(span),
                            proposer=inner.proposer or "grammar", drafted=inner.drafted,
                            copied=inner.copied, ended_by=inner.ended_by, bumps=inner.bumps)
        finally:
            grammar.rollback(moved)

    def feedback(self, ctx: DecodeContext, proposal: Proposal, accepted: int) -> None:
        inner = self._inner_proposal
        if inner is not None and accepted >= self._span:  # the target reached the inner tokens
            self.inner.feedback(ctx, inner, accepted - self._span)

    # ------------------------------------------------------------------ parts
    @staticmethod
    def _forced(ctx: DecodeContext, grammar: Matcher, room: int) -> list[int]:
        """Leading tokens the grammar leaves no choice for, consumed into `grammar`; one end
        token once the grammar is done (which end token does not change the reply)."""
        tokens: list[int] = []
        untested = ctx.sampler.params.logprobs is None
        while len(tokens) < room:
            if grammar.done():
                token: int | None = grammar.tokenizer.eos_ids[0]
            elif untested:
                token = grammar.forced()
            else:
                break
            if token is None or grammar.consume([token]) != 1:
                break
            tokens.append(token)
            if ctx.text_eog(token):
                break
        return tokens

    @staticmethod
    def _span_tokens(ctx: DecodeContext, grammar: Matcher, room: int) -> list[int]:
        """The grammar's fast-forward tokens (and the forced tokens after them), consumed into
        `grammar`: a deterministic span for the target to test."""
        span: list[int] = []
        while len(span) < room and not grammar.done():
            token = grammar.forced()
            candidates = [token] if token is not None else grammar.ff_tokens()
            n = grammar.consume(candidates[:room - len(span)])
            span.extend(candidates[:n])
            if n == 0 or ctx.text_eog(span[-1]):
                break
        return span

    def _inner(self, ctx: DecodeContext, grammar: Matcher, context: list[int], ahead: int) -> Proposal:
        """The inner proposer's proposal after `context` (`ahead` tokens past the committed
        reply, which it sees as produced), cut at the first token the grammar rejects."""
        ctx.produced += ahead
        try:
            proposal = self.inner.propose(ctx, context)
        finally:
            ctx.produced -= ahead
        n = grammar.validate(proposal.tokens)
        if n == len(proposal.tokens):
            return proposal
        log.debug("%s proposal cut at %d of %d tokens by the grammar", proposal.proposer, n, len(proposal))
        return proposal.cut(n)
