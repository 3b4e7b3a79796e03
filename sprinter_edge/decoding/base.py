"""The interface every decoding strategy implements, and what they share.

A strategy is one generator function over a `DecodeContext`: given the prompt tokens it
yields lists of newly committed tokens, each tagged with where it came from, forever;
the driver (`stream.py`) stops it on EOS, the token budget or a stop string. A new
strategy is one new file with one `Strategy` subclass, listed in `decoding/__init__.py`.
Each strategy says what it needs (draft, target, verifier, logits rows per target call), so
the engine, the cost model and the server never test method names.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from enum import Enum

import numpy as np

from ..backend.llama import DecodeOutput, LlamaModel
from ..numerics import token_logprobs
from ..planning.planner import Planner
from ..verifiers.base import Verifier
from .sampling import Sampler


class Origin(str, Enum):
    """Where a committed token came from (the counters add up to new_tokens)."""

    TARGET = "target"  # sampled from the target (ar)
    DRAFT = "draft"  # sampled from the draft alone (draft)
    KEPT = "kept"  # passed by the verifier, never seen by the target (sprinter)
    ACCEPTED = "accepted"  # draft token accepted by the SD test
    RESAMPLED = "resampled"  # replacement drawn from the residual after a rejection
    BONUS = "bonus"  # extra target token after an accepted last draft token


Step = list[tuple[int, Origin]]


@dataclass(frozen=True)
class TokenLogprob:
    """A committed token's log-probability under the target, and the most likely tokens
    (token id, log-probability; most likely first) at that position: the log-softmax of the
    target's logits row after the repetition penalties, before temperature, top-k and top-p."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class Stats:
    method: str = ""
    verifier: str | None = None  # sprinter: which verifier scored the draft tokens
    domain: str | None = None  # sprinter: the request's domain (code | chat), for per-domain presets
    threshold: float | None = None  # sprinter: the verifier threshold this request ran at
    prompt_tokens: int = 0
    new_tokens: int = 0
    # where the new tokens came from
    target_sampled: int = 0
    draft_sampled: int = 0
    kept: int = 0
    accepted: int = 0
    resampled: int = 0
    bonus: int = 0
    # work done
    draft_tokens: int = 0  # tokens proposed by the draft (sd, sprinter, staged cuts)
    lookup_tokens: int = 0  # tokens proposed by prompt lookup (staged: before the draft's cut)
    lookup_accepted: int = 0  # proposed tokens (lookup, staged) the target accepted
    draft_calls: int = 0
    target_calls: int = 0  # decode calls of the target after the prompt
    target_tokens: int = 0  # tokens the target decoded after the prompt
    flags: int = 0  # sprinter: tokens the verifier sent to the target
    cap_hits: int = 0  # sprinter: runs ended by the run cap
    eog_checks: int = 0  # sprinter: end-of-generation tokens sent to the target unscored
    plan: str | None = None  # auto: the plan running at the end (e.g. "sprinter(cap=20)")
    plan_reason: str | None = None  # auto: why
    plan_switches: int = 0  # auto: changes of plan during the reply
    plans_run: list[str] = field(default_factory=list)  # auto: every plan that ran, in order
    kind: str | None = None  # the request's kind (edit | code | chat): auto keeps evidence per kind
    exact: bool = True  # every committed token was tested by the target (no kept tokens by design)
    sd_tests: int = 0
    # wall time, seconds
    prefill_seconds: float = 0.0
    first_token_seconds: float = 0.0  # time to first token: the prompt read and the first step
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    verifier_seconds: float = 0.0
    total_seconds: float = 0.0
    finish_reason: str = ""

    def count(self, origin: Origin) -> None:
        self.new_tokens += 1
        attr = {
            Origin.TARGET: "target_sampled", Origin.DRAFT: "draft_sampled", Origin.KEPT: "kept",
            Origin.ACCEPTED: "accepted", Origin.RESAMPLED: "resampled", Origin.BONUS: "bonus",
        }[origin]
        setattr(self, attr, getattr(self, attr) + 1)

    @property
    def guarantee(self) -> str:
        """What the reply promises: the target's output, or an approximation at a point."""
        if self.exact:
            return "exact: distributed as the target's output (greedy: identical to ar)"
        if self.method == "draft":
            return "approximate: the draft model's output, never checked by the target"
        where = f" at threshold {self.threshold:g}" if self.threshold is not None else ""
        return f"approximate: sprinter{where} ({self.kept} tokens never seen by the target)"

    @property
    def decode_seconds(self) -> float:
        return max(self.total_seconds - self.prefill_seconds, 1e-9)

    @property
    def overhead_seconds(self) -> float:
        used = self.prefill_seconds + self.draft_seconds + self.target_seconds
        return max(0.0, self.total_seconds - used - self.verifier_seconds)

    @property
    def tokens_per_second(self) -> float:
        """Generation speed after the prompt is read (what llama.cpp calls eval speed)."""
        return self.new_tokens / self.decode_seconds if self.new_tokens else 0.0

    @property
    def target_calls_per_token(self) -> float:
        return self.target_calls / self.new_tokens if self.new_tokens else 0.0

    @property
    def mean_run_length(self) -> float:
        """sprinter: tokens kept without the target per catch-up (flag, run cap or end token)."""
        return self.kept / max(1, self.flags + self.cap_hits + self.eog_checks)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            guarantee=self.guarantee,
            tokens_per_second=round(self.tokens_per_second, 3),
            tokens_per_second_with_prefill=round(self.new_tokens / self.total_seconds, 3)
            if self.total_seconds > 0 else 0.0,
            target_calls_per_token=round(self.target_calls_per_token, 4),
            decode_seconds=round(self.decode_seconds, 4),
            overhead_seconds=round(self.overhead_seconds, 4),
            mean_run_length=round(self.mean_run_length, 3) if self.method == "sprinter" else None,
        )
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 4)
        return d


