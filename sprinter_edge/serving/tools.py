"""Tool (function) calling: tools into the prompt, `<tool_call>` blocks out of the reply.

The convention is Hermes / Qwen2.5's, which Qwen2.5-Coder's own chat template (in the GGUF)
uses: the tools are listed as JSON in the system message, and the model answers a call with

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

- A template that formats tools this way (it mentions `tools` and `<tool_call>`) gets the
  tools, the assistant's earlier `tool_calls` and the `tool` messages as they are: the
  template renders them (`render_messages`).
- A template that knows nothing of tools (no `tools` in it, e.g. SmolLM2's) gets the same
  convention spelled out by hand: the tool list in the system message, earlier calls as
  `<tool_call>` text in the assistant's turn, tool results as `<tool_response>` text in a user
  turn (what llama.cpp's server does for templates without tool support).
- A template with a tool format of its own (Llama 3.1's, Mistral's, ...) is refused
  (`ToolError`): this parser reads `<tool_call>` blocks only.

Small models do not always write the tags: Qwen2.5-Coder-1.5B often answers a call as a bare
(or ```json-fenced) `{"name": ..., "arguments": ...}` object. A reply that starts with such an
object naming one of the request's tools is taken as a call too (llama.cpp's Hermes parser
accepts the same); one naming anything else is content.

A named `tool_choice` forces the call, and `required` one call of any tool: the server
constrains the whole reply to a `<tool_call>` block (grammar.Constraint.from_tool_choice), whose
fixed text, up to the name when only one can follow, the grammar forces without asking the
model; a strict tool's arguments follow its schema. `forced_prefix` is that opening as text, for
a reply started by hand. Under "auto" with at least one strict tool the reply is constrained too:
free text with no `<tool_call>` in it, or free text and then blocks shaped as above; neither may
open as a bare call, which would escape the grammar.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import SettingsError

log = logging.getLogger(__name__)

OPEN, CLOSE = "<tool_call>", "</tool_call>"

Support = Literal["native", "fallback", "unsupported"]


class ToolError(SettingsError):
    """A tool request this server cannot honour with this model (a 400)."""


def template_support(template: str | None) -> Support:
    """How tools reach this chat template (see the module docstring)."""
    if not template or "tools" not in template:
        return "fallback"
    return "native" if OPEN in template else "unsupported"


# ---------------------------------------------------------------------------- the prompt


def _arguments_object(arguments: Any) -> Any:
    """The arguments of an earlier call as the template's `tojson` should print them: the
    object when OpenAI's JSON text parses, else the text itself."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def call_text(name: str, arguments: Any) -> str:
    """One call in the Hermes / Qwen convention (what the native template prints)."""
    args = json.dumps(_arguments_object(arguments), ensure_ascii=False)
    return f'{OPEN}\n{{"name": "{name}", "arguments": {args}}}\n{CLOSE}'


def tools_system_text(tools: Sequence[dict[str, Any]]) -> str:
    """The tool list for a template without tool support (Qwen2.5's wording)."""
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{listing}\n</tools>\n\nFor each function call, return a json object with "
            "function name and arguments within <tool_call></tool_call> XML tags:\n"
            f'{OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CLOSE}')


def render_messages(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None,
                    support: Support) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """OpenAI messages (role, content text, tool_calls, tool_call_id) -> the messages and the
    tools to hand the chat template. `tools` None: the template is not told of any tool."""
    if support == "unsupported" and (tools or needs_tool_rendering(messages)):
        raise ToolError("this model's chat template has a tool-call format of its own; the "
                        "server reads the <tool_call> convention (Hermes, Qwen2.5) only")
    if support == "native":
        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [{"type": "function", "id": c.get("id"), "function": {
                    "name": c["function"]["name"],
                    "arguments": _arguments_object(c["function"]["arguments"])}}
                    for c in m["tool_calls"]]
            m["content"] = m.get("content") or ""
            out.append(m)
        return out, list(tools) if tools else None
    # fallback: spell the convention out in plain messages
    out = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(call_text(c["function"]["name"], c["function"]["arguments"])
                              for c in m["tool_calls"])
            out.append({"role": "assistant", "content": f"{content}\n{calls}" if content else calls})
        elif role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append({"role": role, "content": content})
    for m in out:
        m.pop("_tool_results", None)
    if tools:
        text = tools_system_text(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out, None


def tool_prompt(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None,
                engine: Any) -> list[int]:
    """The prompt of a request with tools or tool turns, as tokens: its messages rendered with the
    model's own template (the worker runs it: a PromptBuilder, given as a partial over this)."""
    from ..prompting import prompt_tokens, render_chat

    model = engine.text_model
    msgs, template_tools = render_messages(messages, tools, template_support(model.chat_template))
    return prompt_tokens(model, render_chat(model, msgs, tools=template_tools), chat_rendered=True)


def _tool_related(m: dict[str, Any]) -> bool:
    return m.get("role") == "tool" or bool(m.get("tool_calls"))


def needs_tool_rendering(messages: Sequence[dict[str, Any]]) -> bool:
    """Whether the messages carry earlier calls or tool results."""
    return any(_tool_related(m) for m in messages)


def forced_prefix(name: str | None) -> str:
    """The start of the assistant's reply that forces a call (of `name`, or of a tool the
    model names when None)."""
    if name is None:
        return f'{OPEN}\n{{"name": "'
    return f'{OPEN}\n{{"name": "{name}", "arguments": '


# ---------------------------------------------------------------------------- the reply


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "type": "function",
                             "function": {"name": self.name, "arguments": self.arguments}}
        return d if index is None else {"index": index, **d}


