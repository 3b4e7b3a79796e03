"""Every decoding method a user can name, and the one rule for when an approximate one may run.

The registry is decoding's (`decoding.STRATEGIES`: a new method is its file and a line there)
plus `auto`, which sits above decoding with the planner that chooses among them.
"""

from __future__ import annotations

from .decoding import STRATEGIES, Strategy
from .errors import SettingsError
from .planning.auto import Auto
from .planning.planner import BASELINE, Planner

DEFAULT_METHOD = Auto.name
BASELINE_METHOD = BASELINE.name  # plain decoding: what every speed-up is against, by definition

# kinds of request on which nothing approximate runs unless asked for by name: on edits
# SPRINTER passed the draft's copy exactly where the target makes the change, and skipped the
# requested edit at every preset, while exact lookup ran at 2.3-2.5x ar
EXACT_KINDS = frozenset({"edit"})


def methods() -> tuple[str, ...]:
    """Every registered method's name, `auto` first (read from the registry when called, so a
    method registered later is there)."""
    return (Auto.name, *STRATEGIES)


def described() -> str:
    """Every method with what it does (`Strategy.about`), for help texts: "auto: ...; ar: ..." """
    return "; ".join(f"{m}: {get_strategy(m).about}" for m in methods())


def exact_methods() -> tuple[str, ...]:
    """The methods whose output is the target's."""
    return tuple(m for m in methods() if get_strategy(m).exact)


def get_strategy(name: str, planner: Planner | None = None) -> Strategy:
    """A fresh strategy for method `name` (`auto` runs with `planner`)."""
    if name == Auto.name:
        return Auto(planner)
    try:
        return STRATEGIES[name]()
    except KeyError:
        raise SettingsError(f"unknown method {name!r}; choose from {', '.join(methods())}") from None


def may_approximate(strategy: Strategy, kind: str, point_chosen: bool) -> bool:
    """Whether tokens the target never checks may be committed for this request: a method that
    is approximate by design runs as asked; `auto` runs an approximate plan only when the caller
    chose an operating point, and never on kinds in EXACT_KINDS."""
    if isinstance(strategy, Auto):
        return point_chosen and kind not in EXACT_KINDS
    return not strategy.exact
