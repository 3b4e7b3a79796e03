"""The agents session: aider through a server over several turns in one small git repository.

Where the agents workload (agents.py) gives aider one file in a folder of its own, without git
or a repository map, this is a session as a user runs one: a fresh git repository (a local
identity, an initial commit) holding three standard-library modules of `edits.FILES` (report
split), and a fixed list of turns of different edit kinds across its files (`session_plan`): a
function renamed in one module, type hints on every function of another, docstrings on a third,
then a comment above the function renamed in the first turn. Each turn is one aider command,
`aider FILE --message ...` in the repository, with git on (aider commits each edit, writing the
commit message through the model), the repository map at aider's default (the other modules'
signatures in every prompt) and `--restore-chat-history`: the chat so far is read back, and as
it outgrows aider's history budget aider summarises it in a background thread at start-up,
whose result the turn's request waits for; after writing the files aider commits and summarises
the chat again, which the command waits for. So a server sees what a session sends it: the
main requests, summaries and commit messages interleaved, most sharing long prefixes with
earlier ones.

Rows (`DEFAULT_ROWS`): `serve` (auto, its defaults: its RAM prompt cache included), llama.cpp's
server in its best mode on aider's whole files (ngram-mod: docs/results.md, "Agents") with its
prompt cache in RAM and slot reuse (`--cache-reuse 256`: a row named `CONFIG+reuse`), and
llama.cpp's plain server; each row runs the whole session once, in a repository of its own,
on a server started for it. `orders="both"` runs the rows in the order given, then reversed.

Per turn: the wait from the command to the turn's files written and to aider's exit (as
agents.py measures them), the prompt tokens the server read and those it found in its caches
(`serve`'s /health totals, llama-server's /metrics), the tokens written, the requests, aider's
commits, and whether the edit is done (`Step.check` on the files after the turn). Per session
and row: the totals, and each row's wait over the turns both it and the baseline row (llama.cpp's
best mode) wrote, against the baseline's over the same turns (`wait_ratio`).
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SprinterError
from .agents import (
    AIDER_QUIET,
    FORMATS,
    LlamaServerRow,
    Server,
    aider_version,
    find_aider,
    module_file,
    open_server,
    run_aider,
)
from .edits.ast_tools import FUNCS
from .edits.files import FileEditTask, build_task, check_reply, split_of
from .llama_server import SERVER_CONFIGS

log = logging.getLogger(__name__)

# the session's first three turns: (edit, module) of edits.FILES, each module a file of the
# repository as that task shows it (report split; 1.2-1.5k tokens each, so a prompt with the
# repository map and the summarised history stays within ~8k tokens)
TASKS = (("rename_function", "fnmatch"), ("type_hints", "unittest.util"), ("add_docstrings", "genericpath"))
REUSE = "+reuse"  # a llama-server row with slot reuse on top of its prompt cache
REUSE_OPTIONS = ("--cache-reuse", "256")  # llama.cpp's minimum chunk for reuse by KV shifting
BASELINE = "llama-server-ngram-mod" + REUSE  # llama.cpp's best mode on aider's whole files
DEFAULT_ROWS = ("serve:auto", BASELINE, "llama-server")
ORDERS = ("given", "both")
TARGET = 0.7  # the goal: serve's wait at most this much of the baseline's
# aider as in a user's repository: git, the repository map at its default, the chat kept
SESSION_FLAGS = (*AIDER_QUIET, "--restore-chat-history")
GIT_USER = ("Session Bench", "session@example.invalid")
# aider's own files stay out of the repository (else its first turn edits .gitignore)
GITIGNORE = ".aider*\n"
README = "# utilities\n\nA few small standard-library modules, edited in an aider session.\n"
# the git of the bench itself ignores the user's and the system's configuration
GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}

Check = Callable[[Mapping[str, str], Mapping[str, str]], tuple[bool, str]]  # (before, after) texts


@dataclass(frozen=True)
class Step:
    """One turn of the session: what the user asks of which files, and how its result is judged."""

    edit: str  # the edit kind: an edits.FILES edit, or "comment"
    files: tuple[str, ...]  # the files aider is given (paths in the repository)
    message: str
    check: Check  # the files' texts before and after the turn -> (done, why not)

    def describe(self) -> dict[str, Any]:
        return {"edit": self.edit, "files": list(self.files), "message": self.message}


@dataclass(frozen=True)
class SessionPlan:
    files: dict[str, str]  # the repository's modules: path -> text of the initial commit
    steps: tuple[Step, ...]
    split: str  # the side of the edit tasks' split its modules are on


def task_check(task: FileEditTask, file: str) -> Check:
    """The task's own check (its change, and the module's behaviour) on the file after the turn."""

    def check(before: Mapping[str, str], after: Mapping[str, str]) -> tuple[bool, str]:
        res = check_reply(task, f"```python\n{after[file]}\n```")
        return res.passed, res.why

    return check


def comment_check(file: str, function: str) -> Check:
    """A comment line added just above `function` (its decorators), the code as it was."""

    def check(before: Mapping[str, str], after: Mapping[str, str]) -> tuple[bool, str]:
        text = after[file]
        try:
            tree = ast.parse(text)
        except SyntaxError as exc:
            return False, f"does not parse: {exc.msg} (line {exc.lineno})"
        try:
            if ast.dump(tree) != ast.dump(ast.parse(before[file])):
                return False, "the code changed"
        except SyntaxError:
            return False, "the file did not parse before the turn"
        above = _line_above(text, tree, function)
        if above is None:
            return False, f"no function `{function}`"
        if not above.startswith("#"):
            return False, f"no comment line above `{function}`"
        if above == _line_above(before[file], ast.parse(before[file]), function):
            return False, f"the comment above `{function}` was there before"
        return True, ""

    return check


def _line_above(text: str, tree: ast.AST, function: str) -> str | None:
    """The last non-blank line above `function`'s definition (its decorators), stripped; ""
    when there is none; None when no function has that name."""
    defs = [n for n in ast.walk(tree) if isinstance(n, FUNCS) and n.name == function]
    if not defs:
        return None
    first = min([d.lineno for d in defs[0].decorator_list] + [defs[0].lineno])
    above = [line.strip() for line in text.splitlines()[: first - 1] if line.strip()]
    return above[-1] if above else ""


@functools.cache
def session_plan() -> SessionPlan:
    """The repository and the turns (`TASKS`, then a comment above the function renamed first)."""
    tasks = []
    for edit, module in TASKS:
        task = build_task(edit, module)
        if task is None:
            raise SprinterError(f"this Python's {module} gives no {edit} task: the session needs it")
        tasks.append(task)
    steps = [Step(t.edit, (module_file(t),), t.instruction, task_check(t, module_file(t))) for t in tasks]
    renamed = tasks[0]
    file, (_, new) = module_file(renamed), renamed.renames[0]
    steps.append(Step("comment", (file,),
                      f"Add a one-line comment just above the function `{new}` (the one you just "
                      "renamed) saying what it returns. Change nothing else.", comment_check(file, new)))
    sides = {split_of(m) for _, m in TASKS}
    return SessionPlan({module_file(t): t.code for t in tasks}, tuple(steps), "/".join(sorted(sides)))


# ---------------------------------------------------------------------------- the repository

def git(repo: Path, *args: str) -> str:
    """One git command in `repo`, its output; SprinterError when it fails."""
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=60,
                             env={**os.environ, **GIT_ENV})
    except (OSError, subprocess.SubprocessError) as exc:
        raise SprinterError(f"git {args[0]} failed: {exc}") from None
    if out.returncode != 0:
        raise SprinterError(f"git {' '.join(args)} failed: {out.stderr.strip()[-500:]}")
    return out.stdout


def make_repository(folder: Path, files: Mapping[str, str]) -> Path:
    """A git repository in `folder`: the files, a README and a .gitignore, one commit."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in {**files, "README.md": README, ".gitignore": GITIGNORE}.items():
        (folder / name).write_text(text)
    git(folder, "-c", "init.defaultBranch=main", "init", "-q")
    git(folder, "config", "user.name", GIT_USER[0])
    git(folder, "config", "user.email", GIT_USER[1])
    git(folder, "config", "commit.gpgsign", "false")
    git(folder, "add", "-A")
    git(folder, "commit", "-q", "-m", "Initial commit")
    return folder


