"""Splice: the copy where the source continues, the draft model where the reply departs from it,
in one proposal.

An edit that rewrites many lines leaves its source every few tokens (a type hint after each
parameter, an f-string for each `%` format). Prompt lookup has nothing to propose there, so
every token the copy cannot give costs a plain target step. Here, where no copy continues the
reply but one stood before (the reply is reworking a source), the draft writes greedily, up to
`write_len` tokens; as soon as what it wrote lines up with the source again (its last token,
two where they agree, found after where the copy stood within the copy policy's anchor window
widened by what it wrote) the copy's continuation follows, with the edits learned so far made.
The target checks the written tokens and the copy in one call. Every token is a point mass (a
greedy draft token, a copied token), so the p/q test keeps the output the target's.

Writing is priced per segment from this machine's costs at the current depth: the draft's
catch-up over the tokens it has not read (one call), its steps, and the target rows the
written tokens add, against the plain steps they would replace; after drafting, the proposal
is cut where tokens per millisecond peak (written tokens at their learned acceptance, copied
ones at the anchored copies'). What written tokens earn is learned per kind of request
(`WriteEvidence`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ...costs.evidence import Rate
from ...costs.pricing import best_prefix
from .base import Proposal, Proposer
from .copy_evidence import CopyEvidence
from .copy_state import NO_COPY
from .prompt_lookup import MAX_PROPOSAL, SHIPPED, CopiedToken, CopyPolicy, PromptLookup

if TYPE_CHECKING:
    from ..context import DecodeContext

WRITE_PRIOR = 0.6  # P(the target accepts a written token) before a reply showed it
WRITE_LENGTH_PRIOR = 3.0  # tokens the draft writes before the copy resumes, before any showed it


@dataclass
class WriteEvidence:
    """What the draft's writing at departures earned, per kind of request."""

    accept: Rate = field(default_factory=lambda: Rate(WRITE_PRIOR, 8.0, 400.0))
    length: Rate = field(default_factory=lambda: Rate(WRITE_LENGTH_PRIOR, 4.0, 100.0))


@dataclass
class Written:
    """The round's written part: how many tokens, where the copy resumed after them (source
    position, 0: it did not), how many of their last tokens line up with the source, and the
    reply as it stands after them."""

    tokens: int
    resume: int
    aligned: int
    reply: list[int]


