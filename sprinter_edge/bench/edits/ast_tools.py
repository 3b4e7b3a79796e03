"""AST helpers both edit workloads share: source text addressed as `ast` addresses it, the
names a piece of code binds and uses, and a stable digest for fixed pseudo-random orders."""

from __future__ import annotations

import ast
import hashlib
import itertools
import re
from collections.abc import Sequence

FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
SCOPES = (*FUNCS, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
ATOMIC = (ast.Name, ast.Attribute, ast.Subscript, ast.Call, ast.Constant)
# new names for common short ones (the rest get a suffix): readable renames a user would ask for
SYNONYMS = {
    "n": "num", "m": "count", "k": "size", "x": "value", "y": "other", "a": "first", "b": "second",
    "c": "third", "s": "text", "l": "items", "lst": "items", "arr": "values", "nums": "values",
    "numbers": "values", "string": "text", "strings": "texts", "text": "content", "i": "idx",
    "j": "jdx", "ans": "answer", "ret": "result", "res": "result", "result": "output",
    "idx": "position", "val": "value", "e": "element", "d": "digit", "count": "total",
}

Replacement = tuple[int, int, str]  # replace text[start:end] with this
FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


class SourceText:
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

    def replace(self, edits: Sequence[Replacement]) -> str:
        out, last = [], len(self.text)
        for a, b, new in sorted(edits, reverse=True):
            if b > last:
                raise ValueError("overlapping edits")
            out += [self.text[b:last], new]
            last = a
        out.append(self.text[:last])
        return "".join(reversed(out))


def digest(*parts: str) -> str:
    """A stable hex digest of the parts: the key of every fixed pseudo-random order."""
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def find_function(tree: ast.AST, name: str) -> FunctionNode | None:
    return next((n for n in ast.walk(tree) if isinstance(n, FUNCS) and n.name == name), None)


def parameters(fn: FunctionNode) -> list[ast.arg]:
    """Every parameter of fn, in order (`*args` and `**kwargs` included)."""
    a = fn.args
    return [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs,
            *([a.kwarg] if a.kwarg else [])]


def identifiers(tree: ast.AST) -> set[str]:
    """Every name the code spells: variables, parameters, definitions, attributes, imports,
    keyword arguments."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, (*FUNCS, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
        elif isinstance(n, ast.alias):
            out.add(n.asname or n.name.split(".")[0])
        elif isinstance(n, ast.keyword) and n.arg:
            out.add(n.arg)
    return out


def name_nodes(node: ast.AST) -> list[ast.Name]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Name)]


def nested_bindings(fn: ast.AST) -> set[str]:
    """Names bound in scopes nested inside fn (lambdas, comprehensions, inner functions):
    there the name may be another variable, so a rename of it is left out."""
    out: set[str] = set()
    for scope in ast.walk(fn):
        if scope is fn or not isinstance(scope, SCOPES):
            continue
        for n in ast.walk(scope):
            if isinstance(n, ast.arg):
                out.add(n.arg)
            elif isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
                out.add(n.id)
            elif isinstance(n, (*FUNCS, ast.ClassDef)) and n is not scope:
                out.add(n.name)
    for n in ast.walk(fn):
        if isinstance(n, (ast.Global, ast.Nonlocal)):
            out.update(n.names)
    return out


def own_stores(fn: ast.AST) -> list[str]:
    """Names fn's own scope assigns, first use first (nested scopes not entered)."""
    out: list[str] = []
    stack = list(reversed(list(ast.iter_child_nodes(fn))))
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id not in out:
            out.append(n.id)
        if not isinstance(n, SCOPES):
            stack += reversed(list(ast.iter_child_nodes(n)))
    return out


def fresh_name(candidates: Sequence[str], taken: set[str]) -> str | None:
    return next((c for c in candidates if c.isidentifier() and c not in taken), None)


def new_function_name(old: str) -> str:
    """A renamed function's new name: snake_case <-> camelCase, else a prefix."""
    parts = [p for p in old.split("_") if p]
    if len(parts) > 1:  # snake_case -> camelCase: every token of the name changes
        return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])
    if old != old.lower():
        return re.sub(r"(?<!^)(?=[A-Z])", "_", old).lower()
    return f"compute_{old}"


def most_used(fn: ast.AST, names: Sequence[str]) -> list[str]:
    uses = [n.id for n in name_nodes(fn)]
    return sorted(names, key=lambda s: -uses.count(s))  # stable: first seen wins a tie


def is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def name_uses(tree: ast.AST) -> dict[str, int]:
    """How often each name is read or bound (names, parameters, definitions)."""
    out: dict[str, int] = {}
    for n in ast.walk(tree):
        name = (n.id if isinstance(n, ast.Name) else n.arg if isinstance(n, ast.arg)
                else n.name if isinstance(n, (*FUNCS, ast.ClassDef)) else None)
        if name:
            out[name] = out.get(name, 0) + 1
    return out


def attrs_and_keywords(tree: ast.AST) -> set[str]:
    """Names used as attributes or keyword arguments: a rename would have to reach them, or
    the renamed thing is another one under the same name."""
    return ({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            | {k.arg for k in ast.walk(tree) if isinstance(k, ast.keyword) and k.arg})


def defined_names(tree: ast.AST) -> set[str]:
    return {n.name for n in ast.walk(tree) if isinstance(n, (*FUNCS, ast.ClassDef))}


def public_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]


def arity(fn: ast.FunctionDef) -> int | None:
    """The required positional parameters, None when a required keyword-only one exists."""
    a = fn.args
    if any(d is None for d in a.kw_defaults):
        return None
    return len(a.posonlyargs) + len(a.args) - len(a.defaults)


def qualified_names(tree: ast.Module) -> dict[int, str]:
    """Each top-level function's and method's name by node id, Class.method for a method."""
    out = {}
    for node in tree.body:
        if isinstance(node, FUNCS):
            out[id(node)] = node.name
        elif isinstance(node, ast.ClassDef):
            out.update({id(f): f"{node.name}.{f.name}" for f in node.body if isinstance(f, FUNCS)})
    return out


def count_functions(code: str) -> int:
    return sum(isinstance(n, FUNCS) for n in ast.walk(ast.parse(code)))


def docstring_lines(src: str, fn: ast.AST) -> tuple[int, int] | None:
    """The character range of fn's docstring lines, when the docstring has lines to itself
    and is not fn's whole body."""
    body = fn.body  # type: ignore[attr-defined]
    if ast.get_docstring(fn) is None or len(body) < 2:  # type: ignore[arg-type]
        return None
    text = SourceText(src)
    a, b = text.span(body[0])
    start, end = text.starts[body[0].lineno - 1], src.find("\n", b) + 1 or len(src)
    if src[start:a].strip() or src[b:end].strip():
        return None
    return start, end
