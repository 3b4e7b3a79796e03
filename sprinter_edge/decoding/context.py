"""What a strategy may touch while it decodes: the models (through a meter that times and
counts every call), the sampler, the verifier, this machine's costs and the evidence so far."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..backend.llama import DecodeOutput, LlamaModel, common_prefix
from ..backend.prompt_cache import PromptCache
from ..costs import Costs, Evidence
from ..numerics import token_logprobs
from ..verifiers.base import Verifier
from .registry import all_settings
from .sampling import Sampler
from .stats import Origin, Stats

if TYPE_CHECKING:
    from ..grammar.engine import Matcher
    from .proposers.reply_memory import ReplyMemory

Step = list[tuple[int, Origin]]  # tokens committed in one round, with where each came from


@dataclass(frozen=True)
class TokenLogprob:
    """A committed token's log-probability under the target, and the most likely tokens
    (token id, log-probability; most likely first) at that position: the log-softmax of the
    target's logits row after the repetition penalties, before temperature, top-k and top-p."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class DecodeContext:
    """One reply's decoding state, handed to its strategy and the strategy's proposer."""

    target: LlamaModel | None
    draft: LlamaModel | None  # None with a `draft_loader`: not loaded yet
    sampler: Sampler
    stats: Stats
    max_new_tokens: int
    # the methods' own settings for this reply (decoding/settings.py; a missing one: its default)
    settings: dict[str, Any] = field(default_factory=dict)
    verifier: Verifier | None = None  # scores drafted tokens (sprinter; auto at an operating point)
    threshold: float = 0.5  # the operating point: flag a token whose verifier score is below this
    produced: int = 0  # tokens committed so far (kept up to date by the driver)
    costs: Costs | None = None  # this machine's decode costs (lookup prices its proposals)
    evidence: Evidence | None = None  # what earlier replies showed (kept by the engine's planner)
    kind: str = "chat"  # the request's kind (edit | code | chat)
    prediction: list[int] = field(default_factory=list)  # the client's predicted output, tokenized
    approximate_ok: bool = False  # auto may run SPRINTER (the user chose an operating point)
    # the reply's constraint, in the state of the committed reply (the loop consumes each
    # round's tokens); proposers consume what they try and roll it back. None: free text
    grammar: Matcher | None = None
    # one entry per committed token, in order, when sampler.params.logprobs is not None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    # loads the draft on first use (`auto` keeps a one-model plan from paying for it); it checks
    # the draft's tokenizer against the target's before any of its tokens is used
    draft_loader: Callable[[], LlamaModel] | None = None
    prompt_cache: PromptCache | None = None  # KV states of earlier prompts, restored by prefill
    reply_memory: ReplyMemory | None = None  # earlier replies, a copy source (the reply joins it)
    # what every timing of the reply reads (its model calls, the verifier, the driver's total):
    # the wall clock; a test gives one that only what it charges moves
    clock: Callable[[], float] = time.perf_counter
    _scored: list[int] | None = field(default=None, init=False, repr=False)  # prompt + recorded

    def setting(self, name: str) -> Any:
        """The value of a method's setting for this reply."""
        if name in self.settings:
            return self.settings[name]
        try:
            return all_settings()[name].default
        except KeyError:
            raise KeyError(f"no method declares a setting {name!r}") from None

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
    def has_draft(self) -> bool:
        """A draft is loaded, or can be."""
        return self.draft is not None or self.draft_loader is not None

    def draft_behind(self, seq: list[int]) -> int:
        """Tokens of `seq` a plan that drafts would first have the draft read (all of them
        while it is not loaded); 0 without a draft."""
        if not self.has_draft:
            return 0
        return len(seq) - (common_prefix(self.draft.tokens, seq) if self.draft is not None else 0)

    def load_draft(self) -> LlamaModel:
        """The draft, loaded now if it is not yet."""
        if self.draft is None:
            assert self.draft_loader is not None, "no draft model"
            self.draft = self.draft_loader()
        return self.draft

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - self.produced

    def target_step(self, context: list[int], n_logits: int = 1) -> DecodeOutput:
        assert self.target is not None
        t0 = self.clock()
        out = self.target.sync(context, n_logits=n_logits)
        seconds = self.clock() - t0
        self.stats.timings.target_seconds += seconds
        c, n = self.stats.counters, self.target.last_decoded
        c.target_calls += 1
        c.target_tokens += n
        c.target_rows += min(n_logits, n)
        self.stats.calls.add("target", n, min(n_logits, n), len(context) - n, seconds * 1e3)
        return out

    def draft_step(self, context: list[int], *, n_logits: int = 1, hidden: bool = False) -> DecodeOutput:
        draft = self.load_draft()
        t0 = self.clock()
        out = draft.sync(context, n_logits=n_logits, hidden=hidden)
        seconds = self.clock() - t0
        self.stats.timings.draft_seconds += seconds
        self.stats.counters.draft_calls += 1
        n = draft.last_decoded
        # a call asked for hidden states is dearer than the plain calls the table prices
        self.stats.calls.add("draft", n, min(n_logits, n), len(context) - n,
                             None if hidden else seconds * 1e3)
        return out

    def text_eog(self, token: int) -> bool:
        model = self.target if self.target is not None else self.draft
        assert model is not None
        return model.is_eog(token)