def commit_count(repo: Path) -> int:
    return int(git(repo, "rev-list", "--count", "HEAD").strip())


# ---------------------------------------------------------------------------- turns

@dataclass
class SessionTurn:
    """One aider command of a session: what the user waited and what the server did for it."""

    row: str
    order: int  # the pass over the rows: 1 in the order given, 2 reversed
    edit_format: str
    turn: int
    edit: str
    files: list[str]
    wall_seconds: float  # command to the files written (to aider's exit where it wrote none)
    written: bool  # aider wrote the turn's files
    exit_seconds: float  # command to aider's exit: its summary and commit too
    done: bool
    why: str = ""  # why not done
    exit_code: int = 0
    commits: int = 0  # the commits aider made (each message written by the model)
    requests: int = 0
    prompt_tokens: int = 0  # prompt tokens the server read (not found in its caches)
    cached_tokens: int = 0  # prompt tokens it found in its caches
    completion_tokens: int = 0
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0


def run_session(aider: Path, server: Server, plan: SessionPlan, edit_format: str, work: Path,
                order: int = 1) -> list[SessionTurn]:
    """Every turn of the plan on one server, in a fresh repository under `work`."""
    folder = Path(tempfile.mkdtemp(prefix=f"session-{server.name.replace(':', '-')}-", dir=work))
    repo = make_repository(folder / "repo", plan.files)
    home = folder / "home"  # aider's HOME, and its chat history, kept across the turns
    home.mkdir()
    turns = []
    for n, step in enumerate(plan.steps, 1):
        before_text = {f: (repo / f).read_text() for f in step.files}
        commits = commit_count(repo)
        before = server.totals()
        run = run_aider(aider, server, edit_format, [repo / f for f in step.files], step.message, home,
                        SESSION_FLAGS)
        after = server.totals()
        after_text = {f: (repo / f).read_text() for f in step.files}
        done, why = step.check(before_text, after_text)
        why = run.explained(why)
        used = {k: after.get(k, 0.0) - before.get(k, 0.0)
                for k in ("requests", "prompt_tokens", "prompt_tokens_cached", "completion_tokens",
                          "prompt_seconds", "decode_seconds")}
        written = run.written_seconds is not None
        turn = SessionTurn(
            server.name, order, edit_format, n, step.edit, list(step.files),
            round(run.written_seconds if written else run.exit_seconds, 2), written,
            round(run.exit_seconds, 2), done, why, run.exit_code, commit_count(repo) - commits,
            requests=int(used["requests"]), prompt_tokens=int(used["prompt_tokens"]),
            cached_tokens=int(used["prompt_tokens_cached"]), completion_tokens=int(used["completion_tokens"]),
            prompt_seconds=round(used["prompt_seconds"], 3), decode_seconds=round(used["decode_seconds"], 3))
        turns.append(turn)
        log.info("%s turn %d (%s): %.1f s to the files written, %.1f s to aider's exit, done=%s %s",
                 server.name, n, step.edit, turn.wall_seconds, turn.exit_seconds, done, why)
    return turns


