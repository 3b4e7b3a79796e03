"""The acceptor of the speculative loop: one target decode scores a proposal.

Trusted leading tokens (SPRINTER's passed ones) are committed as they are; every other
proposed token goes through the p/q test against the target's row that predicts it, in order,
and the first rejection ends the round with a token drawn from the residual; when all pass,
the target's last row gives a bonus token. An empty proposal is one plain target step, so
`ar` is the loop with no proposer. Under greedy decoding the test is "the target's argmax
equals the proposed token", and the output is token-identical to `ar`.

Forced leading tokens (the only ones a grammar allows there) come before the trusted ones and
are committed as they are: a point mass under the masked target. With a grammar on the
context every row tested or sampled from is masked to the tokens allowed at its position, so
the reference is the target's distribution restricted to the grammar and renormalised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .context import DecodeContext, Step
from .proposers.base import Proposal
from .sampling import masked
from .stats import Origin


@dataclass
class Round:
    step: Step  # committed tokens with their origin
    accepted: int  # proposed untrusted tokens the target accepted
    tested: int = 0  # proposed tokens that went through the p/q test
    rows: np.ndarray | None = None  # with all_rows: the target's row predicting each proposed token


def accept(ctx: DecodeContext, seq: list[int], proposal: Proposal, *, all_rows: bool = False) -> Round:
    """One round. `all_rows`: the target also scores the trusted tokens (what the on-policy
    collector labels them with); the decode is the same call with more logits rows."""
    tokens, forced = proposal.tokens, proposal.forced
    trusted = forced + proposal.trusted  # leading tokens committed untested
    step: Step = [(t, Origin.FORCED) for t in tokens[:forced]]
    step += [(t, Origin.KEPT) for t in tokens[forced:trusted]]
    if trusted and trusted == len(tokens):  # nothing to test (forced only, or the budget ended the run)
        return Round(step, 0)
    sampler = ctx.sampler
    n_test = len(tokens) - trusted
    masks = _masks(ctx, tokens, trusted)
    n_rows = len(tokens) + 1 if all_rows else n_test + 1
    out = ctx.target_step(seq + tokens, n_logits=n_rows)
    logits = out.logits[n_rows - n_test - 1:]
    for i in range(n_test):
        j = trusted + i
        token, context = tokens[j], seq + tokens[:j]
        p = sampler.prepare(logits[i] if masks is None else masked(logits[i], masks[i]), context)
        ok, replacement = sampler.verify(token, p, proposal.q[j])
        if not ok:
            assert replacement is not None
            ctx.record_target(logits[i], replacement)
            step.append((replacement, Origin.RESAMPLED))
            return Round(step, i, i + 1, out.logits if all_rows else None)
        ctx.record_target(logits[i], token)
        step.append((token, _ACCEPTED[proposal.proposer_of(j)]))
    if not (tokens and ctx.text_eog(tokens[-1])):
        row = logits[n_test]
        bonus = sampler.draw(sampler.prepare(row if masks is None else masked(row, masks[n_test]),
                                             seq + tokens))
        ctx.record_target(row, bonus)
        step.append((bonus, Origin.BONUS if tokens else Origin.TARGET))
    return Round(step, n_test, n_test, out.logits if all_rows else None)


_ACCEPTED = {"draft": Origin.ACCEPTED, "copy": Origin.COPIED, "grammar": Origin.GUIDED}


def _masks(ctx: DecodeContext, tokens: list[int], untested: int) -> np.ndarray | None:
    """The grammar's mask at each tested position and the bonus row's (None: no grammar)."""
    grammar = ctx.grammar
    if grammar is None:
        return None
    moved = grammar.consume(tokens[:untested])
    try:
        if moved < untested:
            raise RuntimeError(f"the grammar rejects an untested proposed token: {tokens[moved]}")
        return grammar.masks_along(tokens[untested:])
    finally:
        grammar.rollback(moved)
