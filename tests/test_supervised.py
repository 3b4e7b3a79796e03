"""`serve` keeps the engine in a worker process and outlives it: a real abort inside the worker
(the debug switch), a SIGKILL, and a worker stopped dead (SIGSTOP, as a hung rpc-server leaves
it) each end the open stream with an `error` event, /health and new requests answer 503 with the
reason while a new worker loads, then requests are served again by the same server process.
The fixture target alone, plain decoding; no timing (a deadline bounds each wait)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.server import TIMEOUT, running_server

from sprinter_edge.serving.engine_process import ABORT_AFTER
from sprinter_edge.serving.supervisor import STALL_ENV

LONG = {"model": "fixture", "prompt": "Once upon a time", "max_tokens": 400, "stream": True,
        "temperature": 0}
STALL = 4  # seconds: the bound on a silent worker in these servers


def server_args(target: Path) -> list[str]:
    return ["--target", str(target), "--method", "ar", "--threads", "1", "--ctx", "512",
            "--models", "none", "--model-name", "fixture"]


def health(base: str) -> httpx.Response:
    return httpx.get(f"{base}/health", timeout=TIMEOUT)


def stream_until_error(base: str, after_chunks: int, then=lambda: None) -> tuple[int, str]:
    """Stream LONG; after `after_chunks` chunks call `then`; the chunks seen and the error event's
    message (the stream must end with one, then [DONE])."""
    seen, events = 0, []
    with httpx.Client(timeout=TIMEOUT) as http, http.stream("POST", f"{base}/v1/completions",
                                                            json=LONG) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if '"choices"' in line:
                    seen += 1
                    if seen == after_chunks:
                        then()
    assert events[-1] == "[DONE]", events[-3:]
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error"
    return seen, error["message"]


def restarting(base: str, cause: str) -> None:
    """Right after the worker ended: /health and a new request answer 503 with the reason."""
    r = health(base)
    assert r.status_code == 503 and r.json()["status"] == "restarting", r.text
    assert cause in r.json()["error"]
    r = httpx.post(f"{base}/v1/completions", timeout=TIMEOUT,
                   json={"model": "fixture", "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 503 and cause in r.json()["error"]["message"], r.text


def served_again(base: str, before: dict) -> dict:
    """The new worker is ready and answers; the server is the same process. /health after."""
    deadline = time.monotonic() + TIMEOUT
    while (r := health(base)).status_code != 200:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.2)
    now = r.json()
    assert now["pid"] == before["pid"] and now["worker_pid"] != before["worker_pid"]
    r = httpx.post(f"{base}/v1/completions", timeout=TIMEOUT,
                   json={"model": "fixture", "prompt": "Hello, my name is", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text
    return health(base).json()


@pytest.mark.slow
def test_an_abort_in_the_worker_ends_the_stream_and_the_server_goes_on(
        fixture_target_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ABORT_AFTER, "5")  # every reply: a reply of 3 tokens never gets there
    log = tmp_path / "serve.log"
    with running_server(server_args(fixture_target_path), log) as base:
        before = health(base).json()
        seen, message = stream_until_error(base, after_chunks=0)
        assert 1 <= seen <= 5  # chunks with text: the sixth never came
        assert "the engine process stopped (SIGABRT); restarting" in message
        restarting(base, "SIGABRT")
        now = served_again(base, before)
        assert now["failed"] == before["failed"] + 2 and now["completed"] == before["completed"] + 1
    assert log.read_text().count("sprinter-edge serve: model") == 1  # never started again


@pytest.fixture(scope="module")
def server(fixture_target_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server whose worker is killed when silent for STALL seconds while it replies."""
    log = tmp_path_factory.mktemp("supervised") / "serve.log"
    os.environ[STALL_ENV] = str(STALL)
    try:
        with running_server(server_args(fixture_target_path), log) as base:
            yield base
    finally:
        del os.environ[STALL_ENV]
    assert "Traceback" not in log.read_text()


def test_a_worker_killed_mid_stream_is_replaced(server: str) -> None:
    before = health(server).json()
    _, message = stream_until_error(server, 3, lambda: os.kill(before["worker_pid"], signal.SIGKILL))
    assert "the engine process stopped (SIGKILL); restarting" in message
    restarting(server, "SIGKILL")
    served_again(server, before)


@pytest.mark.slow
def test_a_worker_silent_mid_stream_is_killed_and_replaced(server: str) -> None:
    """SIGSTOP: alive, holding its connections, saying nothing (as llama.cpp waiting on a hung
    rpc-server): after STALL seconds without a chunk the server kills it."""
    before = health(server).json()
    t0 = time.monotonic()
    _, message = stream_until_error(server, 3, lambda: os.kill(before["worker_pid"], signal.SIGSTOP))
    assert time.monotonic() - t0 >= STALL
    assert f"made no progress for {STALL} s; restarting" in message
    restarting(server, "no progress")
    served_again(server, before)
