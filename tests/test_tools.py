"""Tool calling without a model: the reply parser (whole and streamed) and the prompt side,
rendered through Qwen2.5-Coder's real chat template (copied from the GGUF) and SmolLM2's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sprinter_edge.serving.tools import (
    ToolCallError,
    ToolError,
    ToolStream,
    forced_prefix,
    parse_reply,
    render_messages,
    template_support,
)

# Qwen2.5-Coder-1.5B-Instruct's tokenizer.chat_template, as stored in its GGUF.
QWEN_TEMPLATE = (Path(__file__).parent / "data" / "qwen2.5-coder-chat-template.jinja").read_text()
SMOLLM2_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                    "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
                    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
                    "{{ '<|im_start|>assistant\n' }}{% endif %}")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18}'},
]


def render(template: str, messages: list[dict], tools: list[dict] | None) -> str:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    msgs, template_tools = render_messages(messages, tools, template_support(template))
    return Jinja2ChatFormatter(template=template, eos_token="", bos_token="")(
        messages=msgs, tools=template_tools).prompt


def test_template_support() -> None:
    assert template_support(QWEN_TEMPLATE) == "native"
    assert template_support(SMOLLM2_TEMPLATE) == "fallback"
    assert template_support(None) == "fallback"
    assert template_support("{% if tools %}[AVAILABLE_TOOLS]{% endif %}") == "unsupported"
    with pytest.raises(ToolError, match="tool-call format of its own"):
        render_messages(HISTORY, [WEATHER], "unsupported")


def test_qwen_template_renders_tools_calls_and_results() -> None:
    text = render(QWEN_TEMPLATE, HISTORY, [WEATHER])
    assert "# Tools" in text and json.dumps(WEATHER) in text  # key order kept, no HTML escaping
    # the earlier call as the model writes one (arguments an object, not a JSON string in a string)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert '<|im_start|>user\n<tool_response>\n{"temp_c": 18}\n</tool_response><|im_end|>' in text
    assert text.endswith("<|im_start|>assistant\n")
    # without tools (tool_choice none) the history still renders, with no tool list
    bare = render(QWEN_TEMPLATE, HISTORY, None)
    assert "# Tools" not in bare and "<tool_response>" in bare


def test_fallback_spells_the_convention_out() -> None:
    messages = [{"role": "system", "content": "Be brief."}, *HISTORY,
                {"role": "tool", "tool_call_id": "call_2", "content": "second"}]
    text = render(SMOLLM2_TEMPLATE, messages, [WEATHER])
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(WEATHER) in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call><|im_end|>') in text
    # consecutive tool results share one user turn
    assert ('<|im_start|>user\n<tool_response>\n{"temp_c": 18}\n</tool_response>\n'
            '<tool_response>\nsecond\n</tool_response><|im_end|>') in text


QWEN_REPLY = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("reply, content, calls", [
    ("Hello there.", "Hello there.", []),
    ("  a < b and <tool no  ", "  a < b and <tool no  ", []),
    (QWEN_REPLY, None, [("get_weather", {"city": "Paris"})]),
    ("Let me check.\n" + QWEN_REPLY, "Let me check.", [("get_weather", {"city": "Paris"})]),
    (QWEN_REPLY + "\n" + QWEN_REPLY.replace("Paris", "Rome"), None,
     [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]),
    # a stop at </tool_call> leaves the block open; its JSON is complete
    ('<tool_call>\n{"name": "f", "arguments": {}}', None, [("f", {})]),
    # arguments given as JSON text
    ('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', None, [("f", {"x": 1})]),
    # not JSON: given back as content
    ("<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", []),
    ('<tool_call>\n{"name": "f", "argu', '<tool_call>\n{"name": "f", "argu', []),
])
def test_parse_reply(reply: str, content: str | None, calls: list) -> None:
    parsed = parse_reply(reply)
    assert parsed.content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls
    assert all(c.id.startswith("call_") for c in parsed.calls)
    # streamed one character at a time: the same content and calls
    stream = ToolStream()
    events = [e for ch in reply for e in stream.feed(ch)] + stream.finish()
    text = "".join(v for k, v in events if k == "content")
    assert (text.strip() or None if calls else text) == content
    assert [(c.name, c.arguments) for k, c in events if k == "call"] == [
        (c.name, c.arguments) for c in parsed.calls]


BARE = '```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "Paris"}\n}\n```'


@pytest.mark.parametrize("reply, content, calls", [
    (BARE, None, [("get_weather", {"city": "Paris"})]),  # what Qwen2.5-Coder-1.5B writes
    ('{"name": "get_weather", "arguments": {"city": "Rome"}}', None, [("get_weather", {"city": "Rome"})]),
    ('  {"name": "get_weather", "arguments": {}}\n{"name": "get_weather", "arguments": {"city": "X"}}\nDone.',
     "Done.", [("get_weather", {}), ("get_weather", {"city": "X"})]),
    # not a call: another name, no arguments, other code, JSON that is data
    ('{"name": "launch", "arguments": {}}', '{"name": "launch", "arguments": {}}', []),
    ('{"name": "get_weather"}', '{"name": "get_weather"}', []),
    ("```python\nprint(1)\n```", "```python\nprint(1)\n```", []),
    ('{"id": 3, "name": "get_weather"}', '{"id": 3, "name": "get_weather"}', []),
    (BARE[:45], BARE[:45], []),  # cut off: not valid JSON
    ("{", "{", []),
])
def test_bare_json_calls(reply: str, content: str | None, calls: list) -> None:
    names = ["get_weather", "get_time"]
    parsed = parse_reply(reply, names=names)
    assert parsed.content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls
    stream = ToolStream(names=names)
    events = [e for ch in reply for e in stream.feed(ch)] + stream.finish()
    text = "".join(v for k, v in events if k == "content")
    assert (text.strip() or None if calls else text) == content
    assert [c.name for k, c in events if k == "call"] == [c.name for c in parsed.calls]
    # without the request's names nothing bare is a call
    assert parse_reply(reply).calls == []


def test_forced_calls() -> None:
    prefix = forced_prefix("get_weather")
    assert prefix == '<tool_call>\n{"name": "get_weather", "arguments": '
    parsed = parse_reply('{"city": "Oslo"}}\n</tool_call>', forced=["get_weather"], prefix=prefix)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("get_weather", {"city": "Oslo"})]
    # arguments that are not JSON stay the call's arguments text
    bad = parse_reply("{city: Oslo}}", forced=["get_weather"], prefix=prefix)
    assert [(c.name, c.arguments) for c in bad.calls] == [("get_weather", "{city: Oslo}")]
    # the wrapper's closing brace left out: the arguments object is still whole
    short = parse_reply('{"city": "Oslo"}\n</tool_call>', forced=["get_weather"], prefix=prefix)
    assert [(c.name, c.arguments) for c in short.calls] == [("get_weather", '{"city": "Oslo"}')]
    # required with several tools: the model names one of them, or the reply is an error
    multi = ["get_weather", "get_time"]
    ok = parse_reply('get_time", "arguments": {}}', forced=multi, prefix=forced_prefix(None))
    assert [c.name for c in ok.calls] == ["get_time"]
    with pytest.raises(ToolCallError, match="not one of the tools"):
        parse_reply('launch", "arguments": {}}', forced=multi, prefix=forced_prefix(None))
    with pytest.raises(ToolCallError):
        parse_reply("no idea", forced=multi, prefix=forced_prefix(None))
