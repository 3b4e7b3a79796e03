"""What a reply did, apart from what it said: counters, timings and per-method extras.

Each part has one writer:
- `Counters` origins (`count`): the driver, once per token it hands on;
- `Counters` proposals and tests (`add_round`): the loop, once per round;
- `Counters` calls, `CallLog` and `Timings` model seconds: the context's meter around each
  model call;
- `Timings` prefill, first token, total: the driver; grammar: the driver, from the matcher's
  clock (every Matcher method times itself, grammar/engine.py);
- `PlanTrace`: `auto`; `OperatingPoint`: the engine, when SPRINTER may run.
`Stats.to_dict` flattens them into one JSON object (the bench's, the server's and the CLI's).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from difflib import SequenceMatcher
from enum import Enum
from typing import Protocol

from .registry import declared_counters


class Origin(str, Enum):
    """Where a committed token came from (the counters add up to new_tokens)."""

    TARGET = "target"  # sampled from the target (ar)
    DRAFT = "draft"  # sampled from the draft alone (draft)
    KEPT = "kept"  # passed by the verifier, never seen by the target (sprinter)
    ACCEPTED = "accepted"  # a drafted token accepted by the p/q test
    COPIED = "copied"  # a copied token (prompt, reply, prediction) accepted by the p/q test
    GUIDED = "guided"  # a token of the grammar's fast-forward span accepted by the p/q test
    RESAMPLED = "resampled"  # replacement drawn from the residual after a rejection
    BONUS = "bonus"  # extra target token after an accepted last proposed token
    FORCED = "forced"  # the only token the grammar allows: committed without the target (exact)


_NOT_COUNTS = ("extra", "accepted_per_position")  # Counters fields that are not one count

_ORIGIN_FIELD = {
    Origin.TARGET: "target_sampled", Origin.DRAFT: "draft_sampled", Origin.KEPT: "kept",
    Origin.ACCEPTED: "accepted", Origin.COPIED: "accepted", Origin.GUIDED: "accepted",
    Origin.RESAMPLED: "resampled", Origin.BONUS: "bonus",
    Origin.FORCED: "forced",
}


class ProposalCounts(Protocol):
    """What a round's proposal tells the counters (proposers.base.Proposal has these)."""

    drafted: int  # tokens the draft produced
    copied: int  # tokens a copy offered
    grammar: int  # the grammar's fast-forward tokens
    ended_by: str | None  # what ended an untested run (SPRINTER: flag | cap | eog)
    bumps: tuple[str, ...]  # counters of the proposing method's own to add one to
    forced: int
    trusted: int

    def proposer_of(self, j: int) -> str: ...  # who proposed token j: grammar | copy | draft


