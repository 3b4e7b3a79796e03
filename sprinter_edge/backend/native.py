"""Process-wide llama.cpp state: backend init, log routing, build/CPU facts."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import re
from collections import deque
from collections.abc import Iterator
from pathlib import Path

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
    """Whether this build can put layers on a GPU here, so that every layer goes there by
    default. llama.cpp's `llama_supports_gpu_offload()` also says yes for any build with its RPC
    backend (tools/setup.sh always adds it), whose devices are remote and only used through
    --target-rpc: for such a build a local GPU device is asked for as well (`gpu_devices`)."""
    if not llama_cpp.llama_supports_gpu_offload():
        return False
    if not llama_cpp.llama_supports_rpc():
        return True
    devices = gpu_devices()
    return bool(devices) if devices is not None else False


def gpu_devices() -> list[str] | None:
    """The local GPUs llama.cpp puts offloaded layers on, as "NAME (DESCRIPTION)" (e.g.
    "Metal (Apple M2 Pro)", "CUDA0 (NVIDIA ...)"): the discrete ones, else the integrated ones,
    as llama.cpp picks them; RPC devices left out. None where ggml cannot be asked."""
    try:
        return _gpu_devices()
    except (OSError, AttributeError, ValueError, TypeError) as exc:
        log.debug("cannot list ggml's devices: %s", exc)
        return None


# ggml_backend_dev_type's values (ggml-backend.h)
_DEVICE_GPU, _DEVICE_IGPU = 1, 2


@functools.lru_cache(maxsize=1)
def _gpu_devices() -> list[str] | None:
    libs = _ggml_libs()
    if not libs:
        return None
    p = ctypes.c_void_p
    protos = {"ggml_backend_dev_count": ([], ctypes.c_size_t), "ggml_backend_dev_get": ([ctypes.c_size_t], p),
              "ggml_backend_dev_type": ([p], ctypes.c_int), "ggml_backend_dev_name": ([p], ctypes.c_char_p),
              "ggml_backend_dev_description": ([p], ctypes.c_char_p),
              "ggml_backend_dev_backend_reg": ([p], p), "ggml_backend_reg_name": ([p], ctypes.c_char_p)}
    fns = {}
    for name, (args, res) in protos.items():
        fn = next((getattr(lib, name) for lib in libs if hasattr(lib, name)), None)
        if fn is None:
            return None
        fn.argtypes, fn.restype = args, res
        fns[name] = fn
    found: dict[int, list[str]] = {_DEVICE_GPU: [], _DEVICE_IGPU: []}
    for i in range(fns["ggml_backend_dev_count"]()):
        dev = fns["ggml_backend_dev_get"](i)
        kind = fns["ggml_backend_dev_type"](dev)
        reg = fns["ggml_backend_dev_backend_reg"](dev)
        if kind not in found or (reg and fns["ggml_backend_reg_name"](reg) == b"RPC"):
            continue
        name = (fns["ggml_backend_dev_name"](dev) or b"?").decode(errors="replace")
        about = (fns["ggml_backend_dev_description"](dev) or b"").decode(errors="replace")
        found[kind].append(f"{name} ({about})" if about and about != name else name)
    return found[_DEVICE_GPU] or found[_DEVICE_IGPU]


def _ggml_libs() -> list[ctypes.CDLL]:
    """libggml and libggml-base as llama-cpp-python loaded them (the same handles: both are in)."""
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    libs = []
    for stem in ("ggml", "ggml-base"):
        for name in (f"lib{stem}.so", f"lib{stem}.dylib", f"{stem}.dll"):
            if (lib_dir / name).exists():
                with contextlib.suppress(OSError):
                    libs.append(ctypes.CDLL(str(lib_dir / name)))
                break
    return libs


def device_name(device: str) -> str:
    """A device's short name: "Metal" of "Metal (Apple M2 Pro)"."""
    return device.split(" (", 1)[0]


def llama_cpp_version() -> str:
    return getattr(llama_cpp, "__version__", "unknown")
