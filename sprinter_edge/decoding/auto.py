"""`auto`: run whichever of ar, sd and sprinter is fastest on this machine, and keep checking.

The planner (planning/planner.py) predicts each method's time per token from this machine's
measured decode costs and the pair's acceptance statistics. `auto` runs the predicted best,
times every step of its own work (never the consumer's), and every few tokens tells the
planner what it saw; when another plan is predicted clearly faster for the rest of the reply,
including the cost of catching a model up, it switches. The planner outlives the reply, so
the next one starts from what this one learned.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from ..backend.llama import LlamaModel, common_prefix
from ..planning.planner import Plan, Planner
from .ar import Autoregressive
from .base import DecodeContext, Stats, Step, Strategy
from .sd import Speculative
from .sprinter import Sprinter

REPLAN_EVERY = 16  # tokens between looks at the evidence
SWITCH_GAIN = 0.05  # a switch must be predicted >= 5% faster for the rest of the reply


class Auto(Strategy):
    name = "auto"
    uses_draft = True  # when the engine has one; without it `auto` is `ar`
    needs_verifier = True
    needs_planner = True

    def __init__(self) -> None:
        self.plan: Plan | None = None

    def scores_every_token(self, ctx: DecodeContext) -> bool:
        """Exact unless it may run sprinter (a draft, and a planner that considers it)."""
        return ctx.draft is None or (ctx.planner is not None and not ctx.planner.use_sprinter)

    def target_rows(self, n_tokens: float) -> float:
        return n_tokens if self.plan is not None and self.plan.method == "sd" else 2.0

    def _planner(self, ctx: DecodeContext) -> Planner:
        assert ctx.planner is not None, "auto needs a planner (Engine provides one)"
        return ctx.planner

    def prefill_models(self, ctx: DecodeContext) -> list[LlamaModel]:
        """Decide the first plan, then read the prompt only with the models it uses."""
        planner = self._planner(ctx)
        self.plan, why = planner.best()
        ctx.stats.plan, ctx.stats.plan_reason = self.plan.label, why
        models = [ctx.target] if ctx.target is not None else []
        if self.plan.method != "ar" and ctx.draft is not None:
            models.append(ctx.draft)
        return models

    def run(self, ctx: DecodeContext, prompt: list[int]) -> Iterator[Step]:
        planner = self._planner(ctx)
        stats = ctx.stats
        if self.plan is None:
            self.plan, stats.plan_reason = planner.best()
        seq = list(prompt)
        while True:
            plan = self.plan
            stats.plan = plan.label
            inner = self._start(ctx, plan, seq)
            base = _counters(stats)
            seg_tokens, seg_seconds, since_look = 0, 0.0, 0
            switch_to: tuple[Plan, str] | None = None
            try:
                while switch_to is None:
                    t0 = time.perf_counter()
                    step = next(inner)
                    seg_seconds += time.perf_counter() - t0
                    seg_tokens += len(step)
                    since_look += len(step)
                    seq.extend(t for t, _ in step)
                    yield step
                    if since_look >= REPLAN_EVERY:
                        since_look = 0
                        self._learn(planner, plan, stats, base, seg_tokens, seg_seconds)
                        base, seg_tokens, seg_seconds = _counters(stats), 0, 0.0
                        switch_to = self._should_switch(ctx, planner, plan, seq)
            finally:
                inner.close()
                self._learn(planner, plan, stats, base, seg_tokens, seg_seconds)
            self.plan, stats.plan_reason = switch_to
            stats.plan_switches += 1

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _start(ctx: DecodeContext, plan: Plan, seq: list[int]) -> Iterator[Step]:
        if plan.method == "sd":
            ctx.draft_len = plan.draft_len
            return Speculative().run(ctx, seq)
        if plan.method == "sprinter":
            ctx.run_cap = plan.run_cap
            return Sprinter().run(ctx, seq)
        return Autoregressive().run(ctx, seq)

    @staticmethod
    def _learn(planner: Planner, plan: Plan, stats: Stats, base: dict[str, int], tokens: int,
               seconds: float) -> None:
        now = _counters(stats)
        d = {k: now[k] - base[k] for k in now}
        if plan.method == "sd":
            planner.observe_sd(d["accepted"], d["resampled"])
        elif plan.method == "sprinter":
            planner.observe_sprinter(d["kept"], d["flags"], d["accepted"], d["resampled"])
        planner.observe_time(plan, tokens, seconds)

    @staticmethod
    def _should_switch(ctx: DecodeContext, planner: Planner, plan: Plan,
                       seq: list[int]) -> tuple[Plan, str] | None:
        best, why = planner.best()
        if best.label == plan.label:
            return None
        current_ms = planner.ms_of(plan)
        behind = 0
        if best.method != "ar" and ctx.draft is not None:
            behind = len(seq) - common_prefix(ctx.draft.tokens, seq)
        gain_ms = (current_ms - best.ms_per_token) * max(ctx.remaining, 0)
        if gain_ms <= planner.switch_ms(behind, to_draft=True) or \
                best.ms_per_token > current_ms * (1 - SWITCH_GAIN):
            return None
        return best, f"switched from {plan.label}: {why}"


_COUNTED = ("accepted", "resampled", "kept", "flags")


def _counters(stats: Stats) -> dict[str, int]:
    return {k: getattr(stats, k) for k in _COUNTED}