class ToolCallError(Exception):
    """The model's reply to a forced call is not a call (the server answers 500)."""


def _holdback(text: str) -> int:
    """Length of the longest suffix of text that could still grow into OPEN."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:n]):
            return n
    return 0


def _parse_block(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            json.loads(args)
        except ValueError:
            args = json.dumps(args, ensure_ascii=False)
        text = args
    else:
        text = json.dumps(args, ensure_ascii=False)
    return ToolCall(obj["name"], text)


Event = tuple[str, Any]  # ("content", str) | ("call", ToolCall)


def _bare_start(text: str, names: Sequence[str]) -> bool | None:
    """Whether `text` starts a bare call of one of `names`: optional whitespace, an optional
    ``` or ```json fence, then `{"name": "NAME"`. None: cannot tell yet (a prefix of one)."""
    n = len(text)

    def ws(i: int) -> int:
        while i < n and text[i].isspace():
            i += 1
        return i

    i = ws(0)
    if i == n:
        return None
    if text[i] == "`":
        fence = text[i:i + 3]
        if not "```".startswith(fence):
            return False
        if len(fence) < 3:
            return None
        j = i + 3
        while j < n and text[j].isalpha():
            j += 1
        lang = text[i + 3:j].lower()
        if j == n:
            return None if "json".startswith(lang) else False
        if lang not in ("", "json"):
            return False
        i = ws(j)
        if i == n:
            return None
    if text[i] != "{":
        return False
    i = ws(i + 1)
    key = '"name"'
    seg = text[i:i + len(key)]
    if not key.startswith(seg):
        return False
    if len(seg) < len(key):
        return None
    i = ws(i + len(key))
    if i == n:
        return None
    if text[i] != ":":
        return False
    i = ws(i + 1)
    if i == n:
        return None
    if text[i] != '"':
        return False
    end = text.find('"', i + 1)
    if end < 0:
        return None if any(name.startswith(text[i + 1:]) for name in names) else False
    return text[i + 1:end] in names


def _bare_calls(text: str, names: Sequence[str]) -> tuple[list[ToolCall], str] | None:
    """The calls of a bare reply (objects one after another, fenced or not) and the text
    after them; None when it does not parse as calls of `names`."""
    s = text.strip()
    if s.startswith("```"):
        s = s[s.find("\n") + 1:] if "\n" in s else ""
        fence = s.rfind("```")
        s = s[:fence] if fence >= 0 else s
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    rest = s.strip()
    while rest.startswith("{"):
        try:
            obj, end = decoder.raw_decode(rest)
        except ValueError:
            break
        call = _parse_block(json.dumps(obj)) if isinstance(obj, dict) else None
        if call is None or call.name not in names or not ({"arguments", "parameters"} & set(obj)):
            break
        calls.append(call)
        rest = rest[end:].strip()
    if not calls:
        return None
    return calls, rest


class ToolStream:
    """Splits a reply, fed piece by piece, into content text and tool calls.

    Text that could be the start of `<tool_call>` is held back until it is known not to be;
    a call is emitted when its block closes (or, at `finish`, when the reply ends inside a
    block whose JSON is complete: a stop at `</tool_call>` leaves it so). A block whose JSON
    does not parse is given back as content, unless the call was forced (`forced`: the
    names the reply may call); then the call keeps the text as its arguments (OpenAI: "the
    model does not always generate valid JSON"), or, with no known name to go by (or a call
    of a name not in `forced`), ToolCallError."""

    def __init__(self, *, forced: Sequence[str] | None = None, prefix: str = "",
                 names: Sequence[str] = ()):
        self.forced = list(forced) if forced is not None else None
        self.names = list(names)  # the request's tools: a bare call of one of them counts
        self.calls: list[ToolCall] = []
        self._buf = ""
        self._in_call = False
        # at the reply's start, with names and nothing forced: could it be a bare call?
        self._lead: bool | None = None if self.names and self.forced is None and not prefix else False
        self._pending_space = ""  # whitespace after a call: dropped unless more text follows
        self._cut = False  # the reply was cut by max_tokens (set by finish)
        self._events: list[Event] = []
        if prefix:
            self._events = self.feed(prefix)

    def feed(self, text: str) -> list[Event]:
        events, self._events = self._events, []
        self._buf += text
        if self._lead is None:
            self._lead = _bare_start(self._buf, self.names)
        if self._lead is not False:  # undecided, or a bare call: held to the end
            return events
        while True:
            if self._in_call:
                j = self._buf.find(CLOSE)
                if j < 0:
                    break
                self._close(self._buf[:j], events)
                self._buf = self._buf[j + len(CLOSE):]
                continue
            i = self._buf.find(OPEN)
            if i >= 0:
                self._content(self._buf[:i], events)
                self._buf = self._buf[i + len(OPEN):]
                self._in_call = True
                continue
            hold = _holdback(self._buf)
            self._content(self._buf[:len(self._buf) - hold], events)
            self._buf = self._buf[len(self._buf) - hold:]
            break
        return events

    def finish(self, *, cut: bool = False) -> list[Event]:
        """The events the reply's end releases. `cut`: the token budget ended the reply, so a
        forced call's block that is not a call comes back as content, not ToolCallError."""
        self._cut = cut
        if self._lead is not False:
            bare = _bare_calls(self._buf, self.names) if self._lead else None
            self._lead = False
            if bare is not None:
                calls, rest = bare
                events = list(self._events)
                self._events = []
                for call in calls:
                    self.calls.append(call)
                    events.append(("call", call))
                self._buf = ""
                self._content(rest, events)
                return events
        events = self.feed("")
        if self._in_call:
            self._close(self._buf, events, at_end=True)
        else:
            self._content(self._buf, events)
        self._buf = ""
        return events

    def _content(self, text: str, events: list[Event]) -> None:
        if not text:
            return
        if self.calls:  # after a call: keep whitespace only if text follows it
            text = self._pending_space + text
            self._pending_space = ""
            if not text.strip():
                self._pending_space = text
                return
        events.append(("content", text))

    def _close(self, body: str, events: list[Event], *, at_end: bool = False) -> None:
        self._in_call = False
        call = _parse_block(body.strip())
        if call is None and self.forced is not None:
            try:
                call = self._forced_call(body)
            except ToolCallError:
                if not (at_end and self._cut):
                    raise
        if call is None:
            events.append(("content", OPEN + body + ("" if at_end else CLOSE)))
            return
        if self.forced is not None and call.name not in self.forced:
            raise ToolCallError(f"the model called {call.name!r}, not one of the tools: "
                                f"{', '.join(self.forced)}")
        self.calls.append(call)
        events.append(("call", call))

    def _forced_call(self, body: str) -> ToolCall:
        """A forced call whose JSON does not parse: the name from the forced prefix, the rest
        as the arguments text."""
        assert self.forced is not None
        head = '{"name": "'
        text = body.strip()
        if text.startswith(head):
            name, sep, rest = text[len(head):].partition('"')
            if sep and name in self.forced:
                rest = rest.lstrip()
                if rest.startswith(","):
                    rest = rest[1:].lstrip()
                if rest.startswith('"arguments":'):
                    rest = rest[len('"arguments":'):].strip()
                # the arguments are the rest less the wrapper's closing brace, unless the model
                # left that brace out
                inner = rest[:-1].rstrip() if rest.endswith("}") else rest
                for text in (inner, rest):
                    try:
                        json.loads(text)
                    except ValueError:
                        continue
                    return ToolCall(name, text)
                return ToolCall(name, inner)
        raise ToolCallError(f"the model did not write a call of {', '.join(self.forced)}: "
                            f"{(OPEN + body)[:200]!r}")


@dataclass
class ParsedReply:
    content: str | None
    calls: list[ToolCall]


def parse_reply(text: str, *, forced: Sequence[str] | None = None, prefix: str = "",
                names: Sequence[str] = (), cut: bool = False) -> ParsedReply:
    """A whole reply -> content and calls (the same split `ToolStream` makes piece by piece).
    With calls, the content around them is stripped and None when empty; without any, the
    content is the reply unchanged. `cut`: see `ToolStream.finish`."""
    stream = ToolStream(forced=forced, prefix=prefix, names=names)
    events = stream.feed(text) + stream.finish(cut=cut)
    content = "".join(v for k, v in events if k == "content")
    if stream.calls:
        return ParsedReply(content.strip() or None, stream.calls)
    return ParsedReply(content, [])