class Splice(Proposer):
    """The copy (`PromptLookup`), and the draft writing where it departs (the module's docstring).
    `copy_policy`: the copy's (its anchor window is where the written tokens look for the source)."""

    name = "splice"
    uses_draft = True

    def __init__(self, evidence: CopyEvidence | None = None, writes: WriteEvidence | None = None, *,
                 write_len: int = 8, copy_policy: CopyPolicy = SHIPPED):
        self.copy = PromptLookup(evidence, copy_policy=copy_policy)
        self.writes = writes if writes is not None else WriteEvidence()
        self.write_len = write_len
        self.written: Written | None = None  # the last proposal's written part

    def begin(self, ctx: DecodeContext, prompt: list[int]) -> None:
        self.copy.begin(ctx, prompt)
        if ctx.has_draft and ctx.draft_behind(prompt) > 1:  # a plan switched to mid-reply: it was priced
            ctx.draft_step(prompt)

    def propose(self, ctx: DecodeContext, seq: list[int]) -> Proposal:
        self.written = None
        proposal = self.copy.continue_copy(ctx, seq)
        if proposal is not NO_COPY:
            return proposal
        reworking = self.copy.cursor.at is not None  # the reply is reworking a source (a copy stood)
        if not reworking or not ctx.has_draft or ctx.remaining <= 2 or not self._pays(ctx, seq):
            return Proposal()
        tokens, resume, aligned = self._draft(ctx, seq)
        if not tokens:
            return Proposal()
        return self._proposal(ctx, seq, tokens, resume, aligned)

    # ------------------------------------------------------------------ writing
    def _pays(self, ctx: DecodeContext, seq: list[int]) -> bool:
        """Whether writing is predicted cheaper per token than plain steps: the draft's catch-up
        and steps plus the target rows they add, over the tokens they are expected to yield."""
        assert ctx.costs is not None, "splice prices its proposals with this machine's costs"
        costs = ctx.costs.at(len(seq))
        if costs.draft is None:
            return False
        a, d = self.writes.accept.value, max(1, round(self.writes.length.value))
        behind = max(1, ctx.draft_behind(seq))
        draft_ms = costs.draft.cost(behind) + (d - 1) * costs.draft.cost(1)
        yield_ = 1 + sum(a ** i for i in range(1, d + 1))
        return (draft_ms + costs.target.all_rows(d + 1)) / yield_ < costs.target.cost(1)

    def _draft(self, ctx: DecodeContext, seq: list[int]) -> tuple[list[int], int, int]:
        """The draft's greedy tokens after `seq`, until the source resumes after them (or
        `write_len`, an end token, the budget): (tokens, source position the copy resumes at or
        0, tokens lined up)."""
        stood, index = self.copy.cursor.at, self.copy.index
        window = self.copy.copy_policy.anchor_window
        assert stood is not None
        tokens: list[int] = []
        room = min(self.write_len, ctx.remaining - 2)
        while len(tokens) < room:
            out = ctx.draft_step(seq + tokens)
            token = int(np.argmax(out.logits[0]))
            tokens.append(token)
            if ctx.text_eog(token):
                break
            # the source may have lost about as many tokens as the reply wrote
            resume = index.anchor(stood, window + len(tokens), tail=tokens)
            if resume:
                s = index.seq
                aligned = 2 if len(tokens) >= 2 and resume >= 2 and s[resume - 2] == tokens[-2] else 1
                return tokens, resume, aligned
        return tokens, 0, 0

    def _proposal(self, ctx: DecodeContext, seq: list[int], written: list[int], resume: int,
                  aligned: int) -> Proposal:
        """The written tokens and, after them, the copy from `resume`, cut where tokens per
        millisecond peak (nothing: a plain step)."""
        assert ctx.costs is not None
        s = self.copy.index.seq
        copy: list[CopiedToken] = []
        if resume:
            room = max(min(MAX_PROPOSAL, max(ctx.remaining - 1, 0)) - len(written), 0)
            stop = self.copy.index.copy_end(resume, min(len(s), resume + room))
            copy = self.copy.copy_from(seq + written, resume, max(stop, resume))[:room]
        target = ctx.costs.at(len(seq)).target
        copy_rate = self.copy.evidence.rate(self.copy.evidence.anchor_slot)
        n = best_prefix([self.writes.accept.value] * len(written) + [copy_rate] * len(copy), target)
        if n == 0:
            return Proposal()
        tokens = (written + [t.token for t in copy])[:n]
        w, c = min(n, len(written)), max(0, n - len(written))
        self.written = Written(w, resume if c else 0, aligned, seq + written[:w])
        if c:
            self.copy.offer_copy(copy, resume, len(seq) + w)
        segments = (("draft", w),) + ((("copy", c),) if c else ())
        return Proposal(tokens, list(tokens), proposer="splice", drafted=len(written), copied=c,
                        bumps=("writes",) + (("resumed",) if c else ()), segments=segments)

    def feedback(self, ctx: DecodeContext, proposal: Proposal, accepted: int) -> None:
        w = self.written
        if w is None:
            self.copy.feedback(ctx, proposal, accepted)
            return
        self.writes.accept.add_run(min(accepted, w.tokens), stopped=accepted < w.tokens)
        if accepted < w.tokens or not w.resume:  # the target wrote otherwise, or no copy followed
            return
        self.writes.length.add(float(w.tokens), 1)
        # what the reply wrote since the departure replaced that source
        self.copy.learn_departure(w.reply, w.resume - w.aligned, len(w.reply) - w.aligned)
        copied_part = Proposal(proposal.tokens[w.tokens:], proposal.q[w.tokens:], proposer="lookup",
                               copied=len(proposal) - w.tokens)
        self.copy.feedback(ctx, copied_part, accepted - w.tokens)
