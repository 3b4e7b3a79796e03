"""`sprinter-edge serve` as a live subprocess on a loopback port, with the fixture pair.

Talks to it with the official `openai` client and with raw httpx requests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

HOST = "127.0.0.1"
TIMEOUT = 120.0  # generous: the machine is shared with heavy jobs


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(fixture_target_path: Path, fixture_draft_path: Path, tmp_path_factory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    cmd = [sys.executable, "-m", "sprinter_edge", "serve", "--target", str(fixture_target_path),
           "--draft", str(fixture_draft_path), "--method", "sd", "--verifier", "confidence",
           "--threads", "1", "--ctx", "1024", "--max-tokens", "8", "--host", HOST, "--port", str(port),
           "--model-name", "fixture", "--log-level", "warning"]
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


@pytest.fixture(scope="module")
def client(server: str):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


def test_health_and_models(server: str, client) -> None:
    health = httpx.get(f"{server}/health", timeout=TIMEOUT).json()
    assert health["status"] == "ok" and health["model"] == "fixture"
    assert [m.id for m in client.models.list().data] == ["fixture"]


def test_chat_completion(client) -> None:
    r = client.chat.completions.create(
        model="fixture", messages=[{"role": "user", "content": "Say hello."}], max_tokens=6)
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 6 and r.usage.prompt_tokens > 10
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    extra = r.model_extra["sprinter"]
    assert extra["method"] == "sd" and extra["target_calls"] >= 1


def test_chat_stream_matches_plain(client) -> None:
    messages = [{"role": "user", "content": "Name a fruit."}]
    plain = client.chat.completions.create(model="fixture", messages=messages, max_tokens=8)
    stream = client.chat.completions.create(model="fixture", messages=messages, max_tokens=8,
                                            stream=True, stream_options={"include_usage": True})
    parts, finish, usage = [], None, None
    for ev in stream:
        if ev.usage is not None:
            usage = ev.usage
        for c in ev.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(parts) == plain.choices[0].message.content
    assert finish == plain.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == plain.usage.completion_tokens


def test_completions_and_method_extension(client) -> None:
    r = client.completions.create(model="fixture", prompt="The capital of France is", max_tokens=4,
                                  extra_body={"method": "ar"})
    assert r.choices[0].text and r.model_extra["sprinter"]["method"] == "ar"
    stream = client.completions.create(model="fixture", prompt="The capital of France is",
                                       max_tokens=4, stream=True, extra_body={"method": "ar"})
    assert "".join(ev.choices[0].text for ev in stream if ev.choices) == r.choices[0].text


def test_concurrent_requests(client) -> None:
    prompts = ["Count to three.", "What colour is the sky?", "Say goodbye.", "Name a planet."]

    def ask(p: str) -> str:
        r = client.chat.completions.create(model="fixture", max_tokens=6,
                                           messages=[{"role": "user", "content": p}])
        return r.choices[0].message.content

    alone = [ask(p) for p in prompts]
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        together = list(pool.map(ask, prompts))
    assert together == alone


@pytest.mark.parametrize("body, fragment", [
    (b'{"model": "fixture", "messages": [', "not valid JSON"),
    (b'{"model": "fixture", "messages": [{"role": "user", "content": "hi"}], "bogus": 1}',
     "unknown field 'bogus'"),
    (b'{"model": "fixture", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "many"}',
     "max_tokens"),
    (b'{"model": "fixture", "messages": [{"role": "robot", "content": "hi"}]}', "role"),
    (b'{"model": "fixture", "messages": []}', "messages"),
    (b'{"model": "fixture", "messages": [{"role": "user", "content": "hi"}], "threshold": 3}',
     "threshold"),
    (b'{"model": "fixture", "prompt": [999999]}', "out of range"),
])
def test_bad_requests(server: str, body: bytes, fragment: str) -> None:
    path = "/v1/completions" if b'"prompt"' in body else "/v1/chat/completions"
    r = httpx.post(f"{server}{path}", content=body, headers={"content-type": "application/json"},
                   timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]["message"]


def test_any_model_name_is_served_and_overflow(server: str) -> None:
    # Clients that send a fixed name (or none) get the loaded pair; the reply names it.
    for extra in ({"model": "gpt-4"}, {}):
        r = httpx.post(f"{server}/v1/chat/completions", timeout=TIMEOUT, json={
            **extra, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "fixture"
    r = httpx.post(f"{server}/v1/chat/completions", timeout=TIMEOUT, json={
        "messages": [{"role": "user", "content": "hi"}], "method": "magic"})
    assert r.status_code == 400 and "unknown method" in r.json()["error"]["message"]
    r = httpx.post(f"{server}/v1/completions", timeout=TIMEOUT, json={
        "model": "fixture", "prompt": "word " * 1500})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_disconnect_mid_stream_frees_the_worker(server: str, client) -> None:
    before = httpx.get(f"{server}/health", timeout=TIMEOUT).json()["cancelled"]
    body = {"model": "fixture", "prompt": "Once upon a time", "max_tokens": 600, "stream": True,
            "method": "ar"}
    with httpx.Client(timeout=TIMEOUT) as http, http.stream("POST", f"{server}/v1/completions",
                                                            json=body) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: {"):
                assert "choices" in json.loads(line[6:])
                seen += 1
                if seen == 3:
                    break  # leave mid-stream: the connection closes
    deadline = time.monotonic() + TIMEOUT
    while True:
        health = httpx.get(f"{server}/health", timeout=TIMEOUT).json()
        if health["cancelled"] > before and not health["busy"]:
            break
        assert time.monotonic() < deadline, health
        time.sleep(0.2)
    r = client.chat.completions.create(model="fixture", max_tokens=4,
                                       messages=[{"role": "user", "content": "Hello again."}])
    assert r.choices[0].message.content
