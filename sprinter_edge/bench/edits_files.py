"""Whole-file edits: the edit requests of `edits`, asked of a whole module of real code
instead of one HumanEval function, so the prompt holds 0.8-2k tokens of context and the reply
returns all of it: where copying the input pays, and where a method's speed at depth shows.
A prompt and its reply fit a 4096-token context (`fits`, by `estimate_tokens`).

The files are modules of the running interpreter's standard library (or a contiguous run of a
module's top-level statements, with the imports before it, that runs alone), accelerator
imports (`from _bisect import *`) and `__main__` blocks left out so the Python code is what
runs. Each task is checked automatically: the reply's code block parses, carries the change
(read from the AST) and behaves as the original module does: every public function that
simple arguments exercise is called, in both, on the same deterministic inputs, in a sandboxed
subprocess (`quality.run_program`), and the results, the exceptions' types, the arguments
after the call and what was printed must be equal.

Which inputs exercise a function is measured once per file when it is built: for each
combination of argument types (int, float, str, lists, bytes) a few inputs are run on the
original, and the combinations that mostly return, with more than one distinct result, become
the file's cases. A file is dropped when no function is exercised, or when the original does
not pass its own check (it did not run alone, or not deterministically). Every task is built
with its reference edit (the change made by rewriting the AST) and must pass its check with
it; a planted bug must fail it.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import importlib.util
import itertools
import json
import keyword
import logging
import random
import re
import string
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from . import quality
from .edits import (
    _FUNCS,
    _SYNONYMS,
    EditCheck,
    _args,
    _digest,
    _function_name,
    _identifiers,
    _is_str,
    _mutations,
    _nested_bindings,
    _Text,
    interleave,
    parse_names,
    strip_annotations,
)
from .prompts import CODE_BLOCK_END, BenchPrompt, _segments

log = logging.getLogger(__name__)

PROMPT_KIND = "file_edit"  # the bench's workload (`BenchPrompt.kind`)
KINDS = ("rename_function", "rename_parameter", "rename_class", "rename_helpers", "type_hints", "fstring",
         "fix_bug")
# pure-Python standard library modules whose code is deterministic and runs without files,
# network or clock; each gives one file (the whole module when it fits, else a slice of it)
# (textwrap, shlex, difflib, statistics: every part that runs alone is too short or too long)
MODULES = ("colorsys", "bisect", "fnmatch", "html", "heapq", "string", "calendar", "base64", "ntpath",
           "posixpath", "operator", "stat", "genericpath", "glob", "quopri", "nturl2path", "unittest.util",
           "urllib.parse", "email.quoprimime", "email.base64mime", "email._encoded_words",
           "encodings.punycode")
RETURN_FILE = "Return the whole file in one python code block."
MIN_TOKENS = 750  # of code, by `estimate_tokens`: with the instruction, a prompt of about 1k tokens
CONTEXT = 4096  # the bench's default --ctx: a prompt and its reply must fit, by the estimate
FIT_MARGIN = 0.93  # of CONTEXT: room for the estimate's error (within 10% on stdlib code)
HINT_TOKENS = 12  # what type hints add to a function, at most, in the reply
INSTRUCTION_TOKENS = 100  # the longest instruction twice, with the chat template around the prompt
_MIN_CHARS, _MAX_CHARS = 2_000, 8_000  # no file outside these fits (a quick test before the estimate)
BUILD_TIMEOUT = 20.0  # seconds for a probe or a check at build time
MAX_MUTATIONS = 16  # planted bugs tried per file before the file is left out of fix_bug
MIN_RENAME_USES = 10  # a renamed parameter is used this often across the file
MAX_HELPERS = 3  # rename_helpers: this many private functions at most

# argument types the inputs are drawn from, per parameter
ARG_TYPES = ("int", "float", "str", "list_int", "list_str", "bytes")
MAX_ARITY = 3  # functions with more required parameters are not called
PROBES = 4  # inputs tried per combination of types
CASES_PER_COMBO = 8  # inputs per chosen combination in the check
COMBOS_PER_FUNCTION = 2
_WORDS = ("alpha", "beta", "x", "hello", "world", "foo", "bar", "the", "a", "data", "12", "3.5", "key",
          "value", "*.py", "a b", "it's", "path/to", "C:\\dir", "é", "")
_CHARS = string.ascii_letters[:8] + "XYZ019 .,;:-_*?[]!'\"\\/\t\n<>&#%{}()=@$~" + "  "

# a parameter's new name, when a renamed parameter has one of these names
_RENAMES = {**_SYNONYMS, "a": "items", "x": "item", "lo": "low", "hi": "high", "pat": "pattern",
            "h": "hue", "l": "lightness", "v": "value", "r": "red", "g": "green", "b": "blue",
            "heap": "queue", "item": "entry", "data": "payload", "width": "max_width", "name": "filename",
            "s": "text", "p": "path", "path": "filepath", "year": "yr", "month": "mon", "fp": "stream",
            "obj": "value", "o": "value", "c": "char", "iterable": "items", "seq": "sequence"}


@dataclass(frozen=True)
class FileEditTask:
    """One whole-file edit. `code` is the file shown (with the bug or with its annotations
    taken out), `original` the module whose behaviour the reply must keep, `cases` the calls
    that compare the two ((function, arguments as a Python literal), functions named as in
    `original`), `renames` the (old, new) names the edit asks for."""

    id: str
    kind: str
    module: str
    instruction: str
    code: str
    original: str
    cases: tuple[tuple[str, str], ...]
    renames: tuple[tuple[str, str], ...] = ()
    function: str = ""  # fix_bug: the function with the bug (Class.method for a method)
    old: str = ""  # fix_bug: the planted text; fstring: how many sites there are to convert
    new: str = ""  # fix_bug: the original text it replaced
    lines: tuple[int, int] = (0, 0)  # the lines of the module file the code is (imports before them added)
    whole: bool = True

    @property
    def prompt(self) -> str:
        """What the user types: the instruction, the file in a fenced block, and the instruction
        again (after 1-2k tokens of code the 1.5B target forgot an instruction given only
        before it: 1 of 8 files edited with `ar`, 2 of 8 with it repeated, 2026-12-02)."""
        return (f"{self.instruction}\n\n```python\n{self.code}```\n\n"
                f"{self.instruction} {RETURN_FILE}")

    @property
    def check_kind(self) -> str:
        """The kind as the report shows it, apart from the single-function edits' kinds."""
        return f"file:{self.kind}"

    @classmethod
    def from_dict(cls, d: dict) -> FileEditTask:
        """From `asdict` (or its JSON): lists back to tuples."""
        names = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in names}
        d["cases"] = tuple(tuple(c) for c in d.get("cases", ()))
        d["renames"] = tuple(tuple(r) for r in d.get("renames", ()))
        d["lines"] = tuple(d.get("lines", (0, 0)))
        return cls(**d)


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


