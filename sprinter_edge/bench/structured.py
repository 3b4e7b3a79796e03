"""Structured output: replies constrained to a JSON schema, each checked automatically.

Two sorts of task (`BenchPrompt.workload` "structured", the schema and the truth in `problem`):

* extraction: a public top-level function of the running interpreter's standard library,
  its source pasted into the prompt, to be described in FUNCTION_SCHEMA; the truth is read
  from its AST (defaults as `ast.unparse` writes them, whether any `return` carries a value,
  the exception names its own `raise` statements name), so it is real code no one here wrote
  and an answer no one here typed;
* schema-only: a short request with a schema of enums, bounded numbers and required keys;
  no truth, the reply is checked for validity only.

`check_reply` says whether the reply's whole text is one JSON value the schema accepts (a small
validator, exact for the keywords these schemas use), whether it was cut by max_tokens, and for
extraction tasks the share of truth fields it got right.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .prompts import BenchPrompt

WORKLOAD = "structured"  # the bench's workload (`BenchPrompt.workload`)
# modules whose small public functions make the extraction tasks, in the order they are taken
MODULES = ("textwrap", "shlex", "fnmatch", "bisect", "heapq", "colorsys", "posixpath", "glob",
           "calendar", "statistics", "base64", "html", "json", "string", "keyword", "quopri",
           "copy", "operator", "genericpath", "ntpath", "random", "uu", "gzip", "ipaddress")
PER_MODULE = 3  # at most this many functions of one module, so no module dominates
MAX_SOURCE_CHARS = 2_000  # a function's source at most this long (about 600 tokens)
SCHEMA_EVERY = 6  # a schema-only task at every 6th place: the first N tasks mix both sorts

FUNCTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "parameters": {"type": "array", "maxItems": 6, "items": {  # the tasks have 1-6
            "type": "object",
            "properties": {"name": {"type": "string"}, "default": {"type": ["string", "null"]}},
            "required": ["name", "default"], "additionalProperties": False}},
        "returns_value": {"type": "boolean"},
        "raises": {"type": "array", "maxItems": 6, "items": {"type": "string"}},
    },
    "required": ["name", "parameters", "returns_value", "raises"],
    "additionalProperties": False,
}
FUNCTION_INSTRUCTION = (
    "Read this Python function from the standard library module `{module}` and describe it as "
    "one JSON object with this JSON schema:\n\n{schema}\n\n"
    "- name: the function's name;\n"
    "- parameters: every parameter in order, each with its default value as written in the "
    "source (a string, e.g. \"None\" or \"'utf-8'\"), or null when it has none;\n"
    "- returns_value: true when some `return` statement of the function returns a value other "
    "than None;\n"
    "- raises: the exception names its own `raise` statements name (e.g. \"ValueError\"), "
    "empty when it raises nothing.\n\n"
    "Reply with the JSON object only.\n\n```python\n{source}\n```"
)


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required or list(props),
            "additionalProperties": False}


# schema-only tasks: (id, request, schema); no truth, validity only
SCHEMA_TASKS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("http-status", "List four HTTP status codes with their names and categories.",
     {"type": "array", "minItems": 4, "maxItems": 4, "items": _obj({
         "code": {"type": "integer", "minimum": 100, "maximum": 599}, "name": {"type": "string"},
         "category": {"enum": ["informational", "success", "redirection", "client error",
                               "server error"]}})}),
    ("server-config", "Write the configuration of a small web server that listens on port 8080, "
     "logs warnings and above, and allows 4 workers.",
     _obj({"host": {"type": "string"}, "port": {"type": "integer", "minimum": 1, "maximum": 65535},
           "log_level": {"enum": ["debug", "info", "warning", "error"]},
           "workers": {"type": "integer", "minimum": 1, "maximum": 64},
           "tls": {"type": "boolean"}, "timeout_seconds": {"type": "number", "minimum": 0}},
          ["host", "port", "log_level", "workers"])),
    ("person", "Invent a fictional software engineer: name, age, favourite languages and seniority.",
     _obj({"name": {"type": "string", "minLength": 1},
           "age": {"type": "integer", "minimum": 18, "maximum": 99},
           "languages": {"type": "array", "minItems": 1, "maxItems": 5, "items": {"type": "string"}},
           "seniority": {"enum": ["junior", "mid", "senior", "staff"]}})),
    ("planets", "Give the first three planets of the solar system with their order from the sun "
     "and whether they have moons.",
     _obj({"planets": {"type": "array", "minItems": 3, "maxItems": 3, "items": _obj({
         "name": {"type": "string"}, "order": {"type": "integer", "minimum": 1, "maximum": 8},
         "has_moons": {"type": "boolean"}})}})),
    ("bug-report", "File a bug report: the app crashes when a file name contains a space.",
     _obj({"title": {"type": "string", "maxLength": 80},
           "severity": {"enum": ["low", "medium", "high", "critical"]},
           "steps": {"type": "array", "minItems": 1, "maxItems": 6, "items": {"type": "string"}},
           "component": {"type": ["string", "null"]}})),
    ("recipe", "A recipe for pancakes: its name, servings, and up to five ingredients with amounts "
     "in grams.",
     _obj({"name": {"type": "string"}, "servings": {"type": "integer", "minimum": 1, "maximum": 12},
           "ingredients": {"type": "array", "minItems": 1, "maxItems": 5, "items": _obj({
               "item": {"type": "string"}, "grams": {"type": "number", "minimum": 0, "maximum": 2000}})}})),
    ("units", "Convert 5 kilometres into metres, miles and feet.",
     _obj({"kilometres": {"const": 5}, "conversions": {
         "type": "array", "minItems": 3, "maxItems": 3,
         "items": _obj({"unit": {"enum": ["metres", "miles", "feet"]}, "value": {"type": "number"}})}})),
    ("review", "Classify the sentiment of this review: 'The battery lasts two days, but the screen "
     "scratches easily.'",
     _obj({"sentiment": {"enum": ["positive", "negative", "mixed", "neutral"]},
           "confidence": {"type": "number", "minimum": 0, "maximum": 1},
           "aspects": {"type": "array", "maxItems": 4, "items": _obj({
               "aspect": {"type": "string"}, "polarity": {"enum": ["positive", "negative"]}})}})),
)


@dataclass(frozen=True)
class StructuredCheck:
    """One reply's check (runs[].structured in bench.json). `passed`: schema-valid; `length`:
    cut by max_tokens (never valid); `fenced`: the reply is not JSON, but its first code block
    is schema-valid JSON (a free reply's usual form); `accuracy`: share of truth fields right
    (None without truth or without a JSON object to read)."""

    passed: bool
    length: bool
    why: str
    fenced: bool = False
    accuracy: float | None = None
    fields: dict[str, bool] | None = None


# ---------------------------------------------------------------------- the truth
def _own_nodes(fn: ast.FunctionDef) -> list[ast.AST]:
    """The function's nodes, nested functions, lambdas and classes left out."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    return out


def _raised(node: ast.Raise) -> str | None:
    """The exception a `raise` names: `raise X(...)`, `raise X`, `raise mod.X(...)`; None for a
    re-raise or a variable (a lower-case name: no class a reader can name from the source)."""
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    if isinstance(exc, (ast.Name, ast.Attribute)):
        name = ast.unparse(exc)
        return name if name.rsplit(".", 1)[-1][:1].isupper() else None
    return None


def function_truth(fn: ast.FunctionDef) -> dict[str, Any] | None:
    """What FUNCTION_SCHEMA says of `fn`, or None when the answer would be ambiguous (*args,
    **kwargs, a generator, a raise of a variable)."""
    a = fn.args
    if a.vararg or a.kwarg:
        return None
    positional = a.posonlyargs + a.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = [{"name": p.arg, "default": ast.unparse(d) if d is not None else None}
              for p, d in zip(positional + a.kwonlyargs, defaults + list(a.kw_defaults), strict=True)]
    nodes = _own_nodes(fn)
    if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in nodes):
        return None
    raises: list[str] = []
    for n in nodes:
        if isinstance(n, ast.Raise) and n.exc is not None:
            name = _raised(n)
            if name is None:
                return None
            raises.append(name)
    returns = any(isinstance(n, ast.Return) and n.value is not None
                  and not (isinstance(n.value, ast.Constant) and n.value.value is None) for n in nodes)
    return {"name": fn.name, "parameters": params, "returns_value": returns,
            "raises": sorted(set(raises))}


