"""This machine's decode costs, and each method's tokens/s predicted from its counters.

A decode call of n tokens that returns logits for r of them costs c(n, r). The LM head
(a 152k-token vocabulary for the default pair) is a large part of a batch, and only the
rows asked for pay it: SPRINTER's catch-up asks for 2 rows, SD for all k+1. Measured:
c(n, 1) and c(n, n) for n in 1..32; c(n, r) is linear in r between them.

Predicted seconds of a generation = draft_calls * d(1, 1) + target_calls * t(n_avg, r)
+ the verifier time measured, with n_avg = target_tokens / target_calls and r the rows the
method asks for. The same counters priced with a flat cost (a batch costs one token, as on
a GPU or Apple Silicon) give the speed-up on such a machine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..decoding.base import Stats

log = logging.getLogger(__name__)

SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32)
QUICK_SIZES = (1, 2, 4, 8, 16, 32)
_TEXT = ("def quicksort(items):\n    if len(items) <= 1:\n        return items\n    pivot = items[0]\n"
         "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun. ") * 8


@dataclass
class CostTable:
    """Milliseconds per decode call: `last[n]` with 1 logits row, `full[n]` with n rows."""

    last: dict[int, float] = field(default_factory=dict)
    full: dict[int, float] = field(default_factory=dict)

    def cost(self, n: float, rows: float = 1.0) -> float:
        """ms for a call of n tokens returning `rows` logits rows (interpolated)."""
        n = max(1.0, n)
        rows = min(max(rows, 1.0), n)
        c1, cn = _interp(self.last, n), _interp(self.full, n)
        if n <= 1:
            return c1
        return c1 + (cn - c1) * (rows - 1) / (n - 1)

    def to_dict(self) -> dict:
        return {"last_row_ms": {str(k): round(v, 2) for k, v in self.last.items()},
                "all_rows_ms": {str(k): round(v, 2) for k, v in self.full.items()}}


def _interp(table: dict[int, float], n: float) -> float:
    xs = sorted(table)
    if n <= xs[0]:
        return table[xs[0]]
    for a, b in zip(xs, xs[1:], strict=False):
        if n <= b:
            return table[a] + (table[b] - table[a]) * (n - a) / (b - a)
    if len(xs) < 2:
        return table[xs[-1]]
    a, b = xs[-2], xs[-1]  # extrapolate with the last slope
    return table[b] + (table[b] - table[a]) * (n - b) / (b - a)


def measure(model: object, sizes: Sequence[int] = SIZES, repeats: int = 3) -> CostTable:
    """Time decode calls of n tokens after a 64-token context, median of `repeats`."""
    tokens = model.tokenize(_TEXT)  # type: ignore[attr-defined]
    context, batch = tokens[:64], tokens[64:]
    if len(batch) < max(sizes):
        batch = (batch * (max(sizes) // max(1, len(batch)) + 1))
    model.sync(context, n_logits=0)  # type: ignore[attr-defined]
    table = CostTable()
    for n in sizes:
        for rows, dest in ((1, table.last), (n, table.full)):
            if n == 1 and dest is table.full:
                table.full[1] = table.last[1]
                continue
            times = []
            for _ in range(repeats):
                model.rollback(len(context))  # type: ignore[attr-defined]
                t0 = time.perf_counter()
                model.eval(batch[:n], n_logits=rows)  # type: ignore[attr-defined]
                times.append((time.perf_counter() - t0) * 1e3)
            dest[n] = sorted(times)[len(times) // 2]
    model.rollback(0)  # type: ignore[attr-defined]
    log.info("decode costs measured for %s", getattr(model, "path", model))
    return table


@dataclass
class CostModel:
    target: CostTable
    draft: CostTable | None = None

    def rows_for(self, stats: Stats, n_avg: float) -> float:
        if stats.method == "sd":
            return n_avg  # all k+1 rows
        if stats.method == "sprinter":
            return 2.0  # flagged token + bonus
        return 1.0

    def predict_seconds(self, stats: Stats, *, flat: bool = False) -> float:
        """Decode seconds the counters imply (flat: every call costs a one-token step)."""
        seconds = stats.verifier_seconds
        if stats.target_calls:
            n_avg = stats.target_tokens / stats.target_calls
            ms = self.target.cost(1) if flat else self.target.cost(n_avg, self.rows_for(stats, n_avg))
            seconds += stats.target_calls * ms / 1e3
        if stats.draft_calls and self.draft is not None:
            seconds += stats.draft_calls * self.draft.cost(1) / 1e3
        return seconds

    def predict_tps(self, stats: Stats, *, flat: bool = False) -> float:
        s = self.predict_seconds(stats, flat=flat)
        return stats.new_tokens / s if s > 0 and stats.new_tokens else 0.0

    def ar_tps(self) -> float:
        return 1e3 / self.target.cost(1)

    def to_dict(self) -> dict:
        return {"target": self.target.to_dict(),
                "draft": self.draft.to_dict() if self.draft else None}
