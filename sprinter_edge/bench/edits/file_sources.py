"""The files of the whole-file edits: modules of the running interpreter's standard library
(or a contiguous run of a module's top-level statements, with the imports before it, that
runs alone), accelerator imports (`from _bisect import *`) and `__main__` blocks left out so
the Python code is what runs, each with the cases its behaviour check calls
(`sandbox.probe_cases`). A prompt with the file and a reply returning it fit a 4096-token
context (`fits`, by `estimate_tokens`)."""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import importlib.util
import logging
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ..prompts import _segments
from .ast_tools import FUNCS, arity, count_functions, is_str, public_functions
from .sandbox import MAX_ARITY, PROBE_TIMEOUT, probe_cases, run_check

log = logging.getLogger(__name__)

MIN_TOKENS = 750  # of code, by `estimate_tokens`: with the instruction, a prompt of about 1k tokens
CONTEXT = 4096  # the bench's default --ctx: a prompt and its reply must fit, by the estimate
FIT_MARGIN = 0.93  # of CONTEXT: room for the estimate's error (within 10% on stdlib code)
HINT_TOKENS = 12  # what type hints add to a function, at most, in the reply
INSTRUCTION_TOKENS = 100  # the longest instruction twice, with the chat template around the prompt
_MIN_CHARS, _MAX_CHARS = 2_000, 8_000  # no file outside these fits (a quick test before the estimate)


_WORD = re.compile(r"[A-Za-z_]+")
_PUNCT = re.compile(r"[^\w\s]")


def estimate_tokens(text: str) -> int:
    """Tokens of Python source, estimated from its words, digits, punctuation, lines and
    characters: a least-squares fit to the Qwen2.5 tokenizer on standard library code, within
    10% on every file here. A flat 3.5 characters a token misses by up to 1.65x either way
    (every digit is a token: `colorsys` and `html` run at 2.3 characters a token)."""
    words = len(_WORD.findall(text))
    digits = sum(c.isdigit() for c in text)
    punct = len(_PUNCT.findall(text))
    return round(0.66 * words + 1.65 * digits + 0.36 * punct + 1.04 * text.count("\n") + 0.084 * len(text))


def fits(code: str) -> bool:
    """A prompt with this file and a reply returning it fit CONTEXT, by the estimate."""
    tokens = estimate_tokens(code)
    if tokens < MIN_TOKENS or 2 * tokens + INSTRUCTION_TOKENS > FIT_MARGIN * CONTEXT:
        return False
    return INSTRUCTION_TOKENS + 2 * tokens + HINT_TOKENS * count_functions(code) + 32 <= FIT_MARGIN * CONTEXT



# ---------------------------------------------------------------------------- the files


@dataclass(frozen=True)
class FileSource:
    """A file to edit: `code` (lines `first`-`last` of the module file, after the imports
    before them when it is not `whole`), and the calls that check its behaviour."""

    module: str
    code: str
    first: int
    last: int
    whole: bool
    cases: tuple[tuple[str, str], ...]


def _module_path(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.origin and spec.origin.endswith(".py"):
        return Path(spec.origin)
    path = Path(sysconfig.get_paths()["stdlib"], *module.split(".")).with_suffix(".py")
    return path if path.is_file() else None


def _accelerator(node: ast.stmt) -> bool:
    """`from _mod import *` or a try of imports from `_mod`: C code that replaces the Python
    definitions above it (the edit would never run)."""
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").startswith("_") and any(a.name == "*" for a in node.names)
    if isinstance(node, ast.Try):  # try: from _mod import ... / except ImportError: pass
        return (all(isinstance(s, ast.ImportFrom) and (s.module or "").startswith("_") for s in node.body)
                and all(isinstance(s, ast.Pass) for h in node.handlers for s in h.body))
    return False


def _main_block(node: ast.stmt) -> bool:
    t = node.test if isinstance(node, ast.If) else None
    return (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "__name__"
            and any(is_str(c) and c.value == "__main__" for c in t.comparators))  # type: ignore[attr-defined]


@functools.cache
def _star_names(module: str) -> frozenset[str]:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return frozenset()
    return frozenset(getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")])


def _relative(tree: ast.AST) -> bool:
    """Relative imports: the code runs only inside its package."""
    return any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))


