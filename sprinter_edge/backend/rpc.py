"""A target on other machines: llama.cpp's own RPC backend (`ggml-rpc-server` on each).

`--target-rpc HOST:PORT[,HOST:PORT]` puts every layer of the target on those servers; the draft,
the verifier and the copy stay here. Nothing of our own crosses the network: llama.cpp's client
(`ggml_backend_rpc_add_server`, the path its `--rpc` takes) gives devices that go into
`llama_model_params.devices`.

Faults. llama.cpp's RPC client aborts the process when a server is not there or goes away
(`GGML_ABORT`, a C backtrace). So: a server is dialled before llama.cpp is (one line of error
when it is not there); the sockets llama.cpp opens get TCP keepalive and a user timeout (a peer
that vanishes without a reset is found in ~30 s, not never); and an abort callback turns the
abort into a `TargetLostError` handed to `on_lost`'s handler (by default: one line on stderr),
after which the process ends with the error's exit code. The thread llama.cpp aborted in cannot
go on (C++ frames sit under it), so no process that loaded a lost target lives on: `serve` keeps
the engine in a worker process of its own and starts a new one (serving/supervisor.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import socket
import stat
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import llama_cpp

from ..errors import BackendError, SettingsError, TargetLostError

log = logging.getLogger(__name__)

DIAL_TIMEOUT = 5.0  # seconds to wait for a server's TCP answer before llama.cpp dials it
HELLO_TIMEOUT = 15.0  # seconds to wait for its answer to llama.cpp's hello
# a peer silent this long is gone: keepalive probes after 10 s idle, 5 s apart, 4 tries; and
# data unacknowledged for 30 s ends the connection (TCP_USER_TIMEOUT, Linux;
# TCP_RXT_CONNDROPTIME, macOS)
KEEPALIVE = {"idle": 10, "interval": 5, "count": 4}
USER_TIMEOUT_MS = 30_000
# macOS's <netinet/tcp.h> numbers, for a socket module built without the name: TCP_KEEPALIVE is
# its TCP_KEEPIDLE (seconds), TCP_RXT_CONNDROPTIME its TCP_USER_TIMEOUT (seconds)
_DARWIN_TCP = {"TCP_KEEPALIVE": 0x10, "TCP_RXT_CONNDROPTIME": 0x80, "TCP_KEEPINTVL": 0x101,
               "TCP_KEEPCNT": 0x102}


def parse_endpoints(text: str | Sequence[str]) -> tuple[str, ...]:
    """`HOST:PORT[,HOST:PORT]` (or a list of them) as a tuple, each checked."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    endpoints = tuple(p.strip() for p in parts if p.strip())
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SettingsError(f"--target-rpc: {endpoint!r} is not HOST:PORT")
    return endpoints


def split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def dial(endpoint: str, timeout: float = DIAL_TIMEOUT) -> float:
    """Seconds a TCP connect to `endpoint` took; a one-line BackendError when nothing answers."""
    import time

    host, port = split(endpoint)
    t0 = time.perf_counter()
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return time.perf_counter() - t0
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise BackendError(f"cannot reach the target's rpc-server at {endpoint}: {reason} (is `ggml-rpc-"
                           f"server -H HOST -p {port}` running there, and the port open?)") from None


# ------------------------------------------------------------------------------ ggml through ctypes

def _ggml() -> ctypes.CDLL:
    """libggml as llama-cpp-python loaded it (the same handle: the library is already in)."""
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    names = ("libggml.so", "libggml.dylib", "ggml.dll")
    for name in names:
        if (lib_dir / name).exists():
            lib = ctypes.CDLL(str(lib_dir / name))
            break
    else:
        raise BackendError(f"libggml not found in {lib_dir}")
    p = ctypes.c_void_p
    for fn, args, res in (("ggml_backend_reg_by_name", [ctypes.c_char_p], p),
                          ("ggml_backend_reg_get_proc_address", [p, ctypes.c_char_p], p),
                          ("ggml_backend_reg_dev_count", [p], ctypes.c_size_t),
                          ("ggml_backend_reg_dev_get", [p, ctypes.c_size_t], p),
                          ("ggml_backend_dev_description", [p], ctypes.c_char_p),
                          ("ggml_set_abort_callback", [p], p)):
        f = getattr(lib, fn)
        f.argtypes, f.restype = args, res
    return lib


_AddServer = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_AbortCallback = ctypes.CFUNCTYPE(None, ctypes.c_char_p)


