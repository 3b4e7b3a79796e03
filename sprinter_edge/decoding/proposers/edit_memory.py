"""What a reply has been changing in the text it copies, applied to what it copies next.

An edit repeats itself: a rename replaces one identifier everywhere, a type hint follows the
same parameter wherever it is declared. The copy proposer departs from its source at the first
occurrence (the target writes `low` where the source says `lo`) and resumes a few tokens later.
At the resumption the replaced source tokens and the reply's tokens in their place are known:
that pair is a substitution, remembered with the source token before it as context (a hint
inserted after `path` is keyed by `path`). Copies proposed later carry the substitution, so
the second and later occurrences of an edit are proposed, not rejected. Only a copy of a source
teaches: where the copy was of the reply's own text (the function before, in a file of similar
ones), what the reply writes otherwise is this function differing from that one (`hls_to_rgb(h,
l, s)` after `rgb_to_hls(r, g, b)`), and a rename learned there is refused where it is applied.

A rename has as many spellings as the tokenizer has ways to cut it: ` mode`, `(mode` and `.mode`
are different tokens, so a substitution learned at ` mode` would not apply at `(mode`. When a
learned substitution renames one word (`mode` -> `file_mode`), every whole-word occurrence of
the old word in the indexed text is looked up and its tokens, retokenized with the new word,
become a substitution of their own (`respell`): the second spelling is proposed too. A rename
that keeps the old word's token and writes on after it (` actual` -> ` actual` `_value`) is an
insertion after the context token: read with that token, it renames the word as well.

A substitution learned without its context renames whatever token matches its key, which can be
a piece of a longer word (`p` inside `se|p`); one that spells the start (end) of a word applies
only where the copy is at a word's start (end), as it was where it was learned.

A substitution is a guess like any copied span (a deterministic proposal, a point mass in the
p/q test): exactness never rests on it. Each keeps a score: accepted where it was proposed,
refused where the target wrote otherwise; one refused more often than accepted is not applied.
A reply may rename a word in code and keep it in a comment, a docstring or a string, so a
substitution is scored apart in such prose and in code: trusted in the one where it was learned,
in the other once the reply has made it there too.
"""

from __future__ import annotations

import bisect
import itertools
import keyword
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

MAX_REPLACED = 8  # longest source span a substitution replaces
MAX_WRITTEN = 16  # longest reply span it writes in its place
# a renamed word, alone in its span between punctuation or spaces that the rename keeps
_WORD = re.compile(rb"(\W*)([A-Za-z_]\w*)(\W*)")
_WORDY = re.compile(rb"\w")
CODE, COMMENT = b"", b"#"  # what a byte of Python is in; else the quotes of the string it is in


class Tokenizer(Protocol):
    """What respelling needs of a model: a token's bytes, and text to tokens."""

    def token_bytes(self, token: int, *, special: bool = False) -> bytes: ...

    def tokenize(self, text: str, *, add_special: bool = True, special: bool = True) -> list[int]: ...


class Applied(NamedTuple):
    """Where `EditMemory.apply` made a substitution: which one, and whether in prose (a comment,
    a string: scored apart from code)."""

    key: tuple[int, ...]  # the substitution's key in the memory
    prose: bool


class EditedToken(NamedTuple):
    """One token of a copy with the learned edits made (`EditMemory.apply`)."""

    token: int
    after: int  # the source position after it
    by: Applied | None = None  # the substitution that wrote it (None: the source's own token)


@dataclass
class Substitution:
    key: tuple[int, ...]  # the source tokens, the context token first when `contextual`
    value: tuple[int, ...]  # what the reply wrote in their place (the context token first too)
    contextual: bool
    starts_word: bool = False  # the key's first (last) byte is a word's: it applies only at a
    ends_word: bool = False    # word's start (end), not inside a longer word
    accepted: int = 1  # in code; learned from one occurrence
    refused: int = 0
    prose_accepted: int = 0  # in prose: comments and strings
    prose_refused: int = 0

    @property
    def width(self) -> int:
        """How many source tokens it replaces (0: an insertion after its context token)."""
        return len(self.key) - (1 if self.contextual else 0)

    def trusted(self, prose: bool = False) -> bool:
        if prose:
            return self.prose_accepted > self.prose_refused
        return self.accepted > self.refused

    def add(self, prose: bool, accepted: bool) -> None:
        """One more application (or occurrence) in prose or in code, accepted or refused."""
        name = ("prose_" if prose else "") + ("accepted" if accepted else "refused")
        setattr(self, name, getattr(self, name) + 1)

    @classmethod
    def learned(cls, key: tuple[int, ...], value: tuple[int, ...], contextual: bool,
                prose: bool) -> Substitution:
        """A substitution seen once, in prose or in code."""
        return cls(key, value, contextual, accepted=int(not prose), prose_accepted=int(prose))


