"""The driver shared by every strategy: prefill, stopping, incremental text, statistics."""

from __future__ import annotations

import bisect
import codecs
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ..backend.llama import LlamaModel
from .context import DecodeContext, TokenLogprob
from .stats import Origin, PredictionUsage, Stats
from .strategy import Strategy


@dataclass
class Chunk:
    """A piece of streamed output: the text that became final and the tokens behind it.

    A token is streamed once all of its text is final (a token whose text could still turn
    out to be the start of a stop string waits), so the chunks' `token_ids` join to the
    result's `token_ids` and their `text` to its `text` (unless the stream is cancelled:
    the result then also holds what was decoded but not yet streamed)."""

    text: str
    token_ids: list[int]
    origins: list[Origin]
    logprobs: list[TokenLogprob] | None = None  # aligned with token_ids when asked for


@dataclass
class GenerationResult:
    """A finished (or cancelled) generation.

    `token_ids` and `origins` are the tokens behind `text`:
    - after a stop-string cut (finish_reason "stop") they hold only the tokens whose text lies
      entirely before the cut, so they never carry any part of the stop string. A token that
      straddles the cut (its text begins before the stop string and runs into it) is dropped
      too: its leading characters stay in `text`, and `text` then ends with characters no
      token in `token_ids` accounts for; `detokenize(token_ids)` is then a prefix of `text`;
    - when the budget ends the reply (finish_reason "length") in the middle of a multi-byte
      character, the incomplete bytes are left out of `text` (never a U+FFFD) while the
      tokens that carry them stay in `token_ids`: every token generated is there.
    `stats.new_tokens` counts every token generated (the work done), including an end token
    and the tokens trimmed by a stop cut, so it can exceed `len(token_ids)`.
    `logprobs` (when SamplingParams.logprobs is set) has one entry per token of `token_ids`.
    """

    text: str
    token_ids: list[int]
    method: str
    stats: Stats
    finish_reason: str
    origins: list[Origin] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None

    def to_dict(self) -> dict:
        d = {
            "text": self.text,
            "token_ids": self.token_ids,
            "method": self.method,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_dict(),
        }
        if self.logprobs is not None:
            d["logprobs"] = [{"token": e.token, "logprob": e.logprob,
                              "top": [list(t) for t in e.top]} for e in self.logprobs]
        return d


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
        on_finish: Callable[[Stats], None] | None = None,
    ):
        self.strategy = strategy
        self.on_finish = on_finish  # called with the reply's stats once it ends
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
        if self.result is None:  # closed before it started: nothing was decoded
            stats = self.ctx.stats
            stats.method, stats.prompt_tokens = self.strategy.name, len(self.prompt)
            stats.finish_reason = "cancelled"
            self.result = GenerationResult(
                text="", token_ids=[], method=self.strategy.name, stats=stats,
                finish_reason="cancelled",
                logprobs=[] if self.ctx.sampler.params.logprobs is not None else None)

    def consume(self) -> GenerationResult:
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def _run(self) -> Iterator[Chunk]:
        ctx, stats = self.ctx, self.ctx.stats
        counters, timings = stats.counters, stats.timings
        stats.method = self.strategy.name
        stats.prompt_tokens = len(self.prompt)
        # The engine's own time only: the clock stops while a chunk is with the consumer
        # (this generator is suspended at `yield`), so a slow reader does not lower tok/s.
        t_start = t_resumed = time.perf_counter()
        busy = 0.0
        token_ids: list[int] = []
        origins: list[Origin] = []
        want_logprobs = ctx.sampler.params.logprobs is not None
        logprobs: list[TokenLogprob] = []  # aligned with token_ids (ctx.logprobs: every token)
        # reach[i]: characters of `text` that token i's bytes touch, counting a character the
        # decoder still holds incomplete bytes of (reach is then one past the decoded text).
        reach: list[int] = []
        text = ""
        emitted = 0  # characters of `text` already streamed
        sent_tokens = 0
        finish = "cancelled"
        cut_by_stop = False
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        steps = None
        ctx.sampler.start(self.prompt)
        try:
            # Prefill: every model reads the prompt but its last token, which the first
            # decode of each strategy reads with its logits.
            for model in self.strategy.prefill_models(ctx):
                if ctx.prompt_cache is not None:  # a longer prefix kept from an earlier request
                    ctx.prompt_cache.prepare(model, self.prompt[:-1])
                model.sync(self.prompt[:-1], n_logits=0)
            timings.prefill_seconds = time.perf_counter() - t_start
            if ctx.max_new_tokens <= 0:
                finish = "length"
                return
            steps = self.strategy.run(ctx, self.prompt)
            done = False
            for step in steps:
                if not timings.first_token_seconds:  # prompt read + first step, engine time only
                    timings.first_token_seconds = busy + time.perf_counter() - t_resumed
                for token, origin in step:
                    if self.text_model.is_eog(token):
                        counters.count(origin)  # the end token is generated work, not text
                        finish, done = "stop", True
                        break
                    if want_logprobs:
                        entry = ctx.logprobs[len(token_ids)]
                        assert entry.token == token, "record_target out of step with the tokens"
                        logprobs.append(entry)
                    token_ids.append(token)
                    origins.append(origin)
                    counters.count(origin)
                    ctx.produced += 1
                    text += decoder.decode(self.text_model.token_bytes(token))
                    reach.append(len(text) + (1 if decoder.getstate()[0] else 0))
                    if self.stop:
                        cut = _find_stop(text, self.stop, emitted)
                        if cut is not None:
                            text = text[:cut]
                            finish, done, cut_by_stop = "stop", True, True
                            # keep only the tokens whose text lies wholly before the cut
                            keep = bisect.bisect_right(reach, cut)
                            del token_ids[keep:], origins[keep:], reach[keep:], logprobs[keep:]
                            break
                    if ctx.produced >= ctx.max_new_tokens:
                        finish, done = "length", True
                        break
                if done and finish != "length" and not cut_by_stop:
                    # an end token after incomplete bytes: show them as U+FFFD. A budget cut
                    # inside a character drops its incomplete bytes instead.
                    text += decoder.decode(b"", final=True)
                safe = len(text) if done else len(text) - _holdback(text, self.stop)
                ready = len(token_ids) if done else bisect.bisect_right(reach, safe)
                if safe > emitted or ready > sent_tokens:
                    chunk = Chunk(text[emitted:safe], token_ids[sent_tokens:ready],
                                  origins[sent_tokens:ready],
                                  logprobs[sent_tokens:ready] if want_logprobs else None)
                    emitted, sent_tokens = max(emitted, safe), max(sent_tokens, ready)
                    busy += time.perf_counter() - t_resumed
                    try:
                        yield chunk
                    finally:  # also when the consumer closes the generator here
                        t_resumed = time.perf_counter()
                if done:
                    break
        finally:
            if steps is not None:
                steps.close()
            timings.total_seconds = busy + time.perf_counter() - t_resumed
            if ctx.grammar is not None:  # the matcher is the reply's own (fresh per request)
                timings.grammar_seconds = ctx.grammar.clock.seconds
            stats.finish_reason = finish
            if ctx.prediction:
                stats.prediction = PredictionUsage.of(ctx.prediction, token_ids)
            self.result = GenerationResult(
                text=text, token_ids=token_ids, method=self.strategy.name, stats=stats,
                finish_reason=finish, origins=origins,
                logprobs=logprobs if want_logprobs else None,
            )
            if self.on_finish is not None:
                self.on_finish(stats)


def _find_stop(text: str, stops: Sequence[str], emitted: int) -> int | None:
    start = max(0, emitted - max(len(s) for s in stops))
    best = None
    for stop in stops:
        i = text.find(stop, start)
        if i != -1 and (best is None or i < best):
            best = i
    return best
