"""What a reply has been changing in the text it copies, applied to what it copies next.

An edit repeats itself: a rename replaces one identifier everywhere, a type hint follows the
same parameter wherever it is declared. The copy proposer departs from its source at the first
occurrence (the target writes `low` where the source says `lo`) and resumes a few tokens later.
At the resumption the replaced source tokens and the reply's tokens in their place are known:
that pair is a substitution, remembered with the source token before it as context (a hint
inserted after `path` is keyed by `path`). Copies proposed later carry the substitution, so
the second and later occurrences of an edit are proposed, not rejected.

A substitution is a guess like any copied span (a deterministic proposal, a point mass in the
p/q test): exactness never rests on it. Each keeps a score: accepted where it was proposed,
refused where the target wrote otherwise; one refused more often than accepted is not applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_REPLACED = 8  # longest source span a substitution replaces
MAX_WRITTEN = 16  # longest reply span it writes in its place


@dataclass
class Substitution:
    key: tuple[int, ...]  # the source tokens, the context token first when `contextual`
    value: tuple[int, ...]  # what the reply wrote in their place (the context token first too)
    contextual: bool
    accepted: int = 1  # learned from one occurrence
    refused: int = 0

    @property
    def trusted(self) -> bool:
        return self.accepted > self.refused


class EditMemory:
    """Substitutions learned from the reply so far, and where proposals applied them."""

    def __init__(self) -> None:
        self.subs: dict[tuple[int, ...], Substitution] = {}
        self._longest = 0

    def learn(self, context: int | None, replaced: Sequence[int], written: Sequence[int]) -> None:
        """The reply wrote `written` where the source had `replaced`, after the source token
        `context`. A replacement is also kept without its context (a rename looks the same
        everywhere); an insertion (nothing replaced) only with it."""
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
                old.accepted += 1
            else:
                self.subs[key] = Substitution(key, value, contextual)
            self._longest = max(self._longest, len(key))

    def apply(self, source: Sequence[int], start: int, end: int) -> tuple[list[int], list[int], list[int]]:
        """The copy of source[start:end] with every trusted substitution made: (tokens, the
        source position after each token, the substitution that wrote each token or -1). A key
        with its context token matches with that token at source[i - 1] (so at `start` too); an
        insertion goes before source[i]."""
        tokens: list[int] = []
        after: list[int] = []
        by: list[int] = []
        ids = {key: n for n, key in enumerate(self.subs)}
        i = start
        inserted_at = -1
        while i < end:
            sub = self._at(source, i, end, insertion=inserted_at != i) if self.subs else None
            if sub is None:
                tokens.append(source[i])
                after.append(i + 1)
                by.append(-1)
                i += 1
                continue
            width = len(sub.key) - (1 if sub.contextual else 0)  # source tokens it replaces
            written = sub.value[1:] if sub.contextual else sub.value
            tokens.extend(written)
            after.extend([i + width] * len(written))
            by.extend([ids[sub.key]] * len(written))
            if width == 0:
                inserted_at = i  # then copy source[i] itself
            i += width
        return tokens, after, by

    def _at(self, source: Sequence[int], i: int, end: int, *, insertion: bool) -> Substitution | None:
        """The longest trusted substitution whose source tokens start at i (context keys first);
        an insertion (nothing replaced) only when `insertion`."""
        for n in range(min(self._longest, end - i + 1), 0, -1):
            for contextual in (True, False):
                lo = i - 1 if contextual else i
                if lo < 0 or lo + n > end:
                    continue
                sub = self.subs.get(tuple(source[lo:lo + n]))
                if sub is None or sub.contextual != contextual or not sub.trusted:
                    continue
                if contextual and n == 1 and not insertion:
                    continue
                return sub
        return None

    def score(self, by: Sequence[int], accepted: int) -> None:
        """The target accepted the first `accepted` tokens of a proposal whose tokens `by`
        substitutions wrote: an application all of whose tokens passed counts as accepted, the
        one holding the first refused token as refused."""
        subs = list(self.subs.values())
        j = 0
        while j < len(by):
            n, k = by[j], j
            while k + 1 < len(by) and by[k + 1] == n:
                k += 1
            if n >= 0:
                if k < accepted:
                    subs[n].accepted += 1
                elif j <= accepted:
                    subs[n].refused += 1
            j = k + 1
