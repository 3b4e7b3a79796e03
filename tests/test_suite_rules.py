"""The suite's own rules, each on a small suite of its own (pytester): a skip not on the
allow-list fails the run and every skip is named; deselection is no skip; a test on the default
pair must be marked `integration`; no test module imports another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support import skips

TESTS = Path(__file__).resolve().parent

CONFTEST = '''
from pathlib import Path

import pytest
from support import markers, skips


def pytest_addoption(parser):
    skips.add_option(parser)


def pytest_configure(config):
    config.addinivalue_line("markers", "integration: the default pair")
    skips.register(config, Path(__file__).parent / "allowed.toml")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    markers.check_default_pair_marks(items)


@pytest.fixture
def default_pair_paths():
    return None


@pytest.fixture
def built_on_it(default_pair_paths):
    return default_pair_paths
'''

TESTS_THAT_SKIP = '''
import pytest


def test_passes():
    pass


def test_skips_for_a_machine():
    pytest.skip("this CPU has no such unit")


@pytest.mark.parametrize("n", [1, 2])
def test_skips_missing_a_tool(n):
    pytest.skip("the tool is not built")
'''


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_a=TESTS_THAT_SKIP)
    return pytester


def allow(pytester: pytest.Pytester, *entries: str) -> None:
    (pytester.path / "allowed.toml").write_text("".join(f"[[skip]]\n{e}\n" for e in entries))


def test_a_skip_fails_the_run_and_is_named(suite: pytest.Pytester) -> None:
    result = suite.runpytest()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, skipped=3)
    result.stdout.fnmatch_lines([
        "*= skips: 3, 3 not allowed =*",
        "REFUSED  test_a.py::test_skips_for_a_machine: this CPU has no such unit",
        "REFUSED  test_a.py::test_skips_missing_a_tool[[]1[]]: the tool is not built",
        "REFUSED  test_a.py::test_skips_missing_a_tool[[]2[]]: the tool is not built",
        "3 skip(s) not on allowed.toml: the run fails*",
    ])


def test_an_allowed_skip_passes_and_is_still_named(suite: pytest.Pytester) -> None:
    allow(suite, 'test = "test_a.py::test_skips_for_a_machine"\nreason = "a CPU without the unit"\n'
                 'message = "no such unit"',
          'test = "test_a.py::test_skips_missing_a_tool"\nreason = "every parameter"')
    result = suite.runpytest()
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        "*= skips: 3, 0 not allowed =*",
        "allowed  test_a.py::test_skips_for_a_machine: this CPU has no such unit "
        "(allowed: a CPU without the unit)",
        "allowed  test_a.py::test_skips_missing_a_tool[[]1[]]: *",
    ])


def test_an_allowed_test_skipping_for_another_reason_fails(suite: pytest.Pytester) -> None:
    allow(suite, 'test = "test_a.py::test_skips_*"\nreason = "a machine property"\nmessage = "no such unit"')
    result = suite.runpytest()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*= skips: 3, 2 not allowed =*"])
    assert "REFUSED  test_a.py::test_skips_for_a_machine" not in result.stdout.str()


def test_allow_skips_lists_them_without_failing(suite: pytest.Pytester) -> None:
    result = suite.runpytest("--allow-skips")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["REFUSED  test_a.py::test_skips_for_a_machine: *",
                                 "3 skip(s) not on allowed.toml: not failing the run (--allow-skips)"])


def test_deselection_is_not_a_skip(suite: pytest.Pytester) -> None:
    result = suite.runpytest("-k", "passes")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1, deselected=3)
    assert "skips:" not in result.stdout.str()


def test_a_module_that_skips_whole_fails_the_run(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_b='import pytest\npytest.importorskip("no_such_module_xyz")\n\n'
                               'def test_never():\n    pass\n')
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["REFUSED  test_b.py: could not import 'no_such_module_xyz'*"])


def test_an_entry_without_a_reason_is_refused(suite: pytest.Pytester) -> None:
    allow(suite, 'test = "test_a.py::test_skips_for_a_machine"')
    result = suite.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*allowed.toml: skip entry 1 needs a `test` and a `reason`*"])


def test_an_entry_naming_no_file_is_refused(suite: pytest.Pytester) -> None:
    allow(suite, 'test = "test_gone.py::test_x"\nreason = "a machine property"')
    result = suite.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*allowed.toml: skip entry 1 names no test file: test_gone.py::test_x"])


def test_the_default_pair_needs_the_integration_marker(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_c='''
import pytest


@pytest.mark.integration
def test_marked(default_pair_paths):
    pass


def test_unmarked(default_pair_paths):
    pass


def test_through_a_fixture(built_on_it):
    pass
''')
    result = pytester.runpytest("-m", "not integration")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*without @pytest.mark.integration*", "  test_c.py::test_unmarked",
                                 "  test_c.py::test_through_a_fixture"])
    assert "test_marked" not in result.stderr.str()


def test_the_repository_allow_list_is_short_and_reasoned() -> None:
    entries = skips.load_allow_list(skips.ALLOW_LIST, root=TESTS.parent)
    assert 0 < len(entries) <= 5 and all(len(e.reason) > 20 for e in entries)


def test_no_test_module_imports_another() -> None:
    """Helpers the test modules share live in tests/support/ (or a helper module that is not a
    test module); importing a test module runs its module-level code twice and couples files."""
    offenders = []
    for path in sorted(TESTS.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            offenders += [f"{path.name}:{node.lineno} imports {n}" for n in names
                          if n.split(".")[0].startswith("test_")]
    assert not offenders, offenders


def test_no_test_skips_for_what_the_set_up_installs() -> None:
    """importorskip hides a broken dev set-up: a dependency the dev extra installs is imported."""
    found = [f"{p.name}:{i}" for p in sorted(TESTS.glob("test_*.py"))
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if "importorskip(" in line and p.name != Path(__file__).name]
    assert not found, found