def free_names(tree: ast.AST) -> set[str]:
    """Names the code reads that nothing in it binds and that are not builtins: a slice of a
    module that has any does not run alone."""
    bound: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            bound.add(n.id)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
        elif isinstance(n, (*FUNCS, ast.ClassDef)):
            bound.add(n.name)
        elif isinstance(n, ast.alias) and n.name != "*":
            bound.add((n.asname or n.name).split(".")[0])
        elif isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names):
            bound |= _star_names(n.module or "")
        elif isinstance(n, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and n.name:
            bound.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            bound.add(n.rest)
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            bound.update(n.names)
    loads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loads - bound - set(dir(builtins)) - {"__name__", "__doc__", "__builtins__"}


def _excerpt(module: str) -> tuple[str, int, int, bool] | None:
    """(code, first line, last line, whole): the module without its accelerator imports and
    `__main__` block when that `fits`, else the run of its top-level statements (after the
    module's imports before it) that fits, runs alone and defines the most public functions
    (then the longest, then the first)."""
    path = _module_path(module)
    if path is None:
        return None
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    segs = _segments(source)
    keep = [i for i, node in enumerate(tree.body) if not (_accelerator(node) or _main_block(node))]

    def own_lines(i: int) -> list[str]:
        """Segment i's lines, without the comment block that introduces a dropped statement
        after it (it would describe code no longer there)."""
        first, last, _ = segs[i]
        out = lines[first - 1 : last]
        if i + 1 < len(segs) and i + 1 not in keep:
            while out and out[-1].lstrip().startswith("#"):
                out.pop()
        return out

    def text(chosen: list[int], header: list[int]) -> str:
        parts = [ln for i in header for ln in lines[tree.body[i].lineno - 1 : tree.body[i].end_lineno]]
        body = [ln for i in chosen for ln in own_lines(i)]
        return ("\n".join(parts) + "\n\n\n" if parts else "") + "\n".join(body).strip("\n") + "\n"

    whole = text(keep, [])
    if fits(whole) and not _relative(tree):
        return whole, 1, len(lines), True
    imports = [i for i in keep if isinstance(tree.body[i], (ast.Import, ast.ImportFrom))]
    best: tuple[tuple[int, int, int], str, int, int] | None = None
    for a in range(len(keep)):
        header = [i for i in imports if i < keep[a]]
        for b in range(a, len(keep)):
            chosen = keep[a : b + 1]
            code = text(chosen, header)
            if len(code) > _MAX_CHARS:  # longer windows from here on only
                break
            if len(code) < _MIN_CHARS or not fits(code):  # (the characters first: cheaper)
                continue
            sub = ast.parse(code)
            n_public = sum(1 <= (arity(f) or 0) <= MAX_ARITY for f in public_functions(sub))
            if not n_public or free_names(sub) or _relative(sub):
                continue
            score = (n_public, estimate_tokens(code), -a)
            if best is None or score > best[0]:
                best = (score, code, segs[chosen[0]][0], segs[chosen[-1]][1])
    return None if best is None else (best[1], best[2], best[3], False)


@functools.cache
def file_source(module: str) -> FileSource | None:
    """The file made from `module` with its cases, None when it has no file of the right size,
    no function the inputs exercise, or does not pass its own check."""
    try:
        found = _excerpt(module)
    except (OSError, SyntaxError, ValueError, ImportError) as exc:
        log.info("%s: no file: %s", module, exc)
        return None
    if found is None:
        log.info("%s: no part that runs alone and fits %d tokens with its reply", module, CONTEXT)
        return None
    code, first, last, whole = found
    cases = probe_cases(module, code)
    if not cases:
        log.info("%s: no public function the inputs exercise", module)
        return None
    res = run_check(code, code, module, cases, timeout=PROBE_TIMEOUT)
    if not res.passed:  # it does not run alone, or not the same way twice
        log.info("%s: the original fails its own check: %s", module, res.detail)
        return None
    return FileSource(module, code, first, last, whole, cases)
