"""Prompt lookup: propose the tokens that followed the longest earlier match of the context.

The last few committed tokens are looked up in the prompt and the reply so far; where they
occurred before, what followed them then is the proposal. It costs no model call, and replies
that copy (edits, refactors, answers that quote a pasted file) accept long spans of it. How
long a proposal pays is this machine's question: the target scores k + 1 rows in one decode,
so a proposal of k tokens that the target accepts with probability a per token yields
(1 - a^(k+1)) / (1 - a) tokens for c(k + 1) ms, against c(1) ms for one plain step. The
proposer picks the k that maximises tokens per ms from the measured cost curve (which is not
monotone: a call of 16 tokens can be cheaper than one of 12) and proposes nothing when no k
beats a plain step. `a` is learned per length of the match (a longer match is a safer copy)
and kept across replies of the same kind of request; a copy that has held is priced by how
long it has held (a fresh 3-token match that the reply then follows for 40 tokens is as safe
as a 40-token match), so proposals grow to full calls within a few rounds. A copy stops before
a token the target has refused more often than it copied (`CopyEvidence.stops_at`: the
prompt's closing code fence, spelled otherwise by the reply).

After a departure (the target wrote something other than the copy: the edit) the reply
usually resumes copying a few source tokens later, but a fresh match needs MIN_MATCH tokens of
agreement first. The proposer keeps where its copy stood in the source and re-anchors there:
the reply's last token (two where they agree) found within ANCHOR_WINDOW tokens after that
point continues the copy at once. Anchored proposals keep acceptance evidence of their own.
A match that ends within ALIGN_WINDOW tokens after that point continues the copy too, and wins
over a longer one elsewhere: in a file of similar functions, the reply's previous function,
with the edit already made, matches longer than the function's own source, and goes on as
that function did. Where no match lies near it and the copy goes on from the reply's own text,
it gives way to the source within the proposal, where two of its tokens meet the source just
after where the copy left it: the previous function's signature, then this one's operator.

A proposal is cut where tokens per millisecond peak, which may fall inside the tokens an edit
writes (half of a type hint). When the target's token after it is the edit's next one, the
copy goes on inside the edit, then with the source after it; read against the source, that
token would be a departure, and the copy would look for its place again.

A reformat changes the tokens at nearly every gap (`,b` is one token, `, b` two), so no match
of tokens follows it. Read without its blanks, the reply still follows its source: the copy
goes on from where the reply stands in the source byte by byte, laid out by the whitespace
rules the reply has shown so far (layout.py), and, once the reply is laying out anew, stops
before a kind of gap it has not shown yet (the target's own token there shows it).

An edit that rewrites many lines rewrites lines of one kind (type hints: the `def` lines), so
each copied token is priced by what lines of its source line's kind let through so far in the
reply (line_rates.py), and a proposal ends before the next line of an edited kind.

Staged (with a draft model): the span is first checked by the draft in ONE batched decode,
cut at the draft's first disagreement, and the draft's own token at the cut proposed in its
place; the target then scores only what survived. The cut is a deterministic function of the
context, so every proposal stays a point mass and the p/q test keeps the output exact.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ...costs.pricing import best_length, best_prefix, best_staged_length
from .base import Proposal, Proposer
from .copy_evidence import CopyEvidence
from .edit_memory import MAX_REPLACED, EditMemory
from .layout import Layout
from .line_rates import LineRates

if TYPE_CHECKING:
    from ..context import DecodeContext

MIN_MATCH = 3  # shortest suffix looked up (shorter matches are noise)
MAX_MATCH = 32  # longest suffix compared
MAX_PROPOSAL = 63  # a target call of at most 64 tokens (past 64 rows a row costs no less on CPUs)
SPEC_FACTOR = 2  # propose at most this many tokens per matched token (SuffixDecoding's cap)
CANDIDATES = 32  # most recent occurrences compared per lookup
ANCHOR_WINDOW = 8  # after a departure the copy resumes within this many source tokens
ALIGN_WINDOW = 16  # a match ending this close after where the copy stood continues it
SEPARATOR = -1  # between a predicted output and the sequence in the index: no token id matches it


class SuffixIndex:
    """Where each n-gram of the sequence occurred (n = `min_match`), grown as tokens commit.

    A `source` (the client's predicted output) is indexed before the sequence, behind a
    separator no match crosses, and is the first place a match is looked for. `min_match` and
    `max_match`: the shortest suffix looked up and the longest compared."""

    def __init__(self, source: Sequence[int] = (), *, min_match: int = MIN_MATCH,
                 max_match: int = MAX_MATCH) -> None:
        self.min_match, self.max_match = min_match, max_match
        self.seq: list[int] = [*source, SEPARATOR] if source else []
        self.offset = len(self.seq)  # where the committed sequence starts in `seq`
        self.where: dict[tuple[int, ...], list[int]] = {}
        self._index(0)

    def _index(self, start: int) -> None:
        s, n = self.seq, self.min_match
        for end in range(max(n, start), len(s) + 1):
            self.where.setdefault(tuple(s[end - n:end]), []).append(end)

    def extend(self, seq: list[int]) -> None:
        """Index the tokens of `seq` past what is indexed (`seq` only grows within a reply)."""
        start = len(self.seq) - self.offset
        if seq[:start] != self.seq[self.offset:]:  # a different sequence: start again
            del self.seq[self.offset:]
            self.where, start = {}, 0
            self._index(0)
        self.seq.extend(seq[start:])
        self._index(self.offset + start)

    def match(self, near: int | None = None, window: int = ALIGN_WINDOW) -> tuple[int, int]:
        """(length, end) of the longest earlier match of the sequence's suffix; (0, 0) if none.
        `end` is where the match ends: what followed it starts there. The source's occurrences
        are compared first (they win a tie), then the most recent CANDIDATES of the rest.
        `near`: where the copy stood in its source; a match ending within `window` tokens after
        it continues that copy and wins over a longer one elsewhere (a file of similar functions
        matches the previous function's reply longer than its own source)."""
        s, shortest = self.seq, self.min_match
        if len(s) - self.offset <= shortest:
            return 0, 0
        ends = self.where.get(tuple(s[-shortest:]))
        if not ends:
            return 0, 0
        if near is not None and window > 0:  # `ends` ascend
            lo, hi = bisect.bisect_right(ends, near), bisect.bisect_right(ends, near + window)
            aligned = self._longest(ends[lo:hi])
            if aligned[0]:
                return aligned
        source = [e for e in ends[:CANDIDATES] if e < self.offset]
        return self._longest([*source, *reversed(ends[-CANDIDATES - 1:])])

    def _longest(self, ends: Sequence[int]) -> tuple[int, int]:
        """(length, end) of the longest match of the suffix among those ending at `ends`
        (the first of equals)."""
        s, longest = self.seq, self.max_match
        best_len, best_end = 0, 0
        for end in ends:
            if end >= len(s):  # the suffix itself
                continue
            m = self.min_match
            while m < longest and end - m - 1 >= 0 and s[end - m - 1] == s[len(s) - m - 1]:
                m += 1
            if m > best_len:
                best_len, best_end = m, end
                if m >= longest:
                    break
        return best_len, best_end

    def anchor(self, source: int, window: int | None = None, tail: Sequence[int] = ()) -> int:
        """Where a copy that stood at `source` resumes: just past the first occurrence of the
        sequence's last token (preferring its last two) in the `window` tokens from `source`;
        0 if none. `tail`: tokens after the sequence (not committed) whose end is looked up."""
        s = self.seq
        last = [*s[-2:], *tail][-2:]
        best, best_len = 0, 0
        window = ANCHOR_WINDOW if window is None else window
        for j in range(source, min(source + window, len(s) - 2)):
            if s[j] != last[-1]:
                continue
            agree = 2 if j > 0 and s[j - 1] == last[-2] else 1
            if agree > best_len:
                best, best_len = j + 1, agree
                if agree == 2:
                    break
        return best


class PromptLookup(Proposer):
    """`stage`: never (one model), always (`staged`), or by cost (None: what `auto` runs).
    `learn_edits`: carry what the reply changed in its copies so far (edit_memory.py);
    `respell`: a learned rename also at the word's other tokenizations (the target's tokenizer);
    `layout`: lay copies out by the whitespace rules the reply's departures taught (layout.py).
    `anchor`: re-anchor after a departure, within `anchor_window` source tokens, and prefer a
    match ending within `align_window` tokens of where the copy stood (0: the longest). `min_match`,
    `max_match`, `spec_factor`: the shortest suffix looked up, the longest compared, the most
    tokens proposed per matched token. `reply_edits`: learn edits also where the copy was of the
    reply's own text (off: there the reply writes another function, not an edit of this one's
    source, and the memory learned renames that were not). The shipped policy is the defaults;
    the others are tried by replaying recorded replies (tools/replay.py)."""

    name = "lookup"

    def __init__(self, evidence: CopyEvidence | None = None, *, stage: bool | None = False,
                 anchor: bool = True, learn_edits: bool = True, respell: bool = True, layout: bool = True,
                 anchor_window: int = ANCHOR_WINDOW, align_window: int = ALIGN_WINDOW,
                 min_match: int = MIN_MATCH, max_match: int = MAX_MATCH, spec_factor: int = SPEC_FACTOR,
                 resume_edits: bool = True, return_home: bool = True, line_rates: bool = True,
                 reply_edits: bool = False):
        self.evidence = evidence if evidence is not None else CopyEvidence()
        self.stage = stage
        self.anchor = anchor
        self.learn_edits = learn_edits
        self.respell = respell
        self.learn_layout = layout
        self.anchor_window, self.align_window = anchor_window, align_window
        self.resume_edits, self.return_home, self.line_rates = resume_edits, return_home, line_rates
        self.reply_edits = reply_edits
        self.min_match, self.max_match, self.spec_factor = min_match, max_match, spec_factor
        self.uses_draft = stage is not False
        self.index = SuffixIndex(min_match=min_match, max_match=max_match)
        self.memory = EditMemory()
        self.layout = Layout()
        self.lines = LineRates()
        self._bucket = self._span = self._cut = self._end = self._round_start = 0
        self._was_staged = False  # the last proposal went through the draft first
        self._source: int | None = None  # where the last copy stood in the source
        self._depart: tuple[int, int] | None = None  # (source, reply) positions where they parted
        self._held = False  # the last proposal was accepted whole: the copy goes on
        self._run = 0  # how many tokens the reply has agreed with the copy's source in a row
        self._after: list[tuple[int, int]] = []  # the source (token, byte) after each proposed token
        self._by: list[int] = []  # the substitution that wrote each proposed token (-1: none)
        self._laid: list[int] = []  # the layout rule that laid out each proposed token (-1: none)
        self._heads: list[int] = []  # the kind of source line each proposed token copies (line_rates.py)
        self._depart_skip = 0  # bytes of the departure's source token the reply had written
        self._end_skip = 0  # bytes of the proposal's first source token the reply had written
        self._projected = False  # the proposal continues the source laid out otherwise
        # the copy's token after the proposal where an edit wrote it: (token, the source position
        # of the substitution it is in, how many of its written tokens it completes)
        self._next: tuple[int, int, int] | None = None
        self._copied: list[int] = []  # the last copy, before it was cut to a proposal
        self._drop = 0  # written tokens of the substitution this proposal starts in, already in the reply
        self._reply_at = 0  # where the reply starts in the index: before it, the sources
        self._home: int | None = None  # where the copy stood in a source when it went on from the reply

    def begin(self, ctx: DecodeContext, prompt: list[int]) -> None:
        self.index = SuffixIndex(ctx.prediction, min_match=self.min_match, max_match=self.max_match)
        self.index.extend(prompt)
        self._reply_at, self._home = len(self.index.seq), None
        self.memory = EditMemory(ctx.target if self.respell else None)  # its tokenizer spells renames
        self.layout = Layout(ctx.target if self.learn_layout else None)
        self.lines = LineRates(ctx.target if self.line_rates else None)
        self._source, self._depart, self._held = None, None, False
        self._depart_skip = 0

    def _start(self, seq: list[int]) -> tuple[int, int, int, int] | None:
        """(source position to copy from, bytes of that token the reply has written, match
        length, evidence bucket), or None."""
        s = self.index.seq
        held, self._held, self._projected = self._held, False, False
        nxt, self._next, self._drop = self._next, None, 0
        if held and self._source is not None and self._source < len(s) - 1:
            if nxt is not None and nxt[0] == seq[-1] and self._resumes(seq, nxt[1], nxt[2]):
                # the target wrote on as the edit does: the copy goes on inside the substitution
                self._run += 1
                self._drop = nxt[2]
                return nxt[1], 0, self.max_match, self.evidence.bucket(self._run)
            if s[self._source] == seq[-1]:  # the target's own token after the copy continued it
                self.evidence.copied[seq[-1]] += 1
                self.layout.saw(s, self._source)
                self._run += 1  # a copy that has held this long is as safe as a match as long
                return self._source + 1, 0, self.max_match, self.evidence.bucket(self._run)
            self._depart, self._depart_skip = (self._source, len(seq) - 1), 0
        if self._depart is not None and self.anchor and self.learn_layout:
            found = self._relaid(seq)
            if found is not None:
                return found
            if self._source is not None:  # the reply changed the text: find the source again
                at = self.layout.find(s, self._source, seq[-8:])
                if at is not None:
                    self._depart, self._depart_skip, self._projected = (at[0], len(seq)), at[1], True
                    run = self.min_match
                    return at[0], at[1], run, self.evidence.bucket(run)
        match, end = self.index.match(self._source if self.anchor else None, self.align_window)
        b, aligned = self.evidence.bucket(match), match
        if match and end < self._reply_at:  # a copy of a source: no way home to keep
            self._home = None
        elif match and self._source is not None and self._source < self._reply_at:
            self._home = self._source  # a copy of the reply's own text: where it stood in the source
        if not match and self.anchor and self._source is not None:
            end, b = self.index.anchor(self._source, self.anchor_window), self.evidence.anchor_slot
            match = self.min_match if end else 0  # an anchor is worth a short match's span
            aligned = 1
        if not match:
            return None
        self._run = aligned
        if self._depart is not None:
            (d_src, d_rep), self._depart = self._depart, None
            if not self._depart_skip:  # (a departure inside a token is the layout's)
                self._learn(seq, d_src, d_rep, end - aligned, len(seq) - aligned)
        return end, 0, match, b

    def _resumes(self, seq: list[int], at: int, written: int) -> bool:
        """Whether the copy from source position `at`, edits made, starts with the reply's last
        `written` tokens (a substitution there the reply is writing)."""
        s = self.index.seq
        tokens, _, _ = self.memory.apply(s, at, min(len(s), at + MAX_REPLACED + 1))
        return len(tokens) > written and tokens[:written] == seq[-written:]

    def _next_of(self, k: int) -> tuple[int, int, int] | None:
        """The copy's token k (the one after a proposal of k tokens) where a substitution wrote it,
        with where that substitution's source tokens start and how many of its written tokens
        the reply holds once it is written; None: a token of the source as it is (or none)."""
        by, after = self._by, self._after
        if not self.resume_edits or k >= len(by) or by[k] < 0 or self._laid[k] >= 0:
            return None
        j = k
        while j > 0 and by[j - 1] == by[k] and after[j - 1] == after[k]:
            j -= 1
        written = k - j + 1 + (self._drop if j == 0 else 0)
        return self._copied[k], after[k][0] - self.memory.substitution(by[k]).width, written

    def _relaid(self, seq: list[int]) -> tuple[int, int, int, int] | None:
        """Where the copy goes on when the reply, since it departed, wrote its source again
        laid out otherwise (the same non-blank bytes): as `_start`; None where it wrote
        something else. Where the two meet at a token boundary, the gaps between are learned."""
        assert self._depart is not None
        s = self.index.seq
        d_rep, start = self._depart[1], (self._depart[0], self._depart_skip)
        at = self.layout.project(s, start, seq[d_rep:])
        if at is None or (not self.layout.active and (at == start or at[1])):
            return None  # (until the reply has laid out anew, it shows a layout where it meets the source)
        if at[1] == 0 and at != start:
            self.layout.learn(s, start, at, seq[:d_rep], seq[d_rep:])
            self._depart, self._depart_skip = (at[0], len(seq)), 0
        self._projected = True
        self._run = max(self._run + 1, self.min_match)  # the reply followed the source a token more
        return at[0], at[1], self._run, self.evidence.bucket(self._run)

    def _learn(self, seq: list[int], d_src: int, d_rep: int, source: int, reply: int) -> None:
        """The copy parted from source[d_src] at seq[d_rep] and resumed: source[source:] again
        lines up with seq[reply:]. What the reply wrote in between replaced what the source had,
        where the copy was of a source (the prompt, a predicted output), not of the reply."""
        if d_src >= self._reply_at and not self.reply_edits:
            return  # a copy of the reply's own text (a similar function): it differs, no edit made
        if self.learn_edits and 0 < d_src <= source and d_rep <= reply:
            s = self.index.seq
            prose = self.memory.in_prose(s, d_src)
            self.memory.learn(s[d_src - 1], s[d_src:source], seq[d_rep:reply], prose)
            self.memory.respell(s, s[d_src:source], seq[d_rep:reply], context=s[d_src - 1],
                                prose=prose)

    def propose(self, ctx: DecodeContext, seq: list[int]) -> Proposal:
        self.index.extend(seq)
        self._round_start = len(seq)
        self._was_staged, self._heads = False, []
        found = self._start(seq)
        if found is None:
            return self._no_copy(ctx, seq)
        end, skip, match, b = found
        s = self.index.seq
        stop = min(len(s), end + min(MAX_PROPOSAL, self.spec_factor * match, max(ctx.remaining - 1, 0)))
        if SEPARATOR in s[end:stop]:  # a copy from the predicted output ends where it ends
            stop = s.index(SEPARATOR, end)
        if stop <= end:
            return Proposal()
        self._bucket, self._end, self._end_skip = b, end, skip
        a = self.evidence.rate(b)
        assert ctx.costs is not None, "prompt lookup prices proposals with this machine's costs"
        costs = ctx.costs.at(len(seq))  # what a call costs at this depth of context
        stage = self.stage
        if stage is not False and ctx.has_draft and costs.draft is not None and not skip and not self._drop:
            k_staged, staged_ms = best_staged_length(a, stop - end, costs.target, costs.draft)
            if stage is None:
                stage = staged_ms < min(best_length(a, stop - end, costs.target)[1], costs.target.cost(1))
            if stage:
                return self._staged(ctx, seq, s[end:end + k_staged])
        tokens, aligned = self._copy(seq, end, stop, skip, self._drop)
        if self._home is not None and self.return_home and aligned is None and not skip and not self._drop:
            tokens = self._homeward(seq, tokens)
        self._copied = tokens
        tokens = tokens[:max(ctx.remaining - 1, 0)]
        stops = (i for i, t in enumerate(tokens) if self._as_source(i) and self.evidence.stops_at(t))
        cut = next(stops, None)
        if cut == 0:  # the target writes this one itself; the copy goes on after it
            self._stand(end, skip)
            return Proposal()
        tokens = tokens[:cut]
        self._heads = [self.lines.head(s, self._after[i][0] - 1) for i in range(len(tokens))]
        if self.line_rates:
            k = best_prefix(self.lines.rates(a, self._heads), costs.target)
        else:
            k, _ = best_length(a, len(tokens), costs.target)
        if aligned is not None:  # end where a source token ends, so the copy goes on after it
            k = next((j for j in range(k, 0, -1) if aligned[j - 1]), k)
        if k == 0:  # too unsure to pay for a call
            if self.layout.active:  # in a reply laying out anew the copy still stands where it is
                self._stand(end, skip)
            return Proposal()
        self._next = self._next_of(k)
        tokens, self._heads = list(tokens[:k]), self._heads[:k]
        return Proposal(tokens, list(tokens), source="lookup", copied=len(tokens))

    def _homeward(self, seq: list[int], tokens: list[int]) -> list[int]:
        """A copy of the reply's own text (a similar function written before) given up for the
        source where two of its tokens meet the source just after where the copy left it: past
        that, the source's text is this function's (its operator, its name), the reply's another's."""
        assert self._home is not None
        s, home = self.index.seq, self._home
        for j in range(1, len(tokens)):
            a, b = seq[-1] if j == 1 else tokens[j - 2], tokens[j - 1]
            for h in range(max(home, 1), min(home + self.anchor_window + j, self._reply_at - 1)):
                if s[h] != b or s[h - 1] != a or s[h + 1] == SEPARATOR:
                    continue
                whole = self._after, self._by, self._laid
                kept = self._after[:j], self._by[:j], self._laid[:j]
                stop = h + 1 + len(tokens) - j
                if SEPARATOR in s[h + 1:stop]:
                    stop = s.index(SEPARATOR, h + 1)
                rest, aligned = self._copy(seq + tokens[:j], h + 1, min(stop, self._reply_at))
                if aligned is not None or not rest:  # the reply's copy stands, with what it kept
                    self._after, self._by, self._laid = whole
                    return tokens
                self._after, self._by = kept[0] + self._after, kept[1] + self._by
                self._laid = kept[2] + self._laid
                self._home = None
                return tokens[:j] + rest
        return tokens

    def _stand(self, end: int, skip: int) -> None:
        """No proposal this round, but the copy stands at source token `end` (`skip` bytes of
        it written): the target's token is read against it next round."""
        if not self._projected and not skip:
            self._held, self._source = True, end
        # a projected copy keeps its departure: the next round reads the reply from there again

    def _copy(self, seq: list[int], start: int, stop: int, skip: int = 0,
              drop: int = 0) -> tuple[list[int], list[bool] | None]:
        """The indexed tokens from `start` to `stop` (the first `skip` bytes of the first
        written; the first `drop` tokens, a substitution's, all written) as the reply `seq` would
        copy them: edits made, laid out as it lays them out; with whether each ends where a
        source token ends (None: all do). Keeps the source position after each token and what
        changed it."""
        s = self.index.seq
        tokens, after, self._by = self.memory.apply(s, start, stop)
        if drop:
            tokens, after, self._by = tokens[drop:], after[drop:], self._by[drop:]
        laid = None
        # (no copy laid out from a substitution half written)
        if not drop and (not skip or (self._by and self._by[0] < 0)):
            laid = self.layout.apply(seq, s, (start, skip), tokens, after, self._by)
        if laid is None:
            if skip:  # a token half written is copied only laid out
                tokens, after, self._by = [], [], []
            self._after, self._laid = [(a, 0) for a in after], [-1] * len(tokens)
            return tokens, None
        n = laid.unknown if laid.unknown is not None and self.layout.active else len(laid.tokens)
        # up to a gap it cannot tell, and what is kept of each token with it
        self._after, self._by, self._laid = laid.after[:n], laid.by[:n], laid.rules[:n]
        return laid.tokens[:n], [b == 0 for _, b in laid.after[:n]]

    def _as_source(self, i: int) -> bool:
        """Whether the i-th proposed token is copied as the source has it (no edit, no layout)."""
        return self._by[i] < 0 and self._laid[i] < 0

    def _no_copy(self, ctx: DecodeContext, seq: list[int]) -> Proposal:
        """The proposal where no copy continues the reply (splice.py writes one): a plain step."""
        return Proposal()

    def _staged(self, ctx: DecodeContext, seq: list[int], follow: list[int]) -> Proposal:
        """The draft reads the span in one decode; keep what it agrees with, plus its own
        token where it first disagrees (or after the span)."""
        out = ctx.draft_step(seq + follow, n_logits=len(follow) + 1)
        choice = np.argmax(out.logits, axis=1)
        cut = 0
        while cut < len(follow) and int(choice[cut]) == follow[cut]:
            cut += 1
        tokens = list(follow[:cut])
        if cut < ctx.remaining - 1 and not (tokens and ctx.text_eog(tokens[-1])):
            tokens.append(int(choice[cut]))
        self._span, self._cut, self._was_staged = len(follow), cut, True
        return Proposal(tokens, list(tokens), source="staged", copied=len(follow), drafted=len(tokens) - cut)

    def feedback(self, ctx: DecodeContext, proposal: Proposal, accepted: int) -> None:
        if not proposal.tokens:
            return
        if self._was_staged:  # the draft's agreement stands in for the target's on the cut part
            copied = min(self._cut, accepted)
            self.evidence.add(self._bucket, copied, stopped=copied < self._span)
            self._source = self._end + copied
            return
        n = len(proposal)
        self.evidence.add(self._bucket, accepted, stopped=accepted < n)
        for i, t in enumerate(proposal.tokens[:accepted + 1]):
            if self._as_source(i):
                (self.evidence.copied if i < accepted else self.evidence.refused)[t] += 1
        self.memory.score(self._by[:n], accepted)
        self.layout.score(self._laid[:n], accepted)
        if len(self._heads) == n:  # (a splice's copy after written tokens has none)
            self.lines.score(self._heads, accepted)
        if accepted >= n:
            self._source, skip = self._after[n - 1]
            self._held, self._depart = not skip, None
            if skip:  # the copy stopped inside a token: read the reply from there
                self._depart, self._depart_skip = (self._source, self._round_start + n), skip
            self._run += n
        else:  # the first source byte the reply did not copy; the reply's token in its place
            self._source, skip = self._after[accepted - 1] if accepted else (self._end, self._end_skip)
            self._depart, self._depart_skip = (self._source, self._round_start + accepted), skip
