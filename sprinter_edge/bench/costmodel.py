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

from dataclasses import dataclass

from ..decoding import get_strategy
from ..decoding.base import Stats
from ..planning.costs import SIZES, CostTable, measure

__all__ = ["SIZES", "CostModel", "CostTable", "measure"]

@dataclass
class CostModel:
    target: CostTable
    draft: CostTable | None = None

    def predict_seconds(self, stats: Stats, *, flat: bool = False) -> float:
        """Decode seconds the counters imply (flat: every call costs a one-token step)."""
        seconds = stats.verifier_seconds
        if stats.target_calls:
            n_avg = stats.target_tokens / stats.target_calls
            rows = get_strategy(stats.method).target_rows(n_avg)
            ms = self.target.cost(1) if flat else self.target.cost(n_avg, rows)
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