@dataclass
class Counters:
    # committed tokens by origin
    new_tokens: int = 0
    target_sampled: int = 0
    draft_sampled: int = 0
    kept: int = 0
    accepted: int = 0
    resampled: int = 0
    bonus: int = 0
    forced: int = 0  # constrained: tokens the grammar left no choice for (no target test)
    # proposals and their tests, whatever the method (the field's words: CONTRIBUTING's glossary)
    drafts: int = 0  # rounds whose proposal the target tested (vLLM's num_drafts)
    draft_tokens: int = 0  # tokens the draft proposed
    copied_tokens: int = 0  # tokens a copy offered (prompt, reply, prediction)
    copied_accepted: int = 0  # copied tokens the target accepted
    pq_tests: int = 0  # p/q tests run: every proposed token the target checked (num_draft_tokens)
    run_ends: int = 0  # untested runs that ended in a target call (SPRINTER's catch-ups)
    grammar_proposed: int = 0  # constrained: the grammar's fast-forward tokens proposed
    grammar_accepted: int = 0  # of those, accepted by the p/q test
    # model calls after the prompt
    draft_calls: int = 0
    target_calls: int = 0
    target_tokens: int = 0  # tokens the target decoded
    target_rows: int = 0  # logits rows the target's calls returned (what a call costs depends on it)
    # tested proposals whose token i the target accepted, by i (num_accepted_tokens_per_pos)
    accepted_per_position: Counter[int] = field(default_factory=Counter)
    # a method's own counters, by the names it declares (Strategy.counters)
    extra: Counter[str] = field(default_factory=Counter)

    def count(self, origin: Origin) -> None:
        self.new_tokens += 1
        name = _ORIGIN_FIELD[origin]
        setattr(self, name, getattr(self, name) + 1)

    def add_round(self, proposal: ProposalCounts, tested: int, accepted: int) -> None:
        """One round of the loop: `proposal`, of which `tested` tokens went through the p/q test
        and the first `accepted` passed it."""
        self.pq_tests += tested
        if tested:
            self.drafts += 1
            self.accepted_per_position.update(range(accepted))
        self.draft_tokens += proposal.drafted
        self.copied_tokens += proposal.copied
        # a proposal's tested tokens: the grammar's fast-forward span first, then the rest
        self.grammar_proposed += proposal.grammar
        self.grammar_accepted += min(accepted, proposal.grammar)
        if proposal.copied:
            start = proposal.forced + proposal.trusted
            self.copied_accepted += sum(proposal.proposer_of(start + j) == "copy" for j in range(accepted))
        if proposal.ended_by is not None:
            self.run_ends += 1
        self.extra.update(proposal.bumps)

    def __getattr__(self, name: str) -> int:
        """A method's own counter (`counters.flags`): 0 until its rounds bump it."""
        extra = self.__dict__.get("extra")
        if extra is None or name.startswith("_") or name not in declared_counters():
            raise AttributeError(name)
        return extra[name]

    def acceptance_per_position(self) -> list[float]:
        """The share of tested proposals whose token i the target accepted, for each i."""
        per = self.accepted_per_position
        return [round(per[i] / self.drafts, 4) for i in range(max(per, default=-1) + 1)]

    def by_name(self) -> dict[str, int]:
        """Every count by name, the methods' own included (0 for those not bumped)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _NOT_COUNTS}
        out.update(dict.fromkeys(declared_counters(), 0))
        out.update(self.extra)
        return out


# CallLog's depth step: a call's cost grows with the context it reads, slowly enough that
# 128-token steps price it within a fraction of a percent
DEPTH_STEP = 128


@dataclass
class CallLog:
    """The model calls after the prompt by (tokens decoded, logits rows, depth of context in
    DEPTH_STEP steps): a reply priced call by call, where the mean call size underprices it
    (a few long calls beside many short ones cost more than as many calls of the mean size)."""

    target: Counter[tuple[int, int, int]] = field(default_factory=Counter)
    draft: Counter[tuple[int, int, int]] = field(default_factory=Counter)
    # the calls that were timed as the table prices them: (role, key) -> [calls, total ms]
    # (the engine refines its cost tables from them)
    timed: dict[tuple[str, tuple[int, int, int]], list[float]] = field(default_factory=dict)

    def add(self, role: str, tokens: int, rows: int, depth: int, ms: float | None = None) -> None:
        if tokens:  # a sync that found everything in the KV decoded nothing
            key = (tokens, rows, depth // DEPTH_STEP)
            getattr(self, role)[key] += 1
            if ms is not None:
                entry = self.timed.setdefault((role, key), [0, 0.0])
                entry[0] += 1
                entry[1] += ms

    def by_role(self) -> dict[str, list[tuple[int, int, float, float, int]]]:
        """The timed calls per role as (tokens, rows, depth at the middle of its step, ms each,
        count): what `CostTable.learn_calls` takes."""
        calls: dict[str, list[tuple[int, int, float, float, int]]] = {}
        for (role, (n, rows, step)), (count, total_ms) in self.timed.items():
            depth = (step + 0.5) * DEPTH_STEP
            calls.setdefault(role, []).append((n, rows, depth, total_ms / count, int(count)))
        return calls

    def merge(self, other: CallLog) -> None:
        self.target.update(other.target)
        self.draft.update(other.draft)
        for k, (calls, ms) in other.timed.items():
            entry = self.timed.setdefault(k, [0, 0.0])
            entry[0] += calls
            entry[1] += ms


@dataclass
class Timings:
    """Wall seconds of the engine's own work (never the consumer's)."""

    prefill_seconds: float = 0.0
    first_token_seconds: float = 0.0  # time to first token: the prompt read and the first step
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    verifier_seconds: float = 0.0
    # constrained: inside the grammar (masks, consuming, fast-forward, rollback); counted in
    # overhead_seconds too, which is the time outside the model calls and the verifier
    grammar_seconds: float = 0.0
    total_seconds: float = 0.0

    @property
    def decode_seconds(self) -> float:
        return max(self.total_seconds - self.prefill_seconds, 1e-9)

    @property
    def overhead_seconds(self) -> float:
        used = self.prefill_seconds + self.draft_seconds + self.target_seconds + self.verifier_seconds
        return max(0.0, self.total_seconds - used)


@dataclass
class PlanTrace:
    """`auto`: which plans ran, and why the last one."""

    plan: str | None = None  # the plan running at the end (e.g. "sd(k=3)")
    plan_reason: str | None = None
    plan_switches: int = 0
    plans_run: list[str] = field(default_factory=list)


@dataclass
class PointUsed:
    """SPRINTER's operating point for this request."""

    verifier: str | None = None
    # code | chat (prompting.prompt_domain): the presets are calibrated per domain; not
    # Stats.kind, what auto learns per (an edit request is in the code domain)
    domain: str | None = None
    threshold: float | None = None


