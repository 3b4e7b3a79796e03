"""Fixed cost tables: a test about a decision prices it on a machine it chose, not this one."""

from __future__ import annotations

from sprinter_edge.costs.table import CostTable


def flat(ms: float = 10.0) -> CostTable:
    """A machine where a decode call costs the same whatever its size (proposals always pay)."""
    sizes = range(1, 33)
    return CostTable(last=dict.fromkeys(sizes, ms), full=dict.fromkeys(sizes, ms))
