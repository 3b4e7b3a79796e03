"""The agents workload: aider, a real coding agent, edits whole files through a local server.

Each task is a whole-file edit of `edits.FILES` (a standard-library module and an edit a user
asks of it; `--split` picks the tuning or the report side). For every server row, `serve`
running an engine method (`serve:auto`) or llama.cpp's llama-server in one of its modes
(`llama-server-ngram-mod`), a fresh folder holds the file as the task shows it, and aider is run
on it as a user would: the task's instruction, then a second turn on the same file (a follow-up
that keeps the code: a comment line on top; aider sends its system prompt and the file again,
so this is where a server reads a repeated prompt once or twice). aider runs from a virtual
environment of its own (`find_aider`): it pins every one of its ~100 dependencies.

Measured per turn: the user's wait, from the command to the file written (aider's start-up
included, the same for every row), and the time until aider exits: after writing the file it
summarises its chat history in a background thread (two requests, the reply read again under a
prompt of its own), which an interactive session runs while the user reads the edit, and a
`--message` command waits for; the tokens the server read and wrote and its seconds for each,
read from the server before and after the turn (`serve`'s /health totals, llama-server's
/metrics and, for its requests, its log), summaries included; and whether the edit is done, by
the task's own check on the file aider wrote (turn 2: the comment is there and the code is the
code turn 1 left).
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SprinterError
from ..processes import ServerError, free_port, stop_process, wait_healthy
from .edits.files import FILES, FileEditTask, check_reply
from .llama_server import SERVER_CONFIGS, LlamaServer

log = logging.getLogger(__name__)

FORMATS = ("whole", "diff")  # aider's edit formats: the file back whole, or search/replace blocks
FOLLOW_UP = "Add the comment line `# Reviewed.` as the very first line of the file. Change nothing else."
COMMENT = "# Reviewed."
AIDER_TIMEOUT = 1800.0  # seconds one aider turn may take
WATCH_SECONDS = 0.05  # how often the file is looked at while aider runs
SERVER_CTX = 16384  # every server's context: an agent's request, its file and the file back
# aider, offline and quiet: no update check, no analytics, no question asked, no linting
AIDER_QUIET = ("--no-check-update", "--no-analytics", "--no-show-model-warnings", "--yes-always",
               "--no-auto-lint", "--no-auto-test", "--no-pretty", "--no-fancy-input",
               "--no-show-release-notes", "--no-suggest-shell-commands", "--no-detect-urls",
               "--timeout", str(int(AIDER_TIMEOUT)))
# and, for one file in a folder of its own, no repository map and no git (session.py keeps both)
AIDER_FLAGS = (*AIDER_QUIET, "--map-tokens", "0", "--no-git")
# llama-server logs this as a slot ends each completion: its requests (its metrics count none)
COMPLETION_LOGGED = "stop processing:"
AIDER_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # litellm fetches a price list otherwise


def find_aider() -> Path | None:
    """aider's executable: $SPRINTER_EDGE_AIDER, the checkout's .venv-aider (tools/setup.sh
    --dev makes it), or `aider` on the PATH."""
    env = os.environ.get("SPRINTER_EDGE_AIDER")
    if env:
        return Path(env)
    scripts = ("Scripts", "aider.exe") if sys.platform == "win32" else ("bin", "aider")  # a venv's layout
    checkout = Path(__file__).resolve().parents[2] / ".venv-aider" / Path(*scripts)
    if checkout.is_file():
        return checkout
    found = shutil.which("aider")
    return Path(found) if found else None


@dataclass
class Turn:
    """One aider command: what the user waited and what the server did for it."""

    task: str
    edit: str
    row: str
    edit_format: str
    turn: int  # 1: the task's edit; 2: the follow-up on the same file
    wall_seconds: float  # command to file written (to aider's exit where it wrote none)
    done: bool
    why: str = ""  # why not done
    exit_code: int = 0
    requests: int = 0  # the server's replies during the turn (aider also summarises its chat)
    prompt_tokens: int = 0  # prompt tokens the server read (not found in its caches)
    completion_tokens: int = 0
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    exit_seconds: float = 0.0  # command to aider's exit: its chat summary too (0: not recorded)


# ---------------------------------------------------------------------------- servers

class Server:
    """A server row: started once, its counters read around each turn."""

    name: str
    base: str  # http://127.0.0.1:PORT
    model: str  # the model id aider sends

    def totals(self) -> dict[str, float]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class ServeRow(Server):
    """`sprinter-edge serve --method METHOD` as a user starts it (its defaults otherwise)."""

    def __init__(self, method: str, model_args: Sequence[str], threads: int | None, log_dir: Path,
                 extra: Sequence[str] = ()):
        self.name, self.model = f"serve:{method}", "sprinter"
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "sprinter_edge", "serve", "--method", method, *model_args,
               "--model-name", self.model, "--port", str(port), "--log-level", "info",
               "--ctx", str(SERVER_CTX), *(["--threads", str(threads)] if threads else []), *extra]
        self.log = log_dir / f"{self.name.replace(':', '-')}.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _wait_ready(self.base, self.proc, self.log)

    def totals(self) -> dict[str, float]:
        with urllib.request.urlopen(self.base + "/health", timeout=30) as resp:
            body = json.loads(resp.read())
        totals = body["totals"]
        return {**totals, "prompt_tokens": totals["prompt_tokens_read"],
                "prompt_tokens_cached": totals["prompt_tokens"] - totals["prompt_tokens_read"],
                "requests": body["completed"] + body["cancelled"] + body["failed"]}

    def close(self) -> None:
        stop_process(self.proc, grace=20)


class LlamaServerRow(Server):
    """llama.cpp's own server in one configuration (`SERVER_CONFIGS`), one slot, /metrics on,
    its prompt cache in RAM as large as `serve`'s default; `options`: more of its options."""

    def __init__(self, name: str, binary: Path, target: Path, draft: Path | None, threads: int | None,
                 options: Sequence[str] = ()):
        self.name, self.model = name, "llama"
        self.server = LlamaServer(name, binary, target, draft=draft, n_ctx=SERVER_CTX, n_threads=threads,
                                  options=("--metrics", "--cache-ram", "1024", *options)).start()
        self.base = self.server.url

    def totals(self) -> dict[str, float]:
        with urllib.request.urlopen(self.base + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
        metrics = {}
        for line in text.splitlines():
            if line.startswith("llamacpp:"):
                name, _, value = line.partition(" ")
                metrics[name.removeprefix("llamacpp:")] = float(value)
        return {"prompt_tokens": metrics.get("prompt_tokens_total", 0.0),
                "prompt_tokens_cached": metrics.get("prompt_tokens_cached_total", 0.0),
                "completion_tokens": metrics.get("tokens_predicted_total", 0.0),
                "prompt_seconds": metrics.get("prompt_seconds_total", 0.0),
                "decode_seconds": metrics.get("tokens_predicted_seconds_total", 0.0),
                "requests": float(self.server.log_text().count(COMPLETION_LOGGED))}

    def close(self) -> None:
        self.server.close()


def _wait_ready(base: str, proc: subprocess.Popen[bytes], log_file: Path, timeout: float = 600.0) -> None:
    """`wait_healthy`, the server's log in the error (and the process stopped) when it fails."""
    try:
        wait_healthy(base, proc, timeout, "sprinter-edge serve")
    except ServerError as exc:
        stop_process(proc, grace=20)
        raise SprinterError(f"{exc}: {log_file.read_text()[-2000:]}") from None


# ---------------------------------------------------------------------------- aider

def aider_command(aider: Path, server: Server, edit_format: str, file: Path | Sequence[Path], message: str,
                  home: Path, flags: Sequence[str] = AIDER_FLAGS) -> list[str]:
    """One aider turn: `message` about `file` (or these files), against `server`, then exit."""
    return [str(aider), *map(str, _paths(file)), "--message", message, "--model", f"openai/{server.model}",
            "--openai-api-base", server.base + "/v1", "--openai-api-key", "none",
            "--edit-format", edit_format, "--chat-history-file", str(home / "chat.md"),
            "--input-history-file", str(home / "input.txt"), *flags]


def _paths(file: Path | Sequence[Path]) -> list[Path]:
    return [file] if isinstance(file, Path) else list(file)


@dataclass
class AiderRun:
    written_seconds: float | None  # command to the file(s) written, the last of them (None: none)
    exit_seconds: float
    exit_code: int
    output: str  # the tail of aider's output

    def explained(self, why: str) -> str:
        """`why` an edit is not done, after aider's own failure where it exited with one."""
        if self.exit_code == 0:
            return why
        tail = self.output.strip().splitlines()[-1] if self.output.strip() else ""
        return f"aider exited {self.exit_code}: {tail}; {why}"


def run_aider(aider: Path, server: Server, edit_format: str, file: Path | Sequence[Path], message: str,
              home: Path, flags: Sequence[str] = AIDER_FLAGS) -> AiderRun:
    """One aider command, run in the (first) file's folder, the files watched for aider's
    writes while it runs: written when the last file it changed was."""
    files = _paths(file)
    env = {**os.environ, **AIDER_ENV, "HOME": str(home)}  # aider keeps its own files under HOME
    before = {f: _file_state(f) for f in files}
    changed: dict[Path, float] = {}  # file -> seconds to its first write

    def watch(now: float) -> None:
        for f in files:
            if f not in changed and _file_state(f) != before[f]:
                changed[f] = now

    timed_out = False
    with tempfile.TemporaryFile("w+") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(aider_command(aider, server, edit_format, files, message, home, flags),
                                cwd=files[0].parent, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, text=True)
        while proc.poll() is None:
            watch(time.perf_counter() - t0)
            if time.perf_counter() - t0 > AIDER_TIMEOUT:
                stop_process(proc, grace=5)
                timed_out = True
                break
            time.sleep(WATCH_SECONDS)
        exited = time.perf_counter() - t0
        watch(exited)  # written in the last poll's interval
        written = max(changed.values(), default=None)
        if timed_out:
            return AiderRun(written, exited, 124, f"aider timed out after {AIDER_TIMEOUT:.0f} s")
        out.seek(0)
        return AiderRun(written, exited, proc.returncode, out.read()[-3000:])


def _file_state(file: Path) -> tuple[int, int]:
    st = file.stat()
    return st.st_mtime_ns, st.st_size


def module_file(task: FileEditTask) -> str:
    return task.module.replace(".", "_") + ".py"


def follow_up_done(before: str, after: str) -> tuple[bool, str]:
    """Turn 2's check: the comment is the first line and the code is what it was."""
    first = after.lstrip("\ufeff").splitlines()[:1]
    if first != [COMMENT]:
        return False, f"first line is {first[0][:60]!r}" if first else "the file is empty"
    try:
        same = ast.dump(ast.parse(after)) == ast.dump(ast.parse(before))
    except SyntaxError as exc:
        return False, f"does not parse: {exc.msg}"
    return (True, "") if same else (False, "the code changed")


def run_task(aider: Path, server: Server, task: FileEditTask, edit_format: str, work: Path) -> list[Turn]:
    """Both turns of one task on one server, in a fresh folder under `work`."""
    folder = Path(tempfile.mkdtemp(prefix=task.id.replace("/", "-") + "-", dir=work))
    home = folder / ".home"
    home.mkdir()
    file = folder / module_file(task)
    file.write_text(task.code)
    turns = []
    for n, message in ((1, task.instruction), (2, FOLLOW_UP)):
        before_text = file.read_text()
        before = server.totals()
        run = run_aider(aider, server, edit_format, file, message, home)
        wall = run.written_seconds if run.written_seconds is not None else run.exit_seconds
        after = server.totals()
        text = file.read_text()
        if n == 1:
            check = check_reply(task, f"```python\n{text}\n```")
            done, why = check.passed, check.why
        else:
            done, why = follow_up_done(before_text, text)
        why = run.explained(why)
        used = {k: after[k] - before[k] for k in ("requests", "prompt_tokens", "completion_tokens",
                                                  "prompt_seconds", "decode_seconds")}
        turns.append(Turn(task.id, task.edit, server.name, edit_format, n, round(wall, 2), done, why,
                          run.exit_code,
                          **{k: round(v, 3) if k.endswith("seconds") else int(v) for k, v in used.items()},
                          exit_seconds=round(run.exit_seconds, 2)))
        log.info("%s %s %s turn %d: %.1f s to the file written, %.1f s to aider's exit, done=%s %s",
                 server.name, task.id, edit_format, n, wall, run.exit_seconds, done, why)
    return turns


# ---------------------------------------------------------------------------- the run

@dataclass
class AgentsConfig:
    tasks: int = 2
    split: str | None = "report"
    edits: tuple[str, ...] = ()  # the edit kinds (empty: all)
    formats: tuple[str, ...] = ("whole",)
    rows: tuple[str, ...] = ("serve:auto", "llama-server", "llama-server-ngram-mod")
    threads: int | None = None
    command: str = ""


@dataclass
class AgentsOutcome:
    config: AgentsConfig
    turns: list[Turn] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    wall_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"command": self.config.command, "config": asdict(self.config), "machine": self.machine,
                "wall_seconds": self.wall_seconds, "turns": [asdict(t) for t in self.turns],
                "summary": [r.to_dict() for r in summary(self.turns)]}