@dataclass
class PredictionUsage:
    """How much of a client's predicted output the reply used, as OpenAI's Predicted Outputs
    count it: prediction tokens that appear in the completion (in order) and those that do not."""

    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0

    @classmethod
    def of(cls, prediction: Sequence[int], completion: Sequence[int]) -> PredictionUsage:
        matcher = SequenceMatcher(None, list(prediction), list(completion), autojunk=False)
        used = sum(b.size for b in matcher.get_matching_blocks())
        return cls(used, len(prediction) - used)


@dataclass
class Stats:
    method: str = ""
    kind: str | None = None  # edit | code | chat: auto keeps evidence per kind
    exact: bool = True  # every committed token was tested by the target
    prompt_tokens: int = 0
    finish_reason: str = ""
    counters: Counters = field(default_factory=Counters)
    timings: Timings = field(default_factory=Timings)
    trace: PlanTrace = field(default_factory=PlanTrace)
    point: PointUsed = field(default_factory=PointUsed)
    prediction: PredictionUsage | None = None  # when the client sent a predicted output
    # prompt tokens the target found in its KV cache (or restored from the prompt cache) and
    # did not read anew (None: no prompt was read, e.g. cancelled before it started)
    cached_tokens: int | None = None
    calls: CallLog = field(default_factory=CallLog)  # not in to_dict: the cost model reads it
    guarantee_text: str = ""  # what the output promises, in its method's words (set at the end)
    # what plain decoding (`ar`) would have taken for these tokens after this prompt, by this
    # machine's cost table (None when the engine has none yet)
    baseline_seconds: float | None = None

    @property
    def new_tokens(self) -> int:
        return self.counters.new_tokens

    @property
    def guarantee(self) -> str:
        """What the reply promises (its method's words, `Strategy.guarantee`)."""
        if self.guarantee_text:
            return self.guarantee_text
        if self.exact:
            return "exact: distributed as the target's output (greedy: identical to ar)"
        return "approximate"

    @property
    def tokens_per_second(self) -> float:
        """Generation speed after the prompt is read (what llama.cpp calls eval speed)."""
        n = self.counters.new_tokens
        return n / self.timings.decode_seconds if n else 0.0

    @property
    def target_calls_per_token(self) -> float:
        c = self.counters
        return c.target_calls / c.new_tokens if c.new_tokens else 0.0

    @property
    def mean_run_length(self) -> float:
        """Tokens committed untested per run that ended in a target call (SPRINTER's runs)."""
        c = self.counters
        return c.kept / max(1, c.run_ends)

    @classmethod
    def total(cls, items: Sequence[Stats]) -> Stats:
        """The counters and timings of several replies added up (the method of the first)."""
        out = cls(method=items[0].method if items else "")
        for st in items:
            out.prompt_tokens += st.prompt_tokens
            for part, add in ((out.counters, st.counters), (out.timings, st.timings)):
                for f in fields(part):
                    setattr(part, f.name, getattr(part, f.name) + getattr(add, f.name))
            out.calls.merge(st.calls)
        return out

    def to_dict(self) -> dict:
        """One flat JSON object: the request, every counter, timing and extra, and derived rates."""
        t = self.timings
        d = {"method": self.method, "kind": self.kind, "exact": self.exact,
             "prompt_tokens": self.prompt_tokens, "finish_reason": self.finish_reason,
             **asdict(self.point), **self.counters.by_name(), **asdict(self.trace), **asdict(t),
             **(asdict(self.prediction) if self.prediction is not None else {})}
        d.update(
            guarantee=self.guarantee,
            tokens_per_second=round(self.tokens_per_second, 3),
            tokens_per_second_with_prefill=round(self.new_tokens / t.total_seconds, 3)
            if t.total_seconds > 0 else 0.0,
            target_calls_per_token=round(self.target_calls_per_token, 4),
            decode_seconds=round(t.decode_seconds, 4),
            overhead_seconds=round(t.overhead_seconds, 4),
            acceptance_per_position=self.counters.acceptance_per_position(),
            mean_run_length=round(self.mean_run_length, 3) if self.counters.run_ends else None,
            baseline_seconds=self.baseline_seconds,
            speedup_estimate=round(self.baseline_seconds / t.decode_seconds, 3)
            if self.baseline_seconds and self.new_tokens else None,
        )
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 4)
        return d
