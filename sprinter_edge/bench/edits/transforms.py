"""The transforms the edit tasks are made with: annotations stripped or added, planted bugs
(`mutations`), string building rewritten to `%` / `.format()` (`concatenation_sites`,
`as_formatting`) or to f-strings (`ToFString`), renames (`Renamer`), docstrings stripped or
added, and a poor but equivalent layout (`poor_layout`)."""

from __future__ import annotations

import ast
import io
import re
import string
import tokenize

from .ast_tools import ATOMIC, FUNCS, Replacement, SourceText, docstring_lines, is_str, parameters


def is_str_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str"
            and len(node.args) == 1 and not node.keywords and not isinstance(node.args[0], ast.Constant))


def strip_annotations(src: str, tree: ast.Module) -> str:
    """`src` with every parameter and return annotation of its functions taken out (the rest
    of the text as it was)."""
    text = SourceText(src)
    edits: list[Replacement] = []
    for fn in (n for n in ast.walk(tree) if isinstance(n, FUNCS)):
        edits += [(*text.span(a), a.arg) for a in parameters(fn) if a.annotation is not None]
        if fn.returns is not None:
            start, end = text.span(fn.returns)
            arrow = src.rfind("->", 0, start)
            edits.append((len(src[:arrow].rstrip()), end, ""))
    code = text.replace(edits)
    ast.parse(code)  # a broken strip is a bug here, not a task
    return code


def annotate(tree: ast.Module) -> None:
    for fn in (n for n in ast.walk(tree) if isinstance(n, FUNCS)):
        for a in parameters(fn):
            a.annotation = ast.Name("object")
        fn.returns = ast.Constant(None) if fn.name == "__init__" else ast.Name("object")


_CMP = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
        ast.Eq: ("==", "!="), ast.NotEq: ("!=", "==")}


def _op_edit(text: SourceText, left: ast.AST, right: ast.AST, op: str, new: str) -> Replacement | None:
    """Replace the operator between two operands (only brackets and spaces around it)."""
    a, b = text.span(left)[1], text.span(right)[0]
    pattern = rf"\b{op}\b" if op.isalpha() else re.escape(op) + r"(?![=<>])"
    m = re.search(pattern, text.text[a:b])
    return (a + m.start(), a + m.end(), new) if m else None


def _off_by_one(text: SourceText, node: ast.expr) -> Replacement:
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
    tight = isinstance(node, (*ATOMIC, ast.BinOp)) and not isinstance(
        getattr(node, "op", None), (ast.LShift, ast.RShift, ast.BitAnd, ast.BitOr, ast.BitXor))
    tight = tight or (isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not))
    return start, end, f"{seg} - 1" if tight else f"({seg}) - 1"


def mutations(fn: ast.FunctionDef | ast.AsyncFunctionDef,
              text: SourceText) -> dict[str, list[Replacement]]:
    """Planted-bug candidates in fn's code (its docstring left alone), by class."""
    found: dict[str, list[Replacement | None]] = {
        "comparison": [], "arithmetic": [], "boolean": [], "off-by-one": [], "constant": []}
    body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
    for n in (m for stmt in body for m in ast.walk(stmt)):
        if isinstance(n, ast.Compare):
            for left, op, right in zip([n.left, *n.comparators], n.ops, n.comparators, strict=False):
                if type(op) in _CMP:
                    found["comparison"].append(_op_edit(text, left, right, *_CMP[type(op)]))
        elif (isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Add, ast.Sub))
              and not any(isinstance(x, ast.JoinedStr) or is_str(x) for x in (n.left, n.right))):
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


def _add_leaves(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _add_leaves(node.left) + _add_leaves(node.right)
    return [node]


def concatenation_sites(tree: ast.AST) -> list[tuple[ast.expr, ast.AST | None]]:
    """(expression, its parent) for each string built by `+` with a str literal or `str(x)`,
    and each lone `str(x)`: where code like this would use `%` or `.format`."""
    parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    sites: list[tuple[ast.expr, ast.AST | None]] = []
    inside: set[int] = set()
    for n in ast.walk(tree):  # breadth first: an outer expression before its parts
        if id(n) in inside or not isinstance(n, ast.expr):
            continue
        leaves = _add_leaves(n)
        if ((len(leaves) > 1 and any(is_str(x) or is_str_call(x) for x in leaves)
             and not all(is_str(x) for x in leaves)) or (len(leaves) == 1 and is_str_call(n))):
            sites.append((n, parents.get(n)))
            inside.update(id(m) for m in ast.walk(n))
    return sites


def as_formatting(text: SourceText, node: ast.expr, parent: ast.AST | None, style: str) -> str:
    """The string `node` builds, written with `%` or `.format` (literal text, then one `%s`
    or `{}` per other part; `str(x)` becomes the placeholder of x)."""
    parts: list[str | ast.expr] = []
    for leaf in _add_leaves(node):
        value: str | ast.expr = leaf
        if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str):
            value = leaf.value
        elif is_str_call(leaf):
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
    arg = (args[0] if isinstance(exprs[0], ATOMIC) else f"({args[0]})") if len(args) == 1 \
        else f"({', '.join(args)})"
    out = f"{fmt!r} % {arg}"
    # `%` binds looser than a call, a subscript or an attribute: an operand needs brackets
    operand = (isinstance(parent, (ast.BinOp, ast.UnaryOp, ast.Attribute, ast.Await))
               or (isinstance(parent, ast.Subscript) and parent.value is node)
               or (isinstance(parent, ast.Call) and parent.func is node))
    return f"({out})" if operand else out


