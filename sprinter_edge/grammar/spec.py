"""What a request constrains its reply to: a JSON schema, any JSON object, a regex, a Lark or a
GBNF grammar; built from OpenAI's `response_format` and from forced tool calls.

A `Constraint` is model-independent and hashable (a schema is kept as its JSON text, key order
preserved: llguidance emits properties in the schema's order). Every constructor compiles the
grammar once without a tokenizer, so a bad schema or grammar is refused when the request is read
(`GrammarError`, a 400), not halfway through decoding.

JSON whitespace. llguidance's default lets any run of whitespace sit between JSON tokens; a small
model can then write newlines until max_tokens. The default here allows what pretty-printed JSON
needs (one space, or one or two newlines and an indent of up to 40 blanks), as llama.cpp's
json-schema-to-grammar does; a schema's own `"x-guidance"` key overrides it.

Tool calls (`from_tool_choice`). sprinter_edge/serving/tools.py reads Hermes / Qwen2.5 calls,

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

and `call_text` renders earlier calls exactly so (json.dumps separators ", " and ": "). The
constraint covers the WHOLE reply from its first byte: one block (a named tool_choice), or one
or more blocks joined by "\\n" (`required`; one only with `parallel=False`), each block's JSON
an object whose "name" is one of the tools and whose "arguments" follow that tool's parameters,
written compactly with the rendered separators, so the text is what the model saw in its prompt
and what tools.py parses. Nothing is lost by constraining from the start: where the grammar leaves
one choice (`<tool_call>\\n{"name": "` and, for one tool, its name and `", "arguments": `) the
matcher's fast-forward tokens give that text for free, the job `tools.forced_prefix` does by
hand. Under tool_choice "auto" with a strict tool, the reply is free text that holds no
`<tool_call>` (nor opens as a bare `{"name": ...}` call), or free text up to the first
`<tool_call>` and then blocks as for "required". A reply already started with a forced prefix
is fed to the matcher first (`Matcher.consume_text`). `<tool_call>` is a literal string here:
engine.py builds the token table so that Qwen's single `<tool_call>` token and its spelling in
pieces both match it (so the free text's grammar, not the token table, keeps it out).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import llguidance
from llguidance.gbnf_to_lark import gbnf_to_lark

from ..errors import GrammarError

log = logging.getLogger(__name__)

# a constraint's type: response_format's "type" names the first two (OpenAI's "text" is no constraint)
ConstraintType = Literal["json_schema", "json_object", "regex", "lark", "gbnf"]
TYPES: tuple[str, ...] = ("json_schema", "json_object", "regex", "lark", "gbnf")

# one space, or one or two newlines and an indent (see the module docstring)
JSON_WHITESPACE = r"(?:\x20|\r?\n(?:\r?\n)?[\x20\t]{0,40})"
JSON_DEFAULTS: dict[str, Any] = {"whitespace_pattern": JSON_WHITESPACE}
# a tool call's JSON as tools.call_text writes it
CALL_JSON_FORMAT: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ",
                                    "key_separator": ": "}
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"  # = serving.tools.OPEN / CLOSE

_GBNF_RULE = re.compile(r"(?m)^\s*[A-Za-z][A-Za-z0-9_-]*\s*::=")
_LARK_START = re.compile(r"(?m)^\s*(%llguidance\b|start\s*:(?!:=))")
MAX_MESSAGE = 400


def one_line(message: str) -> str:
    """llguidance's reason on one line, cut to a readable length."""
    text = " ".join(str(message).split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."


def check_grammar(grammar: str, tokenizer: llguidance.LLTokenizer | None, what: str, *,
                  limits: llguidance.LLParserLimits | None = None) -> None:
    """Compile an llguidance grammar (with the tokenizer when given: special tokens resolve
    then); GrammarError with llguidance's reason if it does not."""
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        grammar, tokenizer, limits=limits)
    if is_error:
        raise GrammarError(f"invalid {what}: {one_line(messages[0] if messages else 'unknown error')}")
    for m in messages:  # without a tokenizer, e.g. "can't validate <special_token>": not news
        log.log(logging.WARNING if tokenizer is not None else logging.DEBUG, "%s: %s", what, one_line(m))


