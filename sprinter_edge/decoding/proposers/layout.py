"""How a reply lays out the text it copies: whitespace rules learned where it departed, applied
to what it copies next.

A reformat changes whitespace only: `a,b` becomes `a, b`, `x=1` becomes `x = 1`, two-space
indentation becomes four. The tokens change with it (`,b` is one token, `, b` two), so a copy
matched token by token departs at every gap and finds no match after it. Read byte by byte,
without the blanks, the reply still follows its source: `project` says where in the source
(a token and a byte in it) the reply stands, so the copy goes on from there; where the reply
changed the text too, `find` looks its last non-blank bytes up near where the copy stood.

Where the reply and the source meet at a token boundary again, each gap between two non-blank
characters whose whitespace changed is a rule: (the character before, the character after, the
source's whitespace) -> the reply's. Letters, digits and `_` are one class, so `a,b` teaches
`x,y`; an indentation is learned as a scale, where the new width is a multiple of the old
(2 -> 4 spaces teaches 4 -> 8; a width for a width would learn the nesting of a copy aligned to
a similar block at another depth). A copy is laid out by the trusted
rules and tokenized again, as the target would cut the text it writes.

A rule is a guess like any copied span (a deterministic proposal, a point mass in the p/q
test): exactness never rests on it. Each keeps a score, accepted where a token it laid out was
accepted, refused where the target wrote otherwise; one refused more often than accepted is not
applied.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .edit_memory import Applied, EditedToken, Tokenizer

_BLANK = b" \t\n\r"
_NON_BLANK = re.compile(rb"[^ \t\n\r]")
MAX_GAP = 16  # the longest in-line whitespace a rule writes
MAX_WRITTEN = 48  # the most reply tokens read back to where the source goes on
CONTEXT_TOKENS = 4  # committed tokens read for the gap before a copy
ACTIVE = 2  # rule applications held before a copy stops at a kind of gap never seen
FIND_BYTES = 6  # the fewest non-blank bytes of the reply looked up to find the source again
FIND_WINDOW = 96  # source tokens searched for them after where the copy stood
FIND_BACK = 48  # and before it



class Position(NamedTuple):
    """A place in the source: a token, and how many of its bytes the reply has written."""

    at: int  # the source token
    skip: int = 0  # bytes of it already written


@dataclass
class Rule:
    written: bytes | int  # the reply's whitespace (the indentation's scale: its factor)
    accepted: int = 1  # learned from one occurrence
    refused: int = 0

    @property
    def trusted(self) -> bool:
        return self.accepted > self.refused


class LaidToken(NamedTuple):
    """One token of a copy laid out."""

    token: int
    after: Position  # where the source goes on after it
    by: Applied | None  # the edit memory's substitution that wrote it (None: none)
    rule: int | None  # the rule that laid it out, an index into the copy's rules (None: none)
    gaps: list[tuple]  # the kinds of gap it holds (a closed gap: the token after it)


@dataclass
class Laid:
    """A copy laid out: its tokens, and where the first one holding a kind of gap the reply has
    not shown stands."""

    tokens: list[LaidToken]
    unknown: int | None = None  # the first token holding a kind of gap the reply has not shown


def _kind(byte: int) -> int:
    """A character as a rule reads it: letters, digits, `_` and non-ASCII bytes are one class."""
    return 0x41 if chr(byte).isalnum() or byte == 0x5F or byte >= 0x80 else byte


def _strip(text: bytes) -> bytes:
    return text.translate(None, _BLANK)


def _tail(text: bytes) -> tuple[int | None, bytes]:
    """(the last non-blank byte of `text` or None, the blanks after it)."""
    body = text.rstrip(_BLANK)
    return (body[-1] if body else None), text[len(body):]


def _gaps(text: bytes) -> tuple[list[int], list[tuple[int, int]]]:
    """The positions of `text`'s non-blank bytes, and the (start, end) of the gap after each
    (empty where the next one follows at once; the last runs to the end of `text`)."""
    marks = [m.start() for m in _NON_BLANK.finditer(text)]
    return marks, [(m + 1, e) for m, e in zip(marks, [*marks[1:], len(text)], strict=False)]


def _past(piece: bytes, i: int, n: int) -> Position:
    """The position just past byte n of source token i (`piece`: its bytes)."""
    return Position(i + 1) if n + 1 == len(piece) else Position(i, n + 1)


def _key(left: int, right: int, gap: bytes) -> tuple:
    """The kind of a gap a rule is kept under: an indentation by its width, any other by the
    characters around it and its blanks."""
    split = _indent(gap)
    return ("indent", len(split[1])) if split is not None else (_kind(left), _kind(right), gap)


def _indent(gap: bytes) -> tuple[bytes, bytes] | None:
    """A gap holding a line break split as (up to the last line break, the spaces after it);
    None if it has none or indents with anything but spaces."""
    cut = gap.rfind(b"\n")
    if cut < 0:
        return None
    head, indent = gap[:cut + 1], gap[cut + 1:]
    return (head, indent) if indent.strip(b" ") == b"" else None


class Layout:
    """Whitespace rules learned from the reply so far, and where proposals applied them."""

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self.tokenizer = tokenizer  # None: nothing is read, learned or applied
        self.rules: dict[tuple, Rule] = {}  # (left, right, source gap) -> the reply's gap
        self.scale: Rule | None = None  # the indentation's scale (`written` the factor)
        self.known: set[tuple] = set()  # the kinds of gap the reply has shown, changed or kept
        self._applied: list[Rule] = []  # the rules the last laid-out copy applied
        self._applied_gaps: list[list[tuple]] = []  # the kinds of gap in each of its tokens

    @property
    def trusted(self) -> bool:
        """Some rule is trusted (a copy may be laid out otherwise than its source)."""
        return any(r.trusted for r in self.rules.values()) or bool(self.scale and self.scale.trusted)

    @property
    def active(self) -> bool:
        """The reply is laying its copies out anew: its rules have held ACTIVE times."""
        held = sum(r.accepted for r in self.rules.values())
        return held + (self.scale.accepted if self.scale is not None else 0) >= ACTIVE

    def _spell(self, tokens: Sequence[int]) -> bytes:
        assert self.tokenizer is not None
        return b"".join(self.tokenizer.token_bytes(t) if t >= 0 else b"\0" for t in tokens)

    def _source_text(self, source: Sequence[int], start: Position, end: Position) -> bytes:
        (i, a), (j, b) = start, end
        if i == j:
            return self._spell(source[i:i + 1])[a:b]
        head, tail = self._spell(source[i:i + 1])[a:], self._spell(source[j:j + 1])[:b]
        return head + self._spell(source[i + 1:j]) + tail

    def _blanks_before(self, source: Sequence[int], at: Position) -> bytes:
        """The blanks in `source` just before `at` (back to its last non-blank byte)."""
        i, a = at
        out = b""
        text = self._spell(source[i:i + 1])[:a]
        while True:
            body = text.rstrip(_BLANK)
            out = text[len(body):] + out
            if body or i == 0 or len(out) > 64:
                return out
            i -= 1
            text = self._spell(source[i:i + 1])

    # ------------------------------------------------------------------------ where the reply is

    def project(self, source: Sequence[int], start: Position, written: Sequence[int]) -> Position | None:
        """Where the reply stands in `source` when, since `start`, it wrote `written` with the
        same non-blank bytes as the source from there: just past the last of them (past its
        token where it ends one). None where they differ (an edit, not a layout). `source` is
        the indexed text, the reply included: `written` is its end."""
        if self.tokenizer is None or len(written) > MAX_WRITTEN:
            return None
        wrote = _strip(self._spell(written))
        i, a = start
        k = 0
        limit = min(len(source) - len(written), start.at + 2 * MAX_WRITTEN)  # (`written` ends `source`)
        while k < len(wrote):
            if i >= limit or source[i] < 0:
                return None
            piece = self.tokenizer.token_bytes(source[i])
            for n in range(a, len(piece)):
                byte = piece[n]
                if byte in _BLANK:
                    continue
                if byte != wrote[k]:
                    return None
                k += 1
                if k == len(wrote):
                    return _past(piece, i, n)
            i, a = i + 1, 0
        return start

    def find(self, source: Sequence[int], near: int, written: Sequence[int]) -> Position | None:
        """Where the reply stands in `source` after a change of text, found by its last non-blank
        bytes (`written`: its last tokens) in the source around token `near` (where the copy
        stood; it may have jumped ahead to a similar line): the occurrence nearest `near` of
        the longest of its tails that has FIND_BYTES bytes at least."""
        if self.tokenizer is None or not self.active:
            return None
        tail = _strip(self._spell(written))
        if len(tail) < FIND_BYTES:
            return None
        stripped, where = bytearray(), []  # the source's non-blank bytes, and where each is
        first = max(0, near - FIND_BACK)
        for i in range(first, min(len(source) - len(written), near + FIND_WINDOW)):  # (`written` ends it)
            if source[i] < 0:  # a separator: no match crosses it
                stripped.append(0)
                where.append(Position(i))
                continue
            for n, byte in enumerate(self.tokenizer.token_bytes(source[i])):
                if byte not in _BLANK:
                    stripped.append(byte)
                    where.append(Position(i, n))
        for size in range(min(len(tail), 2 * FIND_BYTES), FIND_BYTES - 1, -1):
            found, at = [], stripped.find(tail[-size:])
            while at >= 0:
                found.append(at)
                at = stripped.find(tail[-size:], at + 1)
            if found:
                at = min(found, key=lambda f: abs(where[f].at - near))
                i, n = where[at + size - 1]
                return _past(self.tokenizer.token_bytes(source[i]), i, n)
        return None

    # ------------------------------------------------------------------------ learning

    def learn(self, source: Sequence[int], start: Position, end: Position, before: Sequence[int],
              written: Sequence[int]) -> int:
        """The reply wrote `written` (after its tokens `before`) where the source has the bytes
        from `start` to `end`, the same but for blanks: a rule for each gap that changed
        between two non-blank bytes; the number learned."""
        if self.tokenizer is None or not written:
            return 0
        left, reply_blanks = _tail(self._spell(before[-CONTEXT_TOKENS:]))
        if left is None:
            return 0
        lead = bytes([left])
        old = lead + self._blanks_before(source, start) + self._source_text(source, start, end)
        new = lead + reply_blanks + self._spell(written)
        old_marks, old_gaps = _gaps(old)
        new_marks, new_gaps = _gaps(new)
        if [old[i] for i in old_marks] != [new[i] for i in new_marks]:
            return 0
        learned = 0
        for k, ((a, b), (c, d)) in enumerate(zip(old_gaps[:-1], new_gaps[:-1], strict=True)):
            was, now = old[a:b], new[c:d]
            if was != now:
                learned += self._learn_gap(old[old_marks[k]], old[old_marks[k + 1]], was, now)
            else:
                self.known.add(_key(old[old_marks[k]], old[old_marks[k + 1]], was))
        return learned

    def _learn_gap(self, left: int, right: int, was: bytes, now: bytes) -> int:
        split_was, split_now = _indent(was), _indent(now)
        if split_was is not None and split_now is not None:
            if split_was[0] != split_now[0]:
                return 0  # the line breaks changed (blank lines): not learned
            old, new = len(split_was[1]), len(split_now[1])
            self.known.add(("indent", old))
            factor = new // old if old and new % old == 0 and new > old else 0
            if self.scale is not None and self.scale.written == factor:
                self.scale.accepted += 1
            elif factor and (self.scale is None or not self.scale.trusted):
                self.scale = Rule(factor)
            elif self.scale is not None:  # an indentation the scale does not explain
                self.scale.refused += 1
            return 1
        if b"\n" in was or b"\n" in now or len(now) > MAX_GAP:
            return 0
        self._keep(_key(left, right, was), now)
        return 1

    def saw(self, source: Sequence[int], i: int) -> None:
        """The reply wrote source token `i` as the source has it: the kinds of gap it closes are
        kept as they are."""
        if self.tokenizer is None or not self.rules or source[i] < 0:
            return
        left, blanks = _tail(self._spell(source[max(i - 2, 0):i]))
        text = (bytes([left]) if left is not None else b"") + blanks + self.tokenizer.token_bytes(source[i])
        marks, gaps = _gaps(text)
        for k, (a, b) in enumerate(gaps[:-1]):
            self.known.add(_key(text[marks[k]], text[marks[k + 1]], text[a:b]))

    def _keep(self, key: tuple, written: bytes | int) -> None:
        self.known.add(key)
        old = self.rules.get(key)
        if old is not None and old.written == written:
            old.accepted += 1
        else:
            self.rules[key] = Rule(written)

    # ------------------------------------------------------------------------ applying

    def _rule(self, left: int | None, right: int | None, gap: bytes) -> tuple[bytes, Rule] | None:
        """The whitespace a trusted rule writes for `gap` between `left` and `right` (None: the
        gap runs to the end of the copy), with the rule; None where none applies."""
        split = _indent(gap)
        if split is not None:
            head, indent = split
            if self.scale is not None and self.scale.trusted and indent:
                return head + indent * int(self.scale.written), self.scale
            return None
        if left is None or right is None:
            return None
        rule = self.rules.get(_key(left, right, gap))
        if rule is not None and rule.trusted:
            assert isinstance(rule.written, bytes)
            return rule.written, rule
        return None

    def apply(self, committed: Sequence[int], source: Sequence[int], start: Position,
              edited: Sequence[EditedToken]) -> Laid | None:
        """The copy `edited` of the source from `start` (as EditMemory.apply gives it; the first
        token's first `start.skip` bytes already written), laid out by the trusted rules as it
        follows the reply `committed`, and tokenized again. None where it stays as it is."""
        if self.tokenizer is None or not edited:
            return None
        skip = start.skip
        if not skip and not self.trusted:
            return None
        pieces = [self.tokenizer.token_bytes(t.token) for t in edited]
        pieces[0] = pieces[0][skip:]
        text = b"".join(pieces)
        owner: list[int] = []  # the copied token each byte of `text` comes from
        for n, piece in enumerate(pieces):
            owner.extend([n] * len(piece))
        left, written = _tail(self._spell(committed[-CONTEXT_TOKENS:]))
        marks, gaps = _gaps(text)
        out = bytearray()
        src: list[int | None] = []  # the byte of `text` each output byte is (None: a blank laid out)
        rule_at: list[int | None] = []  # the rule that laid out each output byte (None: none)
        rules: list[Rule] = []
        pending: int | None = None  # a gap closed by this rule: it rides with the byte after it
        kinds: list[tuple[int, tuple]] = []  # (the output byte it starts at, the kind) of each gap

        def copy(a: int, b: int) -> None:
            nonlocal pending
            for n in range(a, b):
                out.append(text[n])
                src.append(n)
                rule_at.append(pending)
                pending = None

        def gap(a: int, b: int, left: int | None, right: int | None, was: bytes, done: bytes) -> None:
            """Lay out text[a:b], the gap `was` of the source, of which the reply wrote `done`."""
            nonlocal pending
            if left is not None and right is not None:
                kinds.append((len(out), _key(left, right, was)))
            found = self._rule(left, right, was)
            if found is None or not found[0].startswith(done):  # the source's gap, less what is written
                rest = was[len(done):] if was.startswith(done) else b""
                if rest == text[a:b]:
                    copy(a, b)
                else:
                    out.extend(rest)
                    src.extend([None] * len(rest))
                    rule_at.extend([None] * len(rest))
                return
            if found[0][len(done):] == text[a:b]:
                copy(a, b)
                return
            if found[1] not in rules:
                rules.append(found[1])
            n, new = rules.index(found[1]), found[0][len(done):]
            out.extend(new)
            src.extend([None] * len(new))
            rule_at.extend([n] * len(new))
            if not new:
                pending = n

        lead = marks[0] if marks else len(text)
        first = text[marks[0]] if marks else None
        gap(0, lead, left, first, self._blanks_before(source, start) + text[:lead], written)
        for k, (a, b) in enumerate(gaps):
            copy(marks[k], marks[k] + 1)
            right = text[marks[k + 1]] if k + 1 < len(marks) else None
            gap(a, b, text[marks[k]], right, text[a:b], b"")
        if not rules and not skip:
            return None
        return self._retokenize(bytes(out), src, rule_at, rules, kinds, owner, start, edited)

    def _retokenize(self, out: bytes, src: list[int | None], rule_at: list[int | None], rules: list[Rule],
                    kinds: list[tuple[int, tuple]], owner: list[int], start: Position,
                    edited: Sequence[EditedToken]) -> Laid | None:
        """`out` (the laid-out copy) as the tokenizer cuts it (`retokenized`); its rules and
        gaps are what `score` reads next."""
        assert self.tokenizer is not None
        laid = retokenized(self.tokenizer, out, src, rule_at, kinds, owner, start, edited, self.known)
        if laid is not None:
            self._applied, self._applied_gaps = rules, [t.gaps for t in laid.tokens]
        return laid

    def score(self, rule_at: Sequence[int | None], accepted: int) -> None:
        """The target accepted the first `accepted` tokens of a proposal whose tokens the rules
        `rule_at` (indices into the last laid-out copy's rules, None: none) laid out."""
        for gaps in self._applied_gaps[:accepted]:  # what the target wrote there, it has now shown
            self.known.update(gaps)
        seen: set[int] = set()
        for i, n in enumerate(rule_at[:accepted + 1]):
            if n is None or n in seen or n >= len(self._applied):
                continue
            seen.add(n)
            if i < accepted:
                self._applied[n].accepted += 1
            else:
                self._applied[n].refused += 1


def retokenized(tokenizer: Tokenizer, out: bytes, src: list[int | None], rule_at: list[int | None],
                kinds: list[tuple[int, tuple]], owner: list[int], start: Position,
                edited: Sequence[EditedToken], known: set[tuple]) -> Laid | None:
    """`out` (the laid-out copy; `src` and `rule_at` per byte) as the tokenizer cuts it,
    each token's position after it in the source from `owner` (the token of `edited` each byte
    of the copy's text comes from); `known`: the kinds of gap the reply has shown. None where
    the tokenizer does not give the text back byte for byte."""
    try:
        text = out.decode("utf-8")
    except UnicodeDecodeError:  # the copy cuts a character
        return None
    begins = {}  # where each copied token's bytes begin in the copy's text
    for n, o in enumerate(owner):
        begins.setdefault(o, n)
    laid = Laid([])
    k = 0
    pos, last_src = 0, None
    for token in tokenizer.tokenize(text, add_special=False, special=False):
        piece = tokenizer.token_bytes(token)
        end = pos + len(piece)
        if end > len(out) or out[pos:end] != piece:
            return None  # the tokenizer did not give the text back byte for byte
        last_src = max((i for i in [last_src, *src[pos:end]] if i is not None), default=None)
        if last_src is None:  # nothing of the source yet (blanks laid out before it)
            after = start
        else:
            o = owner[last_src]
            if last_src + 1 == len(owner) or owner[last_src + 1] != o or edited[o].by is not None:
                after = Position(edited[o].after)  # (inside a substitution's tokens: after it)
            else:  # inside copied token o: the bytes of it written
                written = last_src + 1 - begins[o] + (start.skip if o == 0 else 0)
                after = Position(edited[o].after - 1, written)
        written_by = (edited[owner[i]].by for i in src[pos:end] if i is not None)
        by = next((b for b in written_by if b is not None), None)
        rule = next((r for r in rule_at[pos:end] if r is not None), None)
        gaps = []
        while k < len(kinds) and kinds[k][0] < end:
            gaps.append(kinds[k][1])
            k += 1
        laid.tokens.append(LaidToken(token, after, by, rule, gaps))
        if laid.unknown is None and any(g not in known for g in gaps):
            laid.unknown = len(laid.tokens) - 1
        pos = end
    if pos != len(out):
        return None
    return laid
