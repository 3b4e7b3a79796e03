"""The `auto` method's brain: predict each method's milliseconds per token on this machine and
pick the fastest, learning from what actually happens.

Candidates: every registered strategy's plans (`Strategy.plans`: `ar`, `sd` per draft length,
`lookup`, `staged`, and `sprinter` per run cap only when the caller allows an approximate
operating point), each priced by its strategy from this machine's costs and the evidence so
far (`Strategy.price`), or, for a method whose speed is learned by running it, from a prior
(`Strategy.prior_ms`: a speed-up over `ar`, or, for a method extending another, that one's
estimate plus what the extension adds). Evidence is kept per kind of request (edit, code, chat): a
copy-heavy edit and a fresh chat reply favour different plans. A plan whose prediction is
within PROBE_WITHIN of the best but that has not run for PROBE_TOKENS tokens on this kind is
probed: predictions for copy-based proposals are guesses until measured.

Prediction = this machine's measured decode costs (costs.py) x the pair's acceptance
statistics (how often the target accepts a drafted token, how often the verifier flags one).
Both are estimates, so the planner keeps two kinds of evidence as it runs, across replies:
- acceptance: running means, seeded with priors (the verifier's calibration where it has one);
- efficiency: for each method, measured time over predicted time, so a cost model that is
  wrong on this machine (threads fighting, thermal limits, a cache effect) corrects itself.
A speculative method is only chosen when it is predicted to beat `ar` by a margin, and
`ar` is what remains when nothing does: that is how `auto` stays at or above plain decoding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..costs import Costs, CostTable, Evidence, Rate
from ..costs.evidence import PLAN_MEMORY
from ..decoding import STRATEGIES, Plan, PriceInputs, RoundPrice, Strategy
from ..decoding.ar import Autoregressive

PROBE_WITHIN = 0.15  # probe a plan predicted within 15% of the best ...
PROBE_TOKENS = 48  # ... until it has run this many tokens on this kind of request: until then
# its prior decides whether it is close (a few measured tokens at a reply's start copy nothing)
MARGIN = 0.05  # a speculative plan must be predicted >= 5% faster than ar to be chosen
# Within a reply, what a plan measured on earlier replies of its kind counts as at most this
# many tokens once the reply has measured it too: requests of one kind differ (a rename copies
# nearly every line, a reformat almost none), so the reply's own clock soon decides
REPLY_CARRY = 64.0
PREDICTION_WEIGHT = 8.0  # the cost model's prediction, in measured tokens
BASELINE = Autoregressive()


def strategy_of(plan: Plan) -> Strategy:
    return STRATEGIES[plan.method]()


@dataclass
class Planner:
    """Chooses among the registered strategies' plans for one engine."""

    costs: Costs
    evidence: Evidence = field(default_factory=Evidence)
    verifier_ms: float = 0.0  # one verifier score
    # the user's values of the methods' settings (sprinter's run cap bounds its plans' caps)
    settings: dict[str, Any] = field(default_factory=dict)
    allow_approximate: bool = True  # approximate plans may be candidates (when the caller allows)
    # measured / predicted time per method (1 = the cost model is right)
    efficiency: dict[str, Rate] = field(default_factory=dict)
    # per kind of request: each plan label's measured time per token over ar's step at the
    # same depth (a ratio: replies run at different depths), and the tokens it ran
    measured: dict[tuple[str, str], Rate] = field(default_factory=dict)
    ran: dict[tuple[str, str], int] = field(default_factory=dict)
    reply: dict[str, Rate] = field(default_factory=dict)  # the same, this reply's (`start_reply`)

    @classmethod
    def of(cls, target: CostTable, draft: CostTable | None = None, **kwargs: Any) -> Planner:
        return cls(Costs(target, draft), **kwargs)

    @property
    def target(self) -> CostTable:
        return self.costs.target

    @property
    def draft(self) -> CostTable | None:
        return self.costs.draft

    def inputs(self, kind: str = "chat", depth: int = 0) -> PriceInputs:
        """What plans are priced from, for a request of `kind` after `depth` tokens of context."""
        return PriceInputs(self.costs.at(depth), self.evidence, kind, self.verifier_ms, self.settings)

    def _runs_here(self, strategy: Strategy) -> bool:
        """A strategy that drafts runs only with a draft."""
        return self.draft is not None or not (strategy.uses_draft or strategy.needs_draft)

    def candidates(self, approximate: bool = False) -> list[Strategy]:
        """The registered strategies whose plans may run here: the draft's only with a draft,
        approximate ones only when the caller chose an operating point."""
        return [s for s in (cls() for cls in STRATEGIES.values())
                if self._runs_here(s) and (s.exact or (approximate and self.allow_approximate))]

    # ------------------------------------------------------------------ predictions
    def _eff(self, method: str) -> float:
        """Measured/predicted time of `method`; a draft method never run yet borrows what the
        others showed (what misleads the cost model, batched target calls, is common to them)."""
        r = self.efficiency.get(method)
        if r is not None:
            return r.value
        if method == BASELINE.name:
            return 1.0
        seen = [v for k, v in self.efficiency.items() if k != BASELINE.name]
        return sum(v.value * v.weight for v in seen) / sum(v.weight for v in seen) if seen else 1.0

    def round_of(self, plan: Plan | str, depth: int = 0, **settings: Any) -> RoundPrice:
        """The expected round of `plan` (a plan, or a method name and its settings) after `depth`
        tokens of context, from costs and the evidence so far; a method priced by a prior is
        priced as a plain step here."""
        plan = STRATEGIES[plan]().plan(**settings) if isinstance(plan, str) else plan
        strategy, inputs = strategy_of(plan), self.inputs(depth=depth)
        price = strategy.price(plan, inputs) if self._runs_here(strategy) else None
        return price if price is not None else BASELINE.price(BASELINE.plan(), inputs)

    def raw_ms(self, plan: Plan | str, depth: int = 0, **settings: Any) -> float:
        """Predicted decode milliseconds per generated token, from costs and acceptance."""
        return self.round_of(plan, depth, **settings).ms_per_token

    def plans(self, kind: str = "chat", approximate: bool = False, *, measured: bool = True,
              depth: int = 0) -> list[Plan]:
        """Every candidate with its corrected prediction, fastest first, after `depth` tokens of
        context. `approximate`: the caller chose an operating point, so SPRINTER may run.
        `measured` off: the predictions alone, before what each plan measured on this kind of
        request."""
        def kind_ms(label: str, predicted: float) -> float:
            return self._kind_ms(kind, label, predicted, depth) if measured else predicted

        inputs = self.inputs(kind, depth)
        base = BASELINE.plan()
        ar_ms = kind_ms(base.label, self.raw_ms(base, depth) * self._eff(BASELINE.name))
        out = [replace(base, ms_per_token=ar_ms)]
        # what a method extending another builds its prior on: that one's estimate, measured
        # where it ran even with `measured` off (it is not the extension's own measurement)
        known: dict[str, float] = {base.method: ar_ms}
        for strategy in self.candidates(approximate):
            for plan in strategy.plans(inputs):
                if plan.method == BASELINE.name:
                    continue
                price = strategy.price(plan, inputs)
                ms = (strategy.prior_ms(kind, ar_ms, inputs, known) if price is None
                      else price.ms_per_token * self._eff(plan.method))
                out.append(replace(plan, ms_per_token=kind_ms(plan.label, ms)))
                own = self._kind_ms(kind, plan.label, ms, depth)
                known[plan.method] = min(known.get(plan.method, own), own)
        return sorted(out, key=lambda p: p.ms_per_token)

    def _kind_ms(self, kind: str, label: str, predicted: float, depth: int) -> float:
        """What this plan measured on this reply and on earlier ones of this kind (those worth
        REPLY_CARRY tokens once this reply measured it), the prediction worth a few tokens."""
        step = self._ar_step(depth)
        parts = [(predicted / step, PREDICTION_WEIGHT)]
        own, earlier = self.reply.get(label), self.measured.get((kind, label))
        if earlier is not None:
            parts.append((earlier.value, min(earlier.weight, REPLY_CARRY if own else PLAN_MEMORY)))
        if own is not None:
            parts.append((own.value, own.weight))
        return step * sum(v * w for v, w in parts) / sum(w for _, w in parts)

    def _ar_step(self, depth: int) -> float:
        """ar's priced ms per token after `depth` tokens: the yardstick measured times are kept
        against."""
        return max(self.raw_ms(BASELINE.plan(), depth), 1e-9)

    def best(self, kind: str = "chat", approximate: bool = False, depth: int = 0) -> tuple[Plan, str]:
        """The plan to run and why: the fastest predicted after `depth` tokens of context (a
        draft plan only when it beats ar by MARGIN), or a probe of a close plan not yet measured
        on this kind of request."""
        plans = self.plans(kind, approximate, depth=depth)
        ar = next(p for p in plans if p.method == BASELINE.name)
        best = plans[0]
        if best.method == BASELINE.name or self.ran.get((kind, best.label), 0) >= PROBE_TOKENS:
            # (ar needs no run to be believed: it is priced by this machine's measured step)
            # a plan not yet run PROBE_TOKENS tokens here is judged by the better of its
            # prediction and its prior: a few tokens are no measurement
            prior = {p.label: p.ms_per_token
                     for p in self.plans(kind, approximate, measured=False, depth=depth)}
            unproven = [(min(p.ms_per_token, prior[p.label]), p) for p in plans[1:]
                        if strategy_of(p).judged_by_runs and self.unproven(kind, p)]
            close = [(ms, p) for ms, p in unproven if ms <= best.ms_per_token * (1 + PROBE_WITHIN)]
            if close:
                p = min(close, key=lambda c: c[0])[1]
                return p, (f"probing {p.label} on {kind} requests (predicted within "
                           f"{PROBE_WITHIN:.0%} of {best.label})")
        if strategy_of(best).judged_by_runs and best.method != BASELINE.name:  # they price every proposal
            return best, (f"predicted {ar.ms_per_token / best.ms_per_token:.2f}x ar on {kind} requests")
        if best.method == BASELINE.name or best.ms_per_token > ar.ms_per_token * (1 - MARGIN):
            other = next((p for p in plans if p.method != BASELINE.name), None)
            why = (f"{other.label} predicted {ar.ms_per_token / other.ms_per_token:.2f}x ar on {kind} "
                   "requests: not worth it" if other else "no draft model")
            return ar, why
        return best, (f"predicted {ar.ms_per_token / best.ms_per_token:.2f}x ar on {kind} requests "
                      f"({best.tokens_per_second:.1f} vs {ar.tokens_per_second:.1f} tok/s)")

    def unproven(self, kind: str, plan: Plan) -> bool:
        """Not measured enough to be judged by its clock: fewer than PROBE_TOKENS run on this kind
        of request, or, for a plan without the draft (trying it catches nothing up), on this
        reply: requests of one kind differ, and one reformat that copied little must not rule
        the copy out for every later edit. `ar` is never unproven: it is priced by this
        machine's measured step, and its clock is not kept (`observe_time`)."""
        if plan.method == BASELINE.name:
            return False
        if self.ran.get((kind, plan.label), 0) < PROBE_TOKENS:
            return True
        own = self.reply.get(plan.label)
        return not strategy_of(plan).uses_draft and (own is None or own.weight < PROBE_TOKENS)

    def opening(self, kind: str, approximate: bool, prompt_tokens: int, reply_tokens: int,
                draft_behind: int) -> tuple[Plan, str]:
        """The plan to start a reply with: `best`, unless it drafts and the draft would first
        have to read `draft_behind` prompt tokens that the plan's gain over the best one-model
        plan, on a reply of at most `reply_tokens`, cannot pay back (a short reply after a
        long prompt: the draft's read would only add to the time to first token)."""
        plan, why = self.best(kind, approximate, prompt_tokens)
        if not strategy_of(plan).uses_draft or draft_behind <= 0:
            return plan, why
        one = next((p for p in self.plans(kind, approximate, depth=prompt_tokens)
                    if not strategy_of(p).uses_draft), None)
        if one is None:
            return plan, why
        gain_ms = (one.ms_per_token - plan.ms_per_token) * reply_tokens
        read_ms = self.switch_ms(draft_behind, to_draft=True)
        if gain_ms > read_ms:
            return plan, why
        return one, (f"{plan.label} would gain at most {max(gain_ms, 0) / 1e3:.1f} s on this reply, less "
                     f"than the draft's {read_ms / 1e3:.1f} s to read the prompt")

    def ms_of(self, plan: Plan, kind: str = "chat", depth: int = 0) -> float:
        """Corrected ms per token of `plan` under what the planner knows now."""
        for p in self.plans(kind, approximate=True, depth=depth):
            if p.label == plan.label:
                return p.ms_per_token
        return self.raw_ms(plan, depth) * self._eff(plan.method)

    # ------------------------------------------------------------------ evidence
    def observe_time(self, plan: Plan, tokens: int, seconds: float, kind: str = "chat",
                     depth: int = 0) -> None:
        """`tokens` generated by `plan` in `seconds` of decoding, on a request of this kind, after
        about `depth` tokens of context."""
        if tokens <= 0 or seconds <= 0:
            return
        ms = seconds * 1e3 / tokens
        key = (kind, plan.label)
        self.ran[key] = self.ran.get(key, 0) + tokens
        if plan.method == BASELINE.name:
            # ar is the yardstick, priced by this machine's measured step: a few of its tokens
            # timed while something else held the CPU would make every other plan look fast for
            # good (ar would not run again on this kind of request to correct it)
            return
        ratio = ms / self._ar_step(depth)
        self.measured.setdefault(key, Rate(ratio, 0.0)).add(ratio, tokens)
        self.reply.setdefault(plan.label, Rate(ratio, 0.0)).add(ratio, tokens)
        price = strategy_of(plan).price(plan, self.inputs(kind, depth))
        if price is not None:  # a priced model, not a prior: how far off it was
            self.efficiency.setdefault(plan.method, Rate(1.0, 8.0)).add(ms / price.ms_per_token, tokens)

    def start_reply(self) -> None:
        """A new reply: what plans measure from now on is also this reply's own evidence."""
        self.reply = {}

    def switch_ms(self, tokens_behind: int, to_draft: bool, depth: int = 0) -> float:
        """The one-off cost of catching a model up on `tokens_behind` tokens."""
        table = self.draft if to_draft and self.draft is not None else self.target
        return table.at(depth).cost(24) / 24 * tokens_behind if tokens_behind > 0 else 0.0



