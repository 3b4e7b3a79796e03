"""The driver shared by every strategy: prefill, stopping, incremental text, statistics."""

from __future__ import annotations

import bisect
import codecs
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ..backend.llama import LlamaModel, common_prefix
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


@dataclass(frozen=True)
class PromptProgress:
    """How far one model has read the reply's prompt, in llama.cpp server's terms (its
    `prompt_progress`): `processed` of the prompt's `total` tokens are in the model's KV cache,
    `cache` of them found there (or in a kept state) before the read began. Each model reads
    all but the last token; the last comes with the first step, and the main model's last
    report (processed == total) with it."""

    role: str  # the model's: "target" | "draft"
    main: bool  # the model the reply's text is of (the target, or the draft of a draft-only method)
    total: int
    cache: int
    processed: int
    seconds: float  # since the prompt's reading began (the reply's clock)


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
    finish_reason "cancelled". `on_progress`, set before the first chunk, hears of the
    prompt's reading (`PromptProgress`: before each model reads, after each of its decode
    calls, and the main model's last when the first step is done), so that a server can tell
    a client that waits on a long prompt."""

    def __init__(
        self,
        strategy: Strategy,
        ctx: DecodeContext,
        prompt: list[int],
        *,
        stop: Sequence[str] = (),
        text_model: LlamaModel,
        on_finish: Callable[[Stats], None] | None = None,
        on_progress: Callable[[PromptProgress], None] | None = None,
    ):
        self.strategy = strategy
        self.on_finish = on_finish  # called with the reply's stats once it ends
        self.on_progress = on_progress
        self._read: PromptProgress | None = None  # the main model's last report, until the first step
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
        clock = ctx.clock
        t_start = t_resumed = clock()
        busy = 0.0
        want_logprobs = ctx.sampler.params.logprobs is not None
        out = _Reply(self.text_model)
        emitted = 0  # characters of `out.text` already streamed
        sent_tokens = 0
        finish = "cancelled"
        steps = None
        ctx.sampler.start(self.prompt)
        try:
            self._prefill(t_start)
            timings.prefill_seconds = clock() - t_start
            if ctx.max_new_tokens <= 0:
                finish = "length"
                return
            steps = self.strategy.run(ctx, self.prompt)
            done = cut_by_stop = False
            for step in steps:
                if not timings.first_token_seconds:  # prompt read + first step, engine time only
                    timings.first_token_seconds = busy + clock() - t_resumed
                if self._read is not None:  # the first step read the prompt's last token
                    self._tell(self._read.role, True, self._read.cache, self._read.total, t_start)
                for token, origin in step:
                    counters.count(origin)
                    if self.text_model.is_eog(token):  # the end token is generated work, not text
                        finish, done = "stop", True
                        break
                    entry = ctx.logprobs[len(out.token_ids)] if want_logprobs else None
                    assert entry is None or entry.token == token, "record_target out of step"
                    out.add(token, origin, entry)
                    ctx.produced += 1
                    if self.stop and out.cut_at_stop(self.stop, emitted):
                        finish, done, cut_by_stop = "stop", True, True
                        break
                    if ctx.produced >= ctx.max_new_tokens:
                        finish, done = "length", True
                        break
                if done and finish != "length" and not cut_by_stop:
                    out.flush()  # an end token after incomplete bytes: show them as U+FFFD
                safe = len(out.text) if done else len(out.text) - _holdback(out.text, self.stop)
                ready = len(out.token_ids) if done else bisect.bisect_right(out.reach, safe)
                if safe > emitted or ready > sent_tokens:
                    chunk = out.chunk(emitted, safe, sent_tokens, ready, want_logprobs)
                    emitted, sent_tokens = max(emitted, safe), max(sent_tokens, ready)
                    busy += clock() - t_resumed
                    try:
                        yield chunk
                    finally:  # also when the consumer closes the generator here
                        t_resumed = clock()
                if done:
                    break
        finally:
            if steps is not None:
                steps.close()
            timings.total_seconds = busy + clock() - t_resumed
            self._finish(GenerationResult(text=out.text, token_ids=out.token_ids, method=self.strategy.name,
                                          stats=stats, finish_reason=finish, origins=out.origins,
                                          logprobs=out.logprobs if want_logprobs else None))

    def _prefill(self, t_start: float) -> None:
        """Every model reads the prompt but its last token, which the first decode of each
        strategy reads with its logits. What the target did not have to read is the reply's
        `cached_tokens`."""
        ctx = self.ctx
        head = self.prompt[:-1]
        for model in self.strategy.prefill_models(ctx):
            if ctx.prompt_cache is not None:  # a longer prefix kept from an earlier request
                ctx.prompt_cache.prepare(model, head)
            report = self._reporter(model, head, t_start) if self.on_progress is not None else None
            model.sync(head, n_logits=0, on_progress=report)
            if model is ctx.target:
                ctx.stats.cached_tokens = len(head) - model.last_decoded

    def _reporter(self, model: LlamaModel, head: list[int], t_start: float) -> Callable[[int, int], None]:
        """Tells the start of `model`'s read (what it already holds) and returns the callback
        that tells each decode call of it."""
        role = "target" if model is self.ctx.target else "draft"
        main = model is self.text_model
        cache = common_prefix(model.tokens, head)  # what `sync` keeps
        self._tell(role, main, cache, cache, t_start)
        return lambda read, _n: self._tell(role, main, cache, cache + read, t_start)

    def _tell(self, role: str, main: bool, cache: int, processed: int, t_start: float) -> None:
        progress = PromptProgress(role, main, len(self.prompt), cache, processed,
                                  self.ctx.clock() - t_start)
        if main:  # kept for the last report, at the first step
            self._read = progress if processed < progress.total else None
        if self.on_progress is not None:
            self.on_progress(progress)

    def _finish(self, result: GenerationResult) -> None:
        """The reply's last figures, its result, and the engine told."""
        ctx, stats = self.ctx, result.stats
        if ctx.grammar is not None:  # the matcher is the reply's own (fresh per request)
            stats.timings.grammar_seconds = ctx.grammar.clock.seconds
        stats.finish_reason = result.finish_reason
        stats.guarantee_text = self.strategy.guarantee(stats)
        if ctx.prediction:
            stats.prediction = PredictionUsage.of(ctx.prediction, result.token_ids)
        if ctx.reply_memory is not None:  # a copy source for the next requests
            ctx.reply_memory.remember(self.prompt, result.token_ids)
        self.result = result
        if self.on_finish is not None:
            self.on_finish(stats)


