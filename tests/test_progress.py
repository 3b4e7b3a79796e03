"""Progress while a prompt is read: `LlamaModel.eval` reports each decode call, a `Generation`
each model's read, and `serve` streams them, as llama.cpp's server does with `return_progress`
(`prompt_progress` chunks) and otherwise as SSE comments, so that a client's read timeout does
not fire on a long prompt. The protocol is checked, never a timing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support.server import TIMEOUT, fixture_server_args, running_server

from sprinter_edge import Engine
from sprinter_edge.backend.llama import LlamaModel, LoadOptions
from sprinter_edge.decoding import PromptProgress, SamplingParams
from sprinter_edge.serving.worker import Request, Runner

WAITING = {"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None,
           "logprobs": None}


def long_prompt(tag: str) -> str:
    """A prompt of some 560 tokens (more than n_batch, 512: two decode calls), its start told
    apart by `tag` so that no earlier request's KV cache holds it."""
    return f"{tag}: " + " ".join(str(i) for i in range(160))


# ---------------------------------------------------------------------------- the model


def test_eval_reports_each_decode_call(fixture_target_path: Path) -> None:
    with LlamaModel(fixture_target_path, LoadOptions(n_ctx=256, n_batch=32, n_threads=1)) as model:
        tokens = model.tokenize(" ".join(str(i) for i in range(60)))[:100]
        assert len(tokens) == 100
        model.eval(tokens[:10], n_logits=0)
        seen: list[tuple[int, int, int]] = []

        def note(read: int, n: int) -> None:
            seen.append((read, n, len(model.tokens)))

        model.eval(tokens[10:], n_logits=1, on_progress=note)
        reads = [read for read, _, _ in seen]
        assert len(seen) >= 3 and reads == sorted(set(reads)) and reads[-1] == 90
        assert all(n == 90 for _, n, _ in seen)
        assert all(held == 10 + read for read, _, held in seen)  # the cache as told, at each call
        assert all(b - a <= 32 for a, b in zip([0, *reads], reads, strict=False))

        seen.clear()
        model.sync(tokens, n_logits=1, on_progress=note)  # the rows asked for: one token read again
        assert [(read, n) for read, n, _ in seen] == [(1, 1)]
        seen.clear()
        model.sync(tokens, n_logits=0, on_progress=note)  # nothing to read: nothing told
        assert seen == []


def test_a_callback_that_raises_leaves_what_was_read(fixture_target_path: Path) -> None:
    class Stop(Exception):
        pass

    def stop_at_64(read: int, n: int) -> None:
        if read >= 64:
            raise Stop

    with LlamaModel(fixture_target_path, LoadOptions(n_ctx=256, n_batch=32, n_threads=1)) as model:
        tokens = model.tokenize(" ".join(str(i) for i in range(60)))[:100]
        with pytest.raises(Stop):
            model.sync(tokens, n_logits=0, on_progress=stop_at_64)
        assert model.tokens == tokens[:len(model.tokens)] and 64 <= len(model.tokens) < 99
        kept = len(model.tokens)
        out = model.sync(tokens, n_logits=1)  # the KV cache agrees with `tokens`: the rest is read
        assert model.last_decoded == len(tokens) - kept and out.logits.shape[0] == 1


# ---------------------------------------------------------------------------- the generation


def run(engine: Engine, prompt: str, method: str) -> list[Any]:
    """The reports and the chunks of one reply, in the order they came."""
    gen = engine.stream(prompt, SamplingParams(max_tokens=3), method=method)
    seen: list[Any] = []
    gen.on_progress = seen.append
    for chunk in gen:
        seen.append(chunk)
    return seen


def test_a_generation_reports_the_prompt_read(fixture_engine: Engine) -> None:
    prompt = "Progress: name three colours of the rainbow, please."
    seen = run(fixture_engine, prompt, "ar")
    reports = [e for e in seen if isinstance(e, PromptProgress)]
    assert seen.index(reports[-1]) < len(reports)  # every report before the first chunk
    assert all(r.role == "target" and r.main for r in reports)
    first, last = reports[0], reports[-1]
    total = last.total
    assert first.processed == first.cache < total - 1  # told before it reads
    assert [r.processed for r in reports] == sorted({r.processed for r in reports})
    assert reports[-2].processed == total - 1 and last.processed == total  # the last token: the first step
    assert all(r.total == total and r.cache == first.cache for r in reports)

    again = [e for e in run(fixture_engine, prompt, "ar") if isinstance(e, PromptProgress)]
    assert [(r.cache, r.processed) for r in again] == [(total - 1, total - 1), (total - 1, total)]


