"""The whole-file edit workload's tasks and checks, no model: files from this interpreter's
standard library, each task's reference edit passes its check, the unchanged input, a broken
edit and a reply that does not parse fail it."""

from __future__ import annotations

import ast
import json
from dataclasses import asdict
from pathlib import Path

import pytest

from sprinter_edge.bench import report, summary
from sprinter_edge.bench.edits import ast_tools, file_sources, sandbox, transforms
from sprinter_edge.bench.edits import files as edits_files
from sprinter_edge.bench.edits import tasks as task_sets
from sprinter_edge.bench.edits.files import FILES
from sprinter_edge.bench.prompts import CODE_BLOCK_END
from sprinter_edge.bench.runner import MethodSpec, RunRecord


@pytest.fixture(scope="module")
def tasks() -> list[edits_files.FileEditTask]:
    return FILES.all()


def as_reply(code: str) -> str:
    """A reply that opens with the code block, cut where the bench's stop string cuts it."""
    reply = f"Here is the file.\n\n```python\n{code}```\nThe code above makes the change."
    return reply[: reply.find(CODE_BLOCK_END[0])]


def _sample(tasks: list[edits_files.FileEditTask]) -> list[edits_files.FileEditTask]:
    """The first two tasks of each edit (every check costs a sandboxed run)."""
    return [t for k in FILES.edits for t in [t for t in tasks if t.edit == k][:2]]


def _by(tasks: list[edits_files.FileEditTask], edit: str) -> edits_files.FileEditTask:
    return next(t for t in tasks if t.edit == edit)


@pytest.mark.slow
def test_tasks_cover_every_edit_and_fit_the_context(tasks: list[edits_files.FileEditTask]) -> None:
    assert {t.edit for t in tasks} == set(FILES.edits)
    assert len(tasks) >= 30 and len({t.id for t in tasks}) == len(tasks)
    assert len({t.module for t in tasks}) >= 10
    for t in tasks:
        prompt = file_sources.estimate_tokens(t.prompt)
        assert file_sources.MIN_TOKENS <= prompt <= 2_000, (t.id, prompt)  # about 1-2k tokens of file
        assert prompt + edits_files.reply_tokens(t) <= file_sources.FIT_MARGIN * file_sources.CONTEXT, t.id
        assert t.prompt.startswith(t.instruction + "\n\n```python\n" + t.code + "```\n\n")
        assert t.prompt.endswith(t.instruction + " " + edits_files.RETURN_FILE) and t.code.endswith("\n")
        assert t.cases and all(isinstance(ast.parse(a, mode="eval").body, ast.Tuple) for _, a in t.cases)
        assert t.original == file_sources.file_source(t.module).code  # type: ignore[union-attr]
        if t.edit == "fix_bug":
            assert t.code != t.original and t.new in t.original and t.old in t.code
        elif t.edit == "add_docstrings":
            assert len(t.code) < len(t.original) and "change nothing else" in t.instruction
        elif t.edit == "reformat":
            assert ast.dump(ast.parse(t.code)) == ast.dump(ast.parse(t.original)) and t.code != t.original
        elif t.edit != "type_hints":
            assert t.code == t.original
    # a renamed parameter is used all over the file
    for t in (t for t in tasks if t.edit == "rename_parameter"):
        uses = ast_tools.name_uses(ast.parse(t.code))
        assert uses[t.renames[0][0]] >= edits_files.MIN_RENAME_USES, t.id


