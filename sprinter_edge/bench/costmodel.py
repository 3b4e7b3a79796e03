"""This machine's decode costs, and each method's tokens/s predicted from its counters.

A decode call of n tokens that returns logits for r of them costs c(n, r). The LM head
(a 152k-token vocabulary for the default pair) is a large part of a batch, and only the
rows asked for pay it: SPRINTER's catch-up asks for 2 rows, SD for all k+1. Measured:
c(n, 1) and c(n, n) for n in 1..32; c(n, r) is linear in r between them.

Predicted seconds of a generation = the sum over its model calls of c(n, r) at the depth of
context each call read (the reply's `CallLog`, whatever plans `auto` ran) + the verifier time
measured. A reply known only by its counters (a JSON record) is priced at its mean call:
draft_calls * d(1, 1) + target_calls * t(n_avg, r_avg) at the reply's mean depth (prompt + half
the reply), which underprices a mix of long and short calls. The same calls priced with a flat
cost (a batch costs one token, as on a GPU or Apple Silicon) give the speed-up on such a machine.

The floor of a workload is what an exact method would pay if every proposal were right: each
token one row of the cheapest all-rows call at its depth (`floor_ratio`: ar's priced time over
that, the most any exact method can reach on this machine). A method's share of it is its
measured ratio over ar divided by the floor's. `priced` prices the other bounds the same way
(tokens no copy gives at a target step, or a perfect draft's step and a row: tools/replay.py bounds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..costs.pricing import flat_table
from ..costs.table import FULL_SIZES, SIZES, CostTable, measure
from ..decoding import Stats
from ..decoding.stats import DEPTH_STEP

__all__ = ["SIZES", "CostModel", "CostTable", "measure"]


@dataclass
class CostModel:
    target: CostTable
    draft: CostTable | None = None

    def predict_seconds(self, stats: Stats, *, flat: bool = False) -> float:
        """Decode seconds the calls imply (flat: every call costs a one-token step)."""
        seconds = stats.timings.verifier_seconds
        log = stats.calls
        if log.target or log.draft:
            for table, calls in ((self.target, log.target), (self.draft, log.draft)):
                if table is None:
                    continue
                one = flat_table(table) if flat else None
                for (n, rows, step), count in calls.items():
                    priced = one or table.at(step * DEPTH_STEP + DEPTH_STEP // 2)
                    seconds += count * priced.cost(n, rows) / 1e3
            return seconds
        c = stats.counters
        depth = stats.prompt_tokens + c.new_tokens // 2  # the reply's mean depth of context
        target = flat_table(self.target) if flat else self.target.at(depth)
        draft = self.draft.at(depth) if self.draft is not None else None
        if c.target_calls:
            n_avg = c.target_tokens / c.target_calls
            rows = c.target_rows / c.target_calls if c.target_rows else 1.0
            seconds += c.target_calls * target.cost(n_avg, rows) / 1e3
        if c.draft_calls and draft is not None:
            seconds += c.draft_calls * draft.cost(1) / 1e3
        return seconds

    def predict_tps(self, stats: Stats | Sequence[Stats], *, flat: bool = False) -> float:
        """Predicted tokens/s of one reply, or of several (each priced at its own depth)."""
        items = [stats] if isinstance(stats, Stats) else list(stats)
        s = sum(self.predict_seconds(st, flat=flat) for st in items)
        n = sum(st.new_tokens for st in items)
        return n / s if s > 0 and n else 0.0

    def floor_ratio(self, replies: Sequence[tuple[int, int]]) -> float | None:
        """ar's priced time over the floor's for replies of (prompt tokens, new tokens), each
        priced in spans of DEPTH_STEP tokens at the span's depth."""
        return self.bound_ratio([(prompt, [False] * new) for prompt, new in replies])

    def bound_ratio(self, replies: Sequence[tuple[int, Sequence[bool]]], *,
                    draft_writes: bool = False) -> float | None:
        """ar's priced time over a bound's (`priced`)."""
        ar, bound = self.priced(replies, draft_writes=draft_writes)
        return ar / bound if bound > 0 else None

    def priced(self, replies: Sequence[tuple[int, Sequence[bool]]], *,
               draft_writes: bool = False) -> tuple[float, float]:
        """(ar's ms, a bound's ms) for replies of (prompt tokens, one flag per new token: whether
        no copy can give it), in spans of DEPTH_STEP tokens at the span's depth. A token a copy
        gives costs the floor's row; a flagged one a target step, or (`draft_writes`, with draft
        costs) a draft step and a floor row where that is cheaper: a draft that is always right,
        its catch-up over the copies free."""
        ar = bound = 0.0
        for prompt, flags in replies:
            for start in range(0, len(flags), DEPTH_STEP):
                span = flags[start:start + DEPTH_STEP]
                depth = prompt + start + len(span) // 2
                table = self.target.at(depth)
                row = min(table.all_rows(n) / n for n in FULL_SIZES)
                novel = table.cost(1)
                if draft_writes and self.draft is not None:
                    novel = min(novel, self.draft.at(depth).cost(1) + row)
                forced = sum(span)
                ar += len(span) * table.cost(1)
                bound += forced * novel + (len(span) - forced) * row
        return ar, bound

    def ar_tps(self) -> float:
        return 1e3 / self.target.cost(1)

    def to_dict(self) -> dict:
        return {"target": self.target.to_dict(),
                "draft": self.draft.to_dict() if self.draft else None}

    @classmethod
    def from_dict(cls, data: dict) -> CostModel:
        """A bench.json's `cost_model`."""
        draft = data.get("draft")
        return cls(CostTable.from_dict(data["target"]), CostTable.from_dict(draft) if draft else None)
