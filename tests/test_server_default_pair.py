"""`sprinter-edge serve` on the real default pair (Qwen2.5-Coder 0.5B -> 1.5B) with the official
`openai` client: a two-step weather tool round trip, its stream, a forced call, and logprobs.
Bounded: greedy, at most 64 new tokens a request, `sd` (exact, so logprobs are allowed)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from support.server import TIMEOUT, running_server

pytestmark = pytest.mark.integration

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city name, e.g. Paris"}},
        "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
QUESTION = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


@pytest.fixture(scope="module")
def client(default_pair_paths: tuple[Path, Path], tmp_path_factory) -> Iterator:  # noqa: ANN001
    draft, target = default_pair_paths
    args = ["--target", str(target), "--draft", str(draft), "--method", "sd", "--verifier",
            "confidence", "--threads", "2", "--ctx", "2048", "--max-tokens", "64",
            "--model-name", "default"]
    with running_server(args, tmp_path_factory.mktemp("serve") / "server.log") as base:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT * 3)


def test_weather_round_trip(client) -> None:  # noqa: ANN001
    first = client.chat.completions.create(model="default", messages=QUESTION, tools=[WEATHER, TIME],
                                           max_tokens=64)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"].lower() == "paris"

    # the same request streamed: the same call, in tool_calls deltas
    stream = client.chat.completions.create(model="default", messages=QUESTION, tools=[WEATHER, TIME],
                                            max_tokens=64, stream=True)
    calls: dict[int, list[str]] = {}
    finish = None
    for ev in stream:
        for ch in ev.choices:
            finish = ch.finish_reason or finish
            for tc in ch.delta.tool_calls or ():
                calls.setdefault(tc.index, [tc.function.name or "", ""])
                calls[tc.index][1] += tc.function.arguments or ""
    assert finish == "tool_calls" and calls == {0: ["get_weather", call.function.arguments]}

    # step two: the tool's answer goes back; the model answers from it. tool_choice "none":
    # with "auto" this 1.5B model calls get_weather again after the result (measured: the prompt
    # is the template's own rendering, the model repeats the call), so the client asks for words.
    messages = [*QUESTION, choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id,
                 "content": json.dumps({"city": "Paris", "temperature_c": 17, "sky": "light rain"})}]
    second = client.chat.completions.create(model="default", messages=messages, tools=[WEATHER, TIME],
                                            tool_choice="none", max_tokens=64)
    answer = second.choices[0]
    assert not answer.message.tool_calls, answer
    assert "17" in answer.message.content and "rain" in answer.message.content.lower(), answer
    print(f"\ncall: {call.function.name}({call.function.arguments})\nanswer: {answer.message.content!r}")


def test_forced_call_and_logprobs(client) -> None:  # noqa: ANN001
    r = client.chat.completions.create(
        model="default", max_tokens=48, tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        messages=[{"role": "user", "content": "I am flying to Tokyo tomorrow."}])
    (call,) = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_time" and "tokyo" in json.loads(call.function.arguments)["city"].lower()

    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Say OK."}],
                                       max_tokens=8, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens and "".join(t.token for t in content) == \
        r.choices[0].message.content
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in content)


STRICT_WEATHER = {"type": "function", "function": {
    **WEATHER["function"], "strict": True,
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city name, e.g. Paris", "maxLength": 32},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}


def test_strict_tool_under_auto(client) -> None:  # noqa: ANN001
    """tool_choice "auto" with a strict tool: a call's arguments follow the tool's schema (the
    model left alone drops "unit"), and a question no tool answers still gets words."""
    for choice in ("auto", None):
        extra = {} if choice is None else {"tool_choice": choice}
        r = client.chat.completions.create(model="default", messages=QUESTION, max_tokens=64,
                                           tools=[STRICT_WEATHER, TIME], **extra)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", c
        (call,) = c.message.tool_calls
        assert call.function.name == "get_weather"
        args = json.loads(call.function.arguments)
        assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
        assert args["city"].lower() == "paris" and len(args["city"]) <= 32
    r = client.chat.completions.create(
        model="default", max_tokens=24, tools=[STRICT_WEATHER, TIME],
        messages=[{"role": "user", "content": "What is 2 + 3? Answer with the number only."}])
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length") and not c.message.tool_calls, c
    assert "5" in c.message.content