@pytest.mark.slow
def test_tasks_build_deterministically(tasks: list[edits_files.FileEditTask]) -> None:
    first = FILES.select(10)
    assert len({t.edit for t in first}) == len(FILES.edits)  # the edits take turns
    assert len({t.module for t in first}) >= 8  # mostly on files no earlier task used
    assert all(t in tasks for t in first)
    edits_files.build_task.cache_clear()
    file_sources.file_source.cache_clear()
    assert FILES.select(10) == first  # rebuilt from the files: the same tasks, cases included
    only = FILES.select(4, ["fix_bug", "fstring"])
    assert [t.edit for t in only] == ["fstring", "fix_bug", "fstring", "fix_bug"]
    prompts = FILES.prompts(3, skip=1)
    assert [p.id for p in prompts] == [t.id for t in first[1:4]]
    assert all(p.workload == "file_edit" and p.stop == CODE_BLOCK_END for p in prompts)
    assert edits_files.FileEditTask.from_dict(json.loads(json.dumps(prompts[0].problem))) == first[1]
    with pytest.raises(ValueError, match="unknown whole-file edit rename"):
        FILES.parse("rename")


@pytest.mark.slow
def test_the_original_passes_its_own_check(tasks: list[edits_files.FileEditTask]) -> None:
    for module in sorted({t.module for t in tasks})[:4]:
        src = file_sources.file_source(module)
        assert src is not None
        res = sandbox.run_check(src.code, src.code, module, src.cases)
        assert res.passed and res.status == "passed", (module, res)


@pytest.mark.slow
def test_references_pass_and_unchanged_inputs_fail(tasks: list[edits_files.FileEditTask]) -> None:
    for task in _sample(tasks):
        assert edits_files.is_file_task(asdict(task))  # how the runner picks the check
        res = edits_files.check_reply(asdict(task), as_reply(edits_files.reference(task)))
        assert res.passed and res.status == "passed" and res.edit == f"file:{task.edit}", (task.id, res)
        res = edits_files.check_reply(task, as_reply(task.code))
        assert not res.passed and res.why, task.id
        if task.edit == "fix_bug":  # the planted bug is caught by the behaviour check
            assert res.failure == "tests" and res.why.startswith("behaviour differs"), (task.id, res)
        else:
            assert res.failure == "change" and res.why.startswith("change not made"), (task.id, res)


@pytest.mark.slow
def test_a_change_that_breaks_behaviour_fails(tasks: list[edits_files.FileEditTask]) -> None:
    """The change is made on the file with the planted bug: the change check passes, the
    behaviour check does not."""
    bugs = {t.module: t for t in tasks if t.edit == "fix_bug"}
    for kind in ("rename_function", "rename_parameter", "type_hints"):
        task = next(t for t in tasks if t.edit == kind and t.module in bugs)
        bug = bugs[task.module]
        broken = edits_files.reference(edits_files.FileEditTask.from_dict({**asdict(task), "code": bug.code}))
        assert edits_files.check_change(task, broken) == ("", "")
        res = edits_files.check_reply(task, as_reply(broken))
        assert not res.passed and res.failure == "tests" and "behaviour differs" in res.why, (task.id, res)


@pytest.mark.slow
def test_replies_that_do_not_run_fail(tasks: list[edits_files.FileEditTask]) -> None:
    task = _by(tasks, "rename_function")
    old, new = task.renames[0]
    res = edits_files.check_reply(task, f"I renamed `{old}` to `{new}`.")
    assert res.failure == "no-code" and "no python code block" in res.why
    ref = edits_files.reference(task)
    res = edits_files.check_reply(task, as_reply(ref[: ref.rindex("\ndef ") + 8]))  # cut off mid-file
    assert res.failure == "parse" and res.why.startswith("did not parse"), res
    # renamed, but the renamed function's body is gone
    tree = ast.parse(ref)
    next(n for n in tree.body if getattr(n, "name", "") == new).body = [ast.Pass()]  # type: ignore[attr-defined]
    res = edits_files.check_reply(task, as_reply(ast.unparse(tree) + "\n"))
    assert res.failure == "tests" and "behaviour differs" in res.why, res
    # an edit that loops forever runs into the time limit
    looping = edits_files.reference(task).replace(f"def {new}(", f"def {new}(*_a):\n    while True:\n"
                                                  f"        pass\n\ndef _unused_{new}(", 1)
    res = edits_files.check_reply(task, as_reply(looping), timeout=3)
    assert not res.passed and res.status == "timeout" and res.why == "behaviour check timed out", res
    # an edited file that does not load says why
    res = edits_files.check_reply(task, as_reply(edits_files.reference(task) + "\nundefined_name.attr\n"))
    assert res.failure == "tests" and "failed to load: NameError" in res.why, res


