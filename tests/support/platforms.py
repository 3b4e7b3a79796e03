"""Other platforms, simulated on this one (tests/test_platform_matrix.py).

`run(code, platform=NAME)` runs `code` in a fresh interpreter made to look like that platform
before the package is imported: `sys.platform`, `platform.system()`/`machine()`/`release()`/
`platform()`, `os.cpu_count()`; `/proc` unreadable (or, on Linux, a `/proc/cpuinfo` of that
machine); the modules it lacks raise ImportError (Windows: resource, fcntl, termios, readline,
pwd, grp), and macOS's readline is a libedit stand-in; the os/signal/socket names it lacks are
gone (Windows: `os.killpg`, `signal.SIGKILL`, ...; macOS: `TCP_KEEPIDLE`, with
`TCP_KEEPALIVE` instead), and on Windows `os.kill(pid, 0)` fails (there it sends CTRL_C_EVENT)
while `ctypes.WinDLL` answers for kernel32 and psapi from this machine's processes.
`run(code, block=(...))` blocks modules on the real platform only.

What it cannot be: the interpreter and its compiled modules stay this machine's (`os.name`,
`os.sep`, pathlib's flavour and subprocess's implementation are chosen when they are imported,
so they are not patched), the third-party dependencies are imported before the simulation
starts (the package's own modules are imported again under it), and llama.cpp is this build.
It runs on a POSIX interpreter only: on Windows, a simulated Linux's os.kill(pid, 0) would
send CTRL_C_EVENT.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import importlib.abc
import io
import json
import os
import pkgutil
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# dependencies' modules the package imports inside functions that the checks reach: imported for
# real first, as the package's own imports are (a module picks its platform's code when imported:
# huggingface_hub's terminal helpers import msvcrt under a simulated win32)
LAZY_DEPENDENCIES = ("huggingface_hub.file_download",)
WINDOWS_MISSING = ("resource", "fcntl", "termios", "readline", "pwd", "grp")

_X86_LAPTOP_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Core(TM) i7-1165G7 @ 2.80GHz
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse \
sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 movbe \
popcnt aes xsave avx f16c rdrand lahf_lm abm bmi1 avx2 bmi2 erms

"""
_ARM_BOARD_CPUINFO = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU part\t: 0xd0b

