"""The agents session bench (bench/session.py) without a model: its repository, its turns'
checks on edits made by hand, a whole session driven by a stand-in for aider that writes the
edits and commits them, and the summary's arithmetic."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from sprinter_edge.bench import agents, session
from sprinter_edge.bench.edits.files import FileEditTask, build_task, reference, split_of
from sprinter_edge.errors import SprinterError

COMMENT = "# Returns the regular expression that matches the shell pattern."


def tasks() -> list[FileEditTask]:
    found = [build_task(edit, module) for edit, module in session.TASKS]
    assert all(found), session.TASKS
    return found  # type: ignore[return-value]


def check(step: session.Step, before: str, after: str) -> tuple[bool, str]:
    """A one-file step's check on the file's text before and after the turn."""
    (file,) = step.files
    return step.check({file: before}, {file: after})


def commented(text: str, function: str) -> str:
    """`text` with COMMENT on its own line just above `def function`."""
    return text.replace(f"\ndef {function}(", f"\n{COMMENT}\ndef {function}(", 1)


def test_the_plan_is_several_edit_kinds_across_files_on_one_side() -> None:
    plan = session.session_plan()
    edits = [s.edit for s in plan.steps]
    assert len(plan.steps) >= 4 and len(set(edits)) == len(edits), edits
    files = [f for s in plan.steps for f in s.files]
    assert set(files) == set(plan.files) and len(plan.files) == 3
    assert files[0] == files[-1]  # the last turn goes back to the first file
    assert plan.split == "report" and {split_of(m) for _, m in session.TASKS} == {"report"}


def test_the_repository_is_built_and_committed(tmp_path: Path) -> None:
    plan = session.session_plan()
    repo = session.make_repository(tmp_path / "repo", plan.files)
    assert session.commit_count(repo) == 1
    assert session.git(repo, "status", "--porcelain") == ""  # everything committed
    tracked = set(session.git(repo, "ls-files").split())
    assert tracked == {*plan.files, "README.md", ".gitignore"}
    for name, text in plan.files.items():
        assert (repo / name).read_text() == text
    assert session.git(repo, "log", "-1", "--format=%an <%ae>").strip() == "{} <{}>".format(*session.GIT_USER)
    assert session.git(repo, "check-ignore", ".aider.chat.history.md").strip()  # aider's files stay out
    (repo / next(iter(plan.files))).write_text("x = 1\n")
    session.git(repo, "commit", "-q", "-am", "an edit")
    assert session.commit_count(repo) == 2


def test_the_turn_checks_accept_a_correct_edit_and_refuse_a_wrong_one(tmp_path: Path) -> None:
    """Each turn's check on the repository's file after an edit made by hand: the edit asked
    for passes; the file untouched, or the edit half made, fails."""
    plan = session.session_plan()
    repo = session.make_repository(tmp_path / "repo", plan.files)
    rename, *_ = found = tasks()
    for step, task in zip(plan.steps, found, strict=False):  # the comment turn apart
        (file,) = step.files
        before = {file: (repo / file).read_text()}
        (repo / file).write_text(reference(task))
        assert step.check(before, {file: (repo / file).read_text()}) == (True, ""), step.edit
        done, why = step.check(before, before)
        assert not done and why.startswith("change not made"), (step.edit, why)
    old, new = rename.renames[0]
    half = rename.code.replace(f"def {old}(", f"def {new}(")  # the definition, not its uses
    assert check(plan.steps[0], rename.code, half) == (False, f"change not made: `{old}` is still used")

    comment = plan.steps[-1]
    before = (repo / comment.files[0]).read_text()  # the rename made above
    assert check(comment, before, commented(before, new)) == (True, "")
    assert check(comment, before, f"{COMMENT}\n{before}") == (False, f"no comment line above `{new}`")
    changed = commented(before, new).replace(f"def {new}(", f"def {new}_(")
    assert check(comment, before, changed) == (False, "the code changed")
    assert check(comment, before, before) == (False, f"no comment line above `{new}`")
    again = commented(before, new)
    assert check(comment, again, again) == (False, f"the comment above `{new}` was there before")
    assert check(comment, before, "def (")[1].startswith("does not parse")


FAKE_AIDER = """\
import json, os, subprocess, sys
args = sys.argv[1:]
files = args[:args.index("--message")]
message = args[args.index("--message") + 1]
edits = json.load(open(os.environ["FAKE_AIDER_EDITS"]))
for f in files:
    text = edits.get(message, {}).get(os.path.basename(f))
    if text is not None:
        open(f, "w").write(text)
        subprocess.run(["git", "commit", "-q", "-am", "aider: " + message[:40]], check=True)