@pytest.mark.slow
def test_change_checks_read_the_ast(tasks: list[edits_files.FileEditTask]) -> None:
    hints = _by(tasks, "type_hints")
    tree = ast.parse(edits_files.reference(hints))
    last = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)][-1]
    last.returns = None
    failure, why = edits_files.check_change(hints, ast.unparse(tree))
    assert failure == "change" and f"{last.name} return" in why
    # a method's self, and __init__'s return, may stay bare
    bare = ("class A:\n    def __init__(self, x: int):\n        pass\n"
            "    def f(self) -> int:\n        return 1\n")
    assert edits_files._missing_hints(ast.parse(bare)) == []
    fstring = _by(tasks, "fstring")
    done = edits_files.reference(fstring)
    assert edits_files.check_change(fstring, done) == ("", "")
    failure, why = edits_files.check_change(fstring, done + "\nLEFT = '%s!' % 1\n")
    assert failure == "change" and "'%s!' % 1" in why
    helpers = _by(tasks, "rename_helpers")
    assert len(helpers.renames) >= 2 and all(new == old.lstrip("_") for old, new in helpers.renames)
    old, new = helpers.renames[-1]
    half = edits_files.reference(edits_files.FileEditTask.from_dict({**asdict(helpers),
                                                                     "renames": helpers.renames[:-1]}))
    failure, why = edits_files.check_change(helpers, half)
    assert failure == "change" and f"`{old}` is still used" in why


@pytest.mark.parametrize(("source", "values"), [
    ("'%s-%r|%5s|%-4d|%03d|%.2f%%|%x' % (a, b, a, c, c, d, c)", {"a": "x", "b": "y'", "c": 7, "d": 2.345}),
    ("'{} and {!r}: {:>6} {name}'.format(a, b, c, name=d)", {"a": 1, "b": "q", "c": 2.5, "d": None}),
    ("'{1}{0!s:>3}{{}}'.format(a, b)", {"a": 1, "b": "q"}),
    ("'%s' % a", {"a": [1, 2]}),
])
def test_formatting_converts_to_equal_fstrings(source: str, values: dict) -> None:
    tree = transforms.ToFString().visit(ast.parse(source, mode="eval"))
    converted = ast.unparse(ast.fix_missing_locations(tree))
    assert isinstance(tree.body, ast.JoinedStr) and not transforms.string_formatting(ast.parse(converted))
    assert eval(converted, {}, dict(values)) == eval(source, {}, dict(values)), converted


def test_forms_it_does_not_convert_leave_no_task() -> None:
    for source in ("'%(a)s' % d", "'%*d' % (3, 4)", "'{0.real}'.format(1)", "'%.3s' % 'abcdef'",
                   "'{} {0}'.format(1)"):
        conv = transforms.ToFString()
        conv.visit(ast.parse(source, mode="eval"))
        assert conv.failed, source