@dataclass(frozen=True)
class Constraint:
    """One structured-output constraint. `source`: the schema's JSON text (json_schema), the
    regex, or the grammar text (lark, gbnf); empty for json_object. `strict`: JSON schema
    keywords llguidance does not implement are an error; with False they are ignored."""

    type: ConstraintType
    source: str = ""
    strict: bool = True
    name: str | None = None  # response_format's schema name / "tool_call": messages only
    _grammar: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise GrammarError(f"unknown constraint type {self.type!r} (one of {', '.join(TYPES)})")
        grammar = self._build()
        check_grammar(grammar, None, self.describe())
        object.__setattr__(self, "_grammar", grammar)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | bool | str, *, strict: bool = True,
                    name: str | None = None) -> Constraint:
        """A JSON schema (a dict, or its JSON text)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise GrammarError(f"the JSON schema is not JSON: {one_line(str(exc))}") from exc
        if not isinstance(schema, (Mapping, bool)):
            raise GrammarError(f"a JSON schema is an object or a boolean, not {type(schema).__name__}")
        try:
            text = json.dumps(schema, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise GrammarError(f"the JSON schema is not JSON-serialisable: {exc}") from exc
        return cls("json_schema", text, strict=strict, name=name)

    @classmethod
    def json_object(cls) -> Constraint:
        """Any JSON object (OpenAI's `{"type": "json_object"}`)."""
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        """The whole reply matches `pattern` (Rust regex syntax, no lookarounds)."""
        if not isinstance(pattern, str):
            raise GrammarError("a regex is a string")
        return cls("regex", pattern)

    @classmethod
    def grammar(cls, text: str, syntax: Literal["gbnf", "lark"] | None = None) -> Constraint:
        """A llama.cpp GBNF grammar (`root ::= ...`) or an llguidance Lark grammar
        (`start: ...`); `syntax` None tells them apart by those rule forms."""
        if not isinstance(text, str) or not text.strip():
            raise GrammarError("the grammar is empty")
        if syntax is None:
            if _GBNF_RULE.search(text):
                syntax = "gbnf"
            elif _LARK_START.search(text):
                syntax = "lark"
            else:
                raise GrammarError("cannot tell the grammar's syntax: a GBNF grammar has a "
                                   "`root ::= ...` rule, a Lark grammar a `start: ...` rule")
        if syntax not in ("gbnf", "lark"):
            raise GrammarError(f"unknown grammar syntax {syntax!r} (gbnf or lark)")
        return cls(syntax, text)

    @classmethod
    def from_response_format(cls, obj: Mapping[str, Any] | None) -> Constraint | None:
        """OpenAI's `response_format`: `{"type": "text"}` (None), `{"type": "json_object"}`, or
        `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": b}}`.
        Also llama.cpp server's `{"type": "json_object", "schema": {...}}`."""
        if obj is None:
            return None
        if not isinstance(obj, Mapping):
            raise GrammarError("response_format must be an object")
        type_ = obj.get("type")
        if type_ == "text":
            return None
        if type_ == "json_object":
            schema = obj.get("schema")
            return cls.json_object() if schema is None else cls.json_schema(schema)
        if type_ == "json_schema":
            spec = obj.get("json_schema")
            if not isinstance(spec, Mapping):
                raise GrammarError('response_format of type "json_schema" needs a "json_schema" '
                                   "object with the schema")
            schema = spec.get("schema")
            strict = bool(spec.get("strict") or False)
            name = spec.get("name") if isinstance(spec.get("name"), str) else None
            if schema is None:  # OpenAI: the schema is optional; no schema, any JSON object
                return cls("json_object", strict=strict, name=name)
            return cls.json_schema(schema, strict=strict, name=name)
        raise GrammarError(f"unsupported response_format type {type_!r} "
                           "(text, json_object or json_schema)")

    @classmethod
    def tool_arguments(cls, tool: Mapping[str, Any]) -> Constraint:
        """The arguments object of one call of `tool` (an OpenAI tool or its "function"),
        written as tools.call_text writes it."""
        name, params, strict = _tool_parts(tool)
        schema = {**params, "x-guidance": {**CALL_JSON_FORMAT, **({} if strict else {"lenient": True})}}
        return cls.json_schema(schema, strict=strict, name=name)

    @classmethod
    def from_tool_choice(cls, tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any,
                         *, parallel: bool = True) -> Constraint | None:
        """The reply's text when tool_choice forces a call (see the module docstring): a named
        function, one call of it; "required", one or more calls (`parallel`) of any tool.
        "auto" (or no tool_choice) with at least one strict tool: free text without a call, or
        free text and then calls shaped as for "required". None for "none", no tools, or
        "auto" without a strict tool: the reply is free text."""
        tools = list(tools or [])
        if tool_choice in (None, "auto", "none") or not tools:
            if tool_choice not in (None, "auto", "none"):
                raise GrammarError("tool_choice forces a call but the request has no tools")
            if tool_choice == "none" or not tools:
                return None
            parts = [_tool_parts(t) for t in tools]
            if not any(strict for _, _, strict in parts):
                return None  # nothing to hold a call to: the reply stays unconstrained
            return cls("lark", tool_call_grammar(parts, many=parallel, auto=True), name="tool_call")
        parts = [_tool_parts(t) for t in tools]
        if tool_choice == "required":
            chosen, many = parts, parallel
        elif isinstance(tool_choice, Mapping):
            fn = tool_choice.get("function")
            want = fn.get("name") if isinstance(fn, Mapping) else tool_choice.get("name")
            chosen = [p for p in parts if p[0] == want]
            if not chosen:
                raise GrammarError(f"tool_choice names {want!r}, which is not one of the tools: "
                                   f"{', '.join(p[0] for p in parts)}")
            chosen, many = chosen[:1], False
        else:
            raise GrammarError(f"unsupported tool_choice {tool_choice!r} "
                               '("auto", "none", "required" or {"type": "function", ...})')
        return cls("lark", tool_call_grammar(chosen, many=many), name="tool_call")

    # ------------------------------------------------------------------ the grammar
    def describe(self) -> str:
        what = {"json_schema": "JSON schema", "json_object": "JSON object constraint",
                "regex": "regex", "lark": "Lark grammar", "gbnf": "GBNF grammar"}[self.type]
        return f"{what} {self.name!r}" if self.name else what

    @property
    def schema(self) -> Any:
        """The JSON schema (json_schema) as an object; None for the other types."""
        return json.loads(self.source) if self.type == "json_schema" else None

    def llguidance_grammar(self) -> str:
        """The grammar as llguidance's LLMatcher takes it."""
        return self._grammar

    def _build(self) -> str:
        M = llguidance.LLMatcher
        try:
            if self.type == "json_object":
                return M.grammar_from_json_schema({"type": "object"}, defaults=JSON_DEFAULTS)
            if self.type == "json_schema":
                overrides = None if self.strict else {"lenient": True}
                return M.grammar_from_json_schema(self.source, defaults=_json_defaults(self.schema),
                                                  overrides=overrides)
            if self.type == "regex":
                return M.grammar_from_regex(self.source)
            if self.type == "lark":
                return M.grammar_from_lark(self.source)
            try:
                lark = gbnf_to_lark(self.source)
            except Exception as exc:  # the converter raises plain exceptions on bad input
                raise GrammarError(f"invalid GBNF grammar: {one_line(str(exc))}") from exc
            return M.grammar_from_lark(lark)
        except GrammarError:
            raise
        except ValueError as exc:
            raise GrammarError(f"invalid {self.describe()}: {one_line(str(exc))}") from exc


def _json_defaults(schema: Any) -> dict[str, Any] | None:
    """JSON_DEFAULTS unless the schema's own "x-guidance" says how whitespace goes (llguidance
    lets a default whitespace_pattern win over the schema's whitespace_flexible)."""
    guidance = schema.get("x-guidance") if isinstance(schema, Mapping) else None
    if isinstance(guidance, Mapping) and {"whitespace_flexible", "whitespace_pattern"} & guidance.keys():
        return None
    return JSON_DEFAULTS


def _tool_parts(tool: Mapping[str, Any]) -> tuple[str, dict[str, Any], bool]:
    """(name, parameters schema, strict) of an OpenAI tool `{"type": "function", "function":
    {...}}` or of its bare function object."""
    if not isinstance(tool, Mapping):
        raise GrammarError("a tool is an object")
    fn = tool.get("function", tool)
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise GrammarError("a tool needs a function with a name")
    params = fn.get("parameters")
    if params is None:
        params = {"type": "object"}
    if not isinstance(params, Mapping):
        raise GrammarError(f"the parameters of tool {fn['name']!r} are not a JSON schema object")
    return fn["name"], dict(params), bool(fn.get("strict") or False)


def tool_call_grammar(tools: Sequence[tuple[str, dict[str, Any], bool]], *, many: bool,
                      auto: bool = False) -> str:
    """Lark grammar of a reply made of `<tool_call>` blocks (see the module docstring). A
    non-strict tool's schema is compiled leniently (keywords llguidance lacks are ignored), and
    one that still does not compile constrains its arguments to any object, as the server
    accepted such tools before constraints existed.

    `auto` (tool_choice "auto"): the reply is free text that holds no `<tool_call>`; or free
    text up to the first `<tool_call>` and then the blocks as in the forced case; or one bare
    call, `{"name": ..., "arguments": ...}` (in a ```json fence or not, pretty-printed or
    not), which tools.py reads as a call and small models write instead of the tags. The free
    text may not open as a bare call: once the text is `{"name": "`, it is the bare call."""
    rules, bare_rules = [], []
    for i, (name, params, strict) in enumerate(tools):
        args: dict[str, Any] = params
        if not strict:
            try:
                check_grammar(llguidance.LLMatcher.grammar_from_json_schema(
                    params, overrides={"lenient": True}), None, f"parameters of tool {name!r}")
            except (GrammarError, ValueError) as exc:
                log.warning("tool %r: arguments constrained to any object: %s", name, exc)
                args = {"type": "object"}
        lenient = {} if strict else {"lenient": True}
        call = {"x-guidance": {**CALL_JSON_FORMAT, **lenient}, "type": "object",
                "properties": {"name": {"const": name}, "arguments": args},
                "required": ["name", "arguments"], "additionalProperties": False}
        rules.append(f"call_{i}: %json {json.dumps(call, ensure_ascii=False)}")
        if auto:
            bare_args = {**args, "x-guidance": {**JSON_DEFAULTS, **lenient}}
            bare_rules += [
                # the name's JSON text and its closing quote: BARE_HEAD took the opening one
                f'bare_{i}: {json.dumps(json.dumps(name, ensure_ascii=False)[1:])} WS? "," WS? '
                f'"\\"arguments\\"" WS? ":" WS? bare_args_{i} WS? "}}"',
                f"bare_args_{i}: %json {json.dumps(bare_args, ensure_ascii=False)}"]
    head = json.dumps(CALL_OPEN + "\n")
    tail = json.dumps("\n" + CALL_CLOSE)
    alternatives = " | ".join(f"call_{i}" for i in range(len(tools)))
    more = ' ("\\n" block)*' if many else ""
    lines = [f"block: {head} body {tail}", f"body: {alternatives}", *rules]
    if not auto:
        return "\n".join([f"start: block{more}", *lines]) + "\n"
    open_re = re.escape(CALL_OPEN)
    bare_head = r'/\s*(```([jJ][sS][oO][nN])?\s*)?\{\s*"name"\s*:\s*"/'
    return "\n".join([
        f"start: TEXT | lead {json.dumps(chr(10))} body {tail}{more} | bare",
        "lead[lazy]: LEAD",  # lazy: it ends at the first <tool_call>
        f"LEAD: /(?s:.*){open_re}/ & ~BARE_HEAD_ON",
        f"TEXT: /(?s:.*)/ & ~/(?s:.*){open_re}(?s:.*)/ & ~BARE_HEAD_ON",
        f"BARE_HEAD_ON: {bare_head[:-1]}(?s:.*)/",
        # lazy, so that it wins over TEXT as soon as the text is a bare call's opening
        "bare_head[lazy]: BARE_HEAD",
        f"BARE_HEAD: {bare_head}",
        "bare: bare_head (" + " | ".join(f"bare_{i}" for i in range(len(tools))) + ") BARE_END",
        "WS: /[\\x20\\t\\r\\n]{1,48}/",
        "BARE_END: /[\\x20\\t\\r\\n]{0,8}(```)?[\\x20\\t\\r\\n]{0,8}/",
        *bare_rules, *lines]) + "\n"
