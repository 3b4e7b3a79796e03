"""What the replies so far showed, kept across replies: rates with priors, by name.

One evidence type, `Rate`: a running mean that starts from a prior worth `weight` observations
and forgets: once it holds `memory` observations, older ones are scaled down so recent replies
weigh more (the kind of text changes between requests). `Evidence` holds the rates the
methods name (a method declares its own and their priors, `Strategy.evidence_priors`, and
folds its rounds into them, `Strategy.learn`) and, per kind of request, whatever state a
proposer keeps (`Evidence.of_kind`; the copy proposers' per-token evidence, for one). It knows
no method: the names are theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

PLAN_PRIOR_WEIGHT = 32.0  # a planner's prior counts as this many observed tokens
PLAN_MEMORY = 512.0  # ... and it remembers at most this many

T = TypeVar("T")


@dataclass
class Rate:
    """A running mean with a prior worth `weight` observations and at most `memory` of them."""

    value: float
    weight: float = PLAN_PRIOR_WEIGHT
    memory: float = PLAN_MEMORY

    def add(self, value: float, n: float) -> None:
        """`n` observations whose mean is `value`."""
        if n <= 0:
            return
        self.weight = min(self.weight, self.memory)
        self.value = (self.value * self.weight + value * n) / (self.weight + n)
        self.weight += n

    def add_run(self, accepted: int, stopped: bool) -> None:
        """A geometric run: `accepted` tokens passed, then one was refused (`stopped`) or the
        proposal ended. The rate is accepted tokens over accepted tokens plus refusals."""
        n = accepted + (1 if stopped else 0)
        if n:
            self.add(accepted / n, n)

    def add_counts(self, hits: int, misses: int) -> None:
        """`hits` successes and `misses` failures."""
        if hits + misses:
            self.add(hits / (hits + misses), hits + misses)


@dataclass
class Evidence:
    """Everything learned from replies that a proposer or the planner reads: named rates and,
    per (name, kind of request), a proposer's own state."""

    rates: dict[str, Rate] = field(default_factory=dict)
    kinds: dict[tuple[str, str], Any] = field(default_factory=dict)

    def rate(self, name: str, prior: float) -> Rate:
        """The rate `name`, started at `prior` the first time anyone asks for it."""
        r = self.rates.get(name)
        if r is None:
            r = self.rates[name] = Rate(prior)
        return r

    def seed(self, name: str, value: float) -> None:
        """Start the rate `name` from `value` (a measured prior), forgetting what it held."""
        self.rates[name] = Rate(value)

    def of_kind(self, name: str, kind: str, make: Callable[[], T]) -> T:
        """The state `name` keeps for requests of `kind` (made by `make` the first time)."""
        key = (name, kind)
        if key not in self.kinds:
            self.kinds[key] = make()
        return self.kinds[key]
