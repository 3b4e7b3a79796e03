"""Child processes this package starts (llama-server, ggml-rpc-server, a delay proxy, `serve`):
a free port for one, waiting until it listens or answers /health, stopping it, and having it
die with its parent. Standard library only: the bench and the backend share it."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

from .errors import SprinterError


class ServerError(SprinterError):
    """A server process did not start, or answered something unusable."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    """Until `url`/health answers 200 (a server loading its models answers 503); ServerError
    when the process exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rc = proc.poll()
        if rc is not None:
            raise ServerError(f"{what} exited with status {rc} while starting")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass  # not listening yet, or 503 while loading the model
        time.sleep(0.1)
    raise ServerError(f"{what} did not answer /health within {timeout:.0f} s")


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float, what: str) -> None:
    """Until 127.0.0.1:`port` accepts a TCP connection (`wait_healthy` for a server that speaks
    no HTTP); ServerError when the process exits first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rc = proc.poll()
        if rc is not None:
            raise ServerError(f"{what} exited with status {rc} while starting")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise ServerError(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


def stop_process(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM, then SIGKILL when it has not ended after `grace` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux, as a child's `preexec_fn`: the child gets SIGTERM when this process dies (even by
    SIGKILL)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