@dataclass
class DecodeContext:
    """What a strategy may touch: the models, the sampler, the verifier, the counters."""

    target: LlamaModel | None
    draft: LlamaModel | None
    sampler: Sampler
    stats: Stats
    max_new_tokens: int
    verifier: Verifier | None = None  # sprinter
    threshold: float = 0.5  # sprinter: flag a token whose verifier score is below this
    run_cap: int | None = 20  # sprinter: longest run without the target (None: no cap)
    draft_len: int = 4  # sd: tokens drafted per round
    verify_eog: bool = True  # sprinter: end-of-generation tokens always go to the target
    produced: int = 0  # tokens committed so far (kept up to date by the driver)
    planner: Planner | None = None  # auto, lookup: this machine's costs and the evidence so far
    kind: str = "chat"  # the request's kind (edit | code | chat)
    approximate_ok: bool = False  # auto may run SPRINTER (the user chose an operating point)
    # one entry per committed token, in order, when sampler.params.logprobs is not None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    _scored: list[int] | None = field(default=None, init=False, repr=False)  # prompt + recorded

    def record_target(self, row: np.ndarray, token: int) -> None:
        """Every strategy that logprobs may be asked of calls this for each committed token
        (accepted, resampled, bonus, sampled), in order, with the target's logits row that
        scored it. A no-op unless logprobs are on."""
        k = self.sampler.params.logprobs
        if k is None:
            return
        if self._scored is None:
            self._scored = list(self.sampler.prompt or ())
        row = self.sampler.penalise(row, self._scored)
        logprob, top = token_logprobs(row, token, k)
        self.logprobs.append(TokenLogprob(token, logprob, tuple(top)))
        self._scored.append(token)

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - self.produced

    def target_step(self, context: list[int], n_logits: int = 1) -> DecodeOutput:
        assert self.target is not None
        t0 = time.perf_counter()
        out = self.target.sync(context, n_logits=n_logits)
        self.stats.target_seconds += time.perf_counter() - t0
        self.stats.target_calls += 1
        self.stats.target_tokens += self.target.last_decoded
        return out

    def draft_step(self, context: list[int], *, n_logits: int = 1, hidden: bool = False) -> DecodeOutput:
        assert self.draft is not None
        t0 = time.perf_counter()
        out = self.draft.sync(context, n_logits=n_logits, hidden=hidden)
        self.stats.draft_seconds += time.perf_counter() - t0
        self.stats.draft_calls += 1
        return out


    def text_eog(self, token: int) -> bool:
        model = self.target if self.target is not None else self.draft
        assert model is not None
        return model.is_eog(token)

class Strategy(ABC):
    """One decoding method, and what it needs to run."""

    name: str = ""
    needs_draft: bool = False  # cannot run without a draft model
    uses_draft: bool = False  # runs the draft when the engine has one
    needs_target: bool = True
    needs_verifier: bool = False  # scores draft tokens (when a draft runs)
    needs_planner: bool = False  # prices its work with this machine's measured costs
    exact: bool = True  # output distributed as the target's (greedy: identical to ar)

    def prefill_models(self, ctx: DecodeContext) -> list[LlamaModel]:
        """The models that read the prompt before the first step (the driver times it)."""
        return [m for m in (ctx.target, ctx.draft) if m is not None]

    def target_rows(self, n_tokens: float) -> float:
        """Logits rows one target call of n tokens asks for (the cost model prices them)."""
        return 1.0

    def scores_every_token(self, ctx: DecodeContext) -> bool:
        """Whether the target scores every token this strategy may commit with `ctx` (what
        logprobs need)."""
        return self.exact

    @abstractmethod
    def run(self, ctx: DecodeContext, prompt: list[int]) -> Iterator[Step]:
        """Yield committed tokens with their origin, round after round, until closed."""