def _functions(code: str) -> int:
    return sum(isinstance(n, _FUNCS) for n in ast.walk(ast.parse(code)))


def reply_tokens(task: FileEditTask) -> int:
    """The tokens a reply that returns the whole file takes, by the estimate, type hints on
    every function included (the budget a bench run gives: --max-tokens at least this)."""
    return estimate_tokens(task.code) + HINT_TOKENS * _functions(task.code) + 32


def fits(code: str) -> bool:
    """A prompt with this file and a reply returning it fit CONTEXT, by the estimate."""
    tokens = estimate_tokens(code)
    if tokens < MIN_TOKENS or 2 * tokens + INSTRUCTION_TOKENS > FIT_MARGIN * CONTEXT:
        return False
    return INSTRUCTION_TOKENS + 2 * tokens + HINT_TOKENS * _functions(code) + 32 <= FIT_MARGIN * CONTEXT


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
            and any(_is_str(c) and c.value == "__main__" for c in t.comparators))  # type: ignore[attr-defined]


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
        elif isinstance(n, (*_FUNCS, ast.ClassDef)):
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


def _public_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]


def _arity(fn: ast.FunctionDef) -> int | None:
    """The required positional parameters, None when a required keyword-only one exists."""
    a = fn.args
    if any(d is None for d in a.kw_defaults):
        return None
    return len(a.posonlyargs) + len(a.args) - len(a.defaults)


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
            n_public = sum(1 <= (_arity(f) or 0) <= MAX_ARITY for f in _public_functions(sub))
            if not n_public or free_names(sub) or _relative(sub):
                continue
            score = (n_public, estimate_tokens(code), -a)
            if best is None or score > best[0]:
                best = (score, code, segs[chosen[0]][0], segs[chosen[-1]][1])
    return None if best is None else (best[1], best[2], best[3], False)


