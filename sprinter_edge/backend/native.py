"""Process-wide llama.cpp state: backend init, log routing, build/CPU facts."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
from collections import deque
from collections.abc import Iterator

import llama_cpp

log = logging.getLogger("sprinter_edge.llama_cpp")

_initialised = False
# a model's whole load log (a line per repacked tensor: ~400 for the default target), which
# LlamaModel reads for the repacked weight buffer
_log_lines: deque[tuple[int, str]] = deque(maxlen=4096)

# ggml log levels: 1 debug, 2 info, 3 warn, 4 error, 5 continuation of the previous line.
# llama.cpp warns about things users cannot act on: only its errors reach WARNING here.
_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.DEBUG, 4: logging.WARNING, 5: logging.DEBUG}
_ERROR_LEVELS = (3, 4)


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", errors="replace").rstrip()
    if line:
        _log_lines.append((level, line))
        log.log(_LEVELS.get(level, logging.DEBUG), "%s", line)


class _LogWindow:
    def __init__(self) -> None:
        self.start = len(_log_lines)
        self.lines: list[tuple[int, str]] = []

    def last_error(self) -> str | None:
        errors = [line for level, line in self.lines if level in _ERROR_LEVELS]
        return errors[-1] if errors else None


@contextlib.contextmanager
def capture_log() -> Iterator[_LogWindow]:
    """Collect llama.cpp's log lines during a call, to turn a NULL return into a message."""
    _log_lines.clear()
    window = _LogWindow()
    try:
        yield window
    finally:
        window.lines = list(_log_lines)


def ensure_backend() -> None:
    global _initialised
    if not _initialised:
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _initialised = True


def system_info() -> str:
    ensure_backend()
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")


def cpu_has_amx() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return "amx_int8" in fh.read()
    except OSError:
        return False


def build_uses_amx(info: str) -> bool:
    """True when this llama.cpp build has the AMX code path compiled in."""
    return re.search(r"AMX_INT8\s*=\s*1", info) is not None


def avoid_extra_buffers() -> bool:
    """Whether to load weights without the extra buffer types (AMX / repacking).

    A native (-march=native) build on a CPU with AMX crashes in ggml_backend_amx_mul_mat
    on the first decode. Turning extra buffer types off avoids it at some speed cost.
    SPRINTER_EDGE_EXTRA_BUFFERS=1/0 overrides the detection."""
    forced = os.environ.get("SPRINTER_EDGE_EXTRA_BUFFERS")
    if forced is not None:
        return forced.strip() in ("0", "false", "no")
    return build_uses_amx(system_info())


def gpu_offload_supported() -> bool:
    return bool(llama_cpp.llama_supports_gpu_offload())


def llama_cpp_version() -> str:
    return getattr(llama_cpp, "__version__", "unknown")