"""


@dataclass(frozen=True)
class Platform:
    name: str
    sys_platform: str
    system: str  # platform.system()
    machine: str  # platform.machine()
    release: str
    cpu_count: int
    proc: dict[str, str] | None  # None: no /proc; else the /proc files it serves (others: this machine's)
    missing: tuple[str, ...] = ()  # modules whose import fails
    libedit: bool = False  # readline is libedit's (macOS's Python, often)
    absent: dict[str, tuple[str, ...]] = field(default_factory=dict)  # module -> names it lacks
    extra: dict[str, dict[str, int]] = field(default_factory=dict)  # module -> names it adds

    @property
    def windows(self) -> bool:
        return self.sys_platform == "win32"


_DARWIN_ABSENT = {"os": ("sched_getaffinity", "sched_setaffinity"),
                  "socket": ("TCP_KEEPIDLE", "TCP_USER_TIMEOUT")}
_DARWIN_EXTRA = {"socket": {"TCP_KEEPALIVE": 0x10, "TCP_KEEPINTVL": 0x101, "TCP_KEEPCNT": 0x102}}
# Linux's and Windows' numbers (netinet/tcp.h, ws2ipdef.h): the same options whatever runs the simulation
_LINUX_EXTRA = {"socket": {"TCP_KEEPIDLE": 4, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 6, "TCP_USER_TIMEOUT": 18}}
_WINDOWS_EXTRA = {"socket": {"TCP_KEEPIDLE": 3, "TCP_KEEPINTVL": 17, "TCP_KEEPCNT": 16}}
_WINDOWS_ABSENT = {
    "os": ("fork", "killpg", "setsid", "getpgid", "setpgrp", "getuid", "geteuid", "sysconf",
           "sched_getaffinity", "sched_setaffinity", "getloadavg", "nice"),
    "signal": ("SIGALRM", "SIGKILL", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT", "setitimer", "alarm",
               "ITIMER_REAL"),
    "socket": ("TCP_USER_TIMEOUT",),
}

PLATFORMS: dict[str, Platform] = {p.name: p for p in (
    Platform("darwin-arm64", "darwin", "Darwin", "arm64", "23.6.0", 10, None, libedit=True,
             absent=_DARWIN_ABSENT, extra=_DARWIN_EXTRA),
    Platform("darwin-x86_64", "darwin", "Darwin", "x86_64", "21.6.0", 12, None, libedit=True,
             absent=_DARWIN_ABSENT, extra=_DARWIN_EXTRA),
    Platform("linux-aarch64", "linux", "Linux", "aarch64", "6.6.31+rpt-rpi-2712", 4,
             {"/proc/cpuinfo": _ARM_BOARD_CPUINFO * 4}, extra=_LINUX_EXTRA),
    Platform("linux-x86_64", "linux", "Linux", "x86_64", "6.8.0-45-generic", 8,
             {"/proc/cpuinfo": _X86_LAPTOP_CPUINFO * 8}, extra=_LINUX_EXTRA),
    Platform("win32-amd64", "win32", "Windows", "AMD64", "10", 16, None, missing=WINDOWS_MISSING,
             absent=_WINDOWS_ABSENT, extra=_WINDOWS_EXTRA),
)}


def run(code: str, platform: str | None = None, block: tuple[str, ...] = (), *,
        env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter, after every module of the package was imported for real (its
    dependencies stay) and dropped again, under `platform`'s simulation (None: this platform)
    with the modules of `block` unimportable. `code` sees REAL_MODULES (the package's modules
    that imported for real), REAL_FAILED (`{module: its error}` of the others), IMPORT_FAILED
    (the same of those that imported for real but not again under the simulation) and PLATFORM
    (the Platform, or None)."""
    config = json.dumps({"platform": platform, "block": list(block), "code": code})
    tests = str(ROOT / "tests")
    boot = f"import sys; sys.path.insert(0, {tests!r}); import support.platforms as p; p._boot()"
    return subprocess.run([sys.executable, "-c", boot, config], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


def run_all(code: str, names: list[str] | None = None, at_once: int = 3,
            **kwargs: object) -> dict[str, subprocess.CompletedProcess[str]]:
    """`run(code, platform=name)` for every platform (or `names`), `at_once` at a time: each
    process spends its seconds importing the package twice, on a core of its own."""
    from concurrent.futures import ThreadPoolExecutor

    names = list(names or PLATFORMS)
    with ThreadPoolExecutor(max(1, min(at_once, os.cpu_count() or 1))) as pool:
        return dict(zip(names, pool.map(lambda name: run(code, platform=name, **kwargs), names), strict=True))


def package_modules() -> dict[str, str | None]:
    """Every module of sprinter_edge (but __main__) -> None when it imports, else its error."""
    import sprinter_edge

    out: dict[str, str | None] = {"sprinter_edge": None}

    def failed(name: str) -> None:
        out[name] = repr(sys.exc_info()[1])

    for info in pkgutil.walk_packages(sprinter_edge.__path__, "sprinter_edge.", onerror=failed):
        if info.name.endswith(".__main__"):  # importing it runs the CLI (the --help checks run that)
            continue
        try:
            importlib.import_module(info.name)
            out.setdefault(info.name, None)
        except Exception as exc:  # reported by the caller
            out[info.name] = f"{type(exc).__name__}: {exc}"
    return out


def _boot() -> None:
    config = json.loads(sys.argv[1])
    sys.argv[1:] = []
    real = package_modules()
    for name in LAZY_DEPENDENCIES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    for name in [m for m in sys.modules if m == "sprinter_edge" or m.startswith("sprinter_edge.")]:
        del sys.modules[name]
    spec = PLATFORMS[config["platform"]] if config["platform"] else None
    blocked = tuple(config["block"]) + (spec.missing if spec else ())
    _block(blocked)
    if spec is not None:
        _simulate(spec)
    again = package_modules()
    scope = {"__name__": "__main__", "REAL_MODULES": sorted(m for m, err in real.items() if err is None),
             "REAL_FAILED": {m: err for m, err in real.items() if err is not None},
             "IMPORT_FAILED": {m: again[m] for m in real if real[m] is None and again.get(m) is not None},
             "PLATFORM": spec}
    exec(compile(config["code"], "<platform check>", "exec"), scope)


# ---------------------------------------------------------------------------- the pieces

class _Blocker(importlib.abc.MetaPathFinder):
    def __init__(self, names: tuple[str, ...]):
        self.names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked: simulated platform)",
                                      name=fullname)
        return None


def _block(names: tuple[str, ...]) -> None:
    for name in list(sys.modules):
        if name.partition(".")[0] in names:
            del sys.modules[name]
    sys.meta_path.insert(0, _Blocker(names))


