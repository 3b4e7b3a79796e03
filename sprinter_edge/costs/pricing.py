"""The pricing formulas, written once: what a proposal or a plan costs per token it yields.

A proposal of k tokens that the target accepts with probability a per token (once the ones
before it were) yields (1 - a^(k+1)) / (1 - a) tokens, the target's own token included, for
one target call of k + 1 rows: `expected_tokens`. A proposer picks the k that maximises tokens
per millisecond on this machine's measured curve (`best_length`), the planner prices plans with
the same formula.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .table import CostTable


@dataclass(frozen=True)
class Costs:
    """The cost tables a decode may read: the target's and, with a pair, the draft's."""

    target: CostTable
    draft: CostTable | None = None

    def at(self, depth: int) -> Costs:
        """The costs of calls after `depth` tokens of context (see CostTable.at)."""
        return Costs(self.target.at(depth), self.draft.at(depth) if self.draft is not None else None)

    def flat(self) -> Costs:
        """The same models priced as if a decode call cost one token whatever its batch (a GPU
        or Apple Silicon, roughly)."""
        return Costs(flat_table(self.target), flat_table(self.draft) if self.draft is not None else None)


def flat_table(table: CostTable) -> CostTable:
    """`table` with every call priced at one token's cost."""
    one = table.cost(1)
    return CostTable(last=dict.fromkeys(table.last, one), full=dict.fromkeys(table.full, one))


def expected_tokens(a: float, k: int) -> float:
    """Tokens one round commits when k tokens are proposed, each accepted with probability a
    once the ones before it were (the target's own token included)."""
    a = min(a, 0.9999)
    return (1 - a ** (k + 1)) / (1 - a)


def best_length(a: float, max_k: int, target: CostTable) -> tuple[int, float]:
    """(k, ms per token) of the best proposal length; k = 0: a plain step is best."""
    best_k, best_ms = 0, target.cost(1)
    for k in range(1, max_k + 1):
        ms = target.all_rows(k + 1) / expected_tokens(a, k)
        if ms < best_ms:
            best_k, best_ms = k, ms
    return best_k, best_ms


def best_prefix(probs: Sequence[float], target: CostTable) -> int:
    """`best_length` for tokens each at its own rate: the proposal length whose tokens per
    millisecond peak, token i accepted with probability probs[i] once the ones before it were;
    0: a plain step is cheaper."""
    best_n, best_rate = 0, 1.0 / target.cost(1)
    alive, expected = 1.0, 1.0
    for n, p in enumerate(probs, start=1):
        alive *= min(p, 0.9999)
        expected += alive
        rate = expected / target.all_rows(n + 1)
        if rate > best_rate:
            best_n, best_rate = n, rate
    return best_n


def staged_cost(a: float, k: int, target: CostTable, draft: CostTable) -> float:
    """ms per token of a staged round: the draft checks k tokens (k + 1 rows), the target
    scores the agreed prefix and the draft's token at the cut. Assumes the draft agrees with a
    copied token about as often as the target does (both read the same context)."""
    a = min(a, 0.9999)
    agreed = a * (1 - a ** k) / (1 - a)  # expected agreed prefix length
    verified = agreed + (1 if agreed < k else 0) + 1
    return (draft.all_rows(k + 1) + target.all_rows(round(verified))) / expected_tokens(a, k)


def best_staged_length(a: float, max_k: int, target: CostTable, draft: CostTable) -> tuple[int, float]:
    """(k, ms per token) of the cheapest staged span of at most max_k tokens."""
    return min(((k, staged_cost(a, k, target, draft)) for k in range(1, max_k + 1)), key=lambda x: x[1])