# ---------------------------------------------------------------------------- inputs


def _value(rng: random.Random, kind: str) -> object:
    if kind == "int":
        return rng.choice([0, 1, 2, 3, 5, 7, 10, -1, -4, 16, 100, rng.randint(-5, 30), rng.randint(1, 12),
                           rng.choice([1900, 2000, 2024])])
    if kind == "float":
        return round(rng.choice([0.0, 1.0, 0.5, rng.random(), rng.random(), rng.uniform(-2.0, 3.0)]), 4)
    if kind == "str":
        if rng.random() < 0.5:
            return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(0, 6)))
        return "".join(rng.choice(_CHARS) for _ in range(rng.randint(0, 24)))
    if kind == "list_int":
        xs = [rng.randint(-5, 20) for _ in range(rng.randint(0, 8))]
        return sorted(xs) if rng.random() < 0.5 else xs
    if kind == "list_str":
        return [rng.choice(_WORDS) for _ in range(rng.randint(0, 5))]
    if kind == "bytes":
        return bytes(rng.choice(b"abcxyz 019=+/\n\t\x00\xff\xe9?") for _ in range(rng.randint(0, 16)))
    raise ValueError(kind)


def _inputs(module: str, function: str, combo: Sequence[str], n: int) -> list[str]:
    """n argument tuples for `function`, as Python literals, the same on every run."""
    out = []
    for i in range(n):
        rng = random.Random(_digest(module, function, *combo, str(i)))
        out.append(repr(tuple(_value(rng, k) for k in combo)))
    return out


# The code both programs share: load a module from source, and call a function of it with
# the result, the arguments after the call and what it printed made comparable between two
# copies of a module (no addresses; names mapped back through the edit's renames).
_HARNESS = r'''
import contextlib, io, itertools, signal, sys, types

def load(name, source):
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, name + ".py", "exec"), module.__dict__)
    return module

def norm(x, names, depth=0):
    if x is None or isinstance(x, (bool, int, float, complex, str, bytes)):
        return x
    if depth > 5:
        return "..."
    d = depth + 1
    if isinstance(x, list):
        return ("list", [norm(v, names, d) for v in x])
    if isinstance(x, tuple):
        return ("tuple", [norm(v, names, d) for v in x])
    if isinstance(x, dict):
        return ("dict", [(norm(k, names, d), norm(v, names, d)) for k, v in x.items()])
    if isinstance(x, (set, frozenset)):
        return ("set", sorted(repr(norm(v, names, d)) for v in x))
    if isinstance(x, (bytearray, memoryview)):
        return ("bytes", bytes(x))
    if isinstance(x, BaseException):
        return ("exception", names.get(type(x).__name__, type(x).__name__))
    if isinstance(x, type):
        return ("class", names.get(x.__name__, x.__name__))
    if hasattr(x, "__next__"):
        return ("iterator", [norm(v, names, d) for v in itertools.islice(x, 1000)])
    if callable(x) and hasattr(x, "__name__"):
        return ("callable", names.get(x.__name__, x.__name__))
    text = repr(x)
    if " at 0x" not in text and type(x).__module__ != NAME:
        return ("repr", text)
    state = getattr(x, "__dict__", None)
    return ("object", norm(dict(state), names, d) if state is not None else None)

def call(module, name, args, names):
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            value = ("returned", norm(getattr(module, name)(*args), names))
    except BaseException as exc:
        value = ("raised", names.get(type(exc).__name__, type(exc).__name__))
    return repr((value, norm(args, names), out.getvalue()))
'''

# Build time, trusted code only (the module as this interpreter ships it): which combinations
# of argument types make each function return, with how many distinct results.
_PROBE = _HARNESS + r'''
import json

def _alarm(signum, frame):
    raise TimeoutError

signal.signal(signal.SIGALRM, _alarm)
module = load(NAME, SOURCE)
found = {}
for key, function, literals in PROBES:
    ok, seen = 0, set()
    for literal in literals:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        try:
            result = call(module, function, eval(literal), {})
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if result.startswith("(('returned'"):
            ok += 1
            seen.add(result)
    found[key] = [ok, len(seen)]
sys.stdout.write(json.dumps(found))
'''

