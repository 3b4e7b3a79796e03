"""`sprinter-edge serve` as a live subprocess on a loopback port, for the tests that talk to it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sprinter_edge.processes import free_port

HOST = "127.0.0.1"
TIMEOUT = 120.0  # generous: the machine is shared with heavy jobs


@contextlib.contextmanager
def running_server(args: list[str], log: Path) -> Iterator[str]:
    """`sprinter-edge serve ARGS` on a free loopback port until the block ends; its base URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "sprinter_edge", "serve", *args, "--host", HOST, "--port", str(port),
           "--log-level", "warning"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://{HOST}:{port}"
    try:
        deadline = time.monotonic() + TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited early:\n{log.read_text()}")
            try:
                if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not come up:\n{log.read_text()}")
            time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def fixture_server_args(target: Path, draft: Path, max_tokens: int) -> list[str]:
    """`serve` on the fixture pair, one thread, `sd` by default, offering that pair alone (not the
    models this machine happens to have: tests/test_serve_models.py builds stores of its own)."""
    return ["--target", str(target), "--draft", str(draft), "--method", "sd", "--verifier", "confidence",
            "--threads", "1", "--ctx", "1024", "--max-tokens", str(max_tokens), "--model-name", "fixture",
            "--models", "none"]


def leave_stream(base: str, body: dict, chunks: int) -> None:
    """POST a streamed completion `body` and close the connection after `chunks` chunks, as a
    client that goes away mid-reply."""
    with httpx.Client(timeout=TIMEOUT) as http, http.stream("POST", f"{base}/v1/completions",
                                                            json=body) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: {"):
                assert "choices" in json.loads(line[6:])
                seen += 1
                if seen == chunks:
                    return  # the connection closes
    raise AssertionError(f"the stream ended after {seen} chunks, before {chunks}")