def open_server(row: str, *, model_args: Sequence[str], target: Path, draft: Path | None,
                threads: int | None, log_dir: Path, llama_options: Sequence[str] = ()) -> Server:
    """A row's server, started; `llama_options`: more options for a llama-server row."""
    if row.startswith("serve:"):
        method, _, extra = row.removeprefix("serve:").partition(" ")
        return ServeRow(method, model_args, threads, log_dir, extra.split())
    if row in SERVER_CONFIGS:
        from ..backend.llama_tools import find_tool

        binary = find_tool("llama-server")
        if binary is None:
            raise SprinterError("llama-server is not built: run tools/build_llama_server.sh "
                                "(setup.sh --dev does)")
        return LlamaServerRow(row, binary, target, draft, threads, llama_options)
    raise SprinterError(f"unknown agents row {row!r}: serve:METHOD or one of {', '.join(SERVER_CONFIGS)}")


def run(config: AgentsConfig, *, model_args: Sequence[str], target: Path, draft: Path | None,
        say: Callable[[str], object] = print, logs: Path | None = None) -> AgentsOutcome:
    """Every task, format and turn on every row; rows one after another (one server at a time:
    two on 2 cores stall each other). `logs`: where `serve`'s logs go (a line per reply)."""
    from ..costs.table import cpu_name

    aider = find_aider()
    if aider is None:
        raise SprinterError("aider is not installed: tools/setup.sh --dev makes .venv-aider "
                            "(or set SPRINTER_EDGE_AIDER to its executable)")
    tasks = FILES.select(config.tasks, config.edits or None, split=config.split)
    outcome = AgentsOutcome(config, machine={"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d"),
                                             "aider": aider_version(aider)})
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sprinter-agents-") as tmp:
        work = Path(tmp)
        for row in config.rows:
            say(f"agents: starting {row}")
            server = open_server(row, model_args=model_args, target=target, draft=draft,
                                 threads=config.threads, log_dir=logs or work)
            try:
                for task in tasks:
                    for edit_format in config.formats:
                        for turn in run_task(aider, server, task, edit_format, work):
                            outcome.turns.append(turn)
                            say(f"agents: {row} {task.id} {edit_format} turn {turn.turn}: "
                                f"{turn.wall_seconds:.1f} s, {turn.completion_tokens} tokens written, "
                                f"{'done' if turn.done else 'NOT done: ' + turn.why}")
            finally:
                server.close()
    outcome.wall_seconds = round(time.perf_counter() - t0, 1)
    return outcome