# The check: the original and the edited module side by side, every case on both.
_CHECK = _HARNESS + r'''
try:
    original = load(NAME, ORIGINAL)
except BaseException as exc:
    print(f"the original failed to load: {type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(2)
try:
    edited = load(NAME, EDITED)
except BaseException as exc:
    print(f"the edited code failed to load: {type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(1)
back = {new: old for old, new in RENAMES.items()}
for function, literal in CASES:
    a = call(original, function, eval(literal), {})
    b = call(edited, RENAMES.get(function, function), eval(literal), back)
    if a != b:
        print(f"behaviour differs: {function}{literal[:60]}: original {a[:50]}, edited {b[:50]}",
              file=sys.stderr)
        sys.exit(1)
'''


def _loaded_name(module: str) -> str:
    """The name a file runs under: not the module's own, so a package (`html`) stays
    importable for the file's own imports (`html.entities`)."""
    return "edited_" + module.replace(".", "_")


def _program(template: str, **constants: object) -> str:
    head = "".join(f"{k} = {v!r}\n" for k, v in constants.items())
    return head + template


def _probe(module: str, code: str) -> tuple[tuple[str, str], ...]:
    """The cases for a file: per public function taking 1-MAX_ARITY required arguments, the
    combinations of argument types that return on at least 3 of PROBES inputs with 2 or more
    distinct results (the best COMBOS_PER_FUNCTION), CASES_PER_COMBO inputs each."""
    tree = ast.parse(code)
    probes = []
    for fn in _public_functions(tree):
        k = _arity(fn)
        if k is None or not 1 <= k <= MAX_ARITY:
            continue
        for combo in itertools.product(ARG_TYPES, repeat=k):
            probes.append(("|".join((fn.name, *combo)), fn.name, _inputs(module, fn.name, combo, PROBES)))
    if not probes:
        return ()
    program = _program(_PROBE, NAME=_loaded_name(module), SOURCE=code, PROBES=probes)
    with tempfile.TemporaryDirectory(prefix="sprinter-probe-") as tmp:
        path = Path(tmp) / "probe.py"
        path.write_text(program, encoding="utf-8")
        try:
            done = subprocess.run([sys.executable, "-I", "-B", str(path)], cwd=tmp, capture_output=True,
                                  text=True, timeout=BUILD_TIMEOUT * 3,
                                  env={"PATH": "/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8",
                                       "PYTHONHASHSEED": "0"})
        except subprocess.TimeoutExpired:
            log.info("%s: probing the inputs timed out", module)
            return ()
    if done.returncode != 0:
        log.info("%s: probing the inputs failed: %s", module, done.stderr.strip().splitlines()[-1:])
        return ()
    found = json.loads(done.stdout)
    cases: list[tuple[str, str]] = []
    for fn in _public_functions(tree):
        good = [(ok, distinct, key) for key, name, _ in probes if name == fn.name
                for ok, distinct in [found[key]] if ok >= PROBES - 1 and distinct >= 2]
        good.sort(key=lambda g: (-g[0], -g[1]))  # stable: the type order breaks ties
        for _, _, key in good[:COMBOS_PER_FUNCTION]:
            combo = key.split("|")[1:]
            cases += [(fn.name, lit) for lit in _inputs(module, fn.name, combo, CASES_PER_COMBO)]
    return tuple(cases)


def run_check(original: str, edited: str, module: str, cases: Sequence[tuple[str, str]],
              renames: Sequence[tuple[str, str]] = (), timeout: float = 10.0) -> quality.ExecResult:
    """Run every case on the original and the edited module, in the sandbox; passed when all
    agree (detail: the first difference, or why the edited code did not load)."""
    program = _program(_CHECK, NAME=_loaded_name(module), ORIGINAL=original, EDITED=edited,
                       CASES=[list(c) for c in cases], RENAMES=dict(renames))
    return quality.run_program(program, timeout)


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
    cases = _probe(module, code)
    if not cases:
        log.info("%s: no public function the inputs exercise", module)
        return None
    res = run_check(code, code, module, cases, timeout=BUILD_TIMEOUT)
    if not res.passed:  # it does not run alone, or not the same way twice
        log.info("%s: the original fails its own check: %s", module, res.detail)
        return None
    return FileSource(module, code, first, last, whole, cases)