def test_the_draft_read_is_reported_apart(fixture_engine: Engine) -> None:
    seen = run(fixture_engine, "Progress: the draft reads too. Say yes.", "sd")
    reports = [e for e in seen if isinstance(e, PromptProgress)]
    assert {r.role for r in reports} == {"target", "draft"}
    assert all(r.main == (r.role == "target") for r in reports)
    assert reports[-1].role == "target" and reports[-1].processed == reports[-1].total


# ---------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def server(fixture_target_path: Path, fixture_draft_path: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("serve-progress") / "server.log"
    with running_server(fixture_server_args(fixture_target_path, fixture_draft_path, 4), log) as base:
        yield base


def sse(base: str, path: str, body: dict[str, Any]) -> list[tuple[str, Any]]:
    """A stream's events as they came: ("comment", text), ("data", the JSON) or ("done", None)."""
    events: list[tuple[str, Any]] = []
    with httpx.Client(timeout=TIMEOUT) as http, http.stream("POST", base + path, json=body) as r:
        assert r.status_code == 200
        block: list[str] = []
        for line in r.iter_lines():
            if line:
                block.append(line)
                continue
            for item in block:
                if item.startswith(":"):
                    events.append(("comment", item[1:].strip()))
                elif item == "data: [DONE]":
                    events.append(("done", None))
                else:
                    assert item.startswith("data: "), item
                    events.append(("data", json.loads(item[6:])))
            block = []
    assert events[-1] == ("done", None)
    return events


def chat(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": 4, "stream": True,
            "method": "ar", **extra}


def progress_of(events: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    return [v["prompt_progress"] for kind, v in events if kind == "data" and "prompt_progress" in v]


def is_reply(event: tuple[str, Any]) -> bool:
    kind, value = event
    return kind == "data" and any(c.get("delta", {}).get("content") or c.get("text")
                                  for c in value.get("choices", []))


@pytest.mark.slow
def test_return_progress_streams_llamacpp_chunks(server: str) -> None:
    events = sse(server, "/v1/chat/completions", chat(long_prompt("alpha"), return_progress=True))
    chunks = [v for kind, v in events if kind == "data"]
    progress = progress_of(events)
    usage = chunks[-1]["usage"]  # the last choice's
    total = usage["prompt_tokens"]
    assert total > 512 and len(progress) >= 4  # before the read, after each of two calls, the last token
    assert all(p["total"] == total for p in progress)
    first = progress[0]
    assert first["processed"] == first["cache"] < total // 4  # a fresh prompt: told before it reads
    assert all(p["cache"] == first["cache"] for p in progress)
    processed = [p["processed"] for p in progress]
    assert processed == sorted(set(processed)) and processed[-1] == total
    times = [p["time_ms"] for p in progress]
    assert all(isinstance(t, int) for t in times) and times == sorted(times)
    # llama.cpp's shape: an otherwise ordinary chunk whose one choice says nothing yet
    for chunk in chunks:
        if "prompt_progress" in chunk:
            assert chunk["object"] == "chat.completion.chunk" and chunk["id"] == chunks[0]["id"]
            assert chunk["choices"] == [WAITING]
            assert set(chunk["prompt_progress"]) == {"total", "cache", "processed", "time_ms"}
    last_progress = max(i for i, e in enumerate(events) if e[0] == "data" and "prompt_progress" in e[1])
    assert last_progress < next(i for i, e in enumerate(events) if is_reply(e))
    assert not any(kind == "comment" for kind, _ in events)  # `ar`: no draft reads

    # the same prompt again: all but its last token found in the KV cache
    again = progress_of(sse(server, "/v1/chat/completions", chat(long_prompt("alpha"), return_progress=True)))
    assert [(p["cache"], p["processed"]) for p in again] == [(total - 1, total - 1), (total - 1, total)]


@pytest.mark.slow
def test_without_return_progress_comments_keep_the_stream_alive(server: str) -> None:
    events = sse(server, "/v1/chat/completions", chat(long_prompt("beta")))
    comments = [text for kind, text in events if kind == "comment"]
    assert progress_of(events) == []
    assert len(comments) >= 4 and all(c.startswith("reading the prompt ") for c in comments)
    counts = [tuple(map(int, c.removeprefix("reading the prompt ").split("/"))) for c in comments]
    total = counts[-1][1]
    assert total > 512 and counts[-1] == (total, total)
    assert [n for n, _ in counts] == sorted({n for n, _ in counts})
    last_comment = max(i for i, e in enumerate(events) if e[0] == "comment")
    assert last_comment < next(i for i, e in enumerate(events) if is_reply(e))


@pytest.mark.slow
def test_the_openai_client_reads_either_stream(server: str) -> None:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)
    messages = [{"role": "user", "content": long_prompt("gamma")}]
    texts = []
    for extra in ({}, {"return_progress": True}):  # comments (a fresh prompt), then progress chunks
        stream = client.chat.completions.create(model="fixture", messages=messages, max_tokens=4,
                                                stream=True, extra_body={"method": "ar", **extra})
        parts, finish, progress = [], None, []
        for chunk in stream:
            if (chunk.model_extra or {}).get("prompt_progress"):
                progress.append(chunk.model_extra["prompt_progress"])
            for choice in chunk.choices:
                parts.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        assert finish in ("stop", "length") and bool(progress) == bool(extra)
        texts.append("".join(parts))
    plain = client.chat.completions.create(model="fixture", messages=messages, max_tokens=4,
                                           extra_body={"method": "ar", "return_progress": True})
    assert texts == [plain.choices[0].message.content] * 2
    assert "prompt_progress" not in (plain.model_extra or {})  # nothing extra unless streamed


