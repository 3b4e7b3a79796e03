"""The `auto` method's brain: predict each method's milliseconds per token on this machine and
pick the fastest, learning from what actually happens.

Candidates: `ar`, `sd` (draft length), `lookup` and `staged` (prompt-lookup proposals, priced
per round by the proposer itself), all exact; `sprinter` (run cap) only when the caller allows
an approximate operating point. Evidence is kept per kind of request (edit, code, chat): a
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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..decoding.run_policy import RunPolicy
from .costs import CostTable

SD_DRAFT_LENS = (1, 2, 3, 4, 5, 6, 8)
KINDS = ("edit", "code", "chat")
# Before any measurement, x ar's speed: prompt lookup is a plain step plus proposals that pass
# its own cost test, so a little above ar on fresh text; staged adds a draft batch per
# proposal. An edit request (it carries the code or document the reply reworks) is a copy:
# lookup measured 2.3-2.5x ar on 50 edit tasks and staged 1.8-1.9x on 30 of them, held in and
# held out (docs/benchmarks.md, sessions 5-7); the priors stay below that.
LOOKUP_PRIOR = {"edit": 2.0, "code": 1.02, "chat": 1.02}
STAGED_PRIOR = {"edit": 1.6, "code": 1.0, "chat": 1.0}
PROBE_WITHIN = 0.15  # probe a plan predicted within 15% of the best ...
PROBE_TOKENS = 48  # ... until it has run this many tokens on this kind of request: until then
# its prior decides whether it is close (a few measured tokens at a reply's start copy nothing)
PROBED = ("ar", "lookup", "staged")  # plans whose speed is learned by running them
RUN_CAPS = (4, 6, 8, 12, 16, 20, 24, 32)
MARGIN = 0.05  # a speculative plan must be predicted >= 5% faster than ar to be chosen
PRIOR_WEIGHT = 32.0  # priors count as this many observed tokens


@dataclass
class Running:
    """A running mean with a prior worth PRIOR_WEIGHT observations; recent data weigh more
    once there is plenty (the kind of text changes between replies)."""

    value: float
    weight: float = PRIOR_WEIGHT

    def add(self, value: float, n: float) -> None:
        if n <= 0:
            return
        self.weight = min(self.weight, 512.0)  # forget slowly: at most 512 tokens of memory
        self.value = (self.value * self.weight + value * n) / (self.weight + n)
        self.weight += n


@dataclass(frozen=True)
class Round:
    """One expected round of a method (a mixture over run lengths for SPRINTER): the draft and
    verifier milliseconds, the milliseconds of its one target call, that call's mean batch and
    the tokens the round yields. ms per token = (draft_ms + target_ms) / tokens."""

    draft_ms: float
    target_ms: float
    tokens: float
    batch: float


@dataclass(frozen=True)
class Plan:
    method: str  # ar | sd | lookup | staged | sprinter
    ms_per_token: float  # predicted, after the efficiency correction
    draft_len: int = 0  # sd
    run_cap: int | None = None  # sprinter

    @property
    def label(self) -> str:
        if self.method == "sd":
            return f"sd(k={self.draft_len})"
        if self.method == "sprinter":
            return f"sprinter(cap={self.run_cap})"
        return self.method

    @property
    def tokens_per_second(self) -> float:
        return 1e3 / self.ms_per_token if self.ms_per_token > 0 else 0.0

    @property
    def exact(self) -> bool:
        return self.method != "sprinter"


@dataclass
class Planner:
    """Chooses among ar, sd (draft length), lookup, staged and sprinter (run cap) for one engine."""

    target: CostTable
    draft: CostTable | None = None
    verifier_ms: float = 0.0  # one verifier score
    max_run_cap: int | None = 20  # the user's cap bounds SPRINTER's (a quality setting)
    use_sprinter: bool = True
    # what the pair does (priors; updated as it runs)
    sd_accept: Running = field(default_factory=lambda: Running(0.75))
    flag_rate: Running = field(default_factory=lambda: Running(0.2))
    flagged_accept: Running = field(default_factory=lambda: Running(0.5))
    # measured / predicted time per method (1 = the cost model is right)
    efficiency: dict[str, Running] = field(default_factory=dict)
    # per kind of request: measured ms per token of each plan label, and tokens it ran
    measured: dict[tuple[str, str], Running] = field(default_factory=dict)
    ran: dict[tuple[str, str], int] = field(default_factory=dict)
    # per kind of request: acceptance of copied spans (the lookup proposers read and write it)
    lookup: dict[str, Any] = field(default_factory=dict)

    def lookup_evidence(self, kind: str) -> Any:
        from ..decoding.proposers.lookup import LookupEvidence

        return self.lookup.setdefault(kind, LookupEvidence())

    # ------------------------------------------------------------------ predictions
    def _eff(self, method: str) -> float:
        """Measured/predicted time of `method`; a draft method never run yet borrows what the
        others showed (what misleads the cost model, batched target calls, is common to them)."""
        r = self.efficiency.get(method)
        if r is not None:
            return r.value
        if method == "ar":
            return 1.0
        seen = [v for k, v in self.efficiency.items() if k != "ar"]
        return sum(v.value * v.weight for v in seen) / sum(v.weight for v in seen) if seen else 1.0

    def raw_ms(self, method: str, *, draft_len: int = 4, run_cap: int | None = 20) -> float:
        """Predicted decode milliseconds per generated token, from costs and acceptance."""
        r = self.round(method, draft_len=draft_len, run_cap=run_cap)
        return (r.draft_ms + r.target_ms) / r.tokens

    def round(self, method: str, *, draft_len: int = 4, run_cap: int | None = 20) -> Round:
        """The expected round of `method`: draft (and verifier) ms, the one target call's ms and
        its mean batch, the tokens it yields."""
        t = self.target
        if method == "ar" or self.draft is None:
            return Round(0.0, t.cost(1), 1.0, 1.0)
        d1, d2 = self.draft.cost(1), self.draft.cost(2)
        if method == "sd":
            a, k = min(self.sd_accept.value, 0.999), draft_len
            tokens = (1 - a ** (k + 1)) / (1 - a)
            all_pass = a ** k  # then the draft reads the last draft token and the bonus: 2 tokens
            return Round(k * d1 + all_pass * (d2 - d1), t.cost(k + 1, k + 1), tokens, k + 1.0)
        if method == "sprinter":
            f = min(max(self.flag_rate.value, 1e-3), 1.0)
            acc = self.flagged_accept.value
            draft_ms = target_ms = tokens = batch = 0.0
            # `kept` tokens kept, then one verified (flagged, or forced at the cap), under the
            # decoder's own run policy (the threshold only matters through f)
            for kept, p in RunPolicy(0.0, run_cap).run_lengths(f):
                steps = kept + 1
                draft_ms += p * (steps * d1 + steps * self.verifier_ms + acc * (d2 - d1))
                target_ms += p * t.cost(kept + 2, 2)  # pending tokens + the last committed one
                batch += p * (kept + 2)
                tokens += p * (kept + 1 + acc)
            return Round(draft_ms, target_ms, tokens, batch)
        raise ValueError(f"no cost model for method {method!r}")

    def plans(self, kind: str = "chat", approximate: bool = False, *, measured: bool = True) -> list[Plan]:
        """Every candidate with its corrected prediction, fastest first. `approximate`: the
        caller chose an operating point, so SPRINTER may run. `measured` off: the predictions
        alone, before what each plan measured on this kind of request."""
        def kind_ms(label: str, predicted: float) -> float:
            return self._kind_ms(kind, label, predicted) if measured else predicted

        ar_ms = kind_ms("ar", self.raw_ms("ar") * self._eff("ar"))
        out = [Plan("ar", ar_ms)]
        out.append(Plan("lookup", kind_ms("lookup", ar_ms / LOOKUP_PRIOR.get(kind, 1.02))))
        if self.draft is not None:
            out.append(Plan("staged", kind_ms("staged", ar_ms / STAGED_PRIOR.get(kind, 1.0))))
            out += [Plan("sd", kind_ms(f"sd(k={k})", self.raw_ms("sd", draft_len=k) * self._eff("sd")),
                         draft_len=k) for k in SD_DRAFT_LENS]
            if self.use_sprinter and approximate:
                caps = [c for c in RUN_CAPS if self.max_run_cap is None or c <= self.max_run_cap]
                if self.max_run_cap is not None and self.max_run_cap not in caps:
                    caps.append(self.max_run_cap)
                out += [Plan("sprinter", kind_ms(
                    f"sprinter(cap={c})", self.raw_ms("sprinter", run_cap=c) * self._eff("sprinter")),
                    run_cap=c) for c in caps]
        return sorted(out, key=lambda p: p.ms_per_token)

    def _kind_ms(self, kind: str, label: str, predicted: float) -> float:
        """What this plan measured on this kind of request, the prediction worth a few tokens."""
        r = self.measured.get((kind, label))
        if r is None:
            return predicted
        w = min(r.weight, 512.0)
        return (r.value * w + predicted * 8.0) / (w + 8.0)

    def best(self, kind: str = "chat", approximate: bool = False) -> tuple[Plan, str]:
        """The plan to run and why: the fastest predicted (a draft plan only when it beats ar
        by MARGIN), or a probe of a close plan not yet measured on this kind of request."""
        plans = self.plans(kind, approximate)
        ar = next(p for p in plans if p.method == "ar")
        best = plans[0]
        if self.ran.get((kind, best.label), 0) >= PROBE_TOKENS:
            # a plan not yet run PROBE_TOKENS tokens here is judged by the better of its
            # prediction and its prior: a few tokens are no measurement
            prior = {p.label: p.ms_per_token for p in self.plans(kind, approximate, measured=False)}
            unproven = [(min(p.ms_per_token, prior[p.label]), p) for p in plans[1:]
                        if p.method in PROBED and self.ran.get((kind, p.label), 0) < PROBE_TOKENS]
            close = [(ms, p) for ms, p in unproven if ms <= best.ms_per_token * (1 + PROBE_WITHIN)]
            if close:
                p = min(close, key=lambda c: c[0])[1]
                return p, (f"probing {p.label} on {kind} requests (predicted within "
                           f"{PROBE_WITHIN:.0%} of {best.label})")
        if best.method in PROBED and best.method != "ar":  # they price every proposal themselves
            return best, (f"predicted {ar.ms_per_token / best.ms_per_token:.2f}x ar on {kind} requests")
        if best.method == "ar" or best.ms_per_token > ar.ms_per_token * (1 - MARGIN):
            other = next((p for p in plans if p.method != "ar"), None)
            why = (f"{other.label} predicted {ar.ms_per_token / other.ms_per_token:.2f}x ar on {kind} "
                   "requests: not worth it" if other else "no draft model")
            return ar, why
        return best, (f"predicted {ar.ms_per_token / best.ms_per_token:.2f}x ar on {kind} requests "
                      f"({best.tokens_per_second:.1f} vs {ar.tokens_per_second:.1f} tok/s)")

    def ms_of(self, plan: Plan, kind: str = "chat") -> float:
        """Corrected ms per token of `plan` under what the planner knows now."""
        for p in self.plans(kind, approximate=True):
            if p.label == plan.label:
                return p.ms_per_token
        return self.predicted(plan) * self._eff(plan.method)
    def predicted(self, plan: Plan) -> float:
        """Uncorrected ms per token of `plan` under the current acceptance estimates."""
        if plan.method in ("lookup", "staged"):
            return self.raw_ms("ar")
        return self.raw_ms(plan.method, draft_len=plan.draft_len, run_cap=plan.run_cap)

    # ------------------------------------------------------------------ evidence
    def observe_time(self, plan: Plan, tokens: int, seconds: float, kind: str = "chat") -> None:
        """`tokens` generated by `plan` in `seconds` of decoding, on a request of this kind."""
        if tokens <= 0 or seconds <= 0:
            return
        ms = seconds * 1e3 / tokens
        key = (kind, plan.label)
        self.ran[key] = self.ran.get(key, 0) + tokens
        r = self.measured.get(key)
        if r is None:
            self.measured[key] = Running(ms, float(tokens))
        else:
            r.add(ms, tokens)
        if plan.method not in ("lookup", "staged"):  # their prediction is a prior, not a model
            self.efficiency.setdefault(plan.method, Running(1.0, 8.0)).add(ms / self.predicted(plan), tokens)

    def observe_sd(self, accepted: int, rejected: int) -> None:
        n = accepted + rejected
        if n:
            self.sd_accept.add(accepted / n, n)

    def observe_sprinter(self, kept: int, flagged: int, accepted: int, rejected: int) -> None:
        scored = kept + flagged
        if scored:
            self.flag_rate.add(flagged / scored, scored)
        n = accepted + rejected
        if n:
            self.flagged_accept.add(accepted / n, n)

    def switch_ms(self, tokens_behind: int, to_draft: bool) -> float:
        """The one-off cost of catching a model up on `tokens_behind` tokens."""
        table = self.draft if to_draft and self.draft is not None else self.target
        return table.cost(24) / 24 * tokens_behind if tokens_behind > 0 else 0.0



def flat_copy(planner: Planner) -> Planner:
    """The same planner priced as if a decode call cost one token whatever its batch (a GPU or
    Apple Silicon, roughly): what `auto` would do on such a machine with this pair."""
    def flat(table: CostTable | None) -> CostTable | None:
        if table is None:
            return None
        one = table.cost(1)
        return CostTable(last=dict.fromkeys(table.last, one), full=dict.fromkeys(table.full, one))

    return Planner(flat(planner.target), flat(planner.draft), planner.verifier_ms, planner.max_run_cap,
                   planner.use_sprinter, planner.sd_accept, planner.flag_rate, planner.flagged_accept)


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
    flat: Round  # the plan's round under flat costs
    measured: Round  # the same round under this machine's costs
    break_even_ms: float
    measured_ratio: float

    def lines(self) -> list[str]:
        """What doctor prints."""
        p, f, m = self.plan, self.flat, self.measured
        d = f" (draft {self.d1:.0f} ms)" if self.d1 is not None else ""
        out = [f"  flat-batch bound, an UPPER bound (not a prediction): if a batch of any size cost what "
               f"one token costs, c(n) = c(1) = {self.c1:.0f} ms for the target{d}, auto would run "
               f"{p.label} at {self.ratio:.2f}x ar"]
        if p.method == "ar":
            return out
        per_token = (f.draft_ms + self.c1) / f.tokens
        out.append(f"    formula: ms/token = (draft ms per round + c(1)) / tokens per round = "
                   f"({f.draft_ms:.0f} + {self.c1:.0f}) / {f.tokens:.2f} = {per_token:.1f}, "
                   f"against ar's c(1) = {self.c1:.0f}")
        mean = " (mean)" if p.method == "sprinter" else ""
        out.append(f"    it needs a target batch of {m.batch:.0f} tokens{mean} to cost <= "
                   f"{max(self.break_even_ms, 0.0):.0f} ms to beat ar at the draft costs measured here; "
                   f"measured here {m.target_ms:.0f} ms: the cost model puts {p.label} at "
                   f"{self.measured_ratio:.2f}x ar on this machine")
        return out


def flat_bound(planner: Planner) -> FlatBound:
    """`FlatBound` for the plan `auto` would pick under flat costs."""
    flat = flat_copy(planner)
    plan, _ = flat.best()
    kw = dict(draft_len=plan.draft_len, run_cap=plan.run_cap)
    f, m = flat.round(plan.method, **kw), planner.round(plan.method, **kw)
    c1 = planner.target.cost(1)
    d1 = planner.draft.cost(1) if planner.draft is not None else None
    ratio = c1 * f.tokens / (f.draft_ms + f.target_ms)
    measured_ratio = c1 * m.tokens / (m.draft_ms + m.target_ms)
    return FlatBound(plan, ratio, c1, d1, f, m, c1 * m.tokens - m.draft_ms, measured_ratio)


def make_planner(target: Any, draft: Any | None, verifier: Any | None, threshold: float | None,
                 max_run_cap: int | None, acceptance: Any | None = None) -> Planner:
    """A planner for these loaded models: costs from the cache (or measured now), the verifier's
    own cost timed here, and acceptance priors from the best source there is: the pair's
    on-policy measurements (`acceptance` in models/pairs.toml), else the verifier's calibration
    table (off-policy: it flags more than SPRINTER's own runs do), else generic values."""
    from .costs import machine_costs

    planner = Planner(machine_costs(target), machine_costs(draft) if draft is not None else None,
                      max_run_cap=max_run_cap)
    if draft is None or verifier is None:
        return planner
    planner.verifier_ms = time_verifier(verifier, draft)
    rows = getattr(verifier, "calibration", None)
    if acceptance is not None:
        planner.sd_accept = Running(acceptance.sd_accept)
        planner.flagged_accept = Running(acceptance.flagged_accept)
        if threshold is not None:
            planner.flag_rate = Running(max(acceptance.flag_rate_at(threshold), 0.01))
    elif rows and threshold is not None:
        from ..verifiers.calibration import row_at

        planner.flag_rate = Running(max(row_at(rows, threshold).flag_rate, 0.01))
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