def _module_source(module: str) -> str | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    path = Path(spec.origin)
    return path.read_text(encoding="utf-8") if path.is_file() else None


def function_tasks(modules: tuple[str, ...] = MODULES) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(module, function, source, truth) of each usable function: public, top-level, not
    decorated, 1-6 parameters, source at most MAX_SOURCE_CHARS, truth unambiguous; at most
    PER_MODULE of each module, in source order. A module without source is skipped."""
    out = []
    for module in modules:
        try:
            source = _module_source(module)
        except (ImportError, ValueError, OSError):  # a module this interpreter lacks (uu: 3.13)
            source = None
        if source is None:
            continue
        taken = 0
        for node in ast.parse(source).body:
            if taken >= PER_MODULE:
                break
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or node.decorator_list:
                continue
            a = node.args
            n_params = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
            text = ast.get_source_segment(source, node)
            truth = function_truth(node)
            if not 1 <= n_params <= 6 or text is None or len(text) > MAX_SOURCE_CHARS or truth is None:
                continue
            out.append((module, node.name, text, truth))
            taken += 1
    return out


def structured_prompts(n: int | None = None) -> list[BenchPrompt]:
    """The first n tasks (None: all): the extraction tasks with a schema-only task at every
    SCHEMA_EVERY-th place."""
    schema_text = json.dumps(FUNCTION_SCHEMA)
    functions = [BenchPrompt(f"structured/{m}.{f}", FUNCTION_INSTRUCTION.format(
        module=m, schema=schema_text, source=src), WORKLOAD,
        {"schema": FUNCTION_SCHEMA, "truth": truth}) for m, f, src, truth in function_tasks()]
    others = [BenchPrompt(f"structured/{name}", f"{request}\n\nReply with one JSON value that follows "
                          f"this JSON schema, and nothing else:\n\n{json.dumps(schema)}", WORKLOAD,
                          {"schema": schema, "truth": None}) for name, request, schema in SCHEMA_TASKS]
    out: list[BenchPrompt] = []
    while functions or others:
        take_schema = others and (len(out) % SCHEMA_EVERY == SCHEMA_EVERY - 1 or not functions)
        out.append((others if take_schema else functions).pop(0))
    return out if n is None else out[:n]


def schema_of(prompt: BenchPrompt) -> dict[str, Any] | None:
    """The JSON schema a structured prompt's reply must follow; None for other workloads."""
    return prompt.problem["schema"] if prompt.workload == WORKLOAD else None


