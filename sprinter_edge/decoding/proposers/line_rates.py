"""What each kind of source line let through in this reply: a copy's per-token acceptance by
the line of the source it copies.

An edit that rewrites many lines rewrites lines of one kind: type hints change every `def`
line and leave the bodies as they are, docstrings go in after the `def` lines, f-strings change
the `return` and `print` lines that format. The copy evidence's rate is one figure for a whole
copy, so a proposal that runs from a body into the next `def` line is priced as safe as the
body and pays for the rows the edit refuses. Here each copied token is priced by its source
line's kind, the line's first non-blank token (`def`, `return`, `#`, ...): the tokens accepted
and refused in lines of that kind so far in the reply, drawn towards the copy's rate until a
few were seen. A proposal is then cut where its tokens per millisecond peak with each token at
its own rate (`pricing.best_prefix`), before the edited line rather than inside it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Protocol

PRIOR_WEIGHT = 8.0  # tokens of the copy's own rate a line kind starts with
MAX_INDENT = 16  # tokens from a line's start to its first non-blank one, at most (else: none)


class TokenText(Protocol):
    def token_bytes(self, token: int, *, special: bool = False) -> bytes: ...


class LineRates:
    """Per kind of source line, the copied tokens the target accepted and refused (one reply).
    `model`: the tokenizer whose token bytes show where lines start (None: one kind of line)."""

    def __init__(self, model: TokenText | None = None) -> None:
        self.model = model
        self.accepted: Counter[int] = Counter()
        self.refused: Counter[int] = Counter()
        self._heads: dict[int, int] = {}  # source position -> its line's first non-blank token

    def head(self, seq: Sequence[int], j: int) -> int:
        """The first non-blank token of the line that source position `j` is in, the line its
        token's first byte is in (`):\n` is the `def` line's; -1: none known)."""
        if self.model is None or not 0 <= j < len(seq):
            return -1
        got = self._heads.get(j)
        if got is not None:
            return got
        start = j
        while start > 0 and b"\n" not in self._bytes(seq[start - 1]):
            start -= 1
        if start > 0 and self._bytes(seq[start - 1]).rsplit(b"\n", 1)[1].strip():
            head = seq[start - 1]  # the line starts inside the token before it (`\n#`)
        else:
            head = next((t for t in seq[start:start + MAX_INDENT] if self._bytes(t).split(b"\n", 1)[0].strip()
                         or b"\n" in self._bytes(t)), -1)  # (a blank line's head is its newline)
        if head >= 0:
            self._heads[j] = head
        return head  # (-1 not kept: the reply may not have written its line's first token yet)

    def _bytes(self, token: int) -> bytes:
        assert self.model is not None
        return self.model.token_bytes(token) if token >= 0 else b"\n"  # a separator ends a line

    def rates(self, a: float, heads: Sequence[int]) -> list[float]:
        """Each copied token's acceptance: its line kind's, drawn towards `a` (the copy's)."""
        out = []
        for h in heads:
            seen = self.accepted[h] + self.refused[h]
            out.append((self.accepted[h] + PRIOR_WEIGHT * a) / (seen + PRIOR_WEIGHT))
        return out

    def score(self, heads: Sequence[int], accepted: int) -> None:
        """A proposal whose tokens lay in lines of `heads` kept its first `accepted`."""
        for h in heads[:accepted]:
            self.accepted[h] += 1
        if accepted < len(heads):
            self.refused[heads[accepted]] += 1
