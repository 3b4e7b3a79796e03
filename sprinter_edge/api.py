"""The public Python API.

    from sprinter_edge import Engine
    engine = Engine.from_pair("default", method="sprinter")
    print(engine.generate("Write a Python function that reverses a string.").text)
    for chunk in engine.stream("Explain recursion in one paragraph."):
        print(chunk.text, end="", flush=True)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .backend.llama import LlamaModel, LoadOptions
from .catalog.registry import PairSpec, load_registry
from .catalog.store import ensure_model
from .decoding import METHODS, DecodeContext, Generation, GenerationResult, Stats, get_strategy
from .decoding.sampling import Sampler, SamplingParams
from .errors import ContextOverflowError, SprinterError, TokenizerMismatchError
from .prompting import Message, prompt_tokens, render_chat
from .verifiers.base import Verifier
from .verifiers.loading import resolve_verifier

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hardware:
    """Where and how the models run. GPU layers: 0 = CPU only, -1 = every layer."""

    n_threads: int | None = None
    n_ctx: int = 4096
    draft_gpu_layers: int = 0
    target_gpu_layers: int = 0
    n_batch: int = 512

    def options(self, role: str) -> LoadOptions:
        layers = self.draft_gpu_layers if role == "draft" else self.target_gpu_layers
        return LoadOptions(n_ctx=self.n_ctx, n_threads=self.n_threads,
                           n_gpu_layers=999 if layers < 0 else layers, n_batch=self.n_batch)


@dataclass
class DecodeSettings:
    method: str = "sprinter"
    threshold: float | None = None  # None: the verifier's calibrated default
    run_cap: int | None = 20
    draft_len: int = 4


class Engine:
    """A draft/target pair plus a decoding method; models load on first use."""

    def __init__(
        self,
        target_path: str | Path,
        draft_path: str | Path | None = None,
        *,
        method: str = "sprinter",
        hardware: Hardware | None = None,
        verifier: str | Verifier = "auto",
        threshold: float | None = None,
        run_cap: int | None = 20,
        draft_len: int = 4,
        pair: PairSpec | None = None,
    ):
        self.target_path = Path(target_path)
        self.draft_path = Path(draft_path) if draft_path else None
        self.hardware = hardware or Hardware()
        self.pair = pair
        self.verifier_spec = verifier
        self.settings = DecodeSettings(method, threshold, run_cap, draft_len)
        self._check_method(method)
        self._target: LlamaModel | None = None
        self._draft: LlamaModel | None = None
        self._verifier: Verifier | None = None
        self.last_stats: Stats | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pair(cls, name: str = "default", *, download: bool = True, offline: bool = False,
                  progress: bool = True, **kwargs: object) -> Engine:
        pair = load_registry().pair(name)
        method = str(kwargs.get("method", "sprinter"))
        draft = ensure_model(pair.draft, download=download, offline=offline, progress=progress) \
            if method != "ar" else None
        target = ensure_model(pair.target, download=download, offline=offline,
                              progress=progress) if method != "draft" else None
        return cls(target or Path("<not loaded>"), draft, pair=pair, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def from_files(cls, draft: str | Path | None, target: str | Path, **kwargs: object) -> Engine:
        return cls(target, draft, **kwargs)  # type: ignore[arg-type]

    def _check_method(self, method: str) -> None:
        if method not in METHODS:
            raise SprinterError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
        if method != "ar" and self.draft_path is None:
            raise SprinterError(f"method {method!r} needs a draft model")

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
        if self.draft_path is None:
            raise SprinterError("no draft model configured")
        if self._draft is None:
            self._draft = LlamaModel(self.draft_path, self.hardware.options("draft"))
            if self._target is not None:
                check_same_tokenizer(self._draft, self._target)
        return self._draft

    @property
    def text_model(self) -> LlamaModel:
        """The model whose tokenizer and chat template are used (they are shared)."""
        if self._target is not None or self.settings.method != "draft":
            return self.target
        return self.draft

    def load(self) -> Engine:
        """Load every model the current method needs (and check they fit together)."""
        strategy = get_strategy(self.settings.method)
        if strategy.needs_target:
            _ = self.target
        if strategy.needs_draft:
            _ = self.draft
        if self.settings.method == "sprinter":
            _ = self.verifier
        return self

    @property
    def verifier(self) -> Verifier:
        if self._verifier is None:
            self._verifier = resolve_verifier(self.verifier_spec, self.pair, self.draft,
                                              self.target)
        return self._verifier

    def set_verifier(self, verifier: str | Verifier) -> None:
        self.verifier_spec = verifier
        self._verifier = None

    def set_method(self, method: str) -> None:
        self._check_method(method)
        self.settings.method = method

    def close(self) -> None:
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

    # ------------------------------------------------------------------ generation
    def stream(
        self,
        prompt: str | Sequence[Message] | list[int],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        chat: bool = True,
        method: str | None = None,
        threshold: float | None = None,
        verifier: Verifier | None = None,
    ) -> Generation:
        """Start a generation; iterate the result for text chunks, then read `.result`."""
        method = method or self.settings.method
        self._check_method(method)
        strategy = get_strategy(method)
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            tokens = list(prompt)
            n_vocab = self.text_model.n_vocab
            bad = [t for t in tokens if not 0 <= t < n_vocab]
            if bad:
                raise SprinterError(f"token ids out of range [0, {n_vocab}): {bad[:5]}")
        else:
            tokens = self.encode(prompt, chat=chat)  # type: ignore[arg-type]
        target = self.target if strategy.needs_target else None
        draft = self.draft if strategy.needs_draft else None
        n_ctx = min(m.n_ctx for m in (target, draft) if m is not None)
        margin = 2 + max(self.settings.draft_len, 1)
        if len(tokens) + margin > n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(tokens)} tokens; the context holds {n_ctx} "
                f"(use --ctx to raise it, or shorten the prompt)"
            )
        budget = min(max_tokens, n_ctx - len(tokens) - margin)
        if budget < max_tokens:
            log.warning("max_tokens lowered from %d to %d to fit the context", max_tokens, budget)
        ver = None
        thr = threshold if threshold is not None else self.settings.threshold
        if method == "sprinter":
            ver = verifier or self.verifier
            thr = thr if thr is not None else ver.default_threshold
            if not 0 < thr <= 1:
                raise SprinterError("threshold must be in (0, 1]")
        ctx = DecodeContext(
            target=target, draft=draft,
            sampler=Sampler(SamplingParams(temperature, top_k, top_p, seed)),
            stats=Stats(), max_new_tokens=budget, verifier=ver,
            threshold=thr if thr is not None else 0.5,
            run_cap=self.settings.run_cap, draft_len=self.settings.draft_len,
        )
        if ver is not None:
            ctx.stats.verifier = ver.name
        self.last_stats = ctx.stats
        return Generation(strategy, ctx, tokens, stop=stop,
                          text_model=target if target is not None else draft)  # type: ignore[arg-type]

    def generate(
        self,
        prompt: str | Sequence[Message] | list[int],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        chat: bool = True,
        method: str | None = None,
        threshold: float | None = None,
        verifier: Verifier | None = None,
    ) -> GenerationResult:
        """Generate to the end and return the text, tokens and counters (see `stream`)."""
        return self.stream(prompt, max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                           top_p=top_p, seed=seed, stop=stop, chat=chat, method=method,
                           threshold=threshold, verifier=verifier).consume()

    def chat(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
        method: str | None = None,
        threshold: float | None = None,
        verifier: Verifier | None = None,
    ) -> GenerationResult:
        """Reply to a conversation: messages are {"role": ..., "content": ...} dicts."""
        return self.generate(list(messages), max_tokens=max_tokens, temperature=temperature,
                             top_k=top_k, top_p=top_p, seed=seed, stop=stop, method=method,
                             threshold=threshold, verifier=verifier)


def check_same_tokenizer(draft: LlamaModel, target: LlamaModel) -> None:
    if draft.n_vocab != target.n_vocab or draft.tokenizer_hash() != target.tokenizer_hash():
        raise TokenizerMismatchError(
            f"draft {draft.path.name} and target {target.path.name} do not share a tokenizer "
            f"(vocab {draft.n_vocab} vs {target.n_vocab}); speculative decoding needs one "
            "vocabulary. Pick a draft from the target's model family."
        )