class _Reply:
    """The reply's text as its tokens arrive, and which tokens stand behind which characters."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.text = ""
        self.token_ids: list[int] = []
        self.origins: list[Origin] = []
        self.logprobs: list[TokenLogprob] = []  # aligned with token_ids when asked for
        # reach[i]: characters of `text` that token i's bytes touch, counting a character the
        # decoder still holds incomplete bytes of (reach is then one past the decoded text)
        self.reach: list[int] = []
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token: int, origin: Origin, logprob: TokenLogprob | None) -> None:
        self.token_ids.append(token)
        self.origins.append(origin)
        if logprob is not None:
            self.logprobs.append(logprob)
        self.text += self._decoder.decode(self.model.token_bytes(token))
        self.reach.append(len(self.text) + (1 if self._decoder.getstate()[0] else 0))

    def cut_at_stop(self, stops: Sequence[str], emitted: int) -> bool:
        """Cut the text before the first stop string, keeping only the tokens whose text lies
        wholly before the cut; whether one was found."""
        cut = _find_stop(self.text, stops, emitted)
        if cut is None:
            return False
        self.text = self.text[:cut]
        keep = bisect.bisect_right(self.reach, cut)
        del self.token_ids[keep:], self.origins[keep:], self.reach[keep:], self.logprobs[keep:]
        return True

    def flush(self) -> None:
        """Incomplete bytes at the end become U+FFFD (a budget cut drops them instead)."""
        self.text += self._decoder.decode(b"", final=True)

    def chunk(self, emitted: int, safe: int, sent: int, ready: int, with_logprobs: bool) -> Chunk:
        return Chunk(self.text[emitted:safe], self.token_ids[sent:ready], self.origins[sent:ready],
                     self.logprobs[sent:ready] if with_logprobs else None)


def _find_stop(text: str, stops: Sequence[str], emitted: int) -> int | None:
    start = max(0, emitted - max(len(s) for s in stops))
    best = None
    for stop in stops:
        i = text.find(stop, start)
        if i != -1 and (best is None or i < best):
            best = i
    return best
