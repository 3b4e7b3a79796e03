"""A real small filesystem for the full-disk tests: a tmpfs, mounted as root (as CI runs)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's syntax: "4m") at `path` until the block ends."""
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:  # root, or CAP_SYS_ADMIN in a container, mounts one
        pytest.fail(f"cannot mount a tmpfs here (this test needs root or CAP_SYS_ADMIN): "
                    f"{r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)
