"""Whole-file edits: the edit requests of `functions`, asked of a whole module of real code
instead of one HumanEval function, so the prompt holds 0.8-2k tokens of context and the reply
returns all of it: where copying the input pays, and where a method's speed at depth shows.
A prompt and its reply fit a 4096-token context (`file_sources.fits`).

The files are modules of the running interpreter's standard library (`file_sources`). Each
task is checked automatically: the reply's code block parses, carries the change (read from
the AST) and behaves as the original module does: every public function that simple
arguments exercise is called, in both, on the same deterministic inputs, in a sandboxed
subprocess (`sandbox.run_check`), and the results, the exceptions' types, the arguments after
the call and what was printed must be equal. Every task is built with its reference edit (the
change made by rewriting the AST) and must pass its check with it; the file shown must fail
the change check (a planted bug: the behaviour check).

Two edits are about the text more than the names: `add_docstrings` shows the file without
its functions' docstrings (`transforms.strip_docstrings`) and asks for one on every function
and method; `reformat` shows it in a poor layout that runs identically (2-space indentation,
no spaces around commas and operators: `transforms.poor_layout`) and asks for PEP 8: the
reply must have the original's AST (`ast.dump`, docstrings kept) and every statement that
starts a line indented by a multiple of 4 spaces.

The split (`split_of`): the modules take turns by their position in `MODULES`, even
positions (0, 2, ...) "report", odd "tuning", 11 each; every file's edits are on the side of
its module. (A SHA-256 of the names splits them 9 report / 13 tuning and leaves no
rename_helpers task to report.) With Python 3.11's files, report / tuning: rename_function
7/5, rename_parameter 8/10, rename_class 2/1, rename_helpers 1/1, type_hints 11/10, fstring
5/1, fix_bug 10/10, add_docstrings 10/7, reformat 11/11: every edit has 3 tasks at least on
the report side but the two rarest, which have 3 and 2 in all.
"""

from __future__ import annotations

import ast
import builtins
import functools
import keyword
import logging
from dataclasses import dataclass

from .. import quality
from .ast_tools import (
    FUNCS,
    SYNONYMS,
    SourceText,
    attrs_and_keywords,
    count_functions,
    defined_names,
    digest,
    identifiers,
    name_uses,
    nested_bindings,
    new_function_name,
    parameters,
    public_functions,
    qualified_names,
)
from .file_sources import HINT_TOKENS, MIN_TOKENS, FileSource, estimate_tokens, file_source
from .sandbox import PROBE_TIMEOUT, run_check
from .tasks import SEALED, EditCheck, TaskSet, rename_old_keys
from .transforms import (
    Renamer,
    ToFString,
    add_docstrings,
    annotate,
    mutations,
    poor_layout,
    string_formatting,
    strip_annotations,
    strip_docstrings,
)

log = logging.getLogger(__name__)

WORKLOAD = "file_edit"  # the bench's workload (`BenchPrompt.workload`)
EDITS = ("rename_function", "rename_parameter", "rename_class", "rename_helpers", "type_hints", "fstring",
         "fix_bug", "add_docstrings", "reformat")
# pure-Python standard library modules whose code is deterministic and runs without files,
# network or clock; each gives one file (the whole module when it fits, else a slice of it)
# (textwrap, shlex, difflib, statistics: every part that runs alone is too short or too long)
MODULES = ("colorsys", "bisect", "fnmatch", "html", "heapq", "string", "calendar", "base64", "ntpath",
           "posixpath", "operator", "stat", "genericpath", "glob", "quopri", "nturl2path", "unittest.util",
           "urllib.parse", "email.quoprimime", "email.base64mime", "email._encoded_words",
           "encodings.punycode")
# The sealed set (CONTRIBUTING's split rule): modules no task, replay, trace or prompt here had
# used when this list was fixed, before its first run. Run only to report, on finished code
# (`--split sealed`); never traced, replayed or tuned on. No run without --split includes it.
# Chosen from modules that build tasks here, leaving out those whose functions read the clock,
# files or the locale; 14 modules, every edit kind among them (fixed before its first run:
# docs/journal.md, "The measurements behind the constants").
SEALED_MODULES = ("email._parseaddr", "getopt", "sndhdr", "xml.etree.ElementPath", "zoneinfo._tzpath",
                  "encodings.idna", "copyreg", "email.charset", "email.utils", "xdrlib", "wsgiref.util",
                  "tabnanny", "mailcap", "opcode")
RETURN_FILE = "Return the whole file in one python code block."
MAX_MUTATIONS = 16  # planted bugs tried per file before the file is left out of fix_bug
MIN_RENAME_USES = 10  # a renamed parameter is used this often across the file
MAX_HELPERS = 3  # rename_helpers: this many private functions at most
MIN_DOCSTRINGS = 2  # add_docstrings: the file shown lacks this many functions' docstrings at least
INDENT = 4  # reformat: spaces per level

