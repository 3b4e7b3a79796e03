"""The public Python API.

    from sprinter_edge import Engine, SamplingParams
    engine = Engine.from_pair("default")  # method "auto": the fastest of ar/sd/sprinter here
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

from .backend.llama import LlamaModel, LoadOptions, check_gguf_file, common_prefix
from .backend.prompt_cache import PromptCache
from .catalog.registry import PairSpec, load_registry
from .catalog.store import ensure_model
from .costs.table import CostTable, cached_file_costs, learning_on, machine_costs, prior_costs, store_costs
from .decoding import (
    STRATEGIES,
    DecodeContext,
    Generation,
    GenerationResult,
    PointUsed,
    Stats,
    Strategy,
    all_settings,
)
from .decoding.sampling import Sampler, SamplingParams
from .decoding.settings import resolve
from .decoding.stats import DEPTH_STEP
from .errors import ContextOverflowError, SettingsError, SprinterError, TokenizerMismatchError
from .methods import DEFAULT_METHOD, EXACT_KINDS, exact_methods, get_strategy, may_approximate
from .planning.planner import Planner, make_planner
from .prompting import Message, prompt_domain, prompt_tokens, render_chat, request_kind
from .verifiers.base import Verifier
from .verifiers.loading import resolve_verifier
from .verifiers.operating_point import OperatingPoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hardware:
    """Where and how the models run. GPU layers: 0 = CPU only, -1 = every layer."""

    n_threads: int | None = None
    n_ctx: int | None = None  # None: the model's trained context up to AUTO_CTX (backend/llama.py)
    draft_gpu_layers: int = 0
    target_gpu_layers: int = 0
    n_batch: int = 512
    flash_attn: str = "auto"  # "on", "off", or "auto": off for repacked weights on the CPU (LoadOptions)

    def options(self, role: str) -> LoadOptions:
        layers = self.draft_gpu_layers if role == "draft" else self.target_gpu_layers
        return LoadOptions(n_ctx=self.n_ctx, n_threads=self.n_threads,
                           n_gpu_layers=999 if layers < 0 else layers, n_batch=self.n_batch,
                           flash_attn=self.flash_attn)


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
    resumed after another one's request reads only its new tokens (0, the default: off)."""

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
        **settings: Any,
    ):
        self.target_path = Path(target_path)
        self.draft_path = Path(draft_path) if draft_path else None
        self.hardware = hardware or Hardware()
        self.pair = pair
        self.verifier_spec = verifier
        self.settings = DecodeSettings(method, OperatingPoint(threshold, preset, max_fp_rate), settings)
        self._check_method(method)
        self._target: LlamaModel | None = None
        self._draft: LlamaModel | None = None
        self._verifier: Verifier | None = None
        self._warned: set[tuple[object, ...]] = set()  # what `_warn_once` has said
        self._planner: Planner | None = None
        self._draft_prior: CostTable | None = None  # the draft's costs guessed, until it loads
        # the cost tables this engine got from the cache or measured, by role: only these learn
        # from the replies' calls and are stored again (never a planner set from outside)
        self._own_costs: dict[str, CostTable] = {}
        if prompt_cache_mib < 0:
            raise SettingsError(f"prompt_cache_mib must be >= 0 (0: off), not {prompt_cache_mib}")
        # Off by default here: a library should not hold up to that much RAM unasked, and one
        # conversation at a time (scripts, the bench) reuses the live KV anyway; the server and
        # the chat REPL turn it on (--cache-ram)
        self.prompt_cache = PromptCache.of_mib(prompt_cache_mib) if prompt_cache_mib > 0 else None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pair(cls, name: str = "default", *, download: bool = True, offline: bool = False,
                  progress: bool = True, with_draft: bool = False, **kwargs: Any) -> Engine:
        """An engine over a registered pair; fetches only the files the method needs (and the
        draft with `with_draft`)."""
        pair = load_registry().pair(name)
        strategy = get_strategy(str(kwargs.get("method", DEFAULT_METHOD)))

        def fetch(model: Any) -> Path:
            return ensure_model(model, download=download, offline=offline, progress=progress)

        draft = fetch(pair.draft) if strategy.uses_draft or with_draft else None
        target = fetch(pair.target) if strategy.needs_target else Path("<not loaded>")
        return cls(target, draft, pair=pair, **kwargs)

    @classmethod
    def from_files(cls, draft: str | Path | None, target: str | Path, **kwargs: Any) -> Engine:
        return cls(target, draft, **kwargs)

    def _check_method(self, method: str) -> Strategy:
        strategy = get_strategy(method)
        if strategy.needs_draft and self.draft_path is None:
            raise SettingsError(f"method {method!r} needs a draft model")
        return strategy

    # ------------------------------------------------------------------ models
    @property
    def target(self) -> LlamaModel:
        if self._target is None:
            self._target = LlamaModel(self.target_path, self.hardware.options("target"))
            if self._draft is not None:
                check_same_tokenizer(self._draft, self._target)
        return self._target

    @property
    def draft(self) -> LlamaModel:
        """The draft, loaded (and checked against the target's tokenizer) on first use."""
        if self.draft_path is None:
            raise SprinterError("no draft model configured")
        if self._draft is None:
            log.info("loading the draft %s", self.draft_path.name)
            draft = LlamaModel(self.draft_path, self.hardware.options("draft"))
            if self._target is not None:
                try:
                    check_same_tokenizer(draft, self._target)
                except TokenizerMismatchError:
                    draft.close()
                    raise
            self._draft = draft
            if self._draft_prior is not None:  # the planner priced it unmeasured: measure it now
                self._draft_prior.replace_with(machine_costs(draft))
                self._own_costs["draft"], self._draft_prior = self._draft_prior, None
        return self._draft

    def _draft_costs(self) -> CostTable:
        """The draft's decode costs for the planner, without loading the draft where it can: from
        the cache when an earlier load of the same file recorded them (its tokenizer checked
        against the target's from that record); from the target's costs scaled by the files'
        sizes while no plan has loaded it (`prior_costs`: measured, in place, when one does);
        else from the loaded draft."""
        assert self.draft_path is not None
        if self._draft is None:
            found = cached_file_costs(self.draft_path, self.hardware.options("draft"))
            if found is not None:
                target = self.target
                if found.n_vocab != target.n_vocab or found.tokenizer_hash != target.tokenizer_hash():
                    raise TokenizerMismatchError(tokenizer_mismatch(
                        self.draft_path.name, found.n_vocab, target.path.name, target.n_vocab))
                return found.table
            check_gguf_file(self.draft_path)  # a missing or foreign file is refused now, not mid-reply
            self._draft_prior = prior_costs(machine_costs(self.target), self.draft_path, self.target_path)
            return self._draft_prior
        return machine_costs(self.draft)

    def _finished(self, stats: Stats) -> None:
        """A reply ended: price it as plain decoding would have run (for the speed-up it shows),
        then learn from its calls."""
        table = self._planner.target if self._planner is not None else None
        if table is None and self._target is not None:
            found = cached_file_costs(self.target_path, self.hardware.options("target"))
            table = found.table if found is not None else None
        if table is not None and stats.new_tokens:
            start = stats.prompt_tokens
            stats.baseline_seconds = round(sum(
                table.at(start + i).cost(1) for i in range(stats.new_tokens)) / 1e3, 4)
        self._learn_costs(stats)

    def _learn_costs(self, stats: Stats) -> None:
        """Fold a finished reply's timed calls into the planner's cost tables and store them: the
        first-use measurement is refined at the sizes and depths requests actually reach."""
        if self._planner is None or not learning_on():
            return
        mine = self._own_costs
        learners = {"target": (self._target, self._planner.target if self._planner.target is
                               mine.get("target") else None),
                    "draft": (self._draft, self._planner.draft if self._planner.draft is
                              mine.get("draft") else None)}
        calls: dict[str, list[tuple[int, int, float, float, int]]] = {}
        for (role, (n, rows, step)), (count, total_ms) in stats.calls.timed.items():
            depth = (step + 0.5) * DEPTH_STEP
            calls.setdefault(role, []).append((n, rows, depth, total_ms / count, int(count)))
        for role, timed in calls.items():
            model, table = learners[role]
            if model is None or table is None:
                continue
            table.learn_calls(timed)
            table.make_monotone()
            store_costs(model, table)

    @property
    def target_decoded_tokens(self) -> int:
        """Tokens the target has decoded since it loaded, prompts read included (0: not loaded)."""
        return self._target.decoded_tokens if self._target is not None else 0

    @property
    def text_model(self) -> LlamaModel:
        """The model whose tokenizer and chat template are used (they are shared)."""
        if self._target is not None or get_strategy(self.settings.method).needs_target:
            return self.target
        return self.draft

    def _uses_draft(self, strategy: Strategy) -> bool:
        return strategy.uses_draft and self.draft_path is not None

    def _scores_drafts(self, strategy: Strategy) -> bool:
        """A verifier will score drafted tokens: the method is approximate by design, or it may
        run an approximate plan at the operating point the engine was given."""
        return strategy.needs_verifier and (not strategy.exact or self.settings.point.is_set)

    def load(self) -> Engine:
        """Load every model the current method needs, check they fit together, resolve the
        operating point and, for `auto`, the plan (so a problem shows here, not at the first
        request)."""
        strategy = get_strategy(self.settings.method)
        if strategy.needs_target:
            _ = self.target
        if self._uses_draft(strategy):
            _ = self.draft
            if self._scores_drafts(strategy):
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
            scored = self.draft_path is not None and self._scores_drafts(get_strategy(self.settings.method))
            draft: LlamaModel | CostTable | None = (
                self.draft if scored else self._draft_costs() if self.draft_path is not None else None)
            self._planner = make_planner(
                self.target, draft, self.verifier if scored else None,
                self.threshold() if scored else None, self.settings.values,
                self.pair.acceptance if self.pair is not None else None)
            self._own_costs = {"target": self._planner.target}
            if self._planner.draft is not None and self._planner.draft is not self._draft_prior:
                self._own_costs["draft"] = self._planner.draft
        return self._planner

    def set_planner(self, planner: Planner | None) -> None:
        """Use this planner for `auto` (None: build one from this machine's costs again)."""
        self._planner = planner

    @property
    def verifier(self) -> Verifier:
        if self._verifier is None:
            self._verifier = resolve_verifier(self.verifier_spec, self.pair, self.draft,
                                              self.target)
        return self._verifier

    def set_verifier(self, verifier: str | Verifier) -> None:
        self.verifier_spec = verifier
        self._verifier = None
        self._planner = None  # its flag-rate evidence was for the old verifier

    def set_method(self, method: str) -> None:
        self._check_method(method)
        self.settings.method = method

    def set_operating_point(self, point: OperatingPoint) -> None:
        self.settings.point = point
        self._planner = None  # its flag-rate evidence was for the old operating point

    def threshold(self, point: OperatingPoint | None = None, verifier: Verifier | None = None,
                  domain: str | None = None, regime: str | None = None) -> float:
        """SPRINTER's threshold for an operating point (default: the engine's) and verifier,
        for a request of this domain ("code" | "chat") and regime ("greedy" | "sampled")."""
        return (point or self.settings.point).resolve(verifier or self.verifier, domain, regime)

    def reset_caches(self) -> None:
        """Empty both KV caches and the prompt cache (the next call reads its prompt from
        scratch)."""
        if self.prompt_cache is not None:
            self.prompt_cache.clear()
        for m in (self._draft, self._target):
            if m is not None:
                m.reset()

    def reusable_prefix(self, model: LlamaModel, tokens: list[int]) -> int:
        """Tokens of `tokens` that `model` will not read again: its live KV or a kept state."""
        if self.prompt_cache is not None:
            return self.prompt_cache.reusable(model, tokens)
        return common_prefix(model.tokens, tokens)

    def close(self) -> None:
        if self.prompt_cache is not None:
            self.prompt_cache.clear()
        for m in (self._draft, self._target):
            if m is not None:
                m.close()
        self._draft = self._target = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ prompts
    def format_chat(self, messages: Sequence[Message]) -> str:
        return render_chat(self.text_model, messages)

    def encode(self, prompt: str | Sequence[Message], *, chat: bool = True) -> list[int]:
        if not isinstance(prompt, str):
            return prompt_tokens(self.text_model, self.format_chat(prompt), chat_rendered=True)
        if chat:
            text = self.format_chat([{"role": "user", "content": prompt}])
            return prompt_tokens(self.text_model, text, chat_rendered=True)
        return prompt_tokens(self.text_model, prompt, chat_rendered=False)

    def _prompt_ids(self, prompt: str | Sequence[Message] | list[int], chat: bool) -> list[int]:
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            tokens = list(prompt)
            n_vocab = self.text_model.n_vocab
            bad = [t for t in tokens if not 0 <= t < n_vocab]
            if bad:
                raise SettingsError(f"token ids out of range [0, {n_vocab}): {bad[:5]}")
        else:
            tokens = self.encode(prompt, chat=chat)  # type: ignore[arg-type]
        if not tokens:
            raise SettingsError("the prompt is empty: give at least one token (or a chat message)")
        return tokens

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
        params = params or SamplingParams()
        values = self._settings_for(settings)
        strategy = self._check_method(method or self.settings.method)
        self._check_bias(params)
        if strategy.needs_costs:
            strategy = get_strategy(strategy.name, self.planner())
        tokens = self._prompt_ids(prompt, chat)
        ctx = self._context(strategy, params, tokens, values)
        request = self.text_model.detokenize(tokens) if isinstance(prompt, list) else prompt
        ctx.kind = ctx.stats.kind = request_kind(request)
        if params.prediction:
            ctx.prediction = self.text_model.tokenize(params.prediction, add_special=False, special=False)
            ctx.kind = ctx.stats.kind = "edit"  # the reply is expected to copy: plan for a copy
        ctx.stats.exact = strategy.exact
        self._operating_point(ctx, strategy, operating_point or self.settings.point, verifier, request)
        if strategy.needs_costs:
            planner = self.planner()
            ctx.costs, ctx.evidence = planner.costs, planner.evidence
        if params.logprobs is not None and not strategy.scores_every_token(ctx):
            raise SettingsError(
                f"logprobs need an exact method ({', '.join(exact_methods())}; auto without an operating "
                f"point): {strategy.name!r} commits tokens the target never scores"
                + (" (it may run sprinter at the operating point given)" if strategy.exact else ""))
        model = ctx.target if ctx.target is not None else ctx.draft
        return Generation(strategy, ctx, tokens, stop=params.stop, text_model=model,  # type: ignore[arg-type]
                          on_finish=self._finished)

    def _settings_for(self, settings: Mapping[str, Any] | None) -> dict[str, Any]:
        """The methods' settings for one call: the engine's, with `settings` checked over them."""
        values = dict(self.settings.values)
        if settings:
            checked = resolve(all_settings(), settings)  # an unknown name or a bad value raises
            values.update({name: checked[name] for name in settings})
        return values

    def _check_bias(self, params: SamplingParams) -> None:
        if params.logit_bias:
            n_vocab = self.text_model.n_vocab
            bad = [t for t, _ in params.logit_bias if t >= n_vocab]
            if bad:
                raise SettingsError(f"logit_bias: token ids out of range [0, {n_vocab}): {bad[:5]}")

    def _context(self, strategy: Strategy, params: SamplingParams, tokens: list[int],
                 values: dict[str, Any]) -> DecodeContext:
        """A reply's context: the models the method needs, the budget the context leaves, the
        constraint's matcher."""
        target = self.target if strategy.needs_target else None
        # `auto` loads the draft when a plan drafts (its first one, or a switch): a one-model
        # plan never pays for it; a method that drafts from the start loads it now
        lazy = strategy.needs_costs and self._draft is None and target is not None
        draft = self.draft if self._uses_draft(strategy) and not lazy else None
        n_ctx = min(m.n_ctx for m in (target, draft) if m is not None)
        margin = 2 + max(cls().lookahead(values) for cls in STRATEGIES.values())
        if len(tokens) + margin > n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(tokens)} tokens; the context holds {n_ctx} "
                f"(use --ctx to raise it, or shorten the prompt)"
            )
        room = n_ctx - len(tokens) - margin
        budget = room if params.max_tokens is None else min(params.max_tokens, room)
        if params.max_tokens is not None and budget < params.max_tokens:
            log.warning("max_tokens lowered from %d to %d to fit the context", params.max_tokens, budget)
        ctx = DecodeContext(
            target=target, draft=draft, sampler=Sampler(params), stats=Stats(),
            max_new_tokens=budget, settings=values,
            draft_loader=(lambda: self.draft) if lazy and self._uses_draft(strategy) else None,
            prompt_cache=self.prompt_cache,
        )
        if params.constraint is not None:  # a fresh matcher: the state of the empty reply
            from .grammar import compile as compile_constraint
            ctx.grammar = compile_constraint(params.constraint, target if target is not None else draft)
        return ctx

    def _operating_point(self, ctx: DecodeContext, strategy: Strategy, point: OperatingPoint,
                         verifier: Verifier | None, request: Any) -> None:
        """Whether tokens the target never checks may be committed, and at which threshold."""
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


def check_same_tokenizer(draft: LlamaModel, target: LlamaModel) -> None:
    if draft.n_vocab != target.n_vocab or draft.tokenizer_hash() != target.tokenizer_hash():
        raise TokenizerMismatchError(tokenizer_mismatch(draft.path.name, draft.n_vocab,
                                                        target.path.name, target.n_vocab))


def tokenizer_mismatch(draft: str, draft_vocab: int, target: str, target_vocab: int) -> str:
    return (f"draft {draft} and target {target} do not share a tokenizer "
            f"(vocab {draft_vocab} vs {target_vocab}); speculative decoding needs one "
            "vocabulary. Pick a draft from the target's model family.")
