"""`sprinter-edge serve` as a live subprocess on a loopback port, with the fixture pair.

Talks to it with the official `openai` client and with raw httpx requests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from support.server import TIMEOUT, fixture_server_args, leave_stream, running_server


@pytest.fixture(scope="module")
def server(fixture_target_path: Path, fixture_draft_path: Path, tmp_path_factory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("serve") / "server.log"
    with running_server(fixture_server_args(fixture_target_path, fixture_draft_path, 8), log) as base:
        yield base


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
    extra = r.model_extra["decoding"]
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
    assert r.choices[0].text and r.model_extra["decoding"]["method"] == "ar"
    stream = client.completions.create(model="fixture", prompt="The capital of France is",
                                       max_tokens=4, stream=True, extra_body={"method": "ar"})
    assert "".join(ev.choices[0].text for ev in stream if ev.choices) == r.choices[0].text


@pytest.mark.slow
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
    leave_stream(server, body, 3)
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


# ---------------------------------------------------------------------------- tools, logprobs, penalties

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_named_tool_choice_forces_a_call(client) -> None:
    """SmolLM2's template has no tools: the server spells the convention out, starts the reply
    with the call and its name, and returns an OpenAI tool call (stream and not alike)."""
    choice = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(model="fixture", messages=ASK_WEATHER, tools=[WEATHER_TOOL],
                                       tool_choice=choice, max_tokens=24)
    c = r.choices[0]
    assert c.finish_reason in ("tool_calls", "length"), c
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert call.id.startswith("call_") and isinstance(call.function.arguments, str)
    assert c.message.content is None
    stream = client.chat.completions.create(model="fixture", messages=ASK_WEATHER, tools=[WEATHER_TOOL],
                                            tool_choice=choice, max_tokens=24, stream=True)
    calls, finish = {}, None
    for ev in stream:
        for ch in ev.choices:
            finish = ch.finish_reason or finish
            assert not ch.delta.content
            for tc in ch.delta.tool_calls or ():
                calls.setdefault(tc.index, [tc.function.name, ""])
                calls[tc.index][1] += tc.function.arguments or ""
    assert calls == {0: ["get_weather", call.function.arguments]} and finish == c.finish_reason


def test_tool_round_trip_messages_are_accepted(client) -> None:
    """An assistant turn with tool_calls (content null) and the tool's result go back in."""
    messages = [*ASK_WEATHER,
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18, "sky": "clear"}'}]
    for tool_choice in ("auto", "none"):
        r = client.chat.completions.create(model="fixture", messages=messages, tools=[WEATHER_TOOL],
                                           tool_choice=tool_choice, max_tokens=8)
        c = r.choices[0]
        assert c.finish_reason in ("stop", "length", "tool_calls")
        assert c.message.content or c.message.tool_calls
        if tool_choice == "none":
            assert not c.message.tool_calls
    # no tools in this request: the earlier call and its result still render
    r = client.chat.completions.create(model="fixture", messages=messages, max_tokens=4)
    assert r.choices[0].message.content