def _simulate(p: Platform) -> None:
    import platform as platform_module
    import signal  # noqa: F401 - patched below
    import socket  # noqa: F401

    sys.platform = p.sys_platform
    platform_module.system = lambda: p.system
    platform_module.machine = lambda: p.machine
    platform_module.release = lambda: p.release
    platform_module.platform = lambda *a, **k: f"{p.system}-{p.release}-{p.machine}"
    os.cpu_count = lambda: p.cpu_count
    if hasattr(os, "process_cpu_count"):
        os.process_cpu_count = lambda: p.cpu_count
    for module, names in p.absent.items():
        for name in names:
            if hasattr(sys.modules[module], name):
                delattr(sys.modules[module], name)
    for module, values in p.extra.items():
        for name, value in values.items():
            setattr(sys.modules[module], name, value)
    _patch_proc(p.proc)
    if p.libedit:
        sys.modules["readline"] = _libedit()
    if p.windows:
        _windows_calls()


def _is_proc(path: object) -> str | None:
    if isinstance(path, int):
        return None
    try:
        text = os.fsdecode(os.fspath(path))
    except TypeError:
        return None
    return text if text == "/proc" or text.startswith("/proc/") else None


def _patch_proc(served: dict[str, str] | None) -> None:
    """/proc as `served` says: None, none of it; else those files, and the rest as it is."""
    real_open = io.open

    def refuse(path: str) -> OSError:
        return FileNotFoundError(2, "No such file or directory (simulated: no /proc)", path)

    def fake_open(file, mode="r", *args, **kwargs):
        path = _is_proc(file)
        if path is None:
            return real_open(file, mode, *args, **kwargs)
        if served is not None and path in served:
            return io.BytesIO(served[path].encode()) if "b" in mode else io.StringIO(served[path])
        if served is not None:
            return real_open(file, mode, *args, **kwargs)
        raise refuse(path)

    builtins.open = io.open = fake_open
    if served is not None:
        return

    def guard(real):
        def call(path=".", *args, **kwargs):
            proc = _is_proc(path)
            if proc is not None:
                raise refuse(proc)
            return real(path, *args, **kwargs)
        return call

    for name in ("open", "listdir", "scandir", "stat", "lstat", "access"):
        setattr(os, name, guard(getattr(os, name)))


def _libedit() -> types.ModuleType:
    """readline as macOS's Python often has it: libedit's, which ignores GNU's bindings."""
    mod = types.ModuleType("readline", "Importing this module enables command line editing using libedit "
                                       "readline.")
    mod.bound = []  # type: ignore[attr-defined]
    mod.parse_and_bind = mod.bound.append  # type: ignore[attr-defined]
    for name in ("read_history_file", "write_history_file", "set_history_length", "set_completer",
                 "set_completer_delims", "add_history", "clear_history"):
        setattr(mod, name, lambda *a, **k: None)
    mod.get_current_history_length = lambda: 0  # type: ignore[attr-defined]
    return mod


def _windows_calls() -> None:
    """os.kill(pid, 0) refused (on Windows it sends CTRL_C_EVENT); ctypes.WinDLL's kernel32
    (OpenProcess, GetExitCodeProcess, CloseHandle) answers from this machine's processes, psapi's
    GetProcessMemoryInfo with a peak working set of 64 MiB."""
    import ctypes

    real_kill, last_error = os.kill, [0]
    still_active, invalid_parameter, access_denied = 259, 87, 5

    def kill(pid: int, sig: int) -> None:
        if sig == 0:
            raise AssertionError("os.kill(pid, 0) on Windows sends CTRL_C_EVENT to the process")
        real_kill(pid, sig)

    def open_process(access: int, inherit: int, pid: int) -> int | None:
        try:
            real_kill(pid, 0)
        except ProcessLookupError:
            last_error[0] = invalid_parameter
            return None
        except PermissionError:
            last_error[0] = access_denied
            return None
        return pid

    def exit_code(handle: int, ref) -> int:
        ref._obj.value = still_active
        return 1

    def memory_info(handle: int, ref, size: int) -> int:
        ref._obj.PeakWorkingSetSize = 64 << 20
        return 1

    class Function:
        def __init__(self, body):
            self.body, self.argtypes, self.restype = body, None, None

        def __call__(self, *args):
            return self.body(*args)

    class WinDLL:
        def __init__(self, name: str, use_last_error: bool = False, **_: object):
            lib = name.lower().removesuffix(".dll")
            if lib == "kernel32":
                self.OpenProcess = Function(open_process)
                self.GetExitCodeProcess = Function(exit_code)
                self.CloseHandle = Function(lambda handle: 1)
            elif lib == "psapi":
                self.GetProcessMemoryInfo = Function(memory_info)
            else:
                raise OSError(f"simulated Windows: no {name} here")

    os.kill = kill
    ctypes.WinDLL = WinDLL  # type: ignore[attr-defined]
    ctypes.get_last_error = lambda: last_error[0]  # type: ignore[attr-defined]