@pytest.mark.slow
def test_completions_and_the_draft(server: str) -> None:
    events = sse(server, "/v1/completions", {"prompt": "Progress: one, two,", "max_tokens": 3,
                                             "stream": True, "return_progress": True})
    chunks = [v for kind, v in events if kind == "data" and "prompt_progress" in v]
    assert chunks and all(c["object"] == "text_completion" for c in chunks)
    assert all(c["choices"] == [{"index": 0, "text": "", "logprobs": None, "finish_reason": None}]
               for c in chunks)
    # `sd`: the draft reads the prompt too, told in comments; the progress is the target's
    events = sse(server, "/v1/chat/completions",
                 chat("Progress: and the draft? Say yes.", method="sd", return_progress=True))
    comments = [text for kind, text in events if kind == "comment"]
    assert comments and all(c.startswith("the draft reading the prompt ") for c in comments)
    progress = progress_of(events)
    assert progress[-1]["processed"] == progress[-1]["total"]


class Client:
    """A task; `leaves`: its client goes away once the first decode call of its prompt is
    reported."""

    def __init__(self, prompt: str, *, leaves: bool):
        self.request = Request(prompt, {"params": SamplingParams(max_tokens=4), "method": "ar"})
        self.cancelled, self.pieces, self.leaves = threading.Event(), {}, leaves
        self.events: list[tuple[str, Any]] = []

    def emit(self, event: str, value: Any = None) -> None:
        self.events.append((event, value))
        if self.leaves and event == "progress" and value.processed > value.cache:
            self.cancelled.set()


def test_a_job_cancelled_while_its_prompt_is_read_stops_at_that_call(fixture_engine: Engine) -> None:
    runner = Runner(fixture_engine)
    task = Client(long_prompt("Cancelled"), leaves=True)
    runner.run(task)
    target = fixture_engine.models.target
    assert [e for e, _ in task.events] == ["started", "progress", "progress"]  # no chunk, no error
    assert task.events[-1][1].processed == len(target.tokens) < task.events[-1][1].total - 1
    assert runner.counters.cancelled == 1 and runner.counters.failed == 0
    after = Client("Say hi.", leaves=False)
    runner.run(after)  # the runner is free, and the next request runs as always
    assert after.events[-1][0] == "done" and runner.counters.completed == 1