# ---------------------------------------------------------------------- the check
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is_type(value: Any, name: str) -> bool:
    if name == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or \
            (isinstance(value, float) and value.is_integer())
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[name])


def validate(value: Any, schema: dict[str, Any], where: str = "$") -> str | None:
    """Why `value` breaks `schema`, None when it follows it. Exact for the keywords the tasks
    use: type, enum, const, properties, required, additionalProperties (false), items,
    min/maxItems, min/maxLength, minimum, maximum."""
    types = schema.get("type")
    if isinstance(types, str):
        types = [types]
    if types is not None and not any(_is_type(value, t) for t in types):
        return f"{where}: not of type {types}"
    if "enum" in schema and not any(_same(value, e) for e in schema["enum"]):
        return f"{where}: {value!r} not one of {schema['enum']}"
    if "const" in schema and not _same(value, schema["const"]):
        return f"{where}: not {schema['const']!r}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{where}: {value} < {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{where}: {value} > {schema['maximum']}"
    if isinstance(value, str) and not (schema.get("minLength", 0) <= len(value)
                                       <= schema.get("maxLength", math.inf)):
        return f"{where}: string length {len(value)} out of bounds"
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", math.inf):
            return f"{where}: {len(value)} items out of bounds"
        for i, item in enumerate(value):
            if "items" in schema and (why := validate(item, schema["items"], f"{where}[{i}]")):
                return why
    if isinstance(value, dict):
        props = schema.get("properties", {})
        missing = [k for k in schema.get("required", ()) if k not in value]
        if missing:
            return f"{where}: missing {', '.join(missing)}"
        extra = [k for k in value if k not in props]
        if extra and schema.get("additionalProperties", True) is False:
            return f"{where}: unexpected {', '.join(extra)}"
        for k, v in value.items():
            if k in props and (why := validate(v, props[k], f"{where}.{k}")):
                return why
    return None