# a parameter's new name, when a renamed parameter has one of these names
_RENAMES = {**SYNONYMS, "a": "items", "x": "item", "lo": "low", "hi": "high", "pat": "pattern",
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
    edit: str
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
        before it: docs/journal.md, "Eight standard-library modules, with Predicted Outputs")."""
        return (f"{self.instruction}\n\n```python\n{self.code}```\n\n"
                f"{self.instruction} {RETURN_FILE}")

    @property
    def check_edit(self) -> str:
        """The edit as the report shows it, apart from the single-function edits."""
        return f"file:{self.edit}"

    @classmethod
    def from_dict(cls, d: dict) -> FileEditTask:
        """From `asdict` (or its JSON): lists back to tuples; results from before the rename
        carry "kind" for `edit`."""
        d = rename_old_keys(d, cls)
        d["cases"] = tuple(tuple(c) for c in d.get("cases", ()))
        d["renames"] = tuple(tuple(r) for r in d.get("renames", ()))
        d["lines"] = tuple(d.get("lines", (0, 0)))
        return cls(**d)


def reply_tokens(task: FileEditTask) -> int:
    """The tokens a reply that returns the whole file takes, by the estimate: the longer of the
    file shown and the original, with type hints or a docstring added to every function (the
    budget a bench run gives: --max-tokens at least this)."""
    longer = max(estimate_tokens(task.code), estimate_tokens(task.original))
    return longer + HINT_TOKENS * count_functions(task.original) + 32


# ---------------------------------------------------------------------------- builders


def _taken(tree: ast.AST) -> set[str]:
    return identifiers(tree) | set(dir(builtins)) | set(keyword.kwlist)


def _task(edit: str, src: FileSource, instruction: str, code: str | None = None,
          **extra: object) -> FileEditTask:
    return FileEditTask(f"{WORKLOAD}/{edit}/{src.module}", edit, src.module, instruction,
                        src.code if code is None else code, src.code, src.cases,
                        lines=(src.first, src.last), whole=src.whole, **extra)  # type: ignore[arg-type]


def _rename_function(src: FileSource, tree: ast.Module) -> FileEditTask | None:
    """The public function the file calls most (at least once besides its definition)."""
    uses = name_uses(tree)
    tested = {f for f, _ in src.cases}
    skip = attrs_and_keywords(tree)
    names = sorted((f.name for f in public_functions(tree) if f.name in tested and f.name not in skip
                    and f.name == f.name.lower() and len(f.name) > 2 and uses.get(f.name, 0) >= 2),
                   key=lambda n: -uses[n])
    for old in names:
        new = next((c for c in (new_function_name(old), f"{old}_impl") if c not in _taken(tree)), None)
        if new:
            return _task("rename_function", src, f"Rename the function `{old}` to `{new}` everywhere in "
                         "this file.", renames=((old, new),))
    return None


def _param_scopes(tree: ast.Module, name: str) -> list[ast.AST] | None:
    """The functions that take `name` as a parameter, when every use of the name in the file
    is inside them and none of them rebinds it in a nested scope; else None."""
    fns = [f for f in ast.walk(tree) if isinstance(f, FUNCS) and any(a.arg == name for a in parameters(f))]
    inside = {id(n) for f in fns for n in ast.walk(f)}
    outside = [n for n in ast.walk(tree) if id(n) not in inside
               and ((isinstance(n, ast.Name) and n.id == name) or (isinstance(n, ast.arg) and n.arg == name))]
    if not fns or outside or any(name in nested_bindings(f) - {a.arg for a in parameters(f)} for f in fns):
        return None
    return fns


def _rename_parameter(src: FileSource, tree: ast.Module) -> FileEditTask | None:
    """The parameter name used most across the file (MIN_RENAME_USES times at least)."""
    uses = name_uses(tree)
    skip = attrs_and_keywords(tree) | {"self", "cls"}
    params = {a.arg for f in ast.walk(tree) if isinstance(f, FUNCS) for a in parameters(f)} - skip
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
    uses = name_uses(tree)
    skip = attrs_and_keywords(tree)
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
    uses = name_uses(tree)
    skip = attrs_and_keywords(tree)
    taken = _taken(tree)
    helpers = [f.name for f in tree.body if isinstance(f, FUNCS) and f.name.startswith("_")
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
    if sum(isinstance(n, FUNCS) for n in ast.walk(tree)) < 2:
        return None
    return _task("type_hints", src, "Add type hints to every parameter and the return value of every "
                 "function and method in this file (`self` and `cls` may stay bare).",
                 strip_annotations(src.code, tree))


def _fstring(src: FileSource, tree: ast.Module) -> FileEditTask | None:
    """When the file builds strings with `%` or `.format()` (twice at least) and each of them
    converts (by `_ToFString`)."""
    sites = string_formatting(tree)
    if len(sites) < 2:
        return None
    conv = ToFString()
    conv.visit(ast.parse(src.code))
    if conv.failed:
        return None
    return _task("fstring", src, "Convert every string built with `%` or `.format()` in this file to an "
                 "f-string.", old=str(len(sites)))


def _fix_bug(src: FileSource, tree: ast.Module) -> FileEditTask | None:
    """The file with one planted bug (`edits._mutations`) that its check catches; candidates
    in a fixed per-file order."""
    text = SourceText(src.code)
    names = qualified_names(tree)
    found = {(names[id(fn)], cls, *e) for fn in ast.walk(tree) if id(fn) in names
             for cls, edits in mutations(fn, text).items() for e in edits}  # type: ignore[arg-type]
    tried = 0
    dump = ast.dump(tree)
    for fn, _, a, b, new in sorted(found, key=lambda c: digest(src.module, *map(str, c))):
        if tried == MAX_MUTATIONS:
            break
        code = text.replace([(a, b, new)])
        try:
            if ast.dump(ast.parse(code)) == dump:
                continue
        except SyntaxError:
            continue
        tried += 1
        res = run_check(src.code, code, src.module, src.cases, timeout=PROBE_TIMEOUT)
        if res.status == "failed" and res.detail.startswith("behaviour differs"):
            what = f"method `{fn}`" if "." in fn else f"function `{fn}`"
            return _task("fix_bug", src, f"The {what} in this file has a bug: for some inputs it gives a "
                         "wrong result. Fix the bug and change nothing else.", code, function=fn,
                         old=new, new=src.code[a:b])
    log.info("%s: no planted bug the check catches in %d tries", src.module, tried)
    return None


def _add_docstrings(src: FileSource, tree: ast.Module) -> FileEditTask | None:
    """The file without its functions' docstrings (MIN_DOCSTRINGS of them at least)."""
    code, stripped = strip_docstrings(src.code, tree)
    if stripped < MIN_DOCSTRINGS:
        return None
    return _task("add_docstrings", src, "Add a docstring to every function and method in this file that "
                 "says what it does, and change nothing else.", code)