def flat_copy(planner: Planner) -> Planner:
    """The same planner priced as if a decode call cost one token whatever its batch (a GPU or
    Apple Silicon, roughly): what `auto` would do on such a machine with this pair."""
    return Planner(planner.costs.flat(), planner.evidence, planner.verifier_ms, planner.settings,
                   planner.allow_approximate)


@dataclass(frozen=True)
class FlatBound:
    """The flat-batch figure and what it would need: an UPPER bound on the speed-up.

    Priced with c(n) = c(1) for every batch (`flat_copy`), `plan` runs at
    ms/token = (flat.draft_ms + c1) / flat.tokens, `ratio` = c1 / that. On a real machine the
    target call of `flat.batch` tokens costs `measured_ms` (this machine's table); the plan
    beats ar only where it costs at most `break_even_ms` = c1 * tokens - draft ms (the draft
    priced as measured), and it runs at `measured_ratio` x ar here."""

    plan: Plan
    ratio: float
    c1: float  # target ms for one token
    d1: float | None  # draft ms for one token
    flat: RoundPrice  # the plan's round under flat costs
    measured: RoundPrice  # the same round under this machine's costs
    break_even_ms: float
    measured_ratio: float

    def lines(self) -> list[str]:
        """What doctor prints."""
        p, f, m = self.plan, self.flat, self.measured
        d = f" (draft {self.d1:.0f} ms)" if self.d1 is not None else ""
        out = [f"  flat-batch bound, an UPPER bound (not a prediction): if a batch of any size cost what "
               f"one token costs, c(n) = c(1) = {self.c1:.0f} ms for the target{d}, auto would run "
               f"{p.label} at {self.ratio:.2f}x ar"]
        if p.method == BASELINE.name:
            return out
        per_token = (f.draft_ms + self.c1) / f.tokens
        out.append(f"    formula: ms/token = (draft ms per round + c(1)) / tokens per round = "
                   f"({f.draft_ms:.0f} + {self.c1:.0f}) / {f.tokens:.2f} = {per_token:.1f}, "
                   f"against ar's c(1) = {self.c1:.0f}")
        mean = " (mean)" if m.batch != round(m.batch) else ""  # a mixture over run lengths
        out.append(f"    it needs a target batch of {m.batch:.0f} tokens{mean} to cost <= "
                   f"{max(self.break_even_ms, 0.0):.0f} ms to beat ar at the draft costs measured here; "
                   f"measured here {m.target_ms:.0f} ms: the cost model puts {p.label} at "
                   f"{self.measured_ratio:.2f}x ar on this machine")
        return out


