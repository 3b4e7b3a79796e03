"""The sandbox of the whole-file edits: a file's behaviour measured and compared. `probe_cases`
finds, once per file at build time, the inputs that exercise its public functions (trusted
code only: the module as this interpreter ships it); `run_check` calls every case on the
original and the edited module side by side in a sandboxed subprocess
(`quality.run_program`) and passes when the results, the exceptions' types, the arguments
after the call and what was printed are equal."""

from __future__ import annotations

import ast
import itertools
import json
import logging
import random
import string
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .. import quality
from .ast_tools import arity, digest, public_functions

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 20.0  # seconds for a probe or a check at build time
# argument types the inputs are drawn from, per parameter
ARG_TYPES = ("int", "float", "str", "list_int", "list_str", "bytes")
MAX_ARITY = 3  # functions with more required parameters are not called
PROBES = 4  # inputs tried per combination of types
CASES_PER_COMBO = 8  # inputs per chosen combination in the check
COMBOS_PER_FUNCTION = 2
_WORDS = ("alpha", "beta", "x", "hello", "world", "foo", "bar", "the", "a", "data", "12", "3.5", "key",
          "value", "*.py", "a b", "it's", "path/to", "C:\\dir", "é", "")
_CHARS = string.ascii_letters[:8] + "XYZ019 .,;:-_*?[]!'\"\\/\t\n<>&#%{}()=@$~" + "  "


def _value(rng: random.Random, arg_type: str) -> object:
    if arg_type == "int":
        return rng.choice([0, 1, 2, 3, 5, 7, 10, -1, -4, 16, 100, rng.randint(-5, 30), rng.randint(1, 12),
                           rng.choice([1900, 2000, 2024])])
    if arg_type == "float":
        return round(rng.choice([0.0, 1.0, 0.5, rng.random(), rng.random(), rng.uniform(-2.0, 3.0)]), 4)
    if arg_type == "str":
        if rng.random() < 0.5:
            return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(0, 6)))
        return "".join(rng.choice(_CHARS) for _ in range(rng.randint(0, 24)))
    if arg_type == "list_int":
        xs = [rng.randint(-5, 20) for _ in range(rng.randint(0, 8))]
        return sorted(xs) if rng.random() < 0.5 else xs
    if arg_type == "list_str":
        return [rng.choice(_WORDS) for _ in range(rng.randint(0, 5))]
    if arg_type == "bytes":
        return bytes(rng.choice(b"abcxyz 019=+/\n\t\x00\xff\xe9?") for _ in range(rng.randint(0, 16)))
    raise ValueError(arg_type)


def _inputs(module: str, function: str, combo: Sequence[str], n: int) -> list[str]:
    """n argument tuples for `function`, as Python literals, the same on every run."""
    out = []
    for i in range(n):
        rng = random.Random(digest(module, function, *combo, str(i)))
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

if hasattr(signal, "setitimer"):
    signal.signal(signal.SIGALRM, _alarm)
    _limit = lambda seconds: signal.setitimer(signal.ITIMER_REAL, seconds)
else:  # Windows: no per-call limit, the whole probe's timeout only
    _limit = lambda seconds: None
module = load(NAME, SOURCE)
found = {}
for key, function, literals in PROBES:
    ok, seen = 0, set()
    for literal in literals:
        _limit(0.5)
        try:
            result = call(module, function, eval(literal), {})
        finally:
            _limit(0)
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


def probe_cases(module: str, code: str) -> tuple[tuple[str, str], ...]:
    """The cases for a file: per public function taking 1-MAX_ARITY required arguments, the
    combinations of argument types that return on at least 3 of PROBES inputs with 2 or more
    distinct results (the best COMBOS_PER_FUNCTION), CASES_PER_COMBO inputs each."""
    tree = ast.parse(code)
    probes = []
    for fn in public_functions(tree):
        k = arity(fn)
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
                                  text=True, timeout=PROBE_TIMEOUT * 3,
                                  env=quality.sandbox_env(tmp))
        except subprocess.TimeoutExpired:
            log.info("%s: probing the inputs timed out", module)
            return ()
    if done.returncode != 0:
        log.info("%s: probing the inputs failed: %s", module, done.stderr.strip().splitlines()[-1:])
        return ()
    found = json.loads(done.stdout)
    cases: list[tuple[str, str]] = []
    for fn in public_functions(tree):
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
