"""What a decoding method is: one `Strategy` subclass that declares everything the engine,
`auto`'s planner and the bench need to know about it.

A strategy runs as one generator over a `DecodeContext`: given the prompt tokens it yields
lists of newly committed tokens, each tagged with where it came from, forever; the driver
(`stream.py`) stops it on EOS, the token budget or a stop string. Beside that it declares
- what it needs: a draft, the target, a verifier, this machine's costs;
- whether its output is the target's (`exact`);
- the plans `auto` may run of it (`plans`) and their price (`price`) from this machine's costs
  and the evidence so far, or a prior speed-up over `ar` for methods whose speed is learned by
  running them;
- how to build its proposer for a plan (loop strategies, loop.py);
- what it owns: its knobs (`settings`, settings.py), the counters its rounds bump
  (`counters`), what its rounds teach (`learn`, into rates it names in `evidence_priors`),
  how its plans are labelled and what its output guarantees (`guarantee`).
A new method is one new file and one line in `decoding/__init__.py`'s registry.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..backend.llama import LlamaModel
from ..costs import Costs, Evidence
from .context import DecodeContext, Step
from .settings import Setting


@dataclass(frozen=True)
class Plan:
    """One way to run a method: its settings and, once priced, its predicted ms per token.
    Made by the method (`Strategy.plan`), which also names it."""

    method: str
    ms_per_token: float = 0.0
    settings: tuple[tuple[str, Any], ...] = ()  # (name, value) of the method's own settings
    name: str = ""  # how reports call it (e.g. "sd(k=3)"); default: the method

    def get(self, name: str, default: Any = None) -> Any:
        return dict(self.settings).get(name, default)

    @property
    def label(self) -> str:
        return self.name or self.method

    @property
    def tokens_per_second(self) -> float:
        return 1e3 / self.ms_per_token if self.ms_per_token > 0 else 0.0


@dataclass(frozen=True)
class RoundPrice:
    """One expected round of a plan (a mixture over run lengths for SPRINTER): the draft and
    verifier milliseconds, the milliseconds of its one target call, that call's mean batch and
    the tokens the round yields. ms per token = (draft_ms + target_ms) / tokens."""

    draft_ms: float
    target_ms: float
    tokens: float
    batch: float

    @property
    def ms_per_token(self) -> float:
        return (self.draft_ms + self.target_ms) / self.tokens


@dataclass(frozen=True)
class PriceInputs:
    """What a plan is priced from."""

    costs: Costs
    evidence: Evidence
    kind: str = "chat"  # the request's kind (edit | code | chat)
    verifier_ms: float = 0.0  # one verifier score
    # the user's values of the methods' settings (a method may bound its plans by them)
    settings: Mapping[str, Any] = field(default_factory=dict)


class Strategy(ABC):
    """One decoding method, and what it needs to run."""

    name: str = ""
    about: str = ""  # what it does, in one line (--method's help)
    needs_draft: bool = False  # cannot run without a draft model
    uses_draft: bool = False  # runs the draft when the engine has one
    needs_target: bool = True
    needs_verifier: bool = False  # scores draft tokens (when a draft runs)
    needs_costs: bool = False  # prices its proposals with this machine's measured costs
    exact: bool = True  # output distributed as the target's (greedy: identical to ar)
    judged_by_runs: bool = False  # `auto` judges it by what it measured running it (and probes it)
    # kinds of request on which `auto` does not leave it for ar mid-reply: a plan whose rounds are
    # plain steps wherever its proposals do not pay runs at ar's speed at worst, and on ar it
    # would stop learning where the reply starts to pay (an edit's copy often starts late)
    kept_over_ar: frozenset[str] = frozenset()
    settings: tuple[Setting, ...] = ()  # its own knobs (settings.py)
    counters: tuple[str, ...] = ()  # the counters its rounds bump (Counters.extra), in --stats

    def plan(self, ms_per_token: float = 0.0, **values: Any) -> Plan:
        """A plan of this method with these settings, named `method(short=value, ...)`."""
        shown = [(s.short or s.name, values[s.name]) for s in self.settings if s.name in values]
        name = f"{self.name}({','.join(f'{k}={v}' for k, v in shown)})" if shown else self.name
        return Plan(self.name, ms_per_token, tuple(sorted(values.items())), name)

    def setting(self, ctx: DecodeContext, plan: Plan | None, name: str) -> Any:
        """A setting's value for this run: the plan's when it has one, else the reply's."""
        if plan is not None and name in dict(plan.settings):
            return plan.get(name)
        return ctx.setting(name)

    def lookahead(self, values: Mapping[str, Any]) -> int:
        """Tokens a round may propose past the budget before it is cut (room kept in the context)."""
        return 0

    def evidence_priors(self) -> dict[str, float]:
        """The rates its prices read, by name, and their values before any reply (Evidence)."""
        return {}

    def seed_evidence(self, evidence: Evidence, acceptance: Any, calibration: Any,  # noqa: B027
                      threshold: float | None) -> None:
        """Start its rates from the pair's measured `acceptance` (models/pairs.toml) or the
        verifier's `calibration` rows at `threshold`, where it has such rates."""

    def guarantee(self, stats: Any) -> str:
        """What a reply of this method promises."""
        if self.exact:
            return "exact: distributed as the target's output (greedy: identical to ar)"
        return "approximate"

    def summary(self, stats: Any) -> dict[str, Any]:
        """Figures of its own for a reply's report (stats.to_dict, --stats)."""
        return {}

    def prefill_models(self, ctx: DecodeContext) -> list[LlamaModel]:
        """The models that read the prompt before the first step (the driver times it)."""
        return [m for m in (ctx.target, ctx.draft) if m is not None]

    def scores_every_token(self, ctx: DecodeContext) -> bool:
        """Whether the target scores every token this strategy may commit with `ctx` (what
        logprobs need)."""
        return self.exact

    def plans(self, inputs: PriceInputs) -> list[Plan]:
        """The plans of this method `auto` may run (settings only; none: not a candidate)."""
        return []

    def price(self, plan: Plan, inputs: PriceInputs) -> RoundPrice | None:
        """`plan`'s expected round from costs and evidence; None: priced by `prior_ms`."""
        return None

    def learn(self, evidence: Evidence, done: dict[str, int]) -> None:  # noqa: B027 (optional)
        """Fold what a stretch of this method's rounds did (counter differences, stats.Counters'
        names) into the evidence its prices read."""

    def prior_speedup(self, kind: str) -> float:
        """Before it has run on this kind of request: its speed over `ar`'s (unpriced methods)."""
        return 1.0

    def prior_ms(self, kind: str, ar_ms: float, inputs: PriceInputs, known: Mapping[str, float]) -> float:
        """Before it has run on this kind of request: its ms per token (unpriced methods), from
        `ar_ms` and `prior_speedup`. `known`: the planner's estimates, measured where they ran,
        of the methods priced before it (the registry's order), for a method that extends one."""
        return ar_ms / self.prior_speedup(kind)

    @abstractmethod
    def run(self, ctx: DecodeContext, prompt: list[int]) -> Iterator[Step]:
        """Yield committed tokens with their origin, round after round, until closed."""
