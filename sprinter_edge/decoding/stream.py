"""The driver shared by every strategy: prefill, stopping, incremental text, statistics."""

from __future__ import annotations

import codecs
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ..backend.llama import LlamaModel
from .base import DecodeContext, Origin, Stats, Strategy


@dataclass
class Chunk:
    """A piece of streamed output: the text that became final and the tokens behind it."""

    text: str
    token_ids: list[int]
    origins: list[Origin]


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    method: str
    stats: Stats
    finish_reason: str
    origins: list[Origin] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "method": self.method,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_dict(),
        }


def _holdback(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of text that could still grow into a stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best


class Generation:
    """Iterate for `Chunk`s; `result` holds the full text and statistics afterwards.

    Breaking out of the loop (or calling `close`) stops decoding; the result then has
    finish_reason "cancelled"."""

    def __init__(
        self,
        strategy: Strategy,
        ctx: DecodeContext,
        prompt: list[int],
        *,
        stop: Sequence[str] = (),
        text_model: LlamaModel,
    ):
        self.strategy = strategy
        self.ctx = ctx
        self.prompt = prompt
        self.stop = [s for s in stop if s]
        self.text_model = text_model
        self.result: GenerationResult | None = None
        self._iter = self._run()

    def __iter__(self) -> Iterator[Chunk]:
        return self._iter

    def close(self) -> None:
        self._iter.close()

    def consume(self) -> GenerationResult:
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def _run(self) -> Iterator[Chunk]:
        ctx, stats = self.ctx, self.ctx.stats
        stats.method = self.strategy.name
        stats.prompt_tokens = len(self.prompt)
        t_start = time.perf_counter()
        token_ids: list[int] = []
        origins: list[Origin] = []
        text = ""
        emitted = 0  # characters of `text` already streamed
        sent_tokens = 0
        finish = "cancelled"
        cut_by_stop = False
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        steps = None
        try:
            # Prefill: every model reads the prompt but its last token, which the first
            # decode of each strategy reads with its logits.
            for model in self.strategy.prefill_models(ctx):
                model.sync(self.prompt[:-1], n_logits=0)
            stats.prefill_seconds = time.perf_counter() - t_start
            if ctx.max_new_tokens <= 0:
                finish = "length"
                return
            steps = self.strategy.run(ctx, self.prompt)
            done = False
            for step in steps:
                for token, origin in step:
                    if self.text_model.is_eog(token):
                        stats.count(origin)  # the end token is generated work, not text
                        finish, done = "stop", True
                        break
                    token_ids.append(token)
                    origins.append(origin)
                    stats.count(origin)
                    ctx.produced += 1
                    text += decoder.decode(self.text_model.token_bytes(token))
                    if self.stop:
                        cut = _find_stop(text, self.stop, emitted)
                        if cut is not None:
                            text = text[:cut]
                            finish, done, cut_by_stop = "stop", True, True
                            break
                    if ctx.produced >= ctx.max_new_tokens:
                        finish, done = "length", True
                        break
                if done and not cut_by_stop:
                    text += decoder.decode(b"", final=True)
                safe = len(text) if done else len(text) - _holdback(text, self.stop)
                if safe > emitted or len(token_ids) > sent_tokens:
                    yield Chunk(text[emitted:safe], token_ids[sent_tokens:],
                                origins[sent_tokens:])
                    emitted, sent_tokens = max(emitted, safe), len(token_ids)
                if done:
                    break
        finally:
            if steps is not None:
                steps.close()
            stats.total_seconds = time.perf_counter() - t_start
            stats.finish_reason = finish
            self.result = GenerationResult(
                text=text, token_ids=token_ids, method=self.strategy.name, stats=stats,
                finish_reason=finish, origins=origins,
            )


def _find_stop(text: str, stops: Sequence[str], emitted: int) -> int | None:
    start = max(0, emitted - max(len(s) for s in stops))
    best = None
    for stop in stops:
        i = text.find(stop, start)
        if i != -1 and (best is None or i < best):
            best = i
    return best