def aider_version(aider: Path) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([str(aider), "--version"], capture_output=True, text=True, timeout=120,
                             env={**os.environ, **AIDER_ENV}).stdout
        return out.strip().splitlines()[-1] if out.strip() else ""
    return ""


# ---------------------------------------------------------------------------- report

@dataclass
class RowSummary:
    """One row and edit format of a run, both turns summed: the user's wait (to the file written,
    and to aider's exit), edits done, tokens and seconds on the server, and each wait over the
    fastest llama-server row's in the same format (a time ratio: under 1, a shorter wait)."""

    row: str
    format: str
    turns: int
    wall_seconds: float
    exit_seconds: float
    turn1_done: int
    turn2_done: int
    tasks: int
    prompt_tokens: int
    prompt_seconds: float
    completion_tokens: int
    decode_seconds: float
    decode_tokens_per_second: float
    wall_vs_best_llama_server: float | None = None  # None: no llama-server row in this format
    exit_vs_best_llama_server: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """As agents.json keeps it (a ratio with no llama-server row to compare with: left out)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def summary(turns: Sequence[Turn]) -> list[RowSummary]:
    """Per row and edit format (`RowSummary`), in the order the rows first ran."""
    groups: dict[tuple[str, str], list[Turn]] = {}
    for t in turns:
        groups.setdefault((t.row, t.edit_format), []).append(t)
    rows = []
    for (row, fmt), ts in groups.items():
        decode = sum(t.decode_seconds for t in ts)
        written = sum(t.completion_tokens for t in ts)
        rows.append(RowSummary(
            row=row, format=fmt, turns=len(ts), wall_seconds=round(sum(t.wall_seconds for t in ts), 1),
            exit_seconds=round(sum(t.exit_seconds for t in ts), 1),
            turn1_done=sum(t.done for t in ts if t.turn == 1),
            turn2_done=sum(t.done for t in ts if t.turn == 2),
            tasks=len({t.task for t in ts}), prompt_tokens=sum(t.prompt_tokens for t in ts),
            prompt_seconds=round(sum(t.prompt_seconds for t in ts), 1), completion_tokens=written,
            decode_seconds=round(decode, 1),
            decode_tokens_per_second=round(written / decode, 2) if decode else 0.0))
    for fmt in {r.format for r in rows}:
        peers = [r for r in rows if r.format == fmt and r.row in SERVER_CONFIGS]
        best_wall = min((r.wall_seconds for r in peers), default=0.0)
        best_exit = min((r.exit_seconds for r in peers), default=0.0)
        for r in rows:
            if r.format == fmt and best_wall:
                r.wall_vs_best_llama_server = round(r.wall_seconds / best_wall, 3)
            if r.format == fmt and best_exit:
                r.exit_vs_best_llama_server = round(r.exit_seconds / best_exit, 3)
    return rows


def markdown(outcome: AgentsOutcome) -> str:
    c, m = outcome.config, outcome.machine
    lines = [f"# agents: aider {m.get('aider', '')} through each server",
             "",
             f"{m.get('date', '')}, {m.get('cpu', '')}; split {c.split or 'both'}, {c.tasks} tasks, "
             f"formats {', '.join(c.formats)}; `{c.command}`",
             "",
             "| row | format | command to file written, both turns (s) | vs best llama-server "
             "| to aider's exit (s) | vs best | edits done | follow-ups "
             "done | prompt tokens read (s) | written tokens | decode tok/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary(outcome.turns):
        lines.append(f"| {r.row} | {r.format} | {r.wall_seconds:.1f} | "
                     f"{r.wall_vs_best_llama_server or 0:.2f}x | {r.exit_seconds:.1f} | "
                     f"{r.exit_vs_best_llama_server or 0:.2f}x | {r.turn1_done}/{r.tasks} | "
                     f"{r.turn2_done}/{r.tasks} | {r.prompt_tokens} ({r.prompt_seconds:.0f}) | "
                     f"{r.completion_tokens} | {r.decode_tokens_per_second:.2f} |")
    lines += ["", "| row | task | format | turn | to file written (s) | to exit (s) | done "
              "| prompt tokens read | written | why not |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for t in outcome.turns:
        lines.append(f"| {t.row} | {t.task} | {t.edit_format} | {t.turn} | {t.wall_seconds:.1f} | "
                     f"{t.exit_seconds:.1f} | "
                     f"{'yes' if t.done else 'no'} | {t.prompt_tokens} | {t.completion_tokens} | "
                     f"{t.why[:80]} |")
    return "\n".join(lines) + "\n"


def write(outcome: AgentsOutcome, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "agents.json", out / "agents.md"]
    paths[0].write_text(json.dumps(outcome.to_dict(), indent=1))
    paths[1].write_text(markdown(outcome))
    return paths


def turns_of(data: dict[str, Any]) -> Iterator[Turn]:
    """The turns of an agents.json."""
    for t in data.get("turns", []):
        yield Turn(**t)
