"""`auto`: run whichever exact plan is fastest on this machine for this kind of request, and
keep checking. It sits above decoding: the planner prices the registered strategies' plans,
and each plan runs as its strategy's proposer in the speculative loop.

The plans are configurations of the speculative loop: ar, sd (draft length), lookup and staged
(prompt-lookup proposals), and sprinter (run cap) only when the caller chose an approximate
operating point; so by default the output is the target's. The planner (planning/planner.py)
predicts each plan's time per token from this machine's measured decode costs, the pair's
acceptance statistics and what each plan measured on earlier requests of the same kind (edit,
code, chat), and probes close plans it has not measured yet. `auto` runs the predicted best,
times every step of its own work (never the consumer's), and every few tokens tells the
planner what it saw; when another plan is predicted clearly faster for the rest of the reply,
including the cost of catching a model up, it switches. The planner outlives the reply, so
the next one starts from what this one learned.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from ..backend.llama import LlamaModel
from ..decoding import DecodeContext, Plan, Stats, Step, Strategy
from ..decoding.loop import LoopStrategy, run_loop
from ..decoding.proposers.base import Proposer
from .planner import BASELINE, Planner, strategy_of

log = logging.getLogger(__name__)

REPLAN_EVERY = 16  # tokens between looks at the evidence
SWITCH_GAIN = 0.05  # a switch must be predicted >= 5% faster for the rest of the reply


class Auto(Strategy):
    name = "auto"
    about = ("the fastest exact plan on this machine, chosen from measured costs and re-checked as it "
             "runs; sprinter only given an operating point")
    uses_draft = True  # when the engine has one; without it `auto` chooses ar or lookup
    needs_verifier = True  # only when the caller allows an approximate plan
    needs_costs = True

    def __init__(self, planner: Planner | None = None) -> None:
        self.planner = planner  # the engine hands its planner over (it outlives the reply)
        self.plan: Plan | None = None
        self._approximate: Strategy | None = None  # an approximate plan's strategy, once one ran

    def guarantee(self, stats: Stats) -> str:
        """The exact methods' promise, or that of the approximate plan it ran."""
        if self._approximate is not None and not stats.exact:
            return self._approximate.guarantee(stats)
        return super().guarantee(stats)

    def scores_every_token(self, ctx: DecodeContext) -> bool:
        """Exact unless it may run sprinter (a draft, and the caller chose an operating point)."""
        return not ctx.has_draft or not ctx.approximate_ok

    def _planner(self) -> Planner:
        assert self.planner is not None, "auto needs a planner (Engine provides one)"
        return self.planner

    def prefill_models(self, ctx: DecodeContext) -> list[LlamaModel]:
        """Decide the first plan, then read the prompt only with the models it uses."""
        planner = self._planner()
        planner.start_reply()
        prompt = ctx.sampler.prompt or []
        self.plan, why = planner.opening(ctx.kind, ctx.approximate_ok, ctx.stats.prompt_tokens,
                                         ctx.max_new_tokens, ctx.draft_behind(prompt[:-1]))
        ctx.stats.trace.plan, ctx.stats.trace.plan_reason = self.plan.label, why
        models = [ctx.target] if ctx.target is not None else []
        if strategy_of(self.plan).uses_draft and ctx.has_draft:
            models.append(ctx.load_draft())
        return models

    def run(self, ctx: DecodeContext, prompt: list[int]) -> Iterator[Step]:
        planner = self._planner()
        stats, trace = ctx.stats, ctx.stats.trace
        if self.plan is None:  # the reply did not start with prefill_models
            planner.start_reply()
            self.plan, trace.plan_reason = planner.best(ctx.kind, ctx.approximate_ok, len(prompt))
        seq = list(prompt)
        while True:
            plan = self.plan
            trace.plan = plan.label
            trace.plans_run.append(plan.label)
            if not strategy_of(plan).exact:
                stats.exact, self._approximate = False, strategy_of(plan)
            inner = run_loop(ctx, seq, _proposer(ctx, plan))
            base = _counters(stats)
            seg_tokens, seg_seconds, since_look = 0, 0.0, 0
            switch_to: tuple[Plan, str] | None = None
            try:
                while switch_to is None:
                    t0 = ctx.clock()
                    step = next(inner)
                    seg_seconds += ctx.clock() - t0
                    seg_tokens += len(step)
                    since_look += len(step)
                    seq.extend(t for t, _ in step)
                    yield step
                    if since_look >= REPLAN_EVERY:
                        since_look = 0
                        self._learn(planner, plan, ctx, base, seg_tokens, seg_seconds, len(seq))
                        base, seg_tokens, seg_seconds = _counters(stats), 0, 0.0
                        switch_to = self._should_switch(ctx, planner, plan, seq)
            finally:
                inner.close()
                self._learn(planner, plan, ctx, base, seg_tokens, seg_seconds, len(seq))
            self.plan, trace.plan_reason = switch_to
            trace.plan_switches += 1

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _learn(planner: Planner, plan: Plan, ctx: DecodeContext, base: dict[str, int], tokens: int,
               seconds: float, depth: int) -> None:
        now = _counters(ctx.stats)
        d = {k: now[k] - base[k] for k in now}
        strategy_of(plan).learn(planner.evidence, d)
        planner.observe_time(plan, tokens, seconds, ctx.kind, depth - tokens // 2)

    @staticmethod
    def _should_switch(ctx: DecodeContext, planner: Planner, plan: Plan,
                       seq: list[int]) -> tuple[Plan, str] | None:
        best, why = planner.best(ctx.kind, ctx.approximate_ok, len(seq))
        if best.label == plan.label:
            log.debug("%d tokens: keep %s (%s)", len(seq), plan.label, why)
            return None
        if best.method == BASELINE.name and ctx.kind in strategy_of(plan).kept_over_ar:
            log.debug("%d tokens: keep %s over ar on %s requests (%s)", len(seq), plan.label, ctx.kind, why)
            return None
        current_ms = planner.ms_of(plan, ctx.kind, len(seq))
        # a draft not loaded yet reads the whole sequence (its load time is not priced)
        behind = ctx.draft_behind(seq) if strategy_of(best).uses_draft else 0
        if behind and planner.unproven(ctx.kind, best):
            # its speed is a prior until measured: no ground for a catch-up that may cost more
            # than the rest of the reply (a probe of a drafting plan is for a reply's opening)
            log.debug("%d tokens: keep %s, %s is unmeasured on %s requests and the draft is %d "
                      "tokens behind", len(seq), plan.label, best.label, ctx.kind, behind)
            return None
        gain_ms = (current_ms - best.ms_per_token) * max(ctx.remaining, 0)
        catch_up_ms = planner.switch_ms(behind, to_draft=True, depth=len(seq))
        keep = gain_ms <= catch_up_ms or best.ms_per_token > current_ms * (1 - SWITCH_GAIN)
        log.debug("%d tokens: %s %.1f ms/token, %s %.1f (%s); gain %.0f ms, catch-up %.0f ms: %s",
                  len(seq), plan.label, current_ms, best.label, best.ms_per_token, why, gain_ms,
                  catch_up_ms, "keep" if keep else "switch")
        return None if keep else (best, f"switched from {plan.label}: {why}")


def _proposer(ctx: DecodeContext, plan: Plan) -> Proposer:
    strategy = strategy_of(plan)
    assert isinstance(strategy, LoopStrategy), f"{plan.method} does not run in the loop"
    return strategy.make_proposer(ctx, plan)


def _counters(stats: Stats) -> dict[str, int]:
    return stats.counters.by_name()