# ---------------------------------------------------------------------------- the run

@dataclass
class SessionConfig:
    rows: tuple[str, ...] = DEFAULT_ROWS
    orders: str = "given"  # "both": the rows in the order given, then reversed
    formats: tuple[str, ...] = ("whole",)
    baseline: str = BASELINE  # the row every other is compared with
    threads: int | None = None
    command: str = ""


@dataclass
class SessionOutcome:
    config: SessionConfig
    plan: list[dict[str, Any]] = field(default_factory=list)  # the turns, as `Step.describe`
    split: str = ""
    turns: list[SessionTurn] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    wall_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"command": self.config.command, "config": asdict(self.config), "machine": self.machine,
                "split": self.split, "plan": self.plan, "notes": self.notes,
                "wall_seconds": self.wall_seconds, "turns": [asdict(t) for t in self.turns],
                "summary": [s.to_dict() for s in summary(self.turns, self.config.baseline)]}


def check_row(row: str) -> None:
    """SprinterError for a row no session can run: serve:METHOD, a llama-server configuration,
    or one with `+reuse`."""
    base = row.removesuffix(REUSE)
    if row.startswith("serve:") and base == row:
        return
    if base in SERVER_CONFIGS:
        return
    raise SprinterError(f"unknown session row {row!r}: serve:METHOD, or one of {', '.join(SERVER_CONFIGS)}, "
                        f"each with {REUSE} for slot reuse ({' '.join(REUSE_OPTIONS)})")