def test_logprobs_chat_and_completions(client) -> None:
    """The target's logprobs, one per completion token, in OpenAI's shapes; greedy, so the
    chosen token is the most likely one; the stream carries the same."""
    hi = [{"role": "user", "content": "Say hi."}]
    r = client.chat.completions.create(model="fixture", messages=hi, max_tokens=6, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and bytes(t.bytes).decode("utf-8", "replace") == t.token
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob == pytest.approx(t.logprob)
        tops = [x.logprob for x in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
    stream = client.chat.completions.create(model="fixture", messages=hi, max_tokens=6, logprobs=True,
                                            top_logprobs=3, stream=True)
    streamed = [t for ev in stream for ch in ev.choices if ch.logprobs for t in ch.logprobs.content]
    assert [(t.token, round(t.logprob, 5)) for t in streamed] == [
        (t.token, round(t.logprob, 5)) for t in content]

    c = client.completions.create(model="fixture", prompt="The capital of France is", max_tokens=5,
                                  logprobs=2)
    lp = c.choices[0].logprobs
    assert "".join(lp.tokens) == c.choices[0].text and len(lp.token_logprobs) == c.usage.completion_tokens
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert all(tok in top and 2 <= len(top) <= 3 for tok, top in zip(lp.tokens, lp.top_logprobs, strict=True))
    plain = client.chat.completions.create(model="fixture", messages=hi, max_tokens=6)
    assert plain.choices[0].logprobs is None


@pytest.mark.slow
def test_penalties_pass_through(client, fixture_engine) -> None:
    """Each penalty reaches the sampler: on a prompt whose greedy reply repeats itself, each one
    changes what the target's scores become (the logprobs are after the penalties) as its
    definition says, the repeat and frequency penalties change the reply, and every reply is the
    in-process engine's (the same pair, method and threads) under the same SamplingParams, token
    for token with its logprob; at zero they leave the reply as it was."""
    from sprinter_edge import SamplingParams

    def local(prompt, **params) -> tuple[list[str], list[float]]:  # noqa: ANN001
        fixture_engine.reset_caches()  # the prompt read afresh, as the server first read it
        r = fixture_engine.generate(prompt, SamplingParams(max_tokens=8, logprobs=0, **params),
                                    chat=not isinstance(prompt, str))
        pieces = [fixture_engine.target.token_bytes(t).decode() for t in r.token_ids]
        return pieces, [e.logprob for e in r.logprobs]

    def served(**body) -> tuple[list[str], list[float]]:  # noqa: ANN003
        r = client.completions.create(model="fixture", prompt=prompt, max_tokens=8, logprobs=0, **body)
        return r.choices[0].logprobs.tokens, r.choices[0].logprobs.token_logprobs

    prompt = "red, red, red, red, red, red,"
    base = served()
    assert base[0] == local(prompt)[0] and base[1] == pytest.approx(local(prompt)[1], abs=1e-5)
    assert len(set(base[0])) < len(base[0])  # the plain reply repeats its tokens
    for penalty in ({"repeat_penalty": 1.5, "repeat_last_n": 16}, {"presence_penalty": 2.0},
                    {"frequency_penalty": 2.0}):
        pen, mine = served(extra_body=penalty), local(prompt, **penalty)
        assert pen[0] == mine[0] and pen[1] == pytest.approx(mine[1], abs=1e-5), (penalty, pen, mine)
        if "repeat_penalty" in penalty:  # it counts the prompt's tokens too: the reply leaves them
            assert pen[0][0] != base[0][0], pen
            continue
        # OpenAI's penalties count the reply's own tokens: its first token is scored as without
        # them, the first token it repeats lower (the logprobs are after the penalties)
        assert pen[1][0] == base[1][0] and pen[0][:3] == base[0][:3], pen
        assert pen[1][2] < base[1][2] - 0.2, pen
        if "frequency_penalty" in penalty:  # growing with each repeat: the reply stops repeating
            assert pen[0] != base[0], pen
    assert served(presence_penalty=0.0, frequency_penalty=0.0) == base
    # and through the chat endpoint, both at once
    messages = [{"role": "user", "content": "List colours."}]
    r = client.chat.completions.create(model="fixture", max_tokens=8, presence_penalty=1.5,
                                       frequency_penalty=1.0, messages=messages, logprobs=True)
    mine = local(messages, presence_penalty=1.5, frequency_penalty=1.0)
    assert r.choices[0].message.content == "".join(mine[0])
    assert [t.logprob for t in r.choices[0].logprobs.content] == pytest.approx(mine[1], abs=1e-5)
    assert mine != local(messages)


@pytest.mark.parametrize("extra, fragment", [
    ({"tools": [{"type": "code_interpreter"}]}, "tools.0"),
    ({"tools": [{**WEATHER_TOOL, "function": {**WEATHER_TOOL["function"], "strict": True,
                                              "parameters": {"type": "nonsense"}}}]},
     "Invalid type: nonsense"),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "not in tools"),
    ({"tool_choice": "required"}, "tool_choice needs tools"),
    ({"functions": [WEATHER_TOOL["function"]]}, "unknown field 'functions'"),
    ({"top_logprobs": 2}, "top_logprobs needs logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": True, "method": "sprinter"}, "logprobs need an exact method"),
    ({"logprobs": True, "method": "draft"}, "logprobs need an exact method"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"repeat_penalty": 0}, "repeat_penalty"),
    ({"messages": [{"role": "user"}]}, "needs a content"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "only assistant"),
])
def test_tool_and_logprob_bad_requests(server: str, extra: dict, fragment: str) -> None:
    body = {"model": "fixture", "messages": ASK_WEATHER, "max_tokens": 2, **extra}
    r = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]["message"], r.json()