@pytest.mark.slow
def test_bench_flags_choose_file_edit_tasks(capsys: pytest.CaptureFixture[str]) -> None:
    from sprinter_edge.bench.results import select_prompts
    from sprinter_edge.cli import build_parser
    from sprinter_edge.cli.bench import config_from
    from sprinter_edge.errors import SprinterError

    def cfg(*flags: str):  # type: ignore[no-untyped-def]
        return config_from(build_parser().parse_args(["bench", *flags]))

    assert cfg().file_edits == 0
    none = ("--humaneval", "0", "--chat", "0", "--explain", "0", "--long", "0")
    c = cfg("--file-edits", "3", "--file-edit-kinds", "type_hints,fix_bug", *none)
    assert c.file_edits == 3 and tuple(c.file_edit_kinds) == ("type_hints", "fix_bug")
    chosen = select_prompts(c)
    assert [p.id for p in chosen] == [t.id for t in FILES.select(3, ["type_hints", "fix_bug"])]
    assert {p.workload for p in chosen} == {"file_edit"}
    both = select_prompts(cfg("--file-edits", "1", "--edits", "1", *none))
    assert [p.workload for p in both] == ["edit", "file_edit"]
    with pytest.raises(SprinterError, match="--file-edit-kinds"):
        cfg("--file-edits", "5", "--file-edit-kinds", "renames")
    c = cfg("--file-edits", "4", "--split", "tuning", *none)
    assert [p.id for p in select_prompts(c)] == [t.id for t in FILES.select(4, split="tuning")]
    with pytest.raises(SprinterError, match="--file-edits"):
        cfg("--file-edits", "-1")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--file-edits N N whole-file edit tasks" in text and "--max-tokens 2048" in text
    assert "--file-edit-kinds KIND,... only these whole-file edit kinds" in text


def _record(method: str, workload: str, i: int, passed: bool, kind: str) -> RunRecord:
    stats = {"prefill_seconds": 0.5 if workload == "file_edit" else 0.1, "total_seconds": 4.0 + i % 2}
    return RunRecord(method, f"{workload}/{i}", workload, "", [], stats, 10, 2.0, 5.0, 0.0,
                     edit={"passed": passed, "edit": kind, "why": "" if passed else "behaviour differs"})


def test_report_has_the_file_edit_workload_with_first_token_and_end_to_end_times() -> None:
    specs = [MethodSpec("ar", "ar"), MethodSpec("lookup", "lookup")]
    records = [_record(m, "file_edit", i, i % 3 != 0 or m == "ar", "file:fix_bug") for m in ("ar", "lookup")
               for i in range(6)]
    records += [_record(m, "edit", i, True, "fix_bug") for m in ("ar", "lookup") for i in range(4)]
    rows = summary.summarize(records, specs)
    ar, lookup = rows
    assert (ar["file_edit_pass"], ar["file_edit_n"], ar["edit_n"]) == (1.0, 6, 4)  # each workload its own
    assert lookup["file_edit_passed"] == 4 and lookup["file_edit_diff_vs_ar"] < 0
    assert lookup["edit_by_kind"] == {"file:fix_bug": [4, 6], "fix_bug": [4, 4]}
    assert lookup["e2e_seconds"] == pytest.approx(4.5)
    groups = summary.summarize_groups(records, specs)
    assert list(groups) == ["edit", "file_edit"]
    g = groups["file_edit"]
    assert g[1]["file_edit_pass"] == pytest.approx(4 / 6) and g[1]["edit_n"] == 0
    assert g[1]["ttft_seconds"] == pytest.approx(0.5) and g[1]["e2e_seconds"] == pytest.approx(4.5)
    md = "\n".join(report.group_tables(groups))
    section = md[md.index("### whole-file edits"):]
    head = section.splitlines()[2]
    for column in ("tok/s", "TTFT s", "end-to-end s", "file edit pass", "file edits done"):
        assert f"| {column} |" in head, head
    assert "| lookup | 5.00 |" in section and "| 4/6 |" in section and "| edits done |" not in section
    table = report.markdown_table(rows)
    assert "| file edits done |" in table and "| edits done |" in table and "| end-to-end s |" in table
    assert "| file edit pass |" not in report.markdown_table([{"method": "ar", "file_edit_n": 0}])


