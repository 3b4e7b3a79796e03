"""The public Python API.

    from sprinter_edge import Engine, SamplingParams
    engine = Engine.from_pair("default")  # method "auto": the fastest exact plan on this machine
    print(engine.generate("Write a Python function that reverses a string.").text)
    for chunk in engine.stream("Explain recursion.", SamplingParams(temperature=0.7, max_tokens=64)):
        print(chunk.text, end="", flush=True)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .backend.llama import LlamaModel, common_prefix
from .backend.prompt_cache import PromptCache
from .catalog.registry import PairSpec
from .costs.learning import learn_reply, plain_seconds
from .costs.table import CostTable
from .decoding import (
    Generation,
    GenerationResult,
    Stats,
    Strategy,
    all_settings,
)
from .decoding.proposers.reply_memory import ReplyMemory
from .decoding.sampling import SamplingParams
from .decoding.settings import resolve
from .errors import SettingsError
from .methods import DEFAULT_METHOD, get_strategy
from .model_pair import Hardware, ModelPair, fetch_pair
from .planning.planner import Planner, make_planner
from .prompting import Message, render_chat
from .reply import encode as encode_prompt
from .reply import start as start_reply
from .verification import Verification
from .verifiers.base import Verifier
from .verifiers.operating_point import OperatingPoint

log = logging.getLogger(__name__)


@dataclass
class DecodeSettings:
    """How the engine decodes unless a call says otherwise (validated on every change): the
    method, SPRINTER's operating point, and the methods' own settings (`values`, each declared
    by its method: decoding/settings.py), also readable as attributes (`settings.draft_len`)."""

    method: str = DEFAULT_METHOD
    point: OperatingPoint = field(default_factory=OperatingPoint)  # sprinter's operating point
    values: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        get_strategy(self.method)  # raises for an unknown method
        self.values = resolve(all_settings(), self.values)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("values")
        if values is not None and name in values:
            return values[name]
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("method", "point", "values"):
            object.__setattr__(self, name, value)
            return
        known = all_settings()
        if name not in known:
            raise AttributeError(f"no method declares a setting {name!r}")
        self.values[name] = known[name].check(value)


class Engine:
    """A draft/target pair plus a decoding method; models load on first use.

    Decoding settings (method, operating point, and each method's own settings as keywords,
    e.g. `draft_len=3` for sd, `run_cap=12` for sprinter) belong to the engine;
    sampling settings (length, temperature, top-k/p, seed, stop texts) to each call, as one
    `SamplingParams`. With `method="auto"` the draft loads only when a plan drafts.
    `prompt_cache_mib` > 0 keeps the KV of earlier prompts in that much RAM, so a conversation
    resumed after another one's request reads only its new tokens (0, the default: off).
    `reply_memory_tokens` > 0 keeps that many tokens of earlier replies as a copy source for the
    next requests (an agent's replies recur in shape; 0, the default: off, so that one reply
    never speeds up another in a measurement)."""

    def __init__(
        self,
        target_path: str | Path,
        draft_path: str | Path | None = None,
        *,
        method: str = DEFAULT_METHOD,
        hardware: Hardware | None = None,
        verifier: str | Verifier = "auto",
        threshold: float | None = None,
        preset: str | None = None,
        max_fp_rate: float | None = None,
        pair: PairSpec | None = None,
        prompt_cache_mib: float = 0,
        reply_memory_tokens: int = 0,
        **settings: Any,
    ):
        self.models = ModelPair(Path(target_path), Path(draft_path) if draft_path else None,
                                hardware or Hardware())
        self.pair = pair
        self.verification = Verification(verifier, pair, self.models)
        self.settings = DecodeSettings(method, OperatingPoint(threshold, preset, max_fp_rate), settings)
        self.check_method(method)
        self._planner: Planner | None = None
        if prompt_cache_mib < 0:
            raise SettingsError(f"prompt_cache_mib must be >= 0 (0: off), not {prompt_cache_mib}")
        # Off by default here: a library should not hold up to that much RAM unasked, and one
        # conversation at a time (scripts, the bench) reuses the live KV anyway; the server and
        # the chat REPL turn it on (--cache-ram)
        self.prompt_cache = PromptCache.of_mib(prompt_cache_mib) if prompt_cache_mib > 0 else None
        if reply_memory_tokens < 0:
            raise SettingsError(f"reply_memory_tokens must be >= 0 (0: off), not {reply_memory_tokens}")
        self.reply_memory = ReplyMemory(reply_memory_tokens) if reply_memory_tokens > 0 else None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pair(cls, name: str = "default", *, download: bool = True, offline: bool = False,
                  progress: bool = True, with_draft: bool = False, **kwargs: Any) -> Engine:
        """An engine over a registered pair; fetches only the files the method needs (and the
        draft with `with_draft`)."""
        strategy = get_strategy(str(kwargs.get("method", DEFAULT_METHOD)))
        pair, target, draft = fetch_pair(name, target=strategy.needs_target,
                                         draft=strategy.uses_draft or with_draft, download=download,
                                         offline=offline, progress=progress)
        return cls(target, draft, pair=pair, **kwargs)

    @classmethod
    def from_files(cls, target: str | Path, *, draft: str | Path | None = None, **kwargs: Any) -> Engine:
        """An engine over the GGUF files `target` and `draft` (None: a one-model engine), as
        `Engine(target, draft)`."""
        return cls(target, draft, **kwargs)

    def check_method(self, method: str) -> Strategy:
        """The strategy of `method`, refused where it needs a draft this engine lacks."""
        strategy = get_strategy(method)
        if strategy.needs_draft and self.draft_path is None:
            raise SettingsError(f"method {method!r} needs a draft model")
        return strategy

    # ------------------------------------------------------------------ models
    @property
    def target_path(self) -> Path:
        return self.models.target_path

    @property
    def draft_path(self) -> Path | None:
        return self.models.draft_path

    @property
    def hardware(self) -> Hardware:
        return self.models.hardware

    @property
    def target(self) -> LlamaModel:
        return self.models.target

    @property
    def draft(self) -> LlamaModel:
        """The draft, loaded (and checked against the target's tokenizer) on first use."""
        return self.models.draft

    def finished(self, stats: Stats) -> None:
        """A reply ended: price it as plain decoding would have run (for the speed-up it shows),
        then fold its timed calls into the cost tables this engine measured (costs/learning.py)."""
        table = self._planner.target if self._planner is not None else self.models.cached_target_costs()
        if table is not None and stats.new_tokens:
            stats.baseline_seconds = plain_seconds(table, stats.prompt_tokens, stats.new_tokens)
        if self._planner is not None:
            learn_reply(stats.calls.by_role(), self.models.learners(self._planner.costs))

    @property
    def text_model(self) -> LlamaModel:
        """The model whose tokenizer and chat template are used (they are shared)."""
        return self.models.text_model(get_strategy(self.settings.method).needs_target)

    def load(self) -> Engine:
        """Load every model the current method needs, check they fit together, resolve the
        operating point and, for `auto`, the plan (so a problem shows here, not at the first
        request)."""
        strategy = get_strategy(self.settings.method)
        if strategy.needs_target:
            _ = self.target
        if strategy.uses_draft and self.draft_path is not None:
            _ = self.draft
            if self.verification.scores_drafts(strategy, self.settings.point):
                self.threshold()
        if strategy.needs_costs:
            self.planner()
        return self

    def planner(self) -> Planner:
        """The `auto` planner: this machine's decode costs (measured once, cached on disk) and
        what the pair's replies have shown so far."""
        if self._planner is None:
            # the verifier (its cost, its flag-rate prior) matters only where SPRINTER may run,
            # and needs the draft loaded; otherwise the draft's cost table is enough
            scored = self.draft_path is not None and self.verification.scores_drafts(
                get_strategy(self.settings.method), self.settings.point)
            draft: LlamaModel | CostTable | None = (
                self.draft if scored else self.models.draft_costs() if self.draft_path is not None else None)
            self._planner = make_planner(
                self.target, draft, self.verifier if scored else None,
                self.threshold() if scored else None, self.settings.values,
                self.pair.acceptance if self.pair is not None else None)
            self.models.measured = {"target": self._planner.target}
            if self._planner.draft is not None and not self.models.is_prior(self._planner.draft):
                self.models.measured["draft"] = self._planner.draft
        return self._planner

    def set_planner(self, planner: Planner | None) -> None:
        """Use this planner for `auto` (None: build one from this machine's costs again)."""
        self._planner = planner

    @property
    def verifier(self) -> Verifier:
        return self.verification.verifier

    def set_verifier(self, verifier: str | Verifier) -> None:
        self.verification.use(verifier)
        self._planner = None  # its flag-rate evidence was for the old verifier

    def set_method(self, method: str) -> None:
        self.check_method(method)
        self.settings.method = method

    def set_operating_point(self, point: OperatingPoint) -> None:
        self.settings.point = point
        self._planner = None  # its flag-rate evidence was for the old operating point

    def threshold(self, point: OperatingPoint | None = None, verifier: Verifier | None = None,
                  domain: str | None = None, regime: str | None = None) -> float:
        """SPRINTER's threshold for an operating point (default: the engine's) and verifier,
        for a request of this domain ("code" | "chat") and regime ("greedy" | "sampled")."""
        return self.verification.threshold(point or self.settings.point, verifier, domain, regime)

    def reset_caches(self) -> None:
        """Empty both KV caches, the prompt cache and the reply memory (the next call reads its
        prompt from scratch and copies from no earlier reply)."""
        if self.prompt_cache is not None:
            self.prompt_cache.clear()
        if self.reply_memory is not None:
            self.reply_memory.clear()
        self.models.reset()

    def reusable_prefix(self, model: LlamaModel, tokens: list[int]) -> int:
        """Tokens of `tokens` that `model` will not read again: its live KV or a kept state."""
        if self.prompt_cache is not None:
            return self.prompt_cache.reusable(model, tokens)
        return common_prefix(model.tokens, tokens)

    def close(self) -> None:
        if self.prompt_cache is not None:
            self.prompt_cache.clear()
        self.models.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ prompts
    def format_chat(self, messages: Sequence[Message]) -> str:
        return render_chat(self.text_model, messages)

    def encode(self, prompt: str | Sequence[Message], *, chat: bool = True) -> list[int]:
        return encode_prompt(self.text_model, prompt, chat=chat)

    # ------------------------------------------------------------------ generation
    def stream(
        self,
        prompt: str | Sequence[Message] | list[int],
        params: SamplingParams | None = None,
        *,
        chat: bool = True,
        method: str | None = None,
        operating_point: OperatingPoint | None = None,
        verifier: Verifier | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> Generation:
        """Start a generation; iterate the result for text chunks, then read `.result`.

        `prompt` is text (wrapped in the chat template unless chat=False), a list of chat
        messages, or token ids. `params` holds the sampling settings (default: greedy, 256
        tokens); `method`, `operating_point`, `verifier` and the methods' `settings` (e.g.
        {"draft_len": 3}) override the engine's for this call.
        """
        return start_reply(self, prompt, params or SamplingParams(), chat=chat, method=method,
                           point=operating_point or self.settings.point, verifier=verifier,
                           values=self._settings_for(settings))

    def _settings_for(self, settings: Mapping[str, Any] | None) -> dict[str, Any]:
        """The methods' settings for one call: the engine's, with `settings` checked over them."""
        values = dict(self.settings.values)
        if settings:
            checked = resolve(all_settings(), settings)  # an unknown name or a bad value raises
            values.update({name: checked[name] for name in settings})
        return values

    def generate(
        self,
        prompt: str | Sequence[Message] | list[int],
        params: SamplingParams | None = None,
        *,
        chat: bool = True,
        method: str | None = None,
        operating_point: OperatingPoint | None = None,
        verifier: Verifier | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> GenerationResult:
        """Generate to the end and return the text, tokens and counters (see `stream`)."""
        return self.stream(prompt, params, chat=chat, method=method, operating_point=operating_point,
                           verifier=verifier, settings=settings).consume()

    def chat(
        self,
        messages: Sequence[Message],
        params: SamplingParams | None = None,
        *,
        method: str | None = None,
        operating_point: OperatingPoint | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> GenerationResult:
        """Reply to a conversation: messages are {"role": ..., "content": ...} dicts."""
        if not messages:
            raise SettingsError("chat() needs at least one message")
        return self.generate(list(messages), params, method=method, operating_point=operating_point,
                             settings=settings)