class Renamer(ast.NodeTransformer):
    """Renames names, parameters, definitions, global statements and `__all__` entries."""

    def __init__(self, renames: dict[str, str]):
        self.renames = renames

    def _new(self, name: str) -> str:
        return self.renames.get(name, name)

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self._new(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.arg = self._new(node.arg)
        self.generic_visit(node)
        return node

    def _named(self, node: ast.AST) -> ast.AST:
        node.name = self._new(node.name)  # type: ignore[attr-defined]
        self.generic_visit(node)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _named

    def visit_Global(self, node: ast.Global) -> ast.Global:
        node.names = [self._new(n) for n in node.names]
        return node

    def visit_Assign(self, node: ast.Assign) -> ast.Assign:
        self.generic_visit(node)
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            for c in ast.walk(node.value):
                if is_str(c):
                    c.value = self._new(c.value)  # type: ignore[attr-defined]
        return node


_PERCENT = re.compile(r"%(?P<flags>[-#0 +]*)(?P<width>\d*)(?:\.(?P<prec>\d+))?(?P<conv>[sdirfFgGeExXo%])")


def _percent_fstring(fmt: str, args: list[ast.expr]) -> ast.JoinedStr | None:
    """`fmt % args` as an f-string, None for a form this does not convert (`%(name)s`, `%*d`,
    `%.3s`, `%c`, ...)."""
    values: list[ast.expr] = []
    pos = 0
    for m in _PERCENT.finditer(fmt):
        if "%" in fmt[pos : m.start()]:
            return None
        values.append(ast.Constant(fmt[pos : m.start()]))
        pos = m.end()
        flags, width, prec, conv = m["flags"], m["width"], m["prec"], m["conv"]
        if conv == "%":
            if flags or width or prec:
                return None
            values.append(ast.Constant("%"))
            continue
        if not args:
            return None
        conversion = -1
        if conv in "sr":  # str() or repr() of anything, padded
            if prec or set(flags) - {"-"}:
                return None
            conversion = ord(conv)
            spec = (("<" if "-" in flags else ">") + width) if width else ""
        else:
            spec = ("<" if "-" in flags else "") + ("+" if "+" in flags else " " if " " in flags else "")
            spec += ("#" if "#" in flags else "") + ("0" if "0" in flags and "-" not in flags else "")
            spec += width + (f".{prec}" if prec else "") + ("d" if conv in "di" else conv)
        fspec = ast.JoinedStr([ast.Constant(spec)]) if spec else None
        values.append(ast.FormattedValue(args.pop(0), conversion, fspec))
    if "%" in fmt[pos:] or args:
        return None
    values.append(ast.Constant(fmt[pos:]))
    return ast.JoinedStr([v for v in values if not (isinstance(v, ast.Constant) and v.value == "")])


def _format_fstring(fmt: str, args: list[ast.expr], kwargs: dict[str, ast.expr]) -> ast.JoinedStr | None:
    values: list[ast.expr] = []
    auto, manual = 0, False
    try:
        parsed = list(string.Formatter().parse(fmt))
    except ValueError:
        return None
    for literal, field, spec, conv in parsed:
        if literal:
            values.append(ast.Constant(literal))
        if field is None:
            continue
        if field == "":
            field, auto = str(auto), auto + 1
        elif field.isdigit():
            manual = True
        if auto and manual:
            return None  # str.format refuses to mix `{}` and `{0}`
        if field.isdigit() and int(field) < len(args):
            value = args[int(field)]
        elif field in kwargs:
            value = kwargs[field]
        else:
            return None  # attribute or index lookups, or an argument not given
        if spec and "{" in spec:
            return None
        fspec = ast.JoinedStr([ast.Constant(spec)]) if spec else None
        values.append(ast.FormattedValue(value, ord(conv) if conv else -1, fspec))
    return ast.JoinedStr(values)


class ToFString(ast.NodeTransformer):
    """`'...' % args` and `'...'.format(...)` on string literals as f-strings; `failed` when a
    site had a form it does not convert."""

    failed = False

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.op, ast.Mod) and is_str(node.left):
            args = list(node.right.elts) if isinstance(node.right, ast.Tuple) else [node.right]
            out = _percent_fstring(node.left.value, args)  # type: ignore[attr-defined]
            self.failed |= out is None
            return out or node
        return node

    def visit_Call(self, node: ast.Call) -> ast.expr:
        self.generic_visit(node)
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "format" and is_str(f.value):
            if any(isinstance(a, ast.Starred) for a in node.args) or \
                    any(k.arg is None for k in node.keywords):
                self.failed = True
                return node
            out = _format_fstring(f.value.value, list(node.args),  # type: ignore[attr-defined]
                                  {k.arg: k.value for k in node.keywords if k.arg})
            self.failed |= out is None
            return out or node
        return node


