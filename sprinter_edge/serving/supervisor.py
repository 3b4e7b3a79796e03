"""The engine's worker process, seen and kept alive from the server (engine_process.py is its
other side).

`SupervisedWorker` offers what the handlers use (`submit` -> Job, counters, state). One thread
reads the worker's pipe and hands each event to its job on the event loop. When the worker
process ends (an abort inside llama.cpp, a kill, the out-of-memory killer, a lost rpc-server),
every open job ends with an `EngineStoppedError` naming the cause (a stream with an `error`
event, a request not begun with a 503), and a new worker process starts: at once, or, with the
target on rpc-servers, once every one answers again. Meanwhile /health and new requests answer
503 with the reason. The server's own process never loads a model and never restarts.

A hung worker: an rpc-server alive but silent leaves llama.cpp waiting for ever. With the
target on rpc-servers (or SPRINTER_EDGE_STALL_SECONDS set), a worker that sends nothing for
`stall` seconds while it runs a reply is killed and replaced; while it reads the prompt, the
bound grows by READ_SECONDS_PER_TOKEN for each of its tokens still to read (a chunk of the
prompt is one llama.cpp call, which tells nothing until it returns: its "progress" event comes
after). Loading a model has no bound.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import signal
import threading
import time
from collections.abc import Sequence
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

from ..backend.rpc import dial
from ..errors import BackendError, EngineStoppedError, TargetLostError
from ..prompting import Message
from . import engine_process
from .engine_process import Status, WorkerSpec
from .worker import Job, Placement, PromptBuilder, Request, WorkerCounters

log = logging.getLogger(__name__)

STALL_SECONDS = 120.0  # with --target-rpc: a reply silent this long is hung
STALL_ENV = "SPRINTER_EDGE_STALL_SECONDS"
READ_SECONDS_PER_TOKEN = 0.25  # a prompt read at 4 tokens/s or faster is not hung
MAX_BACKOFF = 30.0  # seconds between tries: dialling a lost rpc-server, loading again
JOB_EVENTS = frozenset(("started", "progress", "chunk", "done", "error"))


def exit_text(code: int | None) -> str:
    """A worker process's end in words: "SIGABRT", "SIGKILL", "exit code 1"."""
    if code is None or code >= 0:
        return f"exit code {code}"
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _to_read(kind: str, value: Any) -> int:
    """The prompt tokens a job still has to read after this event of its."""
    if kind == "started":  # the prompt's tokens
        return value
    if kind == "progress":  # a PromptProgress
        return value.total - value.processed
    return 0


