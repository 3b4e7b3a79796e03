"""The engine's side of the server: one request at a time, in arrival order.

`Runner` runs a request on the Engine (the models' KV caches are its alone, so requests never
interleave) and tells its events (started, progress, chunk, done, error) to the request's `Task`.
`serve` runs it in a worker process (engine_process.py, supervised by supervisor.py), so that
an abort inside llama.cpp never takes the server down; `EngineWorker` runs it on a thread of
this process instead (`serve --in-process`, and apps built in-process by `create_app`).

Cancelling a job (client gone) closes its Generation at the next decoding step, or, while its
prompt is read, at the end of the decode call reading it (what was read stays in the KV cache
for the next request), which frees the runner for the next request."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from ..api import Engine
from ..decoding import PromptProgress, TokenLogprob
from ..prompting import Message
from .models import ServedModels

log = logging.getLogger(__name__)

# ("started", n) | ("progress", PromptProgress) | ("chunk", Chunk) | ("done", GenerationResult)
# | ("error", exc)
Event = tuple[str, Any]
# A prompt the runner builds with the engine (e.g. rendered with tools): token ids. It crosses to
# the worker process, so a module-level function (or a functools.partial of one), no closure.
PromptBuilder = Callable[[Engine], list[int]]


@dataclass
class Request:
    """What the engine runs for one HTTP request (picklable: it goes to the worker process)."""

    prompt: str | Sequence[Message] | list[int] | PromptBuilder
    kwargs: dict[str, Any]  # Engine.stream's keywords
    origins: bool = False  # the stream shows each token's origin: note every token's bytes
    model: str | None = None  # the id of the model that runs it (serving/models.py); None: the engine's


class Task(Protocol):
    """A request as the runner sees it: where its events go."""

    request: Request
    cancelled: threading.Event
    # the bytes of every token a chunk's or result's logprobs name, filled by the runner before
    # the event is emitted (the tokenizer is the runner's)
    pieces: dict[int, bytes]

    def emit(self, event: str, value: Any = None) -> None: ...


@dataclass
class Job:
    """A request seen from the event loop: its events arrive in `events`."""

    request: Request
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    pieces: dict[int, bytes] = field(default_factory=dict)
    on_cancel: Callable[[], None] | None = None  # tells the worker process (supervisor.py)

    def cancel(self) -> None:
        if not self.cancelled.is_set():
            self.cancelled.set()
            if self.on_cancel is not None:
                self.on_cancel()

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

    def plus(self, other: WorkerCounters) -> WorkerCounters:
        """Both counts summed (a worker process's and those of the ones before it); busy: ours."""
        return WorkerCounters(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                                 for f in dataclasses.fields(self) if f.name != "busy"}, busy=self.busy)

    def totals(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "prompt_tokens_read": self.prompt_tokens_read,
                "completion_tokens": self.completion_tokens,
                "target_calls": self.target_calls, "prompt_seconds": round(self.prompt_seconds, 3),
                "decode_seconds": round(self.decode_seconds, 3)}


@dataclass
class Placement:
    """Where the models are, for /health: the layers in a word (the page shows it) and in the
    line `--stats` prints, and the ids of the models loaded (None: one model served)."""

    layers_on: str = "-"
    layers: str = "no model loaded yet"
    models_loaded: list[str] | None = None


class ReadCancelled(Exception):
    """The client went away while its prompt was read (`_report`)."""


def _report(task: Task, progress: PromptProgress) -> None:
    """Tell the task how far its prompt is read; stop the read if it was cancelled meanwhile."""
    task.emit("progress", progress)
    if task.cancelled.is_set():
        raise ReadCancelled