def string_formatting(tree: ast.AST) -> list[ast.expr]:
    """`%` and `.format()` on string literals: what an f-string replaces."""
    return [n for n in ast.walk(tree)
            if (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) and is_str(n.left))
            or (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "format"
                and is_str(n.func.value))]




# ---------------------------------------------------------------------------- docstrings


def strip_docstrings(src: str, tree: ast.Module) -> tuple[str, int]:
    """`src` without the docstrings of its functions and methods (those on lines of their own
    in a body of more statements; class and module docstrings kept), and how many went."""
    spans = [s for fn in ast.walk(tree) if isinstance(fn, FUNCS) and (s := docstring_lines(src, fn))]
    code = SourceText(src).replace([(a, b, "") for a, b in spans])
    ast.parse(code)  # a broken strip is a bug here, not a task
    return code, len(spans)


def add_docstrings(tree: ast.Module, docs: dict[str, str]) -> None:
    """Give every function and method a docstring: `docs[name]` when there is one, else a
    line that names it (the reference of an edit that asks for them)."""
    for fn in (n for n in ast.walk(tree) if isinstance(n, FUNCS)):
        if ast.get_docstring(fn) is None:
            text = docs.get(fn.name) or f"Do what `{fn.name}` is named for."
            fn.body.insert(0, ast.Expr(ast.Constant(text)))


# ---------------------------------------------------------------------------- layout

# operators that lose the spaces around them in `poor_layout` (not `.`, `:`, `@`, brackets)
_SQUEEZE = frozenset({",", "=", "==", "!=", "<", ">", "<=", ">=", "+", "-", "*", "/", "//", "%", "**",
                      "+=", "-=", "*=", "/=", "//=", "%=", "|", "&", "^", "<<", ">>", "->", "|=", "&="})


def _indent_edits(tokens: list[tokenize.TokenInfo], width: int) -> list[tuple[int, int, int, str]]:
    """(line, start col, end col, text): each statement's indentation as `width` spaces a level."""
    out, depth, line_start = [], 0, True
    for tok in tokens:
        if tok.type == tokenize.INDENT:
            depth += 1
        elif tok.type == tokenize.DEDENT:
            depth -= 1
        elif tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER):
            line_start = line_start or tok.type == tokenize.NEWLINE
        elif line_start:
            out.append((tok.start[0], 0, tok.start[1], " " * (width * depth)))
            line_start = False
    return out


def _squeeze_edits(tokens: list[tokenize.TokenInfo]) -> list[tuple[int, int, int, str]]:
    """(line, start col, end col, ""): the spaces around the `_SQUEEZE` operators."""
    out = []
    for a, b in zip(tokens, tokens[1:], strict=False):
        same_line = a.end[0] == b.start[0] and b.start[1] > a.end[1]
        squeeze = (a.type == tokenize.OP and a.string in _SQUEEZE) or \
                  (b.type == tokenize.OP and b.string in _SQUEEZE)
        if same_line and squeeze and b.type != tokenize.COMMENT:
            out.append((a.end[0], a.end[1], b.start[1], ""))
    return out


def poor_layout(src: str) -> str:
    """`src` laid out badly but equivalent: 2-space indentation and no spaces around commas and
    operators (deterministic, from the tokens; strings, comments and the lines inside brackets
    left as they are). ValueError when the result does not have `src`'s AST."""
    tokens = list(tokenize.generate_tokens(io.StringIO(src).readline))
    lines = src.splitlines(keepends=True)
    edits = sorted(_indent_edits(tokens, 2) + _squeeze_edits(tokens), reverse=True)
    for row, a, b, new in edits:  # right to left in each line, bottom line first
        line = lines[row - 1]
        lines[row - 1] = line[:a] + new + line[b:]
    code = "".join(lines)
    if ast.dump(ast.parse(code)) != ast.dump(ast.parse(src)):
        raise ValueError("the poor layout changed the code")
    return code
