"""One thread owns the Engine and runs requests one at a time, in arrival order.

The models' KV caches belong to the worker thread alone, so requests never interleave;
each request gets a `Job` whose events (started, chunk, done, error) are handed to the
asyncio side through its queue. Cancelling a job (client gone) closes its Generation at
the next decoding step, which frees the worker for the next request."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api import Engine
from ..decoding import TokenLogprob
from ..prompting import Message
from .models import ServedModels

log = logging.getLogger(__name__)

Event = tuple[str, Any]  # ("started", None) | ("chunk", Chunk) | ("done", GenerationResult) | ("error", exc)
# A prompt the worker builds with the engine (e.g. rendered with tools): token ids.
PromptBuilder = Callable[[Engine], list[int]]


@dataclass
class Job:
    prompt: str | Sequence[Message] | list[int] | PromptBuilder
    kwargs: dict[str, Any]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # the bytes of every token a chunk's or result's logprobs name, filled by the worker
    # before the event is emitted (the tokenizer belongs to the worker thread)
    pieces: dict[int, bytes] = field(default_factory=dict)
    origins: bool = False  # the stream shows each token's origin: note every token's bytes
    model: str | None = None  # the id of the model that runs it (serving/models.py); None: the engine's

    def cancel(self) -> None:
        self.cancelled.set()

    def emit(self, event: str, value: Any = None) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is gone (shutdown)
            self.loop.call_soon_threadsafe(self.events.put_nowait, (event, value))


@dataclass
class WorkerCounters:
    """What the server has done since it started (/health shows them): requests by outcome,
    and the tokens and seconds of every reply that ran (a client's whole session, e.g. an
    agent's several requests, is the difference of two readings)."""

    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    busy: bool = False
    prompt_tokens: int = 0
    prompt_tokens_read: int = 0  # of those, not found in the KV cache or a kept state: read anew
    completion_tokens: int = 0
    target_calls: int = 0
    prompt_seconds: float = 0.0  # reading prompts (the part of each not already in the KV cache)
    decode_seconds: float = 0.0  # the rest of each reply

    def add(self, stats: Any, read: int) -> None:
        """Count one reply's `Stats`; `read`: the prompt tokens it read."""
        self.prompt_tokens += stats.prompt_tokens
        self.prompt_tokens_read += read
        self.completion_tokens += stats.counters.new_tokens
        self.target_calls += stats.counters.target_calls
        self.prompt_seconds += stats.timings.prefill_seconds
        self.decode_seconds += stats.timings.decode_seconds

    def totals(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "prompt_tokens_read": self.prompt_tokens_read,
                "completion_tokens": self.completion_tokens,
                "target_calls": self.target_calls, "prompt_seconds": round(self.prompt_seconds, 3),
                "decode_seconds": round(self.decode_seconds, 3)}


class EngineWorker:
    """`prepare` (e.g. `engine.load`) runs on the worker thread before the first job: the server
    listens at once and answers /health with "loading" meanwhile; jobs queue behind it."""

    def __init__(self, engine: Engine, *, prepare: Callable[[], object] | None = None,
                 models: ServedModels | None = None):
        self.engine = engine  # the engine of the job running, or of the last one
        self.models = models  # the models a job may name (None: `engine` runs every job)
        self.counters = WorkerCounters()
        self._prepare = prepare
        self.state = "loading" if prepare is not None else "ready"  # | "failed"
        self.load_error: Exception | None = None
        self.lost: Exception | None = None  # the target went away: every request ends with it
        self._current: Job | None = None
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="sprinter-edge-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._jobs.put(None)
        self._thread.join(timeout)

    @property
    def queued(self) -> int:
        return self._jobs.qsize()

    def submit(self, prompt: str | Sequence[Message] | list[int] | PromptBuilder, *,
               origins: bool = False, model: str | None = None, **kwargs: Any) -> Job:
        """Queue a generation (call from the event loop); read its events from `job.events`."""
        job = Job(prompt, kwargs, asyncio.get_running_loop(), origins=origins, model=model)
        if self.lost is not None:  # the worker thread is parked for good: nobody would answer
            self.counters.failed += 1
            job.emit("error", self.lost)
        else:
            self._jobs.put(job)
        return job

    def lose_target(self, exc: Exception) -> None:
        """The target is gone for this process (its rpc-server went away; backend/rpc.py calls
        this on the thread llama.cpp aborted in, and parks the worker's): the running reply and
        every queued or later request end with `exc`."""
        self.state, self.load_error, self.lost = "failed", exc, exc
        self.counters.busy = False
        log.error("%s", exc)
        pending = [self._current] if self._current is not None else []
        with contextlib.suppress(queue.Empty):
            while True:
                pending.append(self._jobs.get_nowait())
        for job in pending:
            if job is not None:
                self.counters.failed += 1
                job.emit("error", exc)

    def _loop(self) -> None:
        if self._prepare is not None:
            try:
                self._prepare()
                self.state = "ready"
            except Exception as exc:  # kept: every request is answered with it
                log.error("loading the models failed: %s", exc)
                self.state, self.load_error = "failed", exc
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self.counters.busy, self._current = True, job
            try:
                self._run(job)
            except Exception:  # never let one request kill the worker
                log.exception("request failed")
            finally:
                self.counters.busy, self._current = False, None

    def _run(self, job: Job) -> None:
        if job.cancelled.is_set():
            self.counters.cancelled += 1
            return
        if self.load_error is not None:
            self.counters.failed += 1
            job.emit("error", self.load_error)
            return
        if self.models is not None and job.model is not None:
            try:  # the model it names, loaded now if it is not (serving/models.py)
                self.engine = self.models.engine(job.model)
            except Exception as exc:
                self.counters.failed += 1
                job.emit("error", exc)
                return
        decoded = self.engine.models.decoded_tokens()
        try:
            prompt = job.prompt(self.engine) if callable(job.prompt) else job.prompt
            gen = self.engine.stream(prompt, **job.kwargs)
        except Exception as exc:
            self.counters.failed += 1
            job.emit("error", exc)
            return
        job.emit("started")
        try:
            for chunk in gen:
                if job.cancelled.is_set():
                    break
                self._note_pieces(job, chunk.logprobs)
                if job.origins:
                    self._note_tokens(job, chunk.token_ids)
                job.emit("chunk", chunk)
        except Exception as exc:
            log.exception("generation failed")
            self.counters.failed += 1
            job.emit("error", exc)
            return
        finally:
            gen.close()
            if gen.result is not None:
                stats = gen.result.stats
                read = max(self.engine.models.decoded_tokens() - decoded - stats.counters.target_tokens, 0)
                self.counters.add(stats, read)
                log.info("reply: %s", summary_line(stats, read))
        if job.cancelled.is_set():
            self.counters.cancelled += 1
            log.info("request cancelled after %d tokens", len(gen.result.token_ids) if gen.result else 0)
            return
        self.counters.completed += 1
        if gen.result is not None:
            self._note_pieces(job, gen.result.logprobs)
        job.emit("done", gen.result)

    def _note_pieces(self, job: Job, logprobs: list[TokenLogprob] | None) -> None:
        if logprobs:
            for entry in logprobs:
                self._note_tokens(job, [entry.token, *(t for t, _ in entry.top)])

    def _note_tokens(self, job: Job, tokens: Sequence[int]) -> None:
        model = self.engine.text_model
        for token in tokens:
            if token not in job.pieces:
                job.pieces[token] = model.token_bytes(token)


def summary_line(stats: Any, read: int) -> str:
    """One reply in one line of the server's log: what ran, how fast, what the copy and the
    draft saved."""
    c, t = stats.counters, stats.timings
    plans = " > ".join(stats.trace.plans_run) or stats.method
    drafted = c.accepted - c.copied_accepted - c.grammar_accepted
    return (f"{stats.kind} request, {stats.prompt_tokens} prompt tokens ({read} read in "
            f"{t.prefill_seconds:.1f} s); "
            f"{c.new_tokens} tokens in {t.decode_seconds:.1f} s ({stats.tokens_per_second:.1f} tok/s), "
            f"{c.target_calls} target calls; {stats.method}: {plans}; copied tokens {c.copied_accepted} "
            f"accepted of {c.copied_tokens} proposed"
            + (f", draft tokens {drafted} accepted of {c.draft_tokens}"
               if c.draft_tokens else "")
            + f"; {stats.finish_reason}")