class Runner:
    """Runs requests on the engine, one at a time, on whatever thread calls `run`."""

    def __init__(self, engine: Engine, models: ServedModels | None = None):
        self.engine = engine  # the engine of the job running, or of the last one
        self.models = models  # the models a job may name (None: `engine` runs every job)
        self.counters = WorkerCounters()
        self.load_error: Exception | None = None  # loading failed: every request ends with it

    def placement(self) -> Placement:
        m = self.engine.models
        return Placement(m.layers_on(), m.placement(),
                         self.models.loaded() if self.models is not None else None)

    def run(self, task: Task) -> None:
        self.counters.busy = True
        try:
            self._run(task)
        except Exception:  # never let one request kill the worker
            log.exception("request failed")
        finally:
            self.counters.busy = False

    def _run(self, task: Task) -> None:
        req = task.request
        if task.cancelled.is_set():
            self.counters.cancelled += 1
            return
        if self.load_error is not None:
            self.counters.failed += 1
            task.emit("error", self.load_error)
            return
        if self.models is not None and req.model is not None:
            try:  # the model it names, loaded now if it is not (serving/models.py)
                self.engine = self.models.engine(req.model)
            except Exception as exc:
                self.counters.failed += 1
                task.emit("error", exc)
                return
        decoded = self.engine.models.decoded_tokens()
        try:
            prompt = req.prompt(self.engine) if callable(req.prompt) else req.prompt
            gen = self.engine.stream(prompt, **req.kwargs)
        except Exception as exc:
            self.counters.failed += 1
            task.emit("error", exc)
            return
        task.emit("started", len(gen.prompt))  # the prompt's tokens: the supervisor's bound
        # the prompt's reading, as it goes: a stream tells its client (a long prompt is minutes
        # of silence otherwise), and the supervisor knows the worker is alive
        gen.on_progress = partial(_report, task)
        try:
            for chunk in gen:
                if task.cancelled.is_set():
                    break
                self._note_pieces(task, chunk.logprobs)
                if req.origins:
                    self._note_tokens(task, chunk.token_ids)
                task.emit("chunk", chunk)
        except ReadCancelled:
            pass
        except Exception as exc:
            log.exception("generation failed")
            self.counters.failed += 1
            task.emit("error", exc)
            return
        finally:
            gen.close()
            if gen.result is not None:
                stats = gen.result.stats
                read = max(self.engine.models.decoded_tokens() - decoded - stats.counters.target_tokens, 0)
                self.counters.add(stats, read)
                log.info("reply: %s", summary_line(stats, read))
        if task.cancelled.is_set():
            self.counters.cancelled += 1
            log.info("request cancelled after %d tokens", len(gen.result.token_ids) if gen.result else 0)
            return
        self.counters.completed += 1
        if gen.result is not None:
            self._note_pieces(task, gen.result.logprobs)
        task.emit("done", gen.result)

    def _note_pieces(self, task: Task, logprobs: list[TokenLogprob] | None) -> None:
        if logprobs:
            for entry in logprobs:
                self._note_tokens(task, [entry.token, *(t for t, _ in entry.top)])

    def _note_tokens(self, task: Task, tokens: Sequence[int]) -> None:
        model = self.engine.text_model
        for token in tokens:
            if token not in task.pieces:
                task.pieces[token] = model.token_bytes(token)


class EngineWorker:
    """The runner on a thread of this process. `prepare` (e.g. `engine.load`) runs on that thread
    before the first job: the server listens at once and answers /health with "loading"
    meanwhile; jobs queue behind it. An abort inside llama.cpp ends this process."""

    def __init__(self, engine: Engine, *, prepare: Callable[[], object] | None = None,
                 models: ServedModels | None = None):
        self.runner = Runner(engine, models)
        self._prepare = prepare
        self.state = "loading" if prepare is not None else "ready"  # | "failed"
        self.pid = os.getpid()
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="sprinter-edge-worker", daemon=True)

    @property
    def counters(self) -> WorkerCounters:
        return self.runner.counters

    @property
    def load_error(self) -> Exception | None:
        return self.runner.load_error

    def placement(self) -> Placement:
        return self.runner.placement()

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
        job = Job(Request(prompt, kwargs, origins, model), asyncio.get_running_loop())
        self._jobs.put(job)
        return job

    def _loop(self) -> None:
        if self._prepare is not None:
            try:
                self._prepare()
                self.state = "ready"
            except Exception as exc:  # kept: every request is answered with it
                log.error("loading the models failed: %s", exc)
                self.state, self.runner.load_error = "failed", exc
        while True:
            job = self._jobs.get()
            if job is None:
                return
            self.runner.run(job)


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