def passes(config: SessionConfig) -> list[tuple[str, ...]]:
    """The rows of each pass: the order given, and reversed for `orders="both"`."""
    if config.orders not in ORDERS:
        raise SprinterError(f"orders: {' or '.join(ORDERS)}, not {config.orders!r}")
    rows = tuple(config.rows)
    return [rows, rows[::-1]] if config.orders == "both" else [rows]


def open_row(row: str, **kwargs: Any) -> Server:
    """A row's server, started; `CONFIG+reuse`: llama-server CONFIG with REUSE_OPTIONS."""
    base = row.removesuffix(REUSE)
    server = open_server(base, llama_options=REUSE_OPTIONS if base != row else (), **kwargs)
    server.name = row
    return server


def reuse_refused(server: Server) -> bool:
    """llama-server said it turned slot reuse off (a context that cannot shift its cache)."""
    return isinstance(server, LlamaServerRow) and "cache_reuse is not supported" in server.server.log_text()


def run(config: SessionConfig, *, model_args: Sequence[str], target: Path, draft: Path | None,
        say: Callable[[str], object] = print, logs: Path | None = None) -> SessionOutcome:
    """The session once per row, format and pass; one server at a time (two on 2 cores stall
    each other). `logs`: where `serve`'s logs go, a folder per pass."""
    from ..costs.table import cpu_name

    for row in config.rows:
        check_row(row)
    order_rows = passes(config)
    if any(f not in FORMATS for f in config.formats):
        raise SprinterError(f"aider's edit formats are {', '.join(FORMATS)}: {config.formats}")
    if shutil.which("git") is None:
        raise SprinterError("the session needs git on the PATH")
    aider = find_aider()
    if aider is None:
        raise SprinterError("aider is not installed: tools/setup.sh --dev makes .venv-aider "
                            "(or set SPRINTER_EDGE_AIDER to its executable)")
    plan = session_plan()
    outcome = SessionOutcome(config, [s.describe() for s in plan.steps], plan.split,
                             machine={"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d"),
                                      "aider": aider_version(aider)})
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sprinter-session-") as tmp:
        work = Path(tmp)
        for order, rows in enumerate(order_rows, 1):
            log_dir = (logs or work) / f"session-logs-{order}"
            log_dir.mkdir(parents=True, exist_ok=True)
            for row in rows:
                for edit_format in config.formats:
                    say(f"session: pass {order}, starting {row}")
                    server = open_row(row, model_args=model_args, target=target, draft=draft,
                                      threads=config.threads, log_dir=log_dir)
                    try:
                        if row.endswith(REUSE) and reuse_refused(server):
                            outcome.notes.append(f"{row}: llama-server turned --cache-reuse off")
                        for turn in run_session(aider, server, plan, edit_format, work, order):
                            outcome.turns.append(turn)
                            say(f"session: {row} turn {turn.turn} ({turn.edit}): {turn.wall_seconds:.1f} s, "
                                f"{turn.prompt_tokens} read, {turn.cached_tokens} reused, "
                                f"{turn.completion_tokens} written, "
                                f"{'done' if turn.done else 'NOT done: ' + turn.why}")
                    finally:
                        server.close()
    outcome.wall_seconds = round(time.perf_counter() - t0, 1)
    return outcome