# ---------------------------------------------------------------------------- reference edits


class _Renamer(ast.NodeTransformer):
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
                if _is_str(c):
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


class _ToFString(ast.NodeTransformer):
    """`'...' % args` and `'...'.format(...)` on string literals as f-strings; `failed` when a
    site had a form it does not convert."""

    failed = False

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        if isinstance(node.op, ast.Mod) and _is_str(node.left):
            args = list(node.right.elts) if isinstance(node.right, ast.Tuple) else [node.right]
            out = _percent_fstring(node.left.value, args)  # type: ignore[attr-defined]
            self.failed |= out is None
            return out or node
        return node

    def visit_Call(self, node: ast.Call) -> ast.expr:
        self.generic_visit(node)
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "format" and _is_str(f.value):
            if any(isinstance(a, ast.Starred) for a in node.args) or \
                    any(k.arg is None for k in node.keywords):
                self.failed = True
                return node
            out = _format_fstring(f.value.value, list(node.args),  # type: ignore[attr-defined]
                                  {k.arg: k.value for k in node.keywords if k.arg})
            self.failed |= out is None
            return out or node
        return node


def _formatting(tree: ast.AST) -> list[ast.expr]:
    """`%` and `.format()` on string literals: what an f-string replaces."""
    return [n for n in ast.walk(tree)
            if (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) and _is_str(n.left))
            or (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "format"
                and _is_str(n.func.value))]


def _annotate(tree: ast.Module) -> None:
    for fn in (n for n in ast.walk(tree) if isinstance(n, _FUNCS)):
        for a in _args(fn):
            a.annotation = ast.Name("object")
        fn.returns = ast.Constant(None) if fn.name == "__init__" else ast.Name("object")


def reference(task: FileEditTask) -> str:
    """The edit the task asks for, made by rewriting the AST (comments and layout are lost):
    the reply a correct edit would give, up to formatting."""
    if task.kind == "fix_bug":
        return task.original
    tree = ast.parse(task.code)
    if task.renames:
        tree = _Renamer(dict(task.renames)).visit(tree)
    if task.kind == "type_hints":
        _annotate(tree)
    elif task.kind == "fstring":
        tree = _ToFString().visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


# ---------------------------------------------------------------------------- builders


def _uses(tree: ast.AST) -> dict[str, int]:
    """How often each name is read or bound (names, parameters, definitions)."""
    out: dict[str, int] = {}
    for n in ast.walk(tree):
        name = (n.id if isinstance(n, ast.Name) else n.arg if isinstance(n, ast.arg)
                else n.name if isinstance(n, (*_FUNCS, ast.ClassDef)) else None)
        if name:
            out[name] = out.get(name, 0) + 1
    return out