class Devices:
    """The RPC devices of some endpoints, as the NULL-terminated array llama.cpp takes."""

    def __init__(self, endpoints: Sequence[str]):
        from . import native

        native.ensure_backend()
        self.endpoints = tuple(endpoints)
        for endpoint in self.endpoints:
            dial(endpoint)
        lib = _ggml()
        reg = lib.ggml_backend_reg_by_name(b"RPC")
        if not reg:
            raise BackendError("this llama-cpp-python was built without llama.cpp's RPC backend: "
                               "run tools/setup.sh again (it builds with -DGGML_RPC=ON)")
        add_server = _AddServer(lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server"))
        watch_aborts()
        devices: list[int] = []
        for endpoint in self.endpoints:
            _Watch.dialling = endpoint
            # llama.cpp waits for the hello's answer without a timeout (a port that is not an
            # rpc-server answers nothing): we give it HELLO_TIMEOUT
            watchdog = threading.Timer(HELLO_TIMEOUT, _report, ("no answer to llama.cpp's hello "
                                                                f"in {HELLO_TIMEOUT:g} s",))
            watchdog.daemon = True
            watchdog.start()
            server = add_server(endpoint.encode())  # dials it and says hello (aborts if it cannot)
            watchdog.cancel()
            _Watch.dialling = None
            devices += [lib.ggml_backend_reg_dev_get(server, i)
                        for i in range(lib.ggml_backend_reg_dev_count(server))]
        if not devices:
            raise BackendError(f"the rpc-server(s) at {', '.join(self.endpoints)} offer no device")
        self.names = [lib.ggml_backend_dev_description(d).decode(errors="replace") for d in devices]
        self.array = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)

    @property
    def pointer(self) -> int:
        return ctypes.addressof(self.array)

    def keep_alive(self) -> int:
        """Keepalive and a user timeout on every socket this process holds to the endpoints
        (llama.cpp's own, found by their peer address); the number of sockets set."""
        peers = {_resolve(e) for e in self.endpoints}
        done = 0
        fds = _open_fds()
        if fds is None:
            log.warning("keepalive: llama.cpp's sockets cannot be found on %s: an rpc-server that "
                        "vanishes without a reset is noticed only when TCP gives up", sys.platform)
            return 0
        for fd in fds:
            with contextlib.suppress(OSError):
                if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                    continue
                with socket.socket(fileno=os.dup(fd)) as s:  # the same socket, our own fd
                    if s.type != socket.SOCK_STREAM or s.getpeername()[:2] not in peers:
                        continue
                    _set_keepalive(s)
                    done += 1
        return done


def _resolve(endpoint: str) -> tuple[str, int]:
    host, port = split(endpoint)
    with contextlib.suppress(OSError):
        host = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]
    return host, port


def _open_fds() -> list[int] | None:
    """This process's file descriptors (Linux: /proc/self/fd, macOS and the BSDs: /dev/fd, else
    the first thousand tried); None on Windows, where a socket is no file descriptor."""
    if sys.platform == "win32":
        return None
    for folder in ("/proc/self/fd", "/dev/fd"):
        with contextlib.suppress(OSError):
            return [int(n) for n in os.listdir(folder) if n.isdigit()]
    log.debug("keepalive: neither /proc/self/fd nor /dev/fd lists this process's files: trying fds 3-1023")
    return list(range(3, 1024))


def keepalive_options(platform: str | None = None) -> list[tuple[str, int, int]]:
    """(name, IPPROTO_TCP option, value) that make a silent peer found in ~30 s on `platform`
    (default: this one); the options this socket module lacks are left out, except macOS's."""
    platform = platform or sys.platform
    if platform == "darwin":
        wanted = (("TCP_KEEPALIVE", KEEPALIVE["idle"]), ("TCP_KEEPINTVL", KEEPALIVE["interval"]),
                  ("TCP_KEEPCNT", KEEPALIVE["count"]), ("TCP_RXT_CONNDROPTIME", USER_TIMEOUT_MS // 1000))
        return [(name, getattr(socket, name, _DARWIN_TCP[name]), value) for name, value in wanted]
    wanted = (("TCP_KEEPIDLE", KEEPALIVE["idle"]), ("TCP_KEEPINTVL", KEEPALIVE["interval"]),
              ("TCP_KEEPCNT", KEEPALIVE["count"]), ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS))
    return [(name, getattr(socket, name), value) for name, value in wanted if hasattr(socket, name)]


def _set_keepalive(s: socket.socket) -> None:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, option, value in keepalive_options():
        try:
            s.setsockopt(socket.IPPROTO_TCP, option, value)
        except OSError as exc:  # one the kernel refuses: the others still count
            log.debug("keepalive: %s refused: %s", name, exc)


# ------------------------------------------------------------------------------ aborts

def print_lost(exc: TargetLostError) -> None:
    """The default: one line on stderr (a CLI's reply ends there)."""
    sys.stderr.write(f"\nsprinter-edge: error: {exc}\n")
    sys.stderr.flush()


class _Watch:
    """What the abort callback needs to know (this process's): who to tell, which servers are
    in use, which one llama.cpp is saying hello to."""

    handler: Callable[[TargetLostError], None] = staticmethod(print_lost)
    in_use: list[str] = []
    dialling: str | None = None
    watching = False


def on_lost(handler: Callable[[TargetLostError], None]) -> None:
    """Who hears of it when llama.cpp aborts while a target is on rpc-servers: `handler` gets the
    error on the thread llama.cpp aborted in (or the hello's timer), then the process ends with
    the error's exit code (serving/engine_process.py tells the server)."""
    _Watch.handler = handler


@_AbortCallback
def _abort_callback(message: bytes | None) -> None:
    _report((message or b"").decode(errors="replace").strip())  # never returns into llama.cpp


def _report(text: str) -> None:
    if _Watch.dialling is not None:
        error = TargetLostError(f"{_Watch.dialling} did not answer as llama.cpp's rpc-server does ({text}): "
                                "is it one, built from the same llama.cpp version (llama-cpp-python "
                                f"{llama_cpp.__version__}'s)?", at_load=True)
    else:
        where = ", ".join(_Watch.in_use) or "?"
        error = TargetLostError(f"the target's rpc-server at {where} went away ({text})")
    try:
        _Watch.handler(error)
    finally:  # llama.cpp cannot go on: returning into it would abort() with a C backtrace
        os._exit(error.exit_code)


def watch_aborts() -> None:
    if not _Watch.watching:
        _ggml().ggml_set_abort_callback(ctypes.cast(_abort_callback, ctypes.c_void_p))
        _Watch.watching = True


def note_in_use(endpoints: Sequence[str]) -> None:
    _Watch.in_use.extend(e for e in endpoints if e not in _Watch.in_use)