# ---------------------------------------------------------------------------- report

def common_waits(turns: Sequence[SessionTurn], baseline: Sequence[SessionTurn]) -> tuple[float, float, int]:
    """(a row's wait to the files written, the baseline's, how many turns) over the turns both
    wrote: a turn one of them wrote nothing in has no wait to compare."""
    ours = {t.turn: t.wall_seconds for t in turns if t.written}
    theirs = {t.turn: t.wall_seconds for t in baseline if t.written}
    common = ours.keys() & theirs.keys()
    return sum(ours[n] for n in common), sum(theirs[n] for n in common), len(common)


def wait_ratio(turns: Sequence[SessionTurn], baseline: Sequence[SessionTurn]) -> float | None:
    """`common_waits`' ratio, the row's over the baseline's (None: no turn both wrote)."""
    ours, theirs, _ = common_waits(turns, baseline)
    return round(ours / theirs, 3) if theirs else None


@dataclass
class SessionSummary:
    """One row's session (one pass, one format): its turns summed, and its wait and prompt
    tokens read against the baseline row's of the same pass (time ratios: under 1, less)."""

    order: int
    row: str
    format: str
    turns: int
    written: int  # turns whose files aider wrote
    done: int
    wall_seconds: float  # every turn: to the files written (to aider's exit where none)
    exit_seconds: float
    requests: int
    commits: int
    prompt_tokens: int  # read
    cached_tokens: int
    completion_tokens: int
    prompt_seconds: float
    decode_seconds: float
    common_turns: int = 0  # turns both this row and the baseline wrote
    common_wall_seconds: float = 0.0  # this row's wait over them
    wall_vs_baseline: float | None = None  # None: no baseline in this pass, or no common turn
    prompt_vs_baseline: float | None = None  # prompt tokens read over the baseline's

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def summary(turns: Sequence[SessionTurn], baseline: str = BASELINE) -> list[SessionSummary]:
    """Per pass, row and format (in the order they ran), against `baseline` in the same pass
    and format."""
    groups: dict[tuple[int, str, str], list[SessionTurn]] = {}
    for t in turns:
        groups.setdefault((t.order, t.row, t.edit_format), []).append(t)
    out = []
    for (order, row, fmt), ts in groups.items():
        s = SessionSummary(
            order=order, row=row, format=fmt, turns=len(ts), written=sum(t.written for t in ts),
            done=sum(t.done for t in ts), wall_seconds=round(sum(t.wall_seconds for t in ts), 1),
            exit_seconds=round(sum(t.exit_seconds for t in ts), 1), requests=sum(t.requests for t in ts),
            commits=sum(t.commits for t in ts), prompt_tokens=sum(t.prompt_tokens for t in ts),
            cached_tokens=sum(t.cached_tokens for t in ts),
            completion_tokens=sum(t.completion_tokens for t in ts),
            prompt_seconds=round(sum(t.prompt_seconds for t in ts), 1),
            decode_seconds=round(sum(t.decode_seconds for t in ts), 1))
        base = groups.get((order, baseline, fmt))
        if base is not None:
            ours, _, s.common_turns = common_waits(ts, base)
            s.common_wall_seconds, s.wall_vs_baseline = round(ours, 1), wait_ratio(ts, base)
            read = sum(t.prompt_tokens for t in base)
            s.prompt_vs_baseline = round(s.prompt_tokens / read, 3) if read else None
        out.append(s)
    return out