print("done")
"""


class CountingServer(agents.Server):
    """Counters that grow by one request, 100 tokens read and 50 reused per reading."""

    def __init__(self) -> None:
        self.name, self.base, self.model = "serve:fake", "http://127.0.0.1:9", "fake"
        self.reads = 0

    def totals(self) -> dict[str, float]:
        self.reads += 1
        n = self.reads
        return {"requests": n, "prompt_tokens": 100 * n, "prompt_tokens_cached": 50 * n,
                "completion_tokens": 10 * n, "prompt_seconds": 0.5 * n, "decode_seconds": n}

    def close(self) -> None:
        pass


def test_a_session_runs_every_turn_in_one_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in for aider writes the edits it was given (none for the third turn) and commits
    them, as aider does: the turns' records, commits and checks follow."""
    plan = session.session_plan()
    rename, hints, _ = tasks()
    new = rename.renames[0][1]
    renamed = reference(rename)
    edits = {plan.steps[0].message: {plan.steps[0].files[0]: renamed},
             plan.steps[1].message: {plan.steps[1].files[0]: reference(hints)},
             plan.steps[3].message: {plan.steps[3].files[0]: commented(renamed, new)}}
    (tmp_path / "edits.json").write_text(json.dumps(edits))
    monkeypatch.setenv("FAKE_AIDER_EDITS", str(tmp_path / "edits.json"))
    aider = tmp_path / "aider"
    aider.write_text(f"#!{sys.executable}\n{FAKE_AIDER}")
    aider.chmod(aider.stat().st_mode | stat.S_IEXEC)
    work = tmp_path / "work"
    work.mkdir()
    turns = session.run_session(aider, CountingServer(), plan, "whole", work, order=2)
    assert [t.turn for t in turns] == [1, 2, 3, 4]
    assert [t.done for t in turns] == [True, True, False, True], [t.why for t in turns]
    assert [t.written for t in turns] == [True, True, False, True]
    assert [t.commits for t in turns] == [1, 1, 0, 1]
    assert all(t.exit_code == 0 and t.order == 2 and t.row == "serve:fake" for t in turns)
    assert all(0 < t.wall_seconds <= t.exit_seconds + 0.01 for t in turns)
    t = turns[0]
    assert (t.requests, t.prompt_tokens, t.cached_tokens, t.completion_tokens) == (1, 100, 50, 10)
    assert turns[2].why.startswith("change not made")


def test_the_session_runs_aider_with_git_the_map_and_the_history(tmp_path: Path) -> None:
    server = agents.Server()
    server.base, server.model = "http://127.0.0.1:9", "m"
    files = [tmp_path / "a.py", tmp_path / "b.py"]
    cmd = agents.aider_command(Path("aider"), server, "whole", files, "hi", tmp_path, session.SESSION_FLAGS)
    assert cmd[1:3] == [str(f) for f in files] and "--restore-chat-history" in cmd
    assert "--no-git" not in cmd and "--map-tokens" not in cmd
    plain = agents.aider_command(Path("aider"), server, "whole", files[0], "hi", tmp_path)
    assert "--no-git" in plain and plain[plain.index("--map-tokens") + 1] == "0"  # the agents bench's


