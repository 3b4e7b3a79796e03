"""The worker process: the Engine, and the models served, in a child process of `serve`.

The server (supervisor.py) starts it with the "spawn" context (the same on Linux, macOS and
Windows) and two one-way pipes. It builds its engines from a `WorkerSpec`, loads the default
model, then runs requests one at a time (worker.Runner) while a thread reads the server's
messages. Everything it keeps (KV caches, the prompt cache, the learned costs) lives here for
as long as it lives: a new worker process starts afresh.

Server -> worker: ("job", id, Request) | ("cancel", id) | ("stop",).
Worker -> server, each `(kind, job id | None, value, pieces | None)`:
  "ready" (a Placement) once loaded, "failed" (the exception) when loading failed,
  "lost" (a TargetLostError) just before a lost rpc-server ends this process,
  "taken" (None) and "ended" (a Status) around each job,
  and the job's own events, "started" (its prompt's tokens), "progress" (a PromptProgress, while
  it reads the prompt), "chunk", "done", "error", with the bytes of the tokens they name that
  were not sent before (`pieces`): one message per chunk.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import pickle
import queue
import signal
import threading
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ..api import Engine
from ..catalog.registry import PairSpec
from .models import Offer, ServedModels, offer_engine
from .worker import Placement, Request, Runner, WorkerCounters

log = logging.getLogger(__name__)

# a debug switch for tests: the worker calls abort() after this many chunks of a reply (a real
# abort, as a GGML_ASSERT would: no exception, no clean-up)
ABORT_AFTER = "SPRINTER_EDGE_DEBUG_ABORT_AFTER"


@dataclass(frozen=True)
class WorkerSpec:
    """What the worker process builds its engines from: paths and settings (picklable)."""

    target: Path
    draft: Path | None
    engine_kwargs: dict[str, Any]  # Engine's keywords (method, hardware, verifier, ...)
    pair: PairSpec | None = None  # where the pair came from the registry
    offers: tuple[Offer, ...] = ()  # with `serve`'s models: every model offered, the default first
    log_levels: dict[str, int] = field(default_factory=dict)  # the server's, by logger name

    def engine(self) -> Engine:
        return Engine(self.target, self.draft, pair=self.pair, **self.engine_kwargs)

    def models(self, engine: Engine) -> ServedModels | None:
        if not self.offers:
            return None
        return ServedModels(self.offers[0], engine, self.offers[1:],
                            make=partial(offer_engine, self.engine_kwargs))


@dataclass
class Status:
    """The worker's counters and where its models are, sent after each job."""

    counters: WorkerCounters
    placement: Placement


class Outbox:
    """The pipe to the server; one sender at a time (the runner's thread, rpc's abort path)."""

    def __init__(self, conn: Connection):
        self._conn, self._lock = conn, threading.Lock()

    def send(self, kind: str, job_id: int | None = None, value: Any = None,
             pieces: dict[int, bytes] | None = None) -> None:
        with self._lock:
            self._conn.send((kind, job_id, value, pieces))


class RemoteTask:
    """A job of the server's, run here: its events go through the pipe."""

    def __init__(self, job_id: int, request: Request, out: Outbox, abort_after: int):
        self.id, self.request, self.out = job_id, request, out
        self.cancelled = threading.Event()
        self.pieces: dict[int, bytes] = {}
        self._sent = 0  # pieces already sent
        self._chunks, self._abort_after = 0, abort_after

    def emit(self, event: str, value: Any = None) -> None:
        fresh = None
        if len(self.pieces) > self._sent:
            fresh = dict(itertools.islice(self.pieces.items(), self._sent, None))
            self._sent = len(self.pieces)
        if event == "chunk" and self._abort_after:
            self._chunks += 1
            if self._chunks > self._abort_after:
                os.abort()
        if event == "error":
            value = portable(value)
        self.out.send(event, self.id, value, fresh)


def portable(exc: BaseException) -> BaseException:
    """`exc` if it crosses a pipe intact, else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def main(spec: WorkerSpec, inbox: Connection, outbox: Connection) -> None:
    """The worker process's entry point (multiprocessing, "spawn")."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's: it stops us
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    for name, level in spec.log_levels.items():
        logging.getLogger(name).setLevel(level)
    out = Outbox(outbox)
    if spec.engine_kwargs["hardware"].target_rpc:
        from ..backend import rpc

        rpc.on_lost(partial(_tell_lost, out))  # then this process ends (backend/rpc.py)
    abort_after = int(os.environ.get(ABORT_AFTER) or 0)
    tasks: queue.SimpleQueue[RemoteTask | None] = queue.SimpleQueue()
    running: dict[int, RemoteTask] = {}
    threading.Thread(target=_read, args=(inbox, out, tasks, running, abort_after),
                     name="sprinter-edge-inbox", daemon=True).start()
    try:
        engine = spec.engine()
        runner = Runner(engine, spec.models(engine))
        engine.load()
    except Exception as exc:
        log.error("loading the models failed: %s", exc)
        out.send("failed", value=portable(exc))
        return
    out.send("ready", value=runner.placement())
    while (task := tasks.get()) is not None:
        out.send("taken", task.id)
        runner.run(task)
        running.pop(task.id, None)
        out.send("ended", task.id, Status(runner.counters, runner.placement()))


def _read(inbox: Connection, out: Outbox, tasks: queue.SimpleQueue[RemoteTask | None],
          running: dict[int, RemoteTask], abort_after: int) -> None:
    """The server's messages: jobs queue for the runner, cancels reach a job at once."""
    while True:
        try:
            msg = inbox.recv()
        except (EOFError, OSError):  # the server is gone: nobody is left to answer
            os._exit(0)
        if msg[0] == "job":
            task = RemoteTask(msg[1], msg[2], out, abort_after)
            running[task.id] = task
            tasks.put(task)
        elif msg[0] == "cancel":
            with contextlib.suppress(KeyError):
                running[msg[1]].cancelled.set()
        else:  # "stop": the running reply ends at its next step
            for task in list(running.values()):
                task.cancelled.set()
            tasks.put(None)
            return


def _tell_lost(out: Outbox, exc: Exception) -> None:
    out.send("lost", value=exc)  # the server logs it