def _same(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but true is not 1."""
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _parse(text: str) -> Any:
    def refuse(name: str) -> Any:  # NaN and Infinity are not JSON
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


_FENCE = re.compile(r"```[a-zA-Z]*\n(.*?)```", re.S)


def _canonical(default: Any) -> Any:
    """A default as ast.unparse writes it ('x' and "x" alike), when it is a Python expression."""
    if not isinstance(default, str):
        return default
    try:
        return ast.unparse(ast.parse(default.strip(), mode="eval"))
    except (SyntaxError, ValueError):
        return default.strip()


def field_accuracy(reply: Any, truth: dict[str, Any]) -> dict[str, bool]:
    """Each truth field against the reply's: name, the parameter names and defaults (lists, in
    order), returns_value, raises (a set)."""
    r = reply if isinstance(reply, dict) else {}
    params = r.get("parameters") if isinstance(r.get("parameters"), list) else []
    params = [p if isinstance(p, dict) else {} for p in params]
    raises = r.get("raises") if isinstance(r.get("raises"), list) else None
    return {
        "name": r.get("name") == truth["name"],
        "parameter_names": [p.get("name") for p in params] == [p["name"] for p in truth["parameters"]],
        "defaults": [_canonical(p.get("default")) for p in params]
        == [_canonical(p["default"]) for p in truth["parameters"]],
        "returns_value": r.get("returns_value") is truth["returns_value"],
        "raises": raises is not None and all(isinstance(x, str) for x in raises)
        and set(raises) == set(truth["raises"]),
    }


def check_reply(problem: dict[str, Any], text: str, finish_reason: str | None = None) -> StructuredCheck:
    """The reply's check: schema-valid (its whole text, surrounding blanks aside, one JSON
    value the schema accepts), cut by max_tokens, and the truth fields it got right (read from
    the JSON, or from its first code block when the reply is not bare JSON)."""
    schema, truth = problem["schema"], problem.get("truth")
    length = finish_reason == "length"
    fenced = False
    value: Any = None
    try:
        value = _parse(text.strip())
        why = validate(value, schema)
    except ValueError as exc:
        why = f"not JSON: {exc}"
        block = _FENCE.search(text)
        if block is not None:
            try:
                value = _parse(block.group(1).strip())
                fenced = validate(value, schema) is None
            except ValueError:
                value = None
    if length:
        why = "cut by max_tokens" + (f" ({why})" if why else "")
    fields = field_accuracy(value, truth) if truth is not None and isinstance(value, dict) else None
    accuracy = sum(fields.values()) / len(fields) if fields else (0.0 if truth is not None else None)
    return StructuredCheck(passed=why is None and not length, length=length, why=why or "",
                           fenced=fenced, accuracy=accuracy, fields=fields)