class EditMemory:
    """Substitutions learned from the reply so far, and where proposals applied them."""

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self.subs: dict[tuple[int, ...], Substitution] = {}
        self._longest = 0
        self.tokenizer = tokenizer  # None: no respelling
        self._renames: set[tuple[bytes, bytes]] = set()  # words respelled so far
        self._scanned: list[int] = []  # the text read for prose so far,
        self._prose: list[bool] = []  # whether each of its tokens starts in prose,
        self._state = CODE  # and what its end is in

    def learn(self, context: int | None, replaced: Sequence[int], written: Sequence[int],
              prose: bool = False) -> None:
        """The reply wrote `written` where the source had `replaced`, after the source token
        `context` (in prose or in code). A replacement is also kept without its context (a
        rename looks the same everywhere); an insertion (nothing replaced) only with it."""
        replaced, written = tuple(replaced), tuple(written)
        if replaced == written or len(replaced) > MAX_REPLACED or len(written) > MAX_WRITTEN:
            return
        keys = []
        if context is not None:
            keys.append(((context, *replaced), (context, *written), True))
        if replaced:
            keys.append((replaced, written, False))
        for key, value, contextual in keys:
            old = self.subs.get(key)
            if old is not None and old.value == value:
                old.add(prose, accepted=True)
            else:
                self._add(Substitution.learned(key, value, contextual, prose))

    def _add(self, sub: Substitution) -> None:
        """Keep `sub` (replacing one of the same key); `apply` looks keys up to the longest."""
        if not sub.contextual and self.tokenizer is not None:
            spelled = b"".join(map(self._spell, sub.key))
            sub.starts_word = bool(_WORDY.fullmatch(spelled[:1]))
            sub.ends_word = bool(_WORDY.fullmatch(spelled[-1:]))
        self.subs[sub.key] = sub
        self._longest = max(self._longest, len(sub.key))

    def _spell(self, token: int) -> bytes:
        """A token's bytes (a separator, a negative id, is a NUL); the model keeps them cached."""
        assert self.tokenizer is not None
        return self.tokenizer.token_bytes(token) if token >= 0 else b"\0"

    def respell(self, text: Sequence[int], replaced: Sequence[int], written: Sequence[int],
                context: int | None = None, prose: bool = False) -> int:
        """Where `written` renames the one word of `replaced` (the same punctuation around it),
        or, read after the `context` token, of context + `replaced` (a rename that writes on
        after the old word's token), a substitution for every other tokenization of that word in
        `text` (the indexed tokens; negative ids are separators): its tokens, with the new word,
        retokenized, trusted where the rename was made (`prose`). The number added."""
        if self.tokenizer is None or not written:
            return 0
        word = self._rename(replaced, written) if replaced else None
        if word is None and context is not None and context >= 0:
            word = self._rename((context, *replaced), (context, *written))
        if word is None or word in self._renames:
            return 0
        self._renames.add(word)
        old, new = word
        pieces = [self._spell(t) for t in text]
        starts = [0, *itertools.accumulate(map(len, pieces))]  # where each token's bytes begin
        joined = b"".join(pieces)
        added = 0
        # a whole word, not the `s` of a contraction (`path's`)
        for m in re.finditer(rb"(?<!\w)(?<!\w')" + re.escape(old) + rb"(?!\w)", joined):
            i = bisect.bisect_right(starts, m.start()) - 1  # the tokens that hold the word
            j = bisect.bisect_left(starts, m.end())
            key = tuple(text[i:j])
            if key in self.subs or len(key) > MAX_REPLACED or any(t < 0 for t in key):
                continue
            span = joined[starts[i]:starts[j]]
            lo, hi = m.start() - starts[i], m.end() - starts[i]
            try:
                value = self.tokenizer.tokenize((span[:lo] + new + span[hi:]).decode("utf-8"),
                                                add_special=False, special=False)
            except UnicodeDecodeError:  # the span cuts a character: its tokens hold part of one
                continue
            if value and len(value) <= MAX_WRITTEN and tuple(value) != key:
                self._add(Substitution.learned(key, tuple(value), False, prose))
                added += 1
        return added

    def _rename(self, replaced: Sequence[int], written: Sequence[int]) -> tuple[bytes, bytes] | None:
        """(old word, new word) when `written` renames the one word `replaced` spells."""
        assert self.tokenizer is not None
        old = _WORD.fullmatch(b"".join(map(self._spell, replaced)))
        new = _WORD.fullmatch(b"".join(map(self._spell, written)))
        if old is None or new is None or old.group(2) == new.group(2):
            return None
        if keyword.iskeyword(old.group(2).decode()):  # `if` -> `while` is a change of code, no rename
            return None
        if (old.group(1), old.group(3)) != (new.group(1), new.group(3)):
            return None
        return old.group(2), new.group(2)

    def apply(self, source: Sequence[int], start: int, end: int) -> list[EditedToken]:
        """The copy of source[start:end] with every trusted substitution made, token by token,
        each with the source position after it and the substitution that wrote it. A key with
        its context token matches with that token at source[i - 1] (so at `start` too); an
        insertion goes before source[i]."""
        out: list[EditedToken] = []
        i = start
        inserted_at = -1
        while i < end:
            sub = self._at(source, i, end, insertion=inserted_at != i) if self.subs else None
            prose = sub is not None and self.in_prose(source, i)
            if sub is not None and not sub.trusted(prose):
                sub = None
            if sub is None:
                out.append(EditedToken(source[i], i + 1))
                i += 1
                continue
            width = sub.width
            written = sub.value[1:] if sub.contextual else sub.value
            by = Applied(sub.key, prose)
            out.extend(EditedToken(t, i + width, by) for t in written)
            if width == 0:
                inserted_at = i  # then copy source[i] itself
            i += width
        return out

    def _at(self, source: Sequence[int], i: int, end: int, *, insertion: bool) -> Substitution | None:
        """The longest substitution trusted anywhere whose source tokens start at i (context keys
        first); an insertion (nothing replaced) only when `insertion`."""
        for n in range(min(self._longest, end - i + 1), 0, -1):
            for contextual in (True, False):
                lo = i - 1 if contextual else i
                if lo < 0 or lo + n > end:
                    continue
                sub = self.subs.get(tuple(source[lo:lo + n]))
                if sub is None or sub.contextual != contextual or not (sub.trusted() or sub.trusted(True)):
                    continue
                if contextual and n == 1 and not insertion:
                    continue
                if not contextual and not self._bounded(sub, source, i, n):
                    continue
                return sub
        return None

    def _bounded(self, sub: Substitution, source: Sequence[int], i: int, n: int) -> bool:
        """`sub` (its key at source[i:i + n]) starts or ends a word only where one starts or ends:
        not after (before) a source token whose last (first) byte is a word's."""
        if sub.starts_word and i > 0 and _WORDY.fullmatch(self._spell(source[i - 1])[-1:]):
            return False
        return not (sub.ends_word and i + n < len(source)
                    and _WORDY.fullmatch(self._spell(source[i + n])[:1]))

    def in_prose(self, source: Sequence[int], i: int) -> bool:
        """Whether source[i] starts in prose (a comment or a string) rather than code (False
        without a tokenizer). The text is read once, as it grows."""
        if self.tokenizer is None:
            return False
        n = len(self._scanned)
        if len(source) < n or source[:n] != self._scanned:
            self._scanned, self._prose, self._state, n = [], [], CODE, 0
        for t in source[n:i + 1]:
            self._prose.append(self._state != CODE)
            self._state = CODE if t < 0 else _scan(self._state, self._spell(t))
        self._scanned.extend(source[n:i + 1])
        return self._prose[i]

    def substitution(self, by: Applied) -> Substitution:
        """The substitution that wrote a token (`apply`'s `by` for it)."""
        return self.subs[by.key]

    def score(self, by: Sequence[Applied | None], accepted: int) -> None:
        """The target accepted the first `accepted` tokens of a proposal whose tokens `by`
        substitutions wrote (None: the source's own): an application all of whose tokens passed
        counts as accepted, the one holding the first refused token as refused."""
        j = 0
        while j < len(by):
            n, k = by[j], j
            while k + 1 < len(by) and by[k + 1] == n:
                k += 1
            if n is not None and (k < accepted or j <= accepted):
                self.subs[n.key].add(n.prose, accepted=k < accepted)
            j = k + 1


def _scan(state: bytes, text: bytes) -> bytes:
    """What Python text is in after `text`, from `state` (CODE, COMMENT or a string's quotes).
    A string's quotes are read within one token's bytes: a triple quote cut by the tokenizer
    reads as an empty string and a quote (rare; a guess either way)."""
    i, n = 0, len(text)
    while i < n:
        c = text[i:i + 1]
        if state == CODE:
            if c == b"#":
                state = COMMENT
            elif c in (b"'", b'"'):
                state = c * 3 if text[i:i + 3] == c * 3 else c
                i += len(state) - 1
        elif state == COMMENT:
            if c == b"\n":
                state = CODE
        elif c == b"\\":
            i += 1  # an escaped character
        elif text[i:i + len(state)] == state:
            i += len(state) - 1
            state = CODE
        elif c == b"\n" and len(state) == 1:  # a string left open at the end of its line
            state = CODE
        i += 1
    return state
