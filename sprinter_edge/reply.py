"""What one reply starts from: its prompt as tokens, the context it decodes in, and the checks a
request must pass before any model call (`Engine.stream` runs them in order), so a bad request
fails with a clear error and changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .backend.llama import LlamaModel
from .backend.prompt_cache import PromptCache
from .decoding import STRATEGIES, DecodeContext, Generation, Stats, Strategy
from .decoding.proposers.reply_memory import ReplyMemory
from .decoding.sampling import Sampler, SamplingParams
from .errors import ContextOverflowError, SettingsError
from .methods import exact_methods, get_strategy
from .model_pair import ModelPair
from .prompting import Message, prompt_tokens, render_chat, request_kind
from .verifiers.base import Verifier
from .verifiers.operating_point import OperatingPoint

if TYPE_CHECKING:
    from .planning.planner import Planner
    from .verification import Verification

log = logging.getLogger(__name__)


class Engine(Protocol):
    """What `start` reads of the engine (api.Engine), named here so this module stands below it."""

    models: ModelPair
    settings: Any
    prompt_cache: PromptCache | None
    reply_memory: ReplyMemory | None
    verification: Verification

    @property
    def text_model(self) -> LlamaModel: ...

    def check_method(self, method: str) -> Strategy: ...

    def planner(self) -> Planner: ...

    def finished(self, stats: Stats) -> None: ...


def start(engine: Engine, prompt: str | Sequence[Message] | list[int], params: SamplingParams, *,
          chat: bool, method: str | None, point: OperatingPoint, verifier: Verifier | None,
          values: dict[str, Any]) -> Generation:
    """`Engine.stream`: the request checked, its prompt read as tokens, the kind of request told,
    the context built, the operating point applied; the generation ready to iterate."""
    strategy = engine.check_method(method or engine.settings.method)
    model = engine.text_model
    check_bias(model, params)
    if strategy.needs_costs:
        strategy = get_strategy(strategy.name, engine.planner())
    tokens = prompt_ids(model, prompt, chat)
    ctx = decode_context(engine.models, strategy, params, tokens, values, engine.prompt_cache)
    ctx.reply_memory = engine.reply_memory
    request = model.detokenize(tokens) if isinstance(prompt, list) else prompt
    ctx.kind = ctx.stats.kind = request_kind(request)
    if params.prediction:
        ctx.prediction = model.tokenize(params.prediction, add_special=False, special=False)
        ctx.kind = ctx.stats.kind = "edit"  # the reply is expected to copy: plan for a copy
    ctx.stats.exact = strategy.exact
    engine.verification.apply(ctx, strategy, point, verifier, request)
    if strategy.needs_costs:
        planner = engine.planner()
        ctx.costs, ctx.evidence = planner.costs, planner.evidence
    check_logprobs(params, strategy, ctx)
    text_model = ctx.target if ctx.target is not None else ctx.draft
    return Generation(strategy, ctx, tokens, stop=params.stop, text_model=text_model,  # type: ignore[arg-type]
                      on_finish=engine.finished)


def encode(model: LlamaModel, prompt: str | Sequence[Message], *, chat: bool = True) -> list[int]:
    """Text (in the chat template unless `chat` is off) or chat messages, as tokens."""
    if not isinstance(prompt, str):
        return prompt_tokens(model, render_chat(model, prompt), chat_rendered=True)
    if chat:
        return prompt_tokens(model, render_chat(model, [{"role": "user", "content": prompt}]),
                             chat_rendered=True)
    return prompt_tokens(model, prompt, chat_rendered=False)


def prompt_ids(model: LlamaModel, prompt: str | Sequence[Message] | list[int], chat: bool) -> list[int]:
    """The prompt's tokens: token ids as given (checked against the vocabulary), else `encode`d."""
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        tokens = list(prompt)
        bad = [t for t in tokens if not 0 <= t < model.n_vocab]
        if bad:
            raise SettingsError(f"token ids out of range [0, {model.n_vocab}): {bad[:5]}")
    else:
        tokens = encode(model, prompt, chat=chat)  # type: ignore[arg-type]
    if not tokens:
        raise SettingsError("the prompt is empty: give at least one token (or a chat message)")
    return tokens


def check_bias(model: LlamaModel, params: SamplingParams) -> None:
    bad = [t for t, _ in params.logit_bias if t >= model.n_vocab]
    if bad:
        raise SettingsError(f"logit_bias: token ids out of range [0, {model.n_vocab}): {bad[:5]}")


def decode_context(models: ModelPair, strategy: Strategy, params: SamplingParams, tokens: list[int],
                   values: dict[str, Any], prompt_cache: PromptCache | None) -> DecodeContext:
    """A reply's context: the models the method needs, the budget the context leaves (all of
    it when `max_tokens` is None), the constraint's matcher."""
    target = models.target if strategy.needs_target else None
    uses_draft = strategy.uses_draft and models.draft_path is not None
    # `auto` loads the draft when a plan drafts (its first one, or a switch): a one-model
    # plan never pays for it; a method that drafts from the start loads it now
    lazy = strategy.needs_costs and models.loaded("draft") is None and target is not None
    draft = models.draft if uses_draft and not lazy else None
    n_ctx = min(m.n_ctx for m in (target, draft) if m is not None)
    margin = 2 + max(cls().lookahead(values) for cls in STRATEGIES.values())
    if len(tokens) + margin > n_ctx:
        raise ContextOverflowError(f"the prompt has {len(tokens)} tokens; the context holds {n_ctx} "
                                   f"(use --ctx to raise it, or shorten the prompt)")
    room = n_ctx - len(tokens) - margin
    budget = room if params.max_tokens is None else min(params.max_tokens, room)
    if params.max_tokens is not None and budget < params.max_tokens:
        log.warning("max_tokens lowered from %d to %d to fit the context", params.max_tokens, budget)
    ctx = DecodeContext(target=target, draft=draft, sampler=Sampler(params), stats=Stats(),
                        max_new_tokens=budget, settings=values,
                        draft_loader=(lambda: models.draft) if lazy and uses_draft else None,
                        prompt_cache=prompt_cache)
    if params.constraint is not None:  # a fresh matcher: the state of the empty reply
        from .grammar import compile as compile_constraint
        ctx.grammar = compile_constraint(params.constraint, target if target is not None else draft)
    return ctx


def check_logprobs(params: SamplingParams, strategy: Strategy, ctx: DecodeContext) -> None:
    """logprobs are the target's: refused where a token may be committed untested."""
    if params.logprobs is not None and not strategy.scores_every_token(ctx):
        raise SettingsError(
            f"logprobs need an exact method ({', '.join(exact_methods())}; auto without an operating "
            f"point): {strategy.name!r} commits tokens the target never scores"
            + (" (it may run sprinter at the operating point given)" if strategy.exact else ""))