def verdicts(rows: Sequence[SessionSummary], baseline: str = BASELINE) -> list[str]:
    """For each `serve` row and format, the issue's two targets in every pass: its wait at most
    TARGET of the baseline's, its prompt tokens read no more than the baseline's."""
    lines = []
    for row, fmt in dict.fromkeys((s.row, s.format) for s in rows if s.row.startswith("serve:")):
        mine = [s for s in rows if (s.row, s.format) == (row, fmt)]
        if any(s.wall_vs_baseline is None for s in mine):
            lines.append(f"{row} ({fmt}): no turn both it and {baseline} wrote in every pass")
            continue
        waits = ", ".join(f"{s.wall_vs_baseline:.2f}x (pass {s.order})" for s in mine)
        reads = ", ".join(f"{_ratio(s.prompt_vs_baseline)} (pass {s.order})" for s in mine)
        wait_ok = all((s.wall_vs_baseline or 0) <= TARGET for s in mine)
        read_ok = all(s.prompt_vs_baseline is not None and s.prompt_vs_baseline <= 1 for s in mine)
        lines.append(f"{row} ({fmt}) against {baseline}: the wait to the files written over the turns both "
                     f"wrote {waits}, {'met' if wait_ok else 'NOT met'} (target <= {TARGET}x); prompt "
                     f"tokens read {reads}, {'met' if read_ok else 'NOT met'} (target <= 1x); edits done "
                     + ", ".join(f"{s.done}/{s.turns} (pass {s.order})" for s in mine))
    return lines


def markdown(outcome: SessionOutcome) -> str:
    c, m = outcome.config, outcome.machine
    base = c.baseline
    rows = summary(outcome.turns, base)
    lines = [f"# agents session: aider {m.get('aider', '')}, {len(outcome.plan)} turns in one git repository",
             "",
             f"{m.get('date', '')}, {m.get('cpu', '')}; {outcome.split} split; formats "
             f"{', '.join(c.formats)}; passes: {c.orders}; git on, the repository map at aider's default, "
             f"the chat history restored each turn; `{c.command}`",
             "", "Turns:", "",
             *(f"{n}. `{' '.join(p['files'])}` ({p['edit']}): {p['message']}"
               for n, p in enumerate(outcome.plan, 1)),
             "", *(f"- {v}" for v in verdicts(rows, base)), *(f"- note: {n}" for n in outcome.notes), "",
             f"| pass | row | format | to files written, turns both it and {base} wrote (s) | vs {base} "
             "| turns written | all turns, to files written (s) | to aider's exit (s) | edits done "
             "| requests | commits | prompt tokens read (s) | vs baseline | reused | written tokens |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in rows:
        lines.append(f"| {s.order} | {s.row} | {s.format} | {s.common_wall_seconds:.1f} ({s.common_turns}) | "
                     f"{_ratio(s.wall_vs_baseline)} | {s.written}/{s.turns} | {s.wall_seconds:.1f} | "
                     f"{s.exit_seconds:.1f} | {s.done}/{s.turns} | {s.requests} | {s.commits} | "
                     f"{s.prompt_tokens} ({s.prompt_seconds:.0f}) | {_ratio(s.prompt_vs_baseline)} | "
                     f"{s.cached_tokens} | {s.completion_tokens} |")
    lines += ["", "| pass | row | turn | edit | to files written (s) | to exit (s) | done | requests "
              "| commits | prompt tokens read | reused | written | why not |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in outcome.turns:
        wall = f"{t.wall_seconds:.1f}" if t.written else f"(none; {t.wall_seconds:.1f})"
        lines.append(f"| {t.order} | {t.row} | {t.turn} | {t.edit} | {wall} | {t.exit_seconds:.1f} | "
                     f"{'yes' if t.done else 'no'} | {t.requests} | {t.commits} | {t.prompt_tokens} | "
                     f"{t.cached_tokens} | {t.completion_tokens} | {t.why[:80]} |")
    return "\n".join(lines) + "\n"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def write(outcome: SessionOutcome, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "session.json", out / "session.md"]
    paths[0].write_text(json.dumps(outcome.to_dict(), indent=1))
    paths[1].write_text(markdown(outcome))
    return paths