@pytest.mark.slow
def test_bench_file_edits_end_to_end(fixture_target_path: Path, fixture_draft_path: Path,
                                     tmp_path: Path) -> None:
    """--file-edits: the prompts run through every row as --edits' do, each reply is checked
    (runs[].edit, kind file:*), and bench.md has the workload as its own group."""
    from sprinter_edge.cli import main

    out = tmp_path / "bench"
    rc = main(["bench", "--target", str(fixture_target_path), "--draft", str(fixture_draft_path),
               "--methods", "ar,lookup", "--humaneval", "0", "--chat", "1", "--explain", "0", "--long", "0",
               "--file-edits", "2", "--max-tokens", "16", "--threads", "2", "--no-peers", "--no-cost-model",
               "--no-warmup", "--rescore", "none", "--out", str(out), "--no-progress"])
    assert rc == 0
    data = json.loads((out / "bench.json").read_text())
    runs = [r for r in data["runs"] if r["workload"] == "file_edit"]
    assert len(runs) == 4 and all(r["edit"]["edit"].startswith("file:") for r in runs)
    assert all(not r["edit"]["passed"] and "--max-tokens" in r["edit"]["why"] for r in runs)  # 16 tokens
    rows = data["groups"]["file_edit"]
    assert [r["file_edit_n"] for r in rows] == [2, 2] and all(r["e2e_seconds"] > r["ttft_seconds"] > 0
                                                              for r in rows)
    md = (out / "bench.md").read_text()
    assert "### whole-file edits (2 prompts, workload `file_edit`)" in md and "| file edits done |" in md


@pytest.mark.slow
def test_the_split_is_by_module_disjoint_and_stable(tasks: list[edits_files.FileEditTask]) -> None:
    """Modules alternate by their place in MODULES: the sides share no file, cover every task,
    rebuild the same, and each edit has 3 tasks at least on the report side (the two rarest,
    3 and 2 tasks in all: all but one), one at least on the tuning side."""
    sides = {split: FILES.all(split=split) for split in ("tuning", "report")}
    modules = {split: {t.module for t in ts} for split, ts in sides.items()}
    assert modules["tuning"].isdisjoint(modules["report"])
    assert sorted(t.id for ts in sides.values() for t in ts) == sorted(t.id for t in tasks)
    assert [edits_files.split_of(m) for m in edits_files.MODULES[:4]] == ["report", "tuning"] * 2
    for edit in FILES.edits:
        total = sum(t.edit == edit for t in tasks)
        assert sum(t.edit == edit for t in sides["report"]) >= min(3, total - 1), edit
        assert sum(t.edit == edit for t in sides["tuning"]) >= 1, edit
    first = FILES.select(6, split="report")
    assert {t.module for t in first} <= modules["report"]
    edits_files.build_task.cache_clear()
    assert FILES.select(6, split="report") == first
    assert FILES.find(first[0].id) == first[0] and FILES.find("file_edit/nothing/bisect") is None


def test_the_sealed_set_runs_only_when_named() -> None:
    """The sealed modules are none of the others, on a side of their own, and out of every
    selection that does not name it (a bench run without --split, a replay of "all")."""
    sealed = edits_files.SEALED_MODULES
    assert len(sealed) >= 12 and set(sealed).isdisjoint(edits_files.MODULES)
    assert {edits_files.split_of(m) for m in sealed} == {task_sets.SEALED}
    assert set(FILES.source_names("sealed")) == set(sealed)
    assert set(FILES.source_names(None)).isdisjoint(sealed)
    assert "sealed" in task_sets.SPLITS


@pytest.mark.slow
def test_docstring_and_layout_checks(tasks: list[edits_files.FileEditTask]) -> None:
    docs, layout = _by(tasks, "add_docstrings"), _by(tasks, "reformat")
    ref = edits_files.reference(docs)
    assert edits_files.check_change(docs, ref) == ("", "")
    tree = ast.parse(ref)
    fn = next(f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef))
    fn.body = fn.body[1:] or [ast.Pass()]
    failure, why = edits_files.check_change(docs, ast.unparse(tree))
    assert failure == "change" and f"`{fn.name}`" in why
    assert edits_files.misindented(layout.code, ast.parse(layout.code))  # 2 spaces a level
    assert not edits_files.misindented(layout.original, ast.parse(layout.original))
    failure, why = edits_files.check_change(layout, layout.original + "\nEXTRA = 1\n")
    assert failure == "change" and "AST differs" in why
    assert transforms.poor_layout("def f(a, b):\n    return a + b\n") == "def f(a,b):\n  return a+b\n"
