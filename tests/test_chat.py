"""`sprinter-edge chat` driven through a real terminal (pexpect) on the fixture pair."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pexpect
import pytest

PROMPT = ">>> "
TIMEOUT = 120  # generous: the machine is shared with heavy jobs


def spawn(target: Path, draft: Path, *extra: str):
    args = ["-m", "sprinter_edge", "chat", "--target", str(target), "--draft", str(draft),
            "--verifier", "confidence", "--threads", "1", "--ctx", "512", *extra]
    env = {**os.environ, "TERM": "dumb", "PYTHONUNBUFFERED": "1"}
    child = pexpect.spawn(sys.executable, args, env=env, encoding="utf-8", timeout=TIMEOUT,
                          dimensions=(50, 200))
    child.expect_exact("/help for commands")
    child.expect_exact(PROMPT)
    return child


def ask(child, line: str) -> str:
    child.sendline(line)
    child.expect_exact(PROMPT)
    return child.before


@pytest.mark.slow
def test_chat_repl(fixture_target_path: Path, fixture_draft_path: Path) -> None:
    child = spawn(fixture_target_path, fixture_draft_path, "--method", "sd", "--max-tokens", "8")
    try:
        out1 = ask(child, "Hi! Who are you?")
        assert "[max tokens reached]" in out1 or len(out1.strip()) > len("Hi! Who are you?")

        out = ask(child, "/stats")
        assert "method sd" in out and "prompt" in out and "reused from the KV cache" in out

        ask(child, "What is the capital of France?")
        out = ask(child, "/stats")
        # second turn: the first prompt and reply come from the KV cache
        m = re.search(r"prompt (\d+) tokens: (\d+) reused from the KV cache, (\d+) read", out)
        assert m, out
        total, reused, read = map(int, m.groups())
        assert reused > 30 and read < total - reused + 1 and read < 30

        out = ask(child, "/method ar")
        assert "method set to ar" in out
        ask(child, "Thanks.")
        assert "method ar" in ask(child, "/stats")

        out = ask(child, "/threshold 0.4")
        assert "threshold set to 0.4" in out
        out = ask(child, "/threshold nope")
        assert "usage" in out

        out = ask(child, "/frobnicate")
        assert "unknown command '/frobnicate'" in out

        out = ask(child, "/help")
        assert "/reset" in out and "/exit" in out

        # an over-long message: clear error, the session goes on
        out = ask(child, "word " * 700)
        assert "does not fit" in out

        out = ask(child, "/reset")
        assert "conversation cleared" in out

        child.sendeof()  # Ctrl-D
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_chat_ctrl_c_stops_reply(fixture_target_path: Path, fixture_draft_path: Path) -> None:
    child = spawn(fixture_target_path, fixture_draft_path, "--method", "ar", "--max-tokens", "400")
    try:
        child.sendline("Write a very long story about a dragon.")
        child.expect_exact("dragon.\r\n")  # the terminal's echo of the line
        child.expect(r"\w+ \w+ \w+")  # the reply is streaming
        child.sendintr()  # Ctrl-C
        child.expect_exact("[stopped]")
        child.expect_exact(PROMPT)
        out = ask(child, "/stats")
        assert "finish cancelled" in out
        # still alive and usable
        out = ask(child, "/method sd")
        assert "method set to sd" in out
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


@pytest.mark.slow
def test_chat_takes_pasted_blocks_files_and_sampling(fixture_target_path: Path, fixture_draft_path: Path,
                                                      tmp_path: Path) -> None:
    child = spawn(fixture_target_path, fixture_draft_path, "--method", "lookup", "--max-tokens", "8",
                  "--ctx", "2048")
    try:
        # a """ block of three lines is one message
        child.sendline('"""Three lines:')
        child.expect_exact("... ")
        child.sendline("one")
        child.expect_exact("... ")
        child.sendline('two"""')
        child.expect_exact(PROMPT)
        assert "conversation: 2 messages" in ask(child, "/stats")  # the block and its reply

        out = ask(child, "/temp 0.7")
        assert "temperature 0.7" in out
        assert "usage" in ask(child, "/temp hot")
        assert "max tokens 12" in ask(child, "/max 12")
        assert "to the end of the reply" in ask(child, "/max none")
        ask(child, "/max 12")
        ask(child, "/temp 0")

        code = tmp_path / "calc.py"
        code.write_text("def add(a, b):\n    return a + b\n")
        assert "attached" in ask(child, f"/file {code}") and "2 lines" in child.before
        ask(child, "Rename add to plus.")
        out = ask(child, "/stats")
        assert "attached file (the predicted output)" in out and "conversation: 4 messages" in out
        assert "usage" in ask(child, f"/file {tmp_path / 'missing.py'}")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_chat_takes_a_bracketed_paste_as_one_message(fixture_target_path: Path,
                                                       fixture_draft_path: Path) -> None:
    """A terminal that marks a paste (xterm's bracketed paste): its lines are one message."""
    args = ["-m", "sprinter_edge", "chat", "--target", str(fixture_target_path), "--draft",
            str(fixture_draft_path), "--threads", "1", "--ctx", "1024", "--method", "ar", "--max-tokens", "4"]
    child = pexpect.spawn(sys.executable, args, env={**os.environ, "TERM": "xterm", "PYTHONUNBUFFERED": "1"},
                          encoding="utf-8", timeout=TIMEOUT, dimensions=(50, 200))
    try:
        child.expect_exact("/help for commands")
        child.expect_exact(PROMPT)
        child.send("\x1b[200~first pasted line\rsecond pasted line\x1b[201~\r")
        child.expect_exact(PROMPT)
        child.sendline("/stats")
        child.expect("conversation: (\\d+) messages")
        assert child.match.group(1) == "2"  # the paste and its reply
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