def flat_bound(planner: Planner) -> FlatBound:
    """`FlatBound` for the plan `auto` would pick under flat costs."""
    flat = flat_copy(planner)
    plan, _ = flat.best()
    f, m = flat.round_of(plan), planner.round_of(plan)
    c1 = planner.target.cost(1)
    d1 = planner.draft.cost(1) if planner.draft is not None else None
    ratio = c1 * f.tokens / (f.draft_ms + f.target_ms)
    measured_ratio = c1 * m.tokens / (m.draft_ms + m.target_ms)
    return FlatBound(plan, ratio, c1, d1, f, m, c1 * m.tokens - m.draft_ms, measured_ratio)


def make_planner(target: Any, draft: Any | None, verifier: Any | None, threshold: float | None,
                 settings: dict[str, Any] | None = None, acceptance: Any | None = None) -> Planner:
    """A planner for these loaded models: costs from the cache (or measured now), the verifier's
    own cost timed here, and acceptance priors from the best source there is: the pair's
    on-policy measurements (`acceptance` in models/pairs.toml), else the verifier's calibration
    table (off-policy: it flags more than SPRINTER's own runs do), else generic values.
    `draft` may be the draft's cost table instead of the model (priced without loading it); a
    verifier needs the model."""
    from ..costs import machine_costs

    draft_costs = draft if isinstance(draft, CostTable) or draft is None else machine_costs(draft)
    planner = Planner.of(machine_costs(target), draft_costs, settings=dict(settings or {}))
    if draft is None or verifier is None:
        return planner
    if isinstance(draft, CostTable):
        raise TypeError("timing a verifier needs the draft model, not its cost table")
    planner.verifier_ms = time_verifier(verifier, draft)
    rows = getattr(verifier, "calibration", None)
    for cls in STRATEGIES.values():  # each method starts its own rates from what is measured
        cls().seed_evidence(planner.evidence, acceptance, rows, threshold)
    return planner


def time_verifier(verifier: Any, draft: Any, calls: int = 15) -> float:
    """Median milliseconds of one verifier score on draft-sized inputs."""
    from ..verifiers.base import DraftFeatures

    rng = np.random.default_rng(0)
    logits = rng.normal(size=draft.n_vocab).astype(np.float32)
    hidden = rng.normal(size=draft.n_embd).astype(np.float32) if verifier.needs_hidden else None
    times = []
    for i in range(calls):
        f = DraftFeatures(hidden=hidden, logits=logits, token=i, run_position=i, output_position=i)
        t0 = time.perf_counter()
        verifier.score(f)
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]
