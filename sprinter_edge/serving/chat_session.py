"""A multi-turn conversation over one Engine, independent of any terminal.

The session keeps the exact token history of the conversation (prompt tokens plus the
reply tokens as generated), so each new turn's prompt starts with the tokens of the
previous prompt and reply and the model's KV cache is reused; only the end of the last
reply and the new message are read. Re-tokenizing the rendered history instead could split
the reply into different tokens and force the whole reply to be read again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ..api import Engine
from ..backend.llama import common_prefix
from ..decoding import Chunk, Generation, GenerationResult, SamplingParams
from ..methods import get_strategy
from ..prompting import Message, prompt_tokens

log = logging.getLogger(__name__)


@dataclass
class TurnInfo:
    """What one turn cost in prompt reading."""

    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens already in every model's KV cache
    reread_tokens: int = 0  # prompt tokens the models had to read (prefill)
    from_history: bool = False  # prompt built from the kept token history (not re-tokenized)


@dataclass
class ChatSession:
    """Conversation state: messages, the token history behind them, the last reply."""

    engine: Engine
    system: str | None = None
    params: SamplingParams = field(default_factory=SamplingParams)  # for every reply
    messages: list[Message] = field(default_factory=list)
    last_result: GenerationResult | None = None
    last_turn: TurnInfo | None = None
    turns: list[TurnInfo] = field(default_factory=list)
    # the rendered text and tokens of the last prompt, and the reply that followed it
    _prompt_text: str = ""
    _prompt_tokens: list[int] = field(default_factory=list)
    _reply_text: str = ""
    _reply_tokens: list[int] = field(default_factory=list)
    _pending: tuple[list[Message], list[int], str, TurnInfo] | None = None

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget the conversation (the KV cache is simply overwritten by the next turn)."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self._prompt_text, self._prompt_tokens = "", []
        self._reply_text, self._reply_tokens = "", []
        self.last_result = None
        self.last_turn = None

    # ------------------------------------------------------------------ prompts
    def build_prompt(self, messages: list[Message]) -> tuple[str, list[int], bool]:
        """The rendered text and tokens for `messages` + generation prompt, and whether the
        tokens reuse the kept history."""
        model = self.engine.text_model
        text = self.engine.format_chat(messages)
        prev = self._prompt_text + self._reply_text
        if self._prompt_tokens and self._reply_tokens_match() and text.startswith(prev):
            # the tail (end of the reply, the new message) is mid-sequence: no BOS
            tail = model.tokenize(text[len(prev):], add_special=False, special=True)
            return text, self._prompt_tokens + self._reply_tokens + tail, True
        return text, prompt_tokens(model, text, chat_rendered=True), False

    def _reply_tokens_match(self) -> bool:
        model = self.engine.text_model
        return model.detokenize(self._reply_tokens) == self._reply_text

    def _cached_prefix(self, tokens: list[int]) -> int:
        strategy = get_strategy(self.engine.settings.method)
        models = []
        if strategy.needs_target:
            models.append(self.engine.target)
        if strategy.needs_draft:
            models.append(self.engine.draft)
        # the prefill reads tokens[:-1]: a kept state counts up to there
        return min(max(common_prefix(m.tokens, tokens), self.engine.reusable_prefix(m, tokens[:-1]))
                   for m in models)

    # ------------------------------------------------------------------ turns
    def send(self, text: str, prediction: str | None = None) -> Generation:
        """Start the reply to `text` with the engine's method; iterate the result, then call
        `finish`. `prediction`: text the reply is expected to repeat (a file to edit), the copy's
        first source. Raises ContextOverflowError (and other SprinterErrors) before anything
        changes."""
        messages = [*self.messages, {"role": "user", "content": text}]
        text_rendered, tokens, from_history = self.build_prompt(messages)
        reused = self._cached_prefix(tokens)
        params = self.params.replace(prediction=prediction) if prediction else self.params
        gen = self.engine.stream(tokens, params)  # may raise: the session is unchanged
        # prefill reads the prompt but its last token; that one is read by the first decode
        info = TurnInfo(prompt_tokens=len(tokens), reused_tokens=min(reused, len(tokens) - 1),
                        from_history=from_history)
        info.reread_tokens = len(tokens) - info.reused_tokens
        self._pending = (messages, tokens, text_rendered, info)
        log.debug("turn: %d prompt tokens, %d reused, from_history=%s", len(tokens), reused, from_history)
        return gen

    def finish(self, gen: Generation) -> GenerationResult:
        """Record the (possibly cancelled) reply of `gen` in the history."""
        if gen.result is None:
            gen.close()
        result = gen.result
        assert result is not None and self._pending is not None
        messages, tokens, text, info = self._pending
        self._pending = None
        self.messages = [*messages, {"role": "assistant", "content": result.text}]
        self._prompt_text, self._prompt_tokens = text, tokens
        self._reply_text, self._reply_tokens = result.text, list(result.token_ids)
        self.last_result, self.last_turn = result, info
        self.turns.append(info)
        return result

    def reply(self, text: str, on_chunk: Callable[[Chunk], None] | None = None) -> GenerationResult:
        """Send `text` and run the reply to the end (convenience for non-interactive use)."""
        gen = self.send(text)
        try:
            for chunk in gen:
                if on_chunk is not None:
                    on_chunk(chunk)
        finally:
            result = self.finish(gen)
        return result