def _reformat(src: FileSource, tree: ast.Module) -> FileEditTask | None:
    """The file in a poor layout that runs identically (`poor_layout`)."""
    try:
        code = poor_layout(src.code)
    except (ValueError, SyntaxError) as exc:
        log.info("%s: no poor layout: %s", src.module, exc)
        return None
    if code == src.code:
        return None
    return _task("reformat", src, f"Reformat this file to PEP 8 with {INDENT}-space indentation and spaces "
                 "around operators and after commas; change nothing else.", code)


_BUILDERS = {"rename_function": _rename_function, "rename_parameter": _rename_parameter,
             "rename_class": _rename_class, "rename_helpers": _rename_helpers, "type_hints": _type_hints,
             "fstring": _fstring, "fix_bug": _fix_bug, "add_docstrings": _add_docstrings,
             "reformat": _reformat}


@functools.cache
def build_task(edit: str, module: str) -> FileEditTask | None:
    """The `edit` task on `module`'s file, None where it does not apply. Its reference edit
    must pass its check and its input fail the change check (a bug: the behaviour check)."""
    src = file_source(module)
    if src is None:
        return None
    task = _BUILDERS[edit](src, ast.parse(src.code))
    if task is None:
        return None
    if estimate_tokens(task.prompt) < MIN_TOKENS:
        log.info("%s: the prompt is under %d tokens: task left out", task.id, MIN_TOKENS)
        return None
    ref = reference(task)
    failure, why = check_change(task, ref)
    if failure:
        log.warning("%s: the reference edit fails the change check (%s): task left out", task.id, why)
        return None
    if edit != "fix_bug":
        res = run_check(task.original, ref, module, task.cases, task.renames, PROBE_TIMEOUT)
        if not res.passed:
            log.info("%s: the reference edit fails the behaviour check (%s): task left out", task.id,
                     res.detail)
            return None
        if check_change(task, task.code)[0] != "change":
            log.warning("%s: the unchanged input passes the change check: task left out", task.id)
            return None
    return task



# ---------------------------------------------------------------------------- checks


