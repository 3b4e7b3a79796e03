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

The copy's state is one `Cursor`: where it stands in the source (`at`), in which state
(`state`: no copy, held there, loose, departed, and within a round copying and offered), how long
the reply has followed it (`run`), where the reply left it (`departure`), where it stood in the
source while copying the reply's own text (`home`), and the edit token it may go on with
(`resume`). Every transition is a row of `Move` (copy_state.py), which the proposer takes at each
change of state. A round's copy is an `Offer` of `CopiedToken`s, each with the source position
after it and the edit and layout rule that made it.

Staged (`StagedLookup`, with a draft model): the span is first checked by the draft in ONE batched decode,
cut at the draft's first disagreement, and the draft's own token at the cut proposed in its
place; the target then scores only what survived. The cut is a deterministic function of the
context, so every proposal stays a point mass and the p/q test keeps the output exact.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ...costs.pricing import Costs, best_length, best_prefix, best_staged_length
from .base import Proposal, Proposer
from .copy_evidence import CopyEvidence
from .copy_state import NO_COPY, Cursor, Departure, Move, NoCopy, Resume, State
from .edit_memory import MAX_REPLACED, Applied, EditMemory
from .layout import Layout, Position
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
    separator no match crosses, and is the first place a match is looked for. `earlier`: replies
    to earlier requests (reply_memory.py), each behind a separator after the source, the last
    place looked (a tie goes to this request's text). `min_match` and `max_match`: the shortest
    suffix looked up and the longest compared. `prompt`: the request, indexed before the reply."""

    def __init__(self, source: Sequence[int] = (), prompt: Sequence[int] = (), *,
                 earlier: Sequence[Sequence[int]] = (), min_match: int = MIN_MATCH,
                 max_match: int = MAX_MATCH) -> None:
        self.min_match, self.max_match = min_match, max_match
        self.seq: list[int] = [*source, SEPARATOR] if source else []
        self.earlier_at = len(self.seq)  # where the earlier replies start in `seq`
        for reply in earlier:
            self.seq += [*reply, SEPARATOR]
        self.offset = len(self.seq)  # where the committed sequence starts in `seq`
        self.where: dict[tuple[int, ...], list[int]] = {}
        self._index(0)
        if prompt:
            self.extend(list(prompt))
        self.reply_at = len(self.seq)  # where the reply starts: before it, the sources

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

    def copy_end(self, start: int, stop: int) -> int:
        """Where a copy from `start` up to `stop` ends: `stop`, or the separator's position where
        the predicted output ends before it (a copy from the predicted output ends where it ends)."""
        return self.seq.index(SEPARATOR, start) if SEPARATOR in self.seq[start:stop] else stop

    def match(self, near: int | None = None, window: int = ALIGN_WINDOW) -> tuple[int, int]:
        """(length, end) of the longest earlier match of the sequence's suffix; (0, 0) if none.
        `end` is where the match ends: what followed it starts there. The source's occurrences
        are compared first (they win a tie), then the most recent CANDIDATES of the prompt and the
        reply, then those of the earlier replies.
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
        earlier_at = bisect.bisect_left(ends, self.earlier_at)
        offset = bisect.bisect_left(ends, self.offset)
        source, earlier = ends[:min(CANDIDATES, earlier_at)], ends[earlier_at:offset][-CANDIDATES:]
        return self._longest([*source, *reversed(ends[-CANDIDATES - 1:]), *reversed(earlier)])

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

    def anchor(self, at: int, window: int | None = None, tail: Sequence[int] = ()) -> int:
        """Where a copy that stood at `at` resumes: just past the first occurrence of the
        sequence's last token (preferring its last two) in the `window` tokens from `at`;
        0 if none. `tail`: tokens after the sequence (not committed) whose end is looked up."""
        s = self.seq
        last = [*s[-2:], *tail][-2:]
        best, best_len = 0, 0
        window = ANCHOR_WINDOW if window is None else window
        for j in range(at, min(at + window, len(s) - 2)):
            if s[j] != last[-1]:
                continue
            agree = 2 if j > 0 and s[j - 1] == last[-2] else 1
            if agree > best_len:
                best, best_len = j + 1, agree
                if agree == 2:
                    break
        return best


@dataclass(frozen=True)
class CopyPolicy:
    """How the copy behaves: its internal tuning, not a user's knob (a method's knobs are its
    `Setting`s). The methods that copy (lookup, staged, splice) each own one (`copy_policy`), the
    shipped one, the defaults; tools/replay.py builds the others (`VARIANTS`) and compares them
    on recorded replies."""

    anchor: bool = True  # re-anchor after a departure, and prefer a match near where the copy stood
    # source tokens after a departure searched for an anchor (splice's draft: this plus what it wrote)
    anchor_window: int = ANCHOR_WINDOW
    align_window: int = ALIGN_WINDOW  # a match ending this close continues the copy (0: the longest)
    min_match: int = MIN_MATCH  # the shortest suffix looked up
    max_match: int = MAX_MATCH  # the longest suffix compared
    spec_factor: int = SPEC_FACTOR  # the most tokens proposed per matched token
    learn_edits: bool = True  # carry what the reply changed in its copies so far (edit_memory.py)
    respell: bool = True  # a learned rename also at the word's other tokenizations
    layout: bool = True  # lay copies out by the whitespace rules the reply taught (layout.py)
    resume_edits: bool = True  # the copy goes on inside an edit the target is writing
    return_home: bool = True  # a copy of the reply's own text gives way to the source where they meet
    line_rates: bool = True  # price each token by what its kind of source line let through
    # learn edits also where the copy was of the reply's own text (off: there the reply writes
    # another function, not an edit of this one's source, and the memory learned false renames)
    reply_edits: bool = False


SHIPPED = CopyPolicy()


@dataclass(frozen=True)
class CopiedToken:
    """One token of a copy, as the reply would write it."""

    token: int
    after: Position  # where the source goes on after it
    by: Applied | None = None  # the edit memory's substitution that wrote it (None: none)
    laid: int | None = None  # the layout rule that laid it out (None: none)

    @property
    def as_source(self) -> bool:
        """Copied as the source has it (no edit, no layout)."""
        return self.by is None and self.laid is None


class Start(NamedTuple):
    """Where a round's copy starts (`PromptLookup._start`)."""

    at: int  # the source position copied from
    skip: int  # bytes of that token the reply has written
    match: int  # the match length it is priced as
    bucket: int  # its evidence bucket
    projected: bool = False  # the reply's text read against the source laid out otherwise
    drop: int = 0  # the edit's written tokens the reply already holds (a copy inside an edit)


@dataclass
class Offer:
    """The round's copy, as `feedback` reads it."""

    bucket: int
    start: Position  # where in the source it starts
    reply: int  # where in the reply it starts
    copy: list[CopiedToken]  # the copy before it was cut to the proposal
    heads: list[int] = field(default_factory=list)  # the kind of source line each proposed token copies
    staged: tuple[int, int] | None = None  # the draft checked it first: (tokens checked, agreed)


def homeward(index: SuffixIndex, seq: list[int], copy: list[CopiedToken], home: int, window: int,
             copy_at: Callable[[list[int], int, int], tuple[list[CopiedToken], list[bool] | None]],
             ) -> list[CopiedToken] | None:
    """A copy of the reply's own text (a similar function written before, after `seq`) given up
    for the source where two of its tokens meet the source just after `home`, where the copy left
    it (within `window` tokens and as many as it copied): past that, the source's text is this
    function's (its operator, its name), the reply's another's. The copy, its head kept and the
    source (`copy_at`: as the reply would copy it) after it; None where the reply's copy stands."""
    s, reply_at = index.seq, index.reply_at
    tokens = [t.token for t in copy]
    for j in range(1, len(tokens)):
        a, b = seq[-1] if j == 1 else tokens[j - 2], tokens[j - 1]
        for h in range(max(home, 1), min(home + window + j, reply_at - 1)):
            if s[h] != b or s[h - 1] != a or s[h + 1] == SEPARATOR:
                continue
            stop = index.copy_end(h + 1, h + 1 + len(tokens) - j)
            rest, aligned = copy_at(seq + tokens[:j], h + 1, min(stop, reply_at))
            if aligned is not None or not rest:  # (laid out, or nothing: the reply's copy stands)
                return None
            return copy[:j] + rest
    return None


class PromptLookup(Proposer):
    """The copy. `copy_policy`: how it behaves (`CopyPolicy`)."""

    name = "lookup"

    def __init__(self, evidence: CopyEvidence | None = None, *, copy_policy: CopyPolicy = SHIPPED):
        self.evidence = evidence if evidence is not None else CopyEvidence()
        self.copy_policy = copy_policy
        self.index = SuffixIndex(min_match=copy_policy.min_match, max_match=copy_policy.max_match)
        self.memory = EditMemory()
        self.layout = Layout()
        self.lines = LineRates()
        self.cursor = Cursor()
        self.offer: Offer | None = None

    def begin(self, ctx: DecodeContext, prompt: list[int]) -> None:
        p = self.copy_policy
        earlier = ctx.reply_memory.replies() if ctx.reply_memory is not None else ()
        self.index = SuffixIndex(ctx.prediction, prompt, earlier=earlier, min_match=p.min_match,
                                 max_match=p.max_match)
        self.memory = EditMemory(ctx.target if p.respell else None)  # its tokenizer spells renames
        self.layout = Layout(ctx.target if p.layout else None)
        self.lines = LineRates(ctx.target if p.line_rates else None)
        self.cursor, self.offer = Cursor(), None

    # ------------------------------------------------------------------ where the copy starts
    def _start(self, seq: list[int]) -> Start | None:
        """Where this round's copy starts, moving the cursor; None: no copy continues the reply."""
        s, c, p = self.index.seq, self.cursor, self.copy_policy
        resume, c.resume = c.resume, None
        if c.state is State.HELD:
            assert c.at is not None
            if c.at >= len(s) - 1:
                self.cursor.move(Move.AT_END)
            elif resume is not None and resume.token == seq[-1] and self._resumes(seq, resume):
                # the target wrote on as the edit does: the copy goes on inside the substitution
                c.run += 1
                self.cursor.move(Move.RESUME)
                return Start(resume.at, 0, p.max_match, self.evidence.bucket(c.run), drop=resume.written)
            elif s[c.at] == seq[-1]:  # the target's own token after the copy continued it
                self.evidence.followed[seq[-1]] += 1
                self.layout.saw(s, c.at)
                c.run += 1  # a copy that has held this long is as safe as a match as long
                self.cursor.move(Move.FOLLOW)
                return Start(c.at + 1, 0, p.max_match, self.evidence.bucket(c.run))
            else:
                c.departure = Departure(c.at, len(seq) - 1)
                self.cursor.move(Move.DEPART)
        if c.departure is not None and p.anchor and p.layout:
            found = self._relaid(seq, c.departure)
            if found is not None:
                return found
            if c.at is not None:  # the reply changed the text: find the source again
                at = self.layout.find(s, c.at, seq[-8:])
                if at is not None:
                    c.departure = Departure(at.at, len(seq), at.skip)
                    self.cursor.move(Move.REFIND)
                    bucket = self.evidence.bucket(p.min_match)
                    return Start(at.at, at.skip, p.min_match, bucket, projected=True)
        match, end = self.index.match(c.at if p.anchor else None, p.align_window)
        b, aligned = self.evidence.bucket(match), match
        if match and end < self.index.reply_at:  # a copy of a source: no way home to keep
            c.home = None
        elif match and c.at is not None and c.at < self.index.reply_at:
            c.home = c.at  # a copy of the reply's own text: where it stood in the source
        move = Move.MATCH
        if not match and p.anchor and c.at is not None:
            end, b = self.index.anchor(c.at, p.anchor_window), self.evidence.anchor_slot
            match = p.min_match if end else 0  # an anchor is worth a short match's span
            aligned, move = 1, Move.ANCHOR
        if not match:
            self.cursor.move(Move.NO_COPY, c.resting())
            return None
        c.run = aligned
        if c.departure is not None:
            d, c.departure = c.departure, None
            if not d.skip:  # (a departure inside a token is the layout's)
                self._learn(seq, d, end - aligned, len(seq) - aligned)
        self.cursor.move(move)
        return Start(end, 0, match, b)

    def _resumes(self, seq: list[int], resume: Resume) -> bool:
        """Whether the copy from the edit's source position, edits made, starts with the reply's
        last `written` tokens (the reply is writing that substitution)."""
        s, at, written = self.index.seq, resume.at, resume.written
        edited = self.memory.apply(s, at, min(len(s), at + MAX_REPLACED + 1))
        return len(edited) > written and [t.token for t in edited[:written]] == seq[-written:]

    def _relaid(self, seq: list[int], d: Departure) -> Start | None:
        """Where the copy goes on when the reply, since it departed at `d`, wrote its source
        again laid out otherwise (the same non-blank bytes); None where it wrote something
        else. Where the two meet at a token boundary, the gaps are learned."""
        s, c = self.index.seq, self.cursor
        start = Position(d.at, d.skip)
        at = self.layout.project(s, start, seq[d.reply:])
        if at is None or (not self.layout.active and (at == start or at.skip)):
            return None  # (until the reply has laid out anew, it shows a layout where it meets the source)
        if at.skip == 0 and at != start:
            self.layout.learn(s, start, at, seq[:d.reply], seq[d.reply:])
            c.departure = Departure(at.at, len(seq))
        c.run = max(c.run + 1, self.copy_policy.min_match)  # the reply followed the source a token more
        self.cursor.move(Move.RELAY)
        return Start(at.at, at.skip, c.run, self.evidence.bucket(c.run), projected=True)

    def _learn(self, seq: list[int], d: Departure, at: int, reply: int) -> None:
        """The copy parted at `d` and resumed: the source from `at` again lines up with seq[reply:].
        What the reply wrote in between replaced what the source had, where the copy was of a
        source (the prompt, a predicted output), not of the reply."""
        if d.at >= self.index.reply_at and not self.copy_policy.reply_edits:
            return  # a copy of the reply's own text (a similar function): it differs, no edit made
        if self.copy_policy.learn_edits and 0 < d.at <= at and d.reply <= reply:
            s = self.index.seq
            old, new = s[d.at:at], seq[d.reply:reply]
            prose = self.memory.in_prose(s, d.at)
            self.memory.learn(s[d.at - 1], old, new, prose)
            self.memory.respell(s, old, new, context=s[d.at - 1], prose=prose)

    # ------------------------------------------------------------------ the proposal
    def propose(self, ctx: DecodeContext, seq: list[int]) -> Proposal:
        proposal = self.continue_copy(ctx, seq)
        return Proposal() if proposal is NO_COPY else proposal

    def continue_copy(self, ctx: DecodeContext, seq: list[int]) -> Proposal | NoCopy:
        """This round's proposal (empty: a plain step); NO_COPY where no copy continues the reply
        (splice's draft may write there)."""
        self.index.extend(seq)
        self.offer, self.cursor.moves = None, []
        c = self.cursor
        if c.state is State.OFFERED:  # the last round's copy went unread
            self.cursor.move(Move.UNREAD, c.resting())
        start = self._start(seq)
        if start is None:
            return NO_COPY
        s, p = self.index.seq, self.copy_policy
        end, skip, drop = start.at, start.skip, start.drop
        stop = min(len(s), end + min(MAX_PROPOSAL, p.spec_factor * start.match, max(ctx.remaining - 1, 0)))
        stop = self.index.copy_end(end, stop)
        if stop <= end:
            self.cursor.move(Move.EMPTY, c.resting())
            return Proposal()
        a = self.evidence.rate(start.bucket)
        assert ctx.costs is not None, "prompt lookup prices proposals with this machine's costs"
        costs = ctx.costs.at(len(seq))  # what a call costs at this depth of context
        checked = self._checked(ctx, seq, start, stop, a, costs)
        if checked is not None:
            return checked
        copy, aligned = self._copy(seq, end, stop, skip, drop)
        if c.home is not None and p.return_home and aligned is None and not skip and not drop:
            copy = self._homeward(seq, copy)
            if c.home is None:
                self.cursor.move(Move.HOMEWARD)
        offer = self.offer = Offer(start.bucket, Position(end, skip), len(seq), copy)
        room = copy[:max(ctx.remaining - 1, 0)]
        cut = self._first_stop(room)
        if cut == 0:  # the target writes this one itself; the copy goes on after it
            self._stand(start, Move.STOP_FIRST)
            return Proposal()
        room = room[:cut]
        heads = [self.lines.head(s, t.after.at - 1) for t in room]
        if p.line_rates:
            k = best_prefix(self.lines.rates(a, heads), costs.target)
        else:
            k, _ = best_length(a, len(room), costs.target)
        if aligned is not None:  # end where a source token ends, so the copy goes on after it
            k = next((j for j in range(k, 0, -1) if aligned[j - 1]), k)
        if k == 0:  # too unsure to pay for a call
            if self.layout.active:  # in a reply laying out anew the copy still stands where it is
                self._stand(start, Move.UNPAID_LAID)
            else:
                self.cursor.move(Move.UNPAID, c.resting())
            return Proposal()
        c.resume = self._resume_at(copy, k, drop)
        offer.heads = heads[:k]
        tokens = [t.token for t in room[:k]]
        self.cursor.move(Move.PROPOSE)
        return Proposal(tokens, list(tokens), proposer="lookup", copied=len(tokens))

    def _first_stop(self, copy: Sequence[CopiedToken]) -> int | None:
        """The first token copied as the source has it that the target refuses more often than
        it copies (the prompt's closing code fence, spelled otherwise by the reply)."""
        stops = self.evidence.stops_at
        return next((i for i, t in enumerate(copy) if t.as_source and stops(t.token)), None)

    def _resume_at(self, copy: list[CopiedToken], k: int, drop: int) -> Resume | None:
        """The copy's token k (the one after a proposal of k tokens) where a substitution wrote
        it; None: a token of the source as it is (or none)."""
        if not self.copy_policy.resume_edits or k >= len(copy):
            return None
        t, j = copy[k], k
        if t.by is None or t.laid is not None:
            return None
        while j > 0 and copy[j - 1].by == t.by and copy[j - 1].after == t.after:
            j -= 1
        written = k - j + 1 + (drop if j == 0 else 0)
        return Resume(t.token, t.after.at - self.memory.substitution(t.by).width, written)

    def _homeward(self, seq: list[int], copy: list[CopiedToken]) -> list[CopiedToken]:
        """A copy of the reply's own text given up for the source where they meet (`homeward`)."""
        assert self.cursor.home is not None
        home = homeward(self.index, seq, copy, self.cursor.home, self.copy_policy.anchor_window, self._copy)
        if home is None:  # the reply's copy stands
            return copy
        self.cursor.home = None
        return home

    def _stand(self, start: Start, move: Move) -> None:
        """No proposal this round, but the copy stands where it started: the target's token is
        read against it next round (a projected copy keeps its departure: the next round reads
        the reply from there again)."""
        if not start.projected and not start.skip:
            self.cursor.at = start.at
            self.cursor.move(move, State.HELD)
        else:
            self.cursor.move(move, State.DEPARTED)

    def _copy(self, seq: list[int], start: int, stop: int, skip: int = 0,
              drop: int = 0) -> tuple[list[CopiedToken], list[bool] | None]:
        """The indexed tokens from `start` to `stop` (the first `skip` bytes of the first
        written; the first `drop` tokens, a substitution's, all written) as the reply `seq` would
        copy them: edits made, laid out as it lays them out; with whether each ends where a
        source token ends (None: all do)."""
        s = self.index.seq
        edited = self.memory.apply(s, start, stop)
        if drop:
            edited = edited[drop:]
        laid = None
        # (no copy laid out from a substitution half written)
        if not drop and (not skip or (edited and edited[0].by is None)):
            laid = self.layout.apply(seq, s, Position(start, skip), edited)
        if laid is None:
            if skip:  # a token half written is copied only laid out
                return [], None
            return [CopiedToken(t.token, Position(t.after), t.by) for t in edited], None
        n = laid.unknown if laid.unknown is not None and self.layout.active else len(laid.tokens)
        # up to a gap it cannot tell, and what is kept of each token with it
        kept = laid.tokens[:n]
        return [CopiedToken(t.token, t.after, t.by, t.rule) for t in kept], [t.after.skip == 0 for t in kept]

    def _checked(self, ctx: DecodeContext, seq: list[int], start: Start, stop: int, a: float,
                 costs: Costs) -> Proposal | None:
        """The round's proposal where the draft checks the copy first (`StagedLookup`); None: the
        target alone checks it."""
        return None

    # ------------------------------------------------------------------ what a splice composes
    def copy_from(self, seq: list[int], start: int, stop: int) -> list[CopiedToken]:
        """The source from position `start` to `stop` as the reply `seq` would copy it (edits
        made, laid out), ending before a token the target refuses more often than it copies."""
        copy, _ = self._copy(seq, start, stop)
        return copy[:self._first_stop(copy)]

    def offer_copy(self, copy: list[CopiedToken], start: int, reply: int) -> None:
        """A copy proposed after tokens written otherwise: anchored at source `start`, from reply
        position `reply` on; `feedback` then reads it as this round's copy."""
        self.offer = Offer(self.evidence.anchor_slot, Position(start), reply, copy)
        self.cursor.move(Move.OFFER_AFTER_WRITING)

    def learn_departure(self, seq: list[int], at: int, reply: int) -> None:
        """The reply, departed from the copy, lines up with the source again (the source from
        `at` with seq[reply:]): what it wrote in between is learned as an edit of that source."""
        d, self.cursor.departure = self.cursor.departure, None
        if d is not None:
            self._learn(seq, d, at, reply)
            self.cursor.move(Move.LEARN_DEPARTURE)

    # ------------------------------------------------------------------ what the target kept
    def feedback(self, ctx: DecodeContext, proposal: Proposal, accepted: int) -> None:
        offer, c = self.offer, self.cursor
        if not proposal.tokens or offer is None:
            return
        n = len(proposal)
        self.evidence.add(offer.bucket, accepted, stopped=accepted < n)
        for i, t in enumerate(proposal.tokens[:accepted + 1]):
            if offer.copy[i].as_source:  # what the target did with a token as its source has it
                (self.evidence.followed if i < accepted else self.evidence.refused)[t] += 1
        self.memory.score([t.by for t in offer.copy[:n]], accepted)
        self.layout.score([t.laid for t in offer.copy[:n]], accepted)
        if len(offer.heads) == n:  # (a splice's copy after written tokens has none)
            self.lines.score(offer.heads, accepted)
        if accepted >= n:
            c.at, skip = offer.copy[n - 1].after
            c.departure = None
            if skip:  # the copy stopped inside a token: read the reply from there
                c.departure = Departure(c.at, offer.reply + n, skip)
            c.run += n
            self.cursor.move(Move.ACCEPTED, State.DEPARTED if skip else State.HELD)
        else:  # the first source byte the reply did not copy; the reply's token in its place
            c.at, skip = offer.copy[accepted - 1].after if accepted else offer.start
            c.departure = Departure(c.at, offer.reply + accepted, skip)
            self.cursor.move(Move.REFUSED)


class StagedLookup(PromptLookup):
    """The copy, each span checked by the draft first (`staged`: the module's docstring)."""

    uses_draft = True

    def _checked(self, ctx: DecodeContext, seq: list[int], start: Start, stop: int, a: float,
                 costs: Costs) -> Proposal | None:
        if not ctx.has_draft or costs.draft is None or start.skip or start.drop:
            return None
        k, _ = best_staged_length(a, stop - start.at, costs.target, costs.draft)
        follow = self.index.seq[start.at:start.at + k]
        # the draft reads the span in one decode; keep what it agrees with, plus its own token
        # where it first disagrees (or after the span)
        out = ctx.draft_step(seq + follow, n_logits=len(follow) + 1)
        choice = np.argmax(out.logits, axis=1)
        cut = 0
        while cut < len(follow) and int(choice[cut]) == follow[cut]:
            cut += 1
        tokens = list(follow[:cut])
        if cut < ctx.remaining - 1 and not (tokens and ctx.text_eog(tokens[-1])):
            tokens.append(int(choice[cut]))
        self.offer = Offer(start.bucket, Position(start.at, start.skip), len(seq), [],
                           staged=(len(follow), cut))
        self.cursor.move(Move.STAGED)
        return Proposal(tokens, list(tokens), proposer="staged", copied=len(follow),
                        drafted=len(tokens) - cut)

    def feedback(self, ctx: DecodeContext, proposal: Proposal, accepted: int) -> None:
        offer, c = self.offer, self.cursor
        if not proposal.tokens or offer is None or offer.staged is None:
            super().feedback(ctx, proposal, accepted)
            return
        span, cut = offer.staged  # the draft's agreement stands in for the target's on the cut part
        agreed = min(cut, accepted)
        self.evidence.add(offer.bucket, agreed, stopped=agreed < span)
        c.at = offer.start.at + agreed
        c.move(Move.STAGED_READ, c.resting())
