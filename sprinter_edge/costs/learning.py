"""What a finished reply teaches the cost tables, and what it would have cost as plain decoding.

Each reply times its own decode calls (`decoding.stats.CallLog.by_role`: per model role, each
call shape with its depth, milliseconds and count). They are folded into the tables the engine got from the
cache or measured (`CostTable.learn_calls`, which first rescales a table the calls disagree with)
and the tables are stored again, so the sizes and depths requests reach are priced from their
own calls. This is the one way costs are learned; what a method's proposals taught about its
acceptance is the planner's evidence (`Strategy.learn`, CONTRIBUTING's "Learning").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .table import CostTable, learning_on, store_costs

Call = tuple[int, int, float, float, int]  # n tokens, logits rows, depth, ms each, count


def plain_seconds(table: CostTable, start: int, new_tokens: int) -> float:
    """Seconds plain decoding of `new_tokens` after a `start`-token prompt costs on `table`."""
    return round(sum(table.at(start + i).cost(1) for i in range(new_tokens)) / 1e3, 4)


def learn_reply(calls: Mapping[str, list[Call]],
                learners: Mapping[str, tuple[Any, CostTable | None]]) -> None:
    """Fold each role's calls into its table and store it (`learners`: role -> (the loaded model,
    its table; None where it must not learn)). Nothing happens with learning off (LEARN_ENV)."""
    if not learning_on():
        return
    for role, timed in calls.items():
        model, table = learners.get(role, (None, None))
        if model is None or table is None:
            continue
        table.learn_calls(timed)
        table.make_monotone()
        store_costs(model, table)
