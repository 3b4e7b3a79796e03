"""Splice: the copy where the source continues, the draft model where the reply departs from it,
in one proposal.

An edit that rewrites many lines leaves its source every few tokens (a type hint after each
parameter, an f-string for each `%` format). Prompt lookup has nothing to propose there, so
every token the copy cannot give costs a plain target step. Here, where no copy continues the
reply but one stood before (the reply is reworking a source), the draft writes greedily, up to
`write_len` tokens; as soon as what it wrote lines up with the source again (its last token,
two where they agree, found in the anchor window after where the copy stood) the copy's
continuation follows, with the edits learned so far made. The target checks the written
tokens and the copy in one call. Every token is a point mass (a greedy draft token, a copied
token), so the p/q test keeps the output the target's.

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
from .base import Proposal
from .copy_evidence import ANCHOR, CopyEvidence
from .prompt_lookup import ANCHOR_WINDOW, MAX_PROPOSAL, SEPARATOR, PromptLookup

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
class _Written:
    """The round's written part: how many tokens, where the copy resumed after them (source
    position, 0: it did not), how many of their last tokens line up with the source, and the
    reply as it stands after them."""

    tokens: int
    resume: int
    aligned: int
    reply: list[int]


class Splice(PromptLookup):
    """Prompt lookup whose departures the draft writes (see the module's docstring)."""

    name = "splice"

    def __init__(self, evidence: CopyEvidence | None = None, writes: WriteEvidence | None = None, *,
                 write_len: int = 8, anchor: bool = True, learn_edits: bool = True):
        super().__init__(evidence, stage=False, anchor=anchor, learn_edits=learn_edits)
        self.uses_draft = True
        self.writes = writes if writes is not None else WriteEvidence()
        self.write_len = write_len
        self._written: _Written | None = None  # the last proposal's written part

    def begin(self, ctx: DecodeContext, prompt: list[int]) -> None:
        super().begin(ctx, prompt)
        if ctx.has_draft and ctx.draft_behind(prompt) > 1:  # a plan switched to mid-reply: it was priced
            ctx.draft_step(prompt)

    def propose(self, ctx: DecodeContext, seq: list[int]) -> Proposal:
        self._written = None
        return super().propose(ctx, seq)

    # ------------------------------------------------------------------ writing
    def _no_copy(self, ctx: DecodeContext, seq: list[int]) -> Proposal:
        if self._source is None or not ctx.has_draft or ctx.remaining <= 2 or not self._pays(ctx, seq):
            return Proposal()
        tokens, resume, aligned = self._draft(ctx, seq)
        if not tokens:
            return Proposal()
        return self._proposal(ctx, seq, tokens, resume, aligned)

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
        assert self._source is not None
        tokens: list[int] = []
        room = min(self.write_len, ctx.remaining - 2)
        while len(tokens) < room:
            out = ctx.draft_step(seq + tokens)
            token = int(np.argmax(out.logits[0]))
            tokens.append(token)
            if ctx.text_eog(token):
                break
            # the source may have lost about as many tokens as the reply wrote
            resume = self.index.anchor(self._source, ANCHOR_WINDOW + len(tokens), tail=tokens)
            if resume:
                s = self.index.seq
                aligned = 2 if len(tokens) >= 2 and resume >= 2 and s[resume - 2] == tokens[-2] else 1
                return tokens, resume, aligned
        return tokens, 0, 0

    def _proposal(self, ctx: DecodeContext, seq: list[int], written: list[int], resume: int,
                  aligned: int) -> Proposal:
        """The written tokens and, after them, the copy from `resume`, cut where tokens per
        millisecond peak (nothing: a plain step)."""
        assert ctx.costs is not None
        s = self.index.seq
        copy: list[int] = []
        if resume:
            room = min(MAX_PROPOSAL, max(ctx.remaining - 1, 0)) - len(written)
            stop = min(len(s), resume + max(room, 0))
            if SEPARATOR in s[resume:stop]:
                stop = s.index(SEPARATOR, resume)
            copy, _ = self._copy(seq + written, resume, max(stop, resume))
            copy = copy[:max(room, 0)]
            cut = next((i for i, t in enumerate(copy) if self._as_source(i) and self.evidence.stops_at(t)),
                       len(copy))
            copy = copy[:cut]
        target = ctx.costs.at(len(seq)).target
        probs = [self.writes.accept.value] * len(written) + [self.evidence.rate(ANCHOR)] * len(copy)
        n = best_prefix(probs, target)
        if n == 0:
            return Proposal()
        tokens = (written + copy)[:n]
        w, c = min(n, len(written)), max(0, n - len(written))
        self._written = _Written(w, resume if c else 0, aligned, seq + written[:w])
        if c:
            self._bucket, self._end, self._round_start = ANCHOR, resume, len(seq) + w
        segments = (("draft", w),) + ((("copy", c),) if c else ())
        return Proposal(tokens, list(tokens), source="splice", drafted=len(written), copied=c,
                        bumps=("writes",) + (("resumed",) if c else ()), segments=segments)

    def feedback(self, ctx: DecodeContext, proposal: Proposal, accepted: int) -> None:
        w = self._written
        if w is None:
            super().feedback(ctx, proposal, accepted)
            return
        self.writes.accept.add_run(min(accepted, w.tokens), stopped=accepted < w.tokens)
        if accepted < w.tokens:  # the target wrote otherwise: still departed from the source
            return
        if not w.resume:
            return
        self.writes.length.add(float(w.tokens), 1)
        if self._depart is not None:  # what the reply wrote since the departure replaced that source
            (d_src, d_rep), self._depart = self._depart, None
            self._learn(w.reply, d_src, d_rep, w.resume - w.aligned, len(w.reply) - w.aligned)
        copied = Proposal(proposal.tokens[w.tokens:], proposal.q[w.tokens:], source="lookup",
                          copied=len(proposal) - w.tokens)
        super().feedback(ctx, copied, accepted - w.tokens)

