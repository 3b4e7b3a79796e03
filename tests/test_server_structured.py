"""Structured output and Predicted Outputs through the server, with the official `openai` client
against `sprinter-edge serve` on the fixture pair (SmolLM2-135M and its first 20 blocks).

The replies are checked by hand against what was asked (a schema's fields and types, a
grammar's words, a tool's required keys): the constraint, not the model, makes them valid.
The request-side checks at the top need no model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support.server import TIMEOUT, fixture_server_args, running_server

from sprinter_edge.decoding import SamplingParams
from sprinter_edge.serving.handlers import plan_chat
from sprinter_edge.serving.jobs import request_params
from sprinter_edge.serving.responses import ApiError  # noqa: E402
from sprinter_edge.serving.schemas import ChatCompletionRequest, CompletionRequest  # noqa: E402
from sprinter_edge.serving.tools import ToolCallError, parse_reply  # noqa: E402

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "colour": {"enum": ["red", "green", "blue"]}},
    "required": ["name", "age", "colour"], "additionalProperties": False}
PERSON_FORMAT = {"type": "json_schema",
                 "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
ASK_PERSON = [{"role": "user", "content": "Describe a person as JSON: name, age, favourite colour."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city", "strict": True,
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 24},
                                  "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
YES_NO = 'root ::= "yes" | "no"'


# ---------------------------------------------------------------------------- the request side

def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **fields)


def test_fields_become_the_constraint_and_prediction() -> None:
    params, _ = request_params(chat(response_format=PERSON_FORMAT), SamplingParams())
    assert params.constraint is not None and params.constraint.schema == PERSON
    assert params.constraint.strict
    params, _ = request_params(chat(response_format={"type": "text"}), SamplingParams())
    assert params.constraint is None
    params, _ = request_params(CompletionRequest(prompt="x", grammar=YES_NO), SamplingParams())
    assert params.constraint is not None and params.constraint.type == "gbnf"
    params, _ = request_params(CompletionRequest(prompt="x", json_schema=PERSON), SamplingParams())
    assert params.constraint is not None and not params.constraint.strict  # llama.cpp's field
    parts = {"type": "content", "content": [{"type": "text", "text": "a = 1\n"},
                                            {"type": "text", "text": "b = 2\n"}]}
    params, _ = request_params(chat(prediction=parts), SamplingParams())
    assert params.prediction == "a = 1\nb = 2\n"


def test_a_forced_call_is_the_grammar_not_a_prompt_prefix() -> None:
    req = ChatCompletionRequest(messages=ASK_WEATHER, tools=[WEATHER],
                                tool_choice={"type": "function", "function": {"name": "get_weather"}})
    plan = plan_chat(req)
    assert plan.constraint is not None and plan.constraint.name == "tool_call"
    assert plan.one_call and plan.forced == ["get_weather"]
    # "auto" with a strict tool: calls or free text, both shaped by the grammar; a
    # response_format shapes the reply instead; without a strict tool nothing is constrained
    auto = plan_chat(ChatCompletionRequest(messages=ASK_WEATHER, tools=[WEATHER]))
    assert auto.constraint is not None and not auto.one_call and auto.forced is None
    assert plan_chat(ChatCompletionRequest(messages=ASK_WEATHER, tools=[WEATHER],
                                           response_format=PERSON_FORMAT)).constraint is None
    loose = {**WEATHER, "function": {**WEATHER["function"], "strict": False}}
    assert plan_chat(ChatCompletionRequest(messages=ASK_WEATHER, tools=[loose])).constraint is None


def test_a_forced_call_cut_before_its_name_is_content() -> None:
    """max_tokens may end a forced call anywhere: the reply is "length", never a 500."""
    cut = '<tool_call>\n{"name": "get_we'
    with pytest.raises(ToolCallError):
        parse_reply(cut, forced=["get_weather"])
    parsed = parse_reply(cut, forced=["get_weather"], cut=True)
    assert parsed.calls == [] and parsed.content == cut
    # with the name written, the arguments come back as written
    parsed = parse_reply('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',
                         forced=["get_weather"], cut=True)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", '{"city": "Pa')]


@pytest.mark.parametrize("fields, param, fragment", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "bad", "schema": {"type": "nonsense"}}}}, "response_format", "Invalid type: nonsense"),
    ({"response_format": {"type": "xml"}}, "response_format", "unsupported response_format type"),
    ({"json_schema": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}}, "json_schema",
     "does not exist"),
    ({"grammar": "root ::= foo"}, "grammar", "Rule 'foo' not found"),
    ({"grammar": YES_NO, "json_schema": PERSON}, "grammar", "send one of"),
    ({"response_format": PERSON_FORMAT, "tools": [WEATHER], "tool_choice": "required"},
     "response_format", "forces a call"),
    ({"tools": [{**WEATHER, "function": {**WEATHER["function"], "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "pattern": "(?<=a)b"}}}}}]},
     "tools[0].function.parameters", "look-around"),
])
def test_bad_constraints_are_400_naming_the_field(fields: dict[str, Any], param: str,
                                                  fragment: str) -> None:
    with pytest.raises(ApiError) as info:
        req = chat(**fields)
        request_params(req, SamplingParams(), tool_constraint=plan_chat(req).constraint)
    assert info.value.status == 400 and info.value.param == param
    assert fragment in info.value.message


# ---------------------------------------------------------------------------- a live server

@pytest.fixture(scope="module")
def server(fixture_target_path: Path, fixture_draft_path: Path, tmp_path_factory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("serve-structured") / "server.log"
    with running_server(fixture_server_args(fixture_target_path, fixture_draft_path, 96), log) as base:
        yield base


@pytest.fixture(scope="module")
def client(server: str):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)


@pytest.mark.slow
def test_response_format_json_schema(client) -> None:
    r = client.chat.completions.create(model="fixture", messages=ASK_PERSON,
                                       response_format=PERSON_FORMAT, max_tokens=96)
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    person = json.loads(choice.message.content)
    assert list(person) == ["name", "age", "colour"]
    assert isinstance(person["name"], str) and len(person["name"]) <= 16
    assert isinstance(person["age"], int) and 0 <= person["age"] <= 120
    assert person["colour"] in ("red", "green", "blue")
    extra = r.model_extra["decoding"]
    assert extra["forced"] > 0  # `{"name": "` and the like cost no target call
    assert {"grammar_proposed", "grammar_accepted"} <= extra.keys()
    # the same schema streamed: the same text
    stream = client.chat.completions.create(model="fixture", messages=ASK_PERSON,
                                            response_format=PERSON_FORMAT, max_tokens=96, stream=True)
    text = "".join(c.delta.content or "" for ev in stream for c in ev.choices)
    assert text == choice.message.content
    # logprobs come from the target's masked rows, forced tokens included
    r = client.chat.completions.create(model="fixture", messages=ASK_PERSON, logprobs=True,
                                       response_format=PERSON_FORMAT, max_tokens=96)
    content = r.choices[0].logprobs.content
    assert r.choices[0].message.content == choice.message.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(t.token for t in content) == choice.message.content


def test_a_reply_cut_by_max_tokens_is_length(client) -> None:
    r = client.chat.completions.create(model="fixture", messages=ASK_PERSON,
                                       response_format=PERSON_FORMAT, max_tokens=4)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4


def test_response_format_json_object(client) -> None:
    messages = [{"role": "user", "content": 'Reply with a JSON object like {"ok": true}.'}]
    r = client.chat.completions.create(model="fixture", messages=messages,
                                       response_format={"type": "json_object"}, max_tokens=96)
    assert r.choices[0].finish_reason == "stop", r.choices[0]
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.slow
def test_strict_tool_named_choice(client) -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(model="fixture", messages=ASK_WEATHER, tools=[WEATHER],
                                       tool_choice=choice, max_tokens=64)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    (call,) = c.message.tool_calls
    assert call.function.name == "get_weather" and c.message.content is None
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "unit"} and isinstance(args["city"], str) and args["unit"] in "CF"
    stream = client.chat.completions.create(model="fixture", messages=ASK_WEATHER, tools=[WEATHER],
                                            tool_choice=choice, max_tokens=64, stream=True)
    calls = [tc for ev in stream for ch in ev.choices for tc in ch.delta.tool_calls or ()]
    assert [(tc.function.name, tc.function.arguments) for tc in calls] == [
        ("get_weather", call.function.arguments)]


def test_required_tool_choice_is_a_call(client) -> None:
    plain = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string", "maxLength": 24}}}}}
    r = client.chat.completions.create(model="fixture", messages=ASK_WEATHER,
                                       tools=[WEATHER, plain], tool_choice="required", max_tokens=64)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    (call,) = c.message.tool_calls
    assert call.function.name in ("get_weather", "get_time")
    assert isinstance(json.loads(call.function.arguments), dict)


def test_llama_cpp_grammar_on_completions(client, server: str) -> None:
    r = client.completions.create(model="fixture", prompt="Is the sky blue? Answer yes or no:",
                                  max_tokens=8, extra_body={"grammar": YES_NO})
    assert r.choices[0].text in ("yes", "no") and r.choices[0].finish_reason == "stop"
    body = {"prompt": "Name a colour:", "max_tokens": 32, "json_schema": {"enum": ["red", "blue"]}}
    r2 = httpx.post(f"{server}/v1/completions", json=body, timeout=TIMEOUT).json()
    assert json.loads(r2["choices"][0]["text"]) in ("red", "blue")


def test_invalid_schema_is_a_bad_request(client, server: str) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "nonsense"}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="fixture", messages=ASK_PERSON, response_format=bad)
    error = info.value.body
    assert "Invalid type: nonsense" in error["message"] and error["param"] == "response_format"
    r = httpx.post(f"{server}/v1/completions", timeout=TIMEOUT,
                   json={"prompt": "x", "grammar": "root ::= foo"})
    assert r.status_code == 400 and "Rule 'foo' not found" in r.json()["error"]["message"]
    # the server is still serving
    ok = client.completions.create(model="fixture", prompt="Hi", max_tokens=2)
    assert ok.choices[0].text is not None


@pytest.mark.slow
def test_prediction_counts_and_leaves_the_text_unchanged(
        client, fixture_engine, fixture_target_path: Path, fixture_draft_path: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    code = "def add(a, b):\n    return a + b\n"
    messages = [{"role": "user", "content": f"Repeat this code exactly:\n{code}"}]
    for method in ("sd", "lookup"):
        plain = client.chat.completions.create(model="fixture", messages=messages, max_tokens=32,
                                               extra_body={"method": method})
        assert plain.usage.completion_tokens_details is None
        for content in (code, [{"type": "text", "text": code}]):
            r = client.chat.completions.create(model="fixture", messages=messages, max_tokens=32,
                                               prediction={"type": "content", "content": content},
                                               extra_body={"method": method})
            assert r.choices[0].message.content == plain.choices[0].message.content
            details = r.usage.completion_tokens_details
            assert details is not None
            accepted, rejected = details.accepted_prediction_tokens, details.rejected_prediction_tokens
            assert accepted >= 0 and rejected >= 0 and accepted + rejected > 0
            assert accepted <= r.usage.completion_tokens
            extra = r.model_extra["decoding"]
            assert (extra["accepted_prediction_tokens"], extra["rejected_prediction_tokens"]) == (
                accepted, rejected)
        # a prediction of exactly what the model writes greedily: every one of its tokens is
        # found in the reply, which is the plain reply
        written = plain.choices[0].message.content
        r = client.chat.completions.create(model="fixture", messages=messages, max_tokens=32,
                                           prediction={"type": "content", "content": written},
                                           extra_body={"method": method})
        assert r.choices[0].message.content == written
        details = r.usage.completion_tokens_details
        assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (
            r.usage.completion_tokens, 0)
    _a_perfect_prediction_is_copied(fixture_engine, fixture_target_path, fixture_draft_path, tmp_path,
                                    monkeypatch)
    stream = client.chat.completions.create(model="fixture", messages=messages, max_tokens=32,
                                            prediction={"type": "content", "content": code},
                                            stream=True, stream_options={"include_usage": True})
    usage = [ev.usage for ev in stream if ev.usage is not None][-1]
    assert usage.completion_tokens_details.accepted_prediction_tokens == accepted


def _a_perfect_prediction_is_copied(fixture_engine, target: Path, draft: Path, tmp_path: Path,  # noqa: ANN001
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Over HTTP, `lookup` with a prediction of exactly what the model writes greedily to a
    prompt with nothing to copy: the reply is the plain one, every copied token is accepted, and
    the target writes only the first tokens (until the reply has a suffix to look up) and one
    token per call after an accepted copy. On a server of its own whose cost table makes every
    copy pay (a call costs the same whatever its size): whether a copy is worth a call on this
    machine is its timing, not what this checks."""
    from support.costs import flat

    from sprinter_edge.costs.table import store_costs
    from sprinter_edge.decoding.proposers.prompt_lookup import MIN_MATCH

    monkeypatch.setenv("SPRINTER_EDGE_CACHE", str(tmp_path / "cache"))  # the server's too
    store_costs(fixture_engine.target, flat())  # loaded as `serve` loads it: the same cost key
    messages = [{"role": "user", "content": "Write a short poem about the sea."}]
    with running_server(fixture_server_args(target, draft, 32), tmp_path / "serve.log") as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT)
        written = client.chat.completions.create(model="fixture", messages=messages, max_tokens=32,
                                                 extra_body={"method": "lookup"}).choices[0].message.content
        r = client.chat.completions.create(model="fixture", messages=messages, max_tokens=32,
                                           prediction={"type": "content", "content": written},
                                           extra_body={"method": "lookup"})
    assert r.choices[0].message.content == written
    n, extra = r.usage.completion_tokens, r.model_extra["decoding"]
    eog = 1 if r.choices[0].finish_reason == "stop" else 0  # the end token: generated, not text
    assert (extra["accepted_prediction_tokens"], extra["rejected_prediction_tokens"]) == (n, 0)
    assert extra["copied_tokens"] == extra["copied_accepted"] == extra["accepted"], extra
    assert extra["resampled"] == 0 and extra["target_sampled"] <= MIN_MATCH, extra
    assert extra["accepted"] + extra["bonus"] + extra["target_sampled"] == n + eog, extra
    assert extra["bonus"] <= extra["drafts"], extra  # one a tested copy, where all of it passed