def reference(task: FileEditTask) -> str:
    """The edit the task asks for, made by rewriting the AST (comments and layout are lost):
    the reply a correct edit would give, up to formatting."""
    if task.edit in ("fix_bug", "reformat"):
        return task.original
    if task.edit == "add_docstrings":
        tree = ast.parse(task.original)
        add_docstrings(tree, {})
        return ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    tree = ast.parse(task.code)
    if task.renames:
        tree = Renamer(dict(task.renames)).visit(tree)
    if task.edit == "type_hints":
        annotate(tree)
    elif task.edit == "fstring":
        tree = ToFString().visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def _missing_hints(tree: ast.AST) -> list[str]:
    """Parameters and returns without a hint (a method's `self` or `cls`, and `__init__`'s
    return, may stay bare)."""
    missing = []
    methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body
               if isinstance(f, FUNCS)}
    for f in (n for n in ast.walk(tree) if isinstance(n, FUNCS)):
        args = parameters(f)
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
    edit = task.edit
    if task.renames:
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | defined_names(tree)
        if edit == "rename_parameter":
            used |= {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
        for old, new in task.renames:
            if old in used:
                return ("change", f"change not made: `{old}` is still used")
            present = ({n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)} if edit == "rename_parameter"
                       else defined_names(tree))
            if new not in present:
                return ("change", f"change not made: no {_WHAT[edit]} `{new}`")
    elif edit == "type_hints":
        missing = _missing_hints(tree)
        if missing:
            return ("change", "change not made: no type hint on " + ", ".join(missing[:4])
                    + (", ..." if len(missing) > 4 else ""))
    elif edit == "fstring":
        left = string_formatting(tree)
        if left:
            return ("change", f"change not made: `{ast.unparse(left[0])[:60]}` is still there")
        if sum(isinstance(n, ast.JoinedStr) for n in ast.walk(tree)) <= \
                sum(isinstance(n, ast.JoinedStr) for n in ast.walk(ast.parse(task.code))):
            return ("change", "change not made: no new f-string")
    elif edit == "add_docstrings":
        bare = [f.name for f in ast.walk(tree)
                if isinstance(f, FUNCS) and not (ast.get_docstring(f) or "").strip()]
        if bare:
            return ("change", "change not made: no docstring on " + ", ".join(f"`{n}`" for n in bare[:4])
                    + (", ..." if len(bare) > 4 else ""))
    elif edit == "reformat":
        return _layout_failure(task, code, tree)
    return "", ""  # fix_bug: the behaviour check decides


def misindented(code: str, tree: ast.AST) -> list[int]:
    """The lines where a statement starts the line indented by other than a multiple of INDENT
    spaces (a tab counts as one column: not a multiple)."""
    lines = code.splitlines()
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.stmt)
            and not lines[n.lineno - 1][: n.col_offset].strip() and n.col_offset % INDENT]


def _layout_failure(task: FileEditTask, code: str, tree: ast.AST) -> tuple[str, str]:
    """reformat's change check: the original's AST, and every statement at a multiple of INDENT."""
    if ast.dump(tree) != ast.dump(ast.parse(task.original)):
        return ("change", "the code changed: a reformat keeps the same code (its AST differs)")
    bad = misindented(code, tree)
    if bad:
        return ("change", f"change not made: line {bad[0]} is not indented by a multiple of {INDENT} spaces")
    return "", ""


def is_file_task(task: object) -> bool:
    """A whole-file task (or its dict, as the bench's prompts carry it), not a function's."""
    return isinstance(task, FileEditTask) or (isinstance(task, dict) and "module" in task)


def check_reply(task: FileEditTask | dict, reply: str, timeout: float = 10.0) -> EditCheck:
    """Whether a reply does the task: its first python code block parses, carries the change
    and behaves as the original file on every case (`run_check`)."""
    task = task if isinstance(task, FileEditTask) else FileEditTask.from_dict(task)
    code = quality.code_block(reply)
    if code is None:
        return EditCheck(False, task.check_edit, "no python code block in the reply", "no-code")
    failure, why = check_change(task, code)
    if failure:
        return EditCheck(False, task.check_edit, why, failure)
    res = run_check(task.original, code, task.module, task.cases, task.renames, timeout)
    if res.passed:
        return EditCheck(True, task.check_edit, "", "", res.status, res.seconds)
    why = "behaviour check timed out" if res.status == "timeout" else res.detail or "behaviour check failed"
    return EditCheck(False, task.check_edit, why, "tests", res.status, res.seconds)


def split_of(module: str) -> str:
    """A module's side: "sealed" in SEALED_MODULES, else "report" at an even position in
    MODULES, "tuning" at an odd one."""
    if module in SEALED_MODULES:
        return SEALED
    return "report" if MODULES.index(module) % 2 == 0 else "tuning"


# the whole-file edits: every edit of `EDITS` over the files of `MODULES` (and, asked for by
# name, of `SEALED_MODULES`)
FILES: TaskSet[FileEditTask] = TaskSet(WORKLOAD, EDITS, lambda: (*MODULES, *SEALED_MODULES), build_task,
                                       split_of, "whole-file edit")