def _attrs_and_keywords(tree: ast.AST) -> set[str]:
    """Names used as attributes or keyword arguments: a rename would have to reach them, or
    the renamed thing is another one under the same name."""
    return ({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
            | {k.arg for k in ast.walk(tree) if isinstance(k, ast.keyword) and k.arg})


def _taken(tree: ast.AST) -> set[str]:
    return _identifiers(tree) | set(dir(builtins)) | set(keyword.kwlist)


def _task(kind: str, src: FileSource, instruction: str, code: str | None = None,
          **extra: object) -> FileEditTask:
    return FileEditTask(f"{PROMPT_KIND}/{kind}/{src.module}", kind, src.module, instruction,
                        src.code if code is None else code, src.code, src.cases,
                        lines=(src.first, src.last), whole=src.whole, **extra)  # type: ignore[arg-type]


def _rename_function(src: FileSource, tree: ast.Module) -> FileEditTask | None:
    """The public function the file calls most (at least once besides its definition)."""
    uses = _uses(tree)
    tested = {f for f, _ in src.cases}
    skip = _attrs_and_keywords(tree)
    names = sorted((f.name for f in _public_functions(tree) if f.name in tested and f.name not in skip
                    and f.name == f.name.lower() and len(f.name) > 2 and uses.get(f.name, 0) >= 2),
                   key=lambda n: -uses[n])
    for old in names:
        new = next((c for c in (_function_name(old), f"{old}_impl") if c not in _taken(tree)), None)
        if new:
            return _task("rename_function", src, f"Rename the function `{old}` to `{new}` everywhere in "
                         "this file.", renames=((old, new),))
    return None


def _param_scopes(tree: ast.Module, name: str) -> list[ast.AST] | None:
    """The functions that take `name` as a parameter, when every use of the name in the file
    is inside them and none of them rebinds it in a nested scope; else None."""
    fns = [f for f in ast.walk(tree) if isinstance(f, _FUNCS) and any(a.arg == name for a in _args(f))]
    inside = {id(n) for f in fns for n in ast.walk(f)}
    outside = [n for n in ast.walk(tree) if id(n) not in inside
               and ((isinstance(n, ast.Name) and n.id == name) or (isinstance(n, ast.arg) and n.arg == name))]
    if not fns or outside or any(name in _nested_bindings(f) - {a.arg for a in _args(f)} for f in fns):
        return None
    return fns


def _rename_parameter(src: FileSource, tree: ast.Module) -> FileEditTask | None:
    """The parameter name used most across the file (MIN_RENAME_USES times at least)."""
    uses = _uses(tree)
    skip = _attrs_and_keywords(tree) | {"self", "cls"}
    params = {a.arg for f in ast.walk(tree) if isinstance(f, _FUNCS) for a in _args(f)} - skip
    for old in sorted(params, key=lambda p: (-uses[p], p)):
        if uses[old] < MIN_RENAME_USES:
            break
        if _param_scopes(tree, old) is None:
            continue
        new = next((c for c in (_RENAMES.get(old, ""), f"{old}_value") if c.isidentifier()
                    and c not in _taken(tree)), None)
        if new:
            return _task("rename_parameter", src, f"Rename the parameter `{old}` to `{new}` in every "
                         "function of this file that takes it, and every use of it.", renames=((old, new),))
    return None


def _class_name(old: str) -> str:
    """CapWords (`_localized_month` -> `_LocalizedMonth`); a name in CapWords already gets a
    prefix (`Template` -> `PyTemplate`)."""
    private = "_" if old.startswith("_") else ""
    new = private + "".join(p[:1].upper() + p[1:] for p in old.split("_") if p)
    return new if new != old else f"{private}Py{old.lstrip('_')}"


def _rename_class(src: FileSource, tree: ast.Module) -> FileEditTask | None:
    """The class the file uses most (once at least besides its definition)."""
    uses = _uses(tree)
    skip = _attrs_and_keywords(tree)
    classes = sorted((c.name for c in tree.body if isinstance(c, ast.ClassDef) and c.name not in skip
                      and uses.get(c.name, 0) >= 2), key=lambda n: -uses[n])
    for old in classes:
        new = _class_name(old)
        if new not in _taken(tree):
            return _task("rename_class", src, f"Rename the class `{old}` to `{new}` everywhere in this file.",
                         renames=((old, new),))
    return None


def _rename_helpers(src: FileSource, tree: ast.Module) -> FileEditTask | None:
    """Make the private functions the file calls most public: `_name` -> `name` (2 to
    MAX_HELPERS of them)."""
    uses = _uses(tree)
    skip = _attrs_and_keywords(tree)
    taken = _taken(tree)
    helpers = [f.name for f in tree.body if isinstance(f, _FUNCS) and f.name.startswith("_")
               and not f.name.startswith("__") and f.name not in skip and uses.get(f.name, 0) >= 2
               and f.name.lstrip("_") not in taken and f.name.lstrip("_").isidentifier()]
    chosen = sorted(helpers, key=lambda n: -uses[n])[:MAX_HELPERS]
    if len(chosen) < 2:
        return None
    chosen = [n for n in helpers if n in chosen]  # in the file's order
    renames = tuple((old, old.lstrip("_")) for old in chosen)
    listed = ", ".join(f"`{a}` to `{b}`" for a, b in renames)
    return _task("rename_helpers", src, f"Make the helper functions public: rename {listed}, everywhere "
                 "in this file.", renames=renames)


def _type_hints(src: FileSource, tree: ast.Module) -> FileEditTask | None:
    if sum(isinstance(n, _FUNCS) for n in ast.walk(tree)) < 2:
        return None
    return _task("type_hints", src, "Add type hints to every parameter and the return value of every "
                 "function and method in this file (`self` and `cls` may stay bare).",
                 strip_annotations(src.code, tree))


def _fstring(src: FileSource, tree: ast.Module) -> FileEditTask | None:
    """When the file builds strings with `%` or `.format()` (twice at least) and each of them
    converts (by `_ToFString`)."""
    sites = _formatting(tree)
    if len(sites) < 2:
        return None
    conv = _ToFString()
    conv.visit(ast.parse(src.code))
    if conv.failed:
        return None
    return _task("fstring", src, "Convert every string built with `%` or `.format()` in this file to an "
                 "f-string.", old=str(len(sites)))


def _qualified(tree: ast.Module) -> dict[int, str]:
    """Each function's name, Class.method for a method."""
    out = {}
    for node in tree.body:
        if isinstance(node, _FUNCS):
            out[id(node)] = node.name
        elif isinstance(node, ast.ClassDef):
            out.update({id(f): f"{node.name}.{f.name}" for f in node.body if isinstance(f, _FUNCS)})
    return out


def _fix_bug(src: FileSource, tree: ast.Module) -> FileEditTask | None:
    """The file with one planted bug (`edits._mutations`) that its check catches; candidates
    in a fixed per-file order."""
    text = _Text(src.code)
    names = _qualified(tree)
    found = {(names[id(fn)], cls, *e) for fn in ast.walk(tree) if id(fn) in names
             for cls, edits in _mutations(fn, text).items() for e in edits}  # type: ignore[arg-type]
    tried = 0
    dump = ast.dump(tree)
    for fn, _, a, b, new in sorted(found, key=lambda c: _digest(src.module, *map(str, c))):
        if tried == MAX_MUTATIONS:
            break
        code = text.replace([(a, b, new)])
        try:
            if ast.dump(ast.parse(code)) == dump:
                continue
        except SyntaxError:
            continue
        tried += 1
        res = run_check(src.code, code, src.module, src.cases, timeout=BUILD_TIMEOUT)
        if res.status == "failed" and res.detail.startswith("behaviour differs"):
            what = f"method `{fn}`" if "." in fn else f"function `{fn}`"
            return _task("fix_bug", src, f"The {what} in this file has a bug: for some inputs it gives a "
                         "wrong result. Fix the bug and change nothing else.", code, function=fn,
                         old=new, new=src.code[a:b])
    log.info("%s: no planted bug the check catches in %d tries", src.module, tried)
    return None


_BUILDERS = {"rename_function": _rename_function, "rename_parameter": _rename_parameter,
             "rename_class": _rename_class, "rename_helpers": _rename_helpers, "type_hints": _type_hints,
             "fstring": _fstring, "fix_bug": _fix_bug}


@functools.cache
def build_task(kind: str, module: str) -> FileEditTask | None:
    """The `kind` task on `module`'s file, None where it does not apply. Its reference edit
    must pass its check and its input fail the change check (a bug: the behaviour check)."""
    src = file_source(module)
    if src is None:
        return None
    task = _BUILDERS[kind](src, ast.parse(src.code))
    if task is None:
        return None
    ref = reference(task)
    failure, why = check_change(task, ref)
    if failure:
        log.warning("%s: the reference edit fails the change check (%s): task left out", task.id, why)
        return None
    if kind != "fix_bug":
        res = run_check(task.original, ref, module, task.cases, task.renames, BUILD_TIMEOUT)
        if not res.passed:
            log.info("%s: the reference edit fails the behaviour check (%s): task left out", task.id,
                     res.detail)
            return None
        if check_change(task, task.code)[0] != "change":
            log.warning("%s: the unchanged input passes the change check: task left out", task.id)
            return None
    return task


# ---------------------------------------------------------------------------- choosing tasks


def parse_kinds(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """Comma-separated kind names (empty or None: every kind), in KINDS order."""
    return parse_names(spec, KINDS, "file edit kind")


def task_order(kinds: Sequence[str] = KINDS) -> Iterator[FileEditTask]:
    """Every task of these kinds once, in one fixed order (`edits.interleave` over the files)."""
    return interleave(parse_kinds(kinds), MODULES, build_task)


def select_tasks(n: int, kinds: Sequence[str] = KINDS, skip: int = 0) -> list[FileEditTask]:
    """n tasks of `task_order(kinds)` after the first `skip`."""
    return list(itertools.islice(task_order(kinds), skip, skip + n))


def all_tasks(kinds: Sequence[str] = KINDS) -> list[FileEditTask]:
    """Every task that can be built, file by file."""
    kinds = parse_kinds(kinds)
    return [t for m in MODULES for k in kinds if (t := build_task(k, m)) is not None]


def file_edit_prompts(n: int, kinds: Sequence[str] = KINDS, skip: int = 0) -> list[BenchPrompt]:
    """The bench's prompts: kind "file_edit", the task in `problem`; replies stop after their
    code block."""
    return [BenchPrompt(t.id, t.prompt, PROMPT_KIND, asdict(t), CODE_BLOCK_END)
            for t in select_tasks(n, kinds, skip)]


# ---------------------------------------------------------------------------- checks


def _defined(tree: ast.AST) -> set[str]:
    return {n.name for n in ast.walk(tree) if isinstance(n, (*_FUNCS, ast.ClassDef))}


def _missing_hints(tree: ast.AST) -> list[str]:
    """Parameters and returns without a hint (a method's `self` or `cls`, and `__init__`'s
    return, may stay bare)."""
    missing = []
    methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body
               if isinstance(f, _FUNCS)}
    for f in (n for n in ast.walk(tree) if isinstance(n, _FUNCS)):
        args = _args(f)
        if id(f) in methods and args and args[0].arg in ("self", "cls", "mcs", "metacls"):
            args = args[1:]
        missing += [f"{f.name}({a.arg})" for a in args if a.annotation is None]
        if f.returns is None and f.name != "__init__":
            missing.append(f"{f.name} return")
    return missing


_WHAT = {"rename_function": "function", "rename_parameter": "parameter", "rename_class": "class",
         "rename_helpers": "function"}


def check_change(task: FileEditTask, code: str) -> tuple[str, str]:
    """("", "") when `code` parses and carries the task's change, else (failure, why)."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return ("parse", f"did not parse: {exc.msg} (line {exc.lineno})")
    kind = task.kind
    if task.renames:
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | _defined(tree)
        if kind == "rename_parameter":
            used |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
        for old, new in task.renames:
            if old in used:
                return ("change", f"change not made: `{old}` is still used")
            present = ({n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)} if kind == "rename_parameter"
                       else _defined(tree))
            if new not in present:
                return ("change", f"change not made: no {_WHAT[kind]} `{new}`")
    elif kind == "type_hints":
        missing = _missing_hints(tree)
        if missing:
            return ("change", "change not made: no type hint on " + ", ".join(missing[:4])
                    + (", ..." if len(missing) > 4 else ""))
    elif kind == "fstring":
        left = _formatting(tree)
        if left:
            return ("change", f"change not made: `{ast.unparse(left[0])[:60]}` is still there")
        if sum(isinstance(n, ast.JoinedStr) for n in ast.walk(tree)) <= \
                sum(isinstance(n, ast.JoinedStr) for n in ast.walk(ast.parse(task.code))):
            return ("change", "change not made: no new f-string")
    return "", ""  # fix_bug: the behaviour check decides


def is_file_task(task: object) -> bool:
    """A whole-file task (or its dict, as the bench's prompts carry it), not a function's."""
    return isinstance(task, FileEditTask) or (isinstance(task, dict) and "module" in task)


def check_reply(task: FileEditTask | dict, reply: str, timeout: float = 10.0) -> EditCheck:
    """Whether a reply does the task: its first python code block parses, carries the change
    and behaves as the original file on every case (`run_check`)."""
    task = task if isinstance(task, FileEditTask) else FileEditTask.from_dict(task)
    code = quality.code_block(reply)
    if code is None:
        return EditCheck(False, task.check_kind, "no python code block in the reply", "no-code")
    failure, why = check_change(task, code)
    if failure:
        return EditCheck(False, task.check_kind, why, failure)
    res = run_check(task.original, code, task.module, task.cases, task.renames, timeout)
    if res.passed:
        return EditCheck(True, task.check_kind, "", "", res.status, res.seconds)
    why = "behaviour check timed out" if res.status == "timeout" else res.detail or "behaviour check failed"
    return EditCheck(False, task.check_kind, why, "tests", res.status, res.seconds)