def test_the_files_written_is_when_the_last_of_them_was(tmp_path: Path) -> None:
    """run_aider with two files: written when the second one changed; None when aider wrote none."""
    files = [tmp_path / "a.py", tmp_path / "b.py"]
    for f in files:
        f.write_text("x = 1\n")
    aider = tmp_path / "aider"
    aider.write_text(f"#!{sys.executable}\nimport sys, time\n"
                     "open(sys.argv[1], 'a').write('y = 2\\n'); time.sleep(0.3)\n"
                     "open(sys.argv[2], 'a').write('z = 3\\n'); time.sleep(0.3)\n")
    aider.chmod(aider.stat().st_mode | stat.S_IEXEC)
    server = agents.Server()
    server.base, server.model = "http://127.0.0.1:9", "m"
    run = agents.run_aider(aider, server, "whole", files, "hi", tmp_path, session.SESSION_FLAGS)
    assert run.exit_code == 0, run.output
    assert run.written_seconds is not None and 0.25 <= run.written_seconds < run.exit_seconds
    quiet = tmp_path / "quiet"
    quiet.write_text(f"#!{sys.executable}\n")
    quiet.chmod(quiet.stat().st_mode | stat.S_IEXEC)
    assert agents.run_aider(quiet, server, "whole", files, "hi", tmp_path).written_seconds is None


def turn(row: str, n: int, wall: float, *, order: int = 1, written: bool = True, read: int = 100,
         done: bool = True) -> session.SessionTurn:
    return session.SessionTurn(row, order, "whole", n, "edit", ["a.py"], wall, written, wall + 5, done,
                               prompt_tokens=read, cached_tokens=1000, requests=3, commits=1)


def test_the_summary_compares_the_turns_both_rows_wrote() -> None:
    serve, base, plain = "serve:auto", session.BASELINE, "llama-server"
    turns = []
    for order in (1, 2):
        turns += [turn(serve, n, w, order=order, read=80) for n, w in enumerate((10, 20, 30, 40), 1)]
        # the baseline wrote nothing in turn 3 (its wait there is to aider's exit), serve nothing in 4
        turns[-1].written = False
        turns += [turn(base, n, w, order=order, written=n != 3, read=100)
                  for n, w in enumerate((20, 40, 50, 60), 1)]
        turns += [turn(plain, n, 100, order=order) for n in (1, 2, 3, 4)]
    rows = {(s.order, s.row): s for s in session.summary(turns, base)}
    s = rows[(1, serve)]
    # turns 1 and 2 only: serve 10 + 20 s against the baseline's 20 + 40 s
    assert (s.common_turns, s.common_wall_seconds, s.wall_vs_baseline) == (2, 30.0, 0.5)
    assert (s.turns, s.written, s.wall_seconds, s.prompt_tokens, s.cached_tokens) == (4, 3, 100.0, 320, 4000)
    assert s.prompt_vs_baseline == 0.8 and s.requests == 12 and s.commits == 4
    assert rows[(1, base)].wall_vs_baseline == 1.0 and rows[(1, base)].common_turns == 3
    assert rows[(2, plain)].wall_vs_baseline == 2.5  # 300 s against 20 + 40 + 60
    assert session.wait_ratio(turns[:4], turns[4:8]) == 0.5
    assert session.common_waits(turns[:4], turns[4:8]) == (30.0, 60.0, 2)
    assert session.wait_ratio(turns[:4], []) is None
    (verdict,) = session.verdicts(list(rows.values()), base)
    assert "0.50x (pass 1), 0.50x (pass 2), met" in verdict and "0.80x (pass 1)" in verdict
    no_base = session.summary([t for t in turns if t.row != base], base)
    assert all(r.wall_vs_baseline is None and "wall_vs_baseline" not in r.to_dict() for r in no_base)
    plan = [step.describe() for step in session.session_plan().steps]
    outcome = session.SessionOutcome(session.SessionConfig(), plan, "report", turns)
    text = session.markdown(outcome)
    assert "| 1 | serve:auto | whole | 30.0 (2) | 0.50x |" in text and verdict in text
    assert json.loads(json.dumps(outcome.to_dict()))["summary"][0]["wall_vs_baseline"] == 0.5


def test_rows_and_passes() -> None:
    for row in ("serve:auto", "serve:lookup", session.BASELINE, "llama-server",
                "llama-server-draft-tuned+reuse"):
        session.check_row(row)
    for row in ("serve:auto+reuse", "llama-server-nope", "llama-server+reuse+reuse"):
        with pytest.raises(SprinterError):
            session.check_row(row)
    config = session.SessionConfig(rows=("serve:auto", "a", "b"), orders="both")
    assert session.passes(config) == [("serve:auto", "a", "b"), ("b", "a", "serve:auto")]
    config.orders = "given"
    assert session.passes(config) == [("serve:auto", "a", "b")]