class SupervisedWorker:
    """The engine in a worker process that is restarted when it ends. States: "loading" (the
    first worker), "ready", "restarting" (a worker ended: a new one is awaited or loading) and
    "failed" (the first load failed: kept, as the in-process worker keeps it)."""

    def __init__(self, spec: WorkerSpec, *, endpoints: Sequence[str] = (), stall: float | None = None):
        self.spec, self.endpoints, self.stall = spec, tuple(endpoints), stall
        self.state = "loading"
        self.load_error: Exception | None = None  # why requests are refused, /health says it
        self.pid: int | None = None  # the worker process's
        self._placement = Placement()
        self._past = WorkerCounters()  # the workers that ended
        self._live = WorkerCounters()  # this one's, as of its last job
        self._failed = 0  # requests that ended here: refused, or their worker gone
        self._jobs: dict[int, Job] = {}  # sent to the worker and not ended, in the order sent
        self._running: int | None = None  # the job the worker runs
        self._ids = itertools.count()
        self._lock = threading.Lock()  # the state, `_jobs` and the pipe to the worker
        self._to_worker: Connection | None = None
        self._process: Any = None
        self._deadline: float | None = None  # a worker silent past it is hung (`stall`)
        self._bound = 0.0  # the seconds that deadline allowed
        self._verdict: str | None = None  # why we killed it
        self._told: Exception | None = None  # what it said before it ended ("failed", "lost")
        self._ready_seen = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="sprinter-edge-supervisor",
                                        daemon=True)

    # ------------------------------------------------------------------ the handlers' side
    @property
    def counters(self) -> WorkerCounters:
        total = self._past.plus(self._live)
        total.failed += self._failed
        total.busy = self._running is not None
        return total

    @property
    def queued(self) -> int:
        return max(len(self._jobs) - (self._running is not None), 0)

    def placement(self) -> Placement:
        return self._placement

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        with self._lock:
            self._send(("stop",))
        if self._process is not None:
            self._process.join(timeout)
            if self._process.is_alive():
                self._process.kill()
        self._thread.join(timeout)

    def submit(self, prompt: str | Sequence[Message] | list[int] | PromptBuilder, *,
               origins: bool = False, model: str | None = None, **kwargs: Any) -> Job:
        """Send a generation to the worker (call from the event loop); its events arrive in
        `job.events`. While there is no worker to run it, it ends at once with the reason."""
        job = Job(Request(prompt, kwargs, origins, model), asyncio.get_running_loop())
        with self._lock:
            if self.state in ("loading", "ready"):
                job_id = next(self._ids)
                self._jobs[job_id] = job
                job.on_cancel = partial(self._cancel, job_id)
                # a worker that just ended: the supervisor ends the job with the reason
                self._send(("job", job_id, job.request))
                return job
            self._failed += 1
        job.emit("error", self.load_error)
        return job

    def _cancel(self, job_id: int) -> None:
        with self._lock:
            if job_id in self._jobs:
                self._send(("cancel", job_id))

    def _send(self, msg: tuple[Any, ...]) -> None:
        try:
            if self._to_worker is not None:
                self._to_worker.send(msg)
        except (OSError, ValueError):  # the worker is gone: the supervisor sees it end
            pass

    # ------------------------------------------------------------------ the supervisor thread
    def _supervise(self) -> None:
        ever_ready, tries = False, 0
        while True:
            try:
                process, from_worker = self._spawn()
            except Exception as exc:  # no process can start here (the spec does not pickle, ...)
                log.exception("the engine process cannot start")
                self._close("failed", EngineStoppedError(f"the engine process cannot start: {exc}"))
                return
            self._read(from_worker)
            from_worker.close()
            reason = self._reason(process)
            ever_ready = ever_ready or self._ready_seen
            lost = isinstance(self._told, TargetLostError) and not self._told.at_load
            if self._stopping.is_set():
                self._close("restarting", EngineStoppedError(f"{reason}; the server stops"))
                return
            if not ever_ready and not lost:  # the first load failed: kept, as a wrong port is
                log.error("loading the models failed: %s", reason)
                self._close("failed", self._told or EngineStoppedError(f"{reason} while loading the models"))
                return
            log.error("%s: restarting the engine", reason)
            when = "once the rpc-server answers again" if self.endpoints else "now"
            self._close("restarting", EngineStoppedError(f"{reason}; restarting {when}"))
            self._wait_for_endpoints()
            tries = 0 if self._ready_seen else tries + 1
            if tries:  # the last one did not get ready either: not in a tight loop
                delay = min(2.0 ** tries, MAX_BACKOFF)
                self.load_error = EngineStoppedError(f"{reason}; trying again in {delay:.0f} s")
                self._stopping.wait(delay)
            if self._stopping.is_set():
                return

    def _spawn(self) -> tuple[Any, Connection]:
        ctx = multiprocessing.get_context("spawn")  # no fork of the server's threads; as on macOS, Windows
        worker_in, to_worker = ctx.Pipe(duplex=False)
        from_worker, worker_out = ctx.Pipe(duplex=False)
        process = ctx.Process(target=engine_process.main, args=(self.spec, worker_in, worker_out),
                              name="sprinter-edge-engine", daemon=True)
        self._verdict = self._told = None
        self._ready_seen = False
        process.start()
        worker_in.close()  # the worker's ends are its own: its exit closes the pipe (EOF here)
        worker_out.close()
        with self._lock:
            self._to_worker, self._process, self.pid = to_worker, process, process.pid
        return process, from_worker

    def _read(self, conn: Connection) -> None:
        """The worker's messages until it ends (the pipe's end: no polling)."""
        while True:
            deadline = self._deadline
            if deadline is not None and not conn.poll(max(deadline - time.monotonic(), 0.0)):
                self._verdict = f"the engine process made no progress for {self._bound:.0f} s"
                self._deadline = None
                self._process.kill()  # its end follows as the pipe's
                continue
            try:
                kind, job_id, value, pieces = conn.recv()
            except (EOFError, OSError):
                return
            if kind in JOB_EVENTS:
                job = self._jobs.get(job_id)
                if job is not None:
                    if pieces:
                        job.pieces.update(pieces)
                    job.emit(kind, value)
                if self.stall is not None:
                    self._watch(self.stall + _to_read(kind, value) * READ_SECONDS_PER_TOKEN)
            elif kind == "taken":  # no bound while it sets up (a model may load)
                self._running, self._deadline = job_id, None
            elif kind == "ended":
                status: Status = value
                with self._lock:
                    self._jobs.pop(job_id, None)
                    self._running, self._deadline = None, None
                    self._live, self._placement = status.counters, status.placement
            elif kind == "ready":
                with self._lock:
                    self._placement, self._ready_seen = value, True
                    self.state, self.load_error = "ready", None
            else:  # "failed" (loading) or "lost" (its rpc-server): its end follows
                self._told = value

    def _watch(self, seconds: float) -> None:
        self._bound, self._deadline = seconds, time.monotonic() + seconds

    def _reason(self, process: Any) -> str:
        """Why the worker ended, in words."""
        process.join(10)
        if process.is_alive():  # its pipe closed, yet it runs: not ours any more
            process.kill()
            process.join(10)
        if isinstance(self._told, TargetLostError):
            return str(self._told)
        if self._verdict is not None:
            return self._verdict
        if self._told is not None:
            return f"loading the models failed: {self._told}"
        return f"the engine process stopped ({exit_text(process.exitcode)})"

    def _close(self, state: str, error: Exception) -> None:
        """No worker now: every open job ends with `error`, and so does every new one until
        the next worker is ready."""
        with self._lock:
            self.state, self.load_error = state, error
            jobs, self._jobs = self._jobs, {}
            if self._to_worker is not None:
                self._to_worker.close()
            self._running, self._deadline, self._to_worker = None, None, None
            self._past, self._live = self._past.plus(self._live), WorkerCounters()
            self._failed += len(jobs)
        for job in jobs.values():
            job.emit("error", error)

    def _wait_for_endpoints(self) -> None:
        """With the target on rpc-servers: until every one answers (a TCP connect), backing off."""
        delay = 1.0
        while self.endpoints and not self._stopping.is_set():
            try:
                for endpoint in self.endpoints:
                    dial(endpoint, timeout=2.0)
                return
            except BackendError:
                self._stopping.wait(delay)
                delay = min(delay * 2, MAX_BACKOFF / 3)
