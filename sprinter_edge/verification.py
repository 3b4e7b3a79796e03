"""SPRINTER's side of an engine: its verifier (resolved on first use), the threshold an operating
point gives, and, for each request, whether tokens the target never checks may be committed.

Only `sprinter` (and `auto` given an operating point) lets drafted tokens through unchecked, and
never on an edit: there the draft copies the input with high confidence exactly where the target
would change it (methods.may_approximate).
"""

from __future__ import annotations

import logging
from typing import Any

from .catalog.registry import PairSpec
from .decoding import DecodeContext, PointUsed, Strategy
from .methods import EXACT_KINDS, may_approximate
from .model_pair import ModelPair
from .prompting import prompt_domain
from .verifiers.base import Verifier
from .verifiers.loading import resolve_verifier
from .verifiers.operating_point import OperatingPoint

log = logging.getLogger(__name__)


class Verification:
    """The verifier an engine scores drafted tokens with, and how a request uses it."""

    def __init__(self, spec: str | Verifier, pair: PairSpec | None, models: ModelPair):
        self.spec, self.pair, self.models = spec, pair, models
        self._verifier: Verifier | None = None
        self._warned: set[tuple[object, ...]] = set()  # what `_warn_once` has said

    @property
    def verifier(self) -> Verifier:
        if self._verifier is None:
            self._verifier = resolve_verifier(self.spec, self.pair, self.models.draft, self.models.target)
        return self._verifier

    def use(self, spec: str | Verifier) -> None:
        """Score with this verifier from now on (resolved on first use)."""
        self.spec, self._verifier = spec, None

    @staticmethod
    def scores_drafts(strategy: Strategy, point: OperatingPoint) -> bool:
        """A verifier will score drafted tokens: the method is approximate by design, or it may
        run an approximate plan at the operating point given."""
        return strategy.needs_verifier and (not strategy.exact or point.is_set)

    def threshold(self, point: OperatingPoint, verifier: Verifier | None = None,
                  domain: str | None = None, regime: str | None = None) -> float:
        """The threshold of `point` for `verifier` (default: this one), on a request of this
        domain ("code" | "chat") and regime ("greedy" | "sampled")."""
        return point.resolve(verifier or self.verifier, domain, regime)

    def apply(self, ctx: DecodeContext, strategy: Strategy, point: OperatingPoint,
              verifier: Verifier | None, request: Any) -> None:
        """Whether the reply of `ctx` may commit tokens the target never checks, and at which
        threshold of which verifier."""
        asked = point.is_set or verifier is not None
        ctx.approximate_ok = may_approximate(strategy, ctx.kind, asked)
        if strategy.needs_verifier and not strategy.exact and ctx.kind in EXACT_KINDS:
            self._warn_once(("edit",), "%s on an edit request: measured to skip requested changes "
                            "(6/20 edits done at the quality preset where ar did 18/20); auto or "
                            "lookup is exact and faster there", strategy.name)
        elif asked and not ctx.approximate_ok:
            log.info("%s request: %s keeps to exact plans whatever the operating point "
                     "(SPRINTER skips edits)", ctx.kind, strategy.name)
        if not (strategy.needs_verifier and ctx.has_draft and ctx.approximate_ok):
            return
        ctx.verifier = verifier or self.verifier
        domain = prompt_domain(request)
        regime = "greedy" if ctx.sampler.params.greedy else "sampled"
        ctx.threshold = self.threshold(point, ctx.verifier, domain, regime)
        top = ctx.verifier.highest_score()
        if top is not None and ctx.threshold > top:
            self._warn_once(("threshold", ctx.verifier.name, ctx.threshold),
                            "threshold %g is above the highest score verifier %s gives (%.6f): "
                            "every drafted token goes to the target",
                            ctx.threshold, ctx.verifier.name, top)
        ctx.stats.point = PointUsed(ctx.verifier.name, domain, ctx.threshold)

    def _warn_once(self, key: tuple[object, ...], message: str, *args: object) -> None:
        """A warning this engine gives once per `key`, however many requests earn it."""
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)
