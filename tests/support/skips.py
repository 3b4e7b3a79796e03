"""A skip is a failure: the run fails when a test skipped that tests/allowed_skips.toml does not
allow, and the terminal summary names every skip, allowed or not.

A skipped test hides what it was written to check, so the suite cannot pass by skipping: what
the dev set-up provides (a package, llama-server, chromium, the default pair) is a failure with a
hint when missing, and a skip is kept only for a property of the machine that no set-up changes
(an AMX CPU, a CPU whose weights llama.cpp does not repack). Such a skip is listed in the
allow-list with its reason:

    [[skip]]
    test = "tests/test_x.py::test_y"     # a node id, a prefix of one (a file, a class, a test
                                         # without its parameters) or an fnmatch pattern
    reason = "why this machine may skip it"
    message = "AMX"                      # optional: the skip's own message must contain this

Deselection (`-m`, `-k`) is not a skip. `--allow-skips` lists the skips without failing the run,
for a developer's partial runs; CI never passes it.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ALLOW_LIST = Path(__file__).resolve().parent.parent / "allowed_skips.toml"
OPTION = "--allow-skips"


@dataclass(frozen=True)
class Allowed:
    test: str
    reason: str
    message: str = ""

    def matches(self, nodeid: str, message: str) -> bool:
        if self.message and self.message not in message:
            return False
        if any(c in self.test for c in "*?["):
            return fnmatch.fnmatchcase(nodeid, self.test)
        return nodeid == self.test or nodeid.startswith((self.test + "::", self.test + "["))


@dataclass(frozen=True)
class Skip:
    nodeid: str
    message: str
    allowed: Allowed | None


def load_allow_list(path: Path = ALLOW_LIST, root: Path | None = None) -> list[Allowed]:
    """The allow-list's entries; a malformed entry, or one naming a test file that does not
    exist (under `root`), is a usage error."""
    if not path.exists():
        return []
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    out = []
    for i, entry in enumerate(data.get("skip", [])):
        unknown = set(entry) - {"test", "reason", "message"}
        test, reason = str(entry.get("test", "")).strip(), str(entry.get("reason", "")).strip()
        if unknown or not test or not reason:
            raise pytest.UsageError(f"{path.name}: skip entry {i + 1} needs a `test` and a `reason` "
                                    f"(and no other key than `message`): {entry}")
        file = test.split("::", 1)[0]
        if root is not None and not any(c in file for c in "*?[") and not (root / file).exists():
            raise pytest.UsageError(f"{path.name}: skip entry {i + 1} names no test file: {test}")
        out.append(Allowed(test, reason, str(entry.get("message", ""))))
    return out


def _message(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr  # a skip's is (path, line, "Skipped: why")
    text = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


class SkipPolicy:
    """Records every skip of the session; fails the session for one not allowed."""

    def __init__(self, config: pytest.Config, allow_list: Path = ALLOW_LIST) -> None:
        self.enforce = not config.getoption(OPTION)
        root = Path(str(config.rootpath))
        self.allow = load_allow_list(allow_list, root=root)
        self.where = allow_list.relative_to(root) if allow_list.is_relative_to(root) else allow_list
        self.skips: list[Skip] = []

    def _record(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if not report.skipped or hasattr(report, "wasxfail"):  # an xfail reports as skipped
            return
        message = _message(report)
        allowed = next((a for a in self.allow if a.matches(report.nodeid, message)), None)
        self.skips.append(Skip(report.nodeid, message, allowed))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._record(report)  # a module that skipped as a whole

    @property
    def refused(self) -> list[Skip]:
        return [s for s in self.skips if s.allowed is None]

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.enforce and self.refused and exitstatus in (pytest.ExitCode.OK,
                                                            pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:  # noqa: ANN001
        if not self.skips:
            return
        tr = terminalreporter
        tr.write_sep("=", f"skips: {len(self.skips)}, {len(self.refused)} not allowed")
        for s in self.skips:
            if s.allowed is not None:
                tr.write_line(f"allowed  {s.nodeid}: {s.message} (allowed: {s.allowed.reason})")
        for s in self.refused:
            tr.write_line(f"REFUSED  {s.nodeid}: {s.message}", red=True)
        if self.refused:
            verdict = ("the run fails: a skip hides what the test checks; provide what it needs, or "
                       "list it there with its reason if this machine cannot")
            if not self.enforce:
                verdict = f"not failing the run ({OPTION})"
            tr.write_line(f"{len(self.refused)} skip(s) not on {self.where}: {verdict}",
                          red=self.enforce, bold=True)


def add_option(parser: pytest.Parser) -> None:
    parser.addoption(OPTION, action="store_true", default=False,
                     help="list skipped tests without failing the run for them (a partial run on a "
                          "machine without the dev set-up; CI never passes it)")


def register(config: pytest.Config, allow_list: Path = ALLOW_LIST) -> None:
    config.pluginmanager.register(SkipPolicy(config, allow_list), "sprinter-edge-skip-policy")
