"""What this machine offers the models: its performance cores and its free memory, on Linux,
macOS and Windows, with the standard library only (each reader has a fallback: a missing /proc or
/sys, no sysctl, no kernel32).

Tests simulate another platform by patching `platform.system()` and `os.cpu_count()`, pointing
SYS_DEVICES / PROC_MEMINFO / PROC_CPUINFO at other files, and replacing `run` (the one place a
command such as `sysctl` or `vm_stat` runs) or `windows_core_count` / `windows_free_memory`.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

SYS_DEVICES = Path("/sys/devices")  # system/cpu/cpuN/topology, cpu_core/cpus (Intel hybrid)
PROC_MEMINFO = Path("/proc/meminfo")
PROC_CPUINFO = Path("/proc/cpuinfo")
FALLBACK_MEMORY = 8 << 30  # what free_memory says when nothing can be read

# outputs of `sysctl` (machine facts that never change while the process runs), by command
_static: dict[tuple[str, ...], str | None] = {}


def run(args: Sequence[str]) -> str | None:
    """A command's standard output, or None when it is missing, fails or hangs (2 s)."""
    key = tuple(args)
    if key in _static:
        return _static[key]
    exe = shutil.which(args[0]) or (f"/usr/sbin/{args[0]}" if args[0] == "sysctl" else None)
    out: str | None = None
    if exe is not None:
        try:
            done = subprocess.run([exe, *args[1:]], capture_output=True, text=True, timeout=2, check=False)
            out = done.stdout if done.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            out = None
    if args[0] == "sysctl":
        _static[key] = out
    return out


def _sysctl_int(name: str) -> int | None:
    out = run(["sysctl", "-n", name])
    try:
        return int(out.strip()) if out else None
    except ValueError:
        return None


# ------------------------------------------------------------------------------ cores

def performance_cores() -> int:
    """The threads a model decodes with by default: the performance cores, as llama.cpp's own
    tools count them (`common_cpu_get_num_math`): one per physical core, hyperthread siblings
    not counted, Intel's efficiency cores left out (Linux); `hw.perflevel0.physicalcpu`, else
    `hw.physicalcpu` (macOS); the physical cores (Windows). On Linux only the CPUs this process
    may run on count (a container's cpuset). Where nothing tells, llama.cpp's fallback: the
    logical CPUs, halved above 4. Always >= 1."""
    system = platform.system()
    found: int | None = None
    if system == "Linux":
        found = linux_physical_cores()
    elif system == "Darwin":
        found = _sysctl_int("hw.perflevel0.physicalcpu") or _sysctl_int("hw.physicalcpu")
    elif system == "Windows":
        found = windows_core_count()
    if found is None or found < 1:
        n = os.cpu_count() or 1
        found = n if n <= 4 else n // 2
    return max(1, found)


def _cpu_list(text: str) -> set[int]:
    """A kernel CPU list ("0-3,8,10-11") as a set."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def linux_physical_cores() -> int | None:
    """Distinct cores (sets of hyperthread siblings) among the CPUs this process may run on,
    Intel hybrid's efficiency cores left out; /proc/cpuinfo's (physical id, core id) pairs when
    /sys has no topology; None when neither can be read."""
    cpu_dir = SYS_DEVICES / "system" / "cpu"
    try:
        cpus = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = set()
    if not cpus:
        with contextlib.suppress(OSError):
            cpus = {int(p.name[3:]) for p in cpu_dir.glob("cpu[0-9]*") if p.name[3:].isdigit()}
    with contextlib.suppress(OSError, ValueError):
        # Intel hybrid: the performance cores' PMU lists its CPUs (the efficiency cores are cpu_atom's)
        performance = _cpu_list((SYS_DEVICES / "cpu_core" / "cpus").read_text())
        if cpus & performance:
            cpus &= performance
    siblings: set[str] = set()
    for cpu in sorted(cpus):
        try:
            siblings.add((cpu_dir / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text().strip())
        except OSError:
            siblings.clear()
            break
    if siblings:
        return len(siblings)
    return _cpuinfo_cores()


def _cpuinfo_cores() -> int | None:
    try:
        text = PROC_CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    cores: set[tuple[str, str]] = set()
    for block in text.split("\n\n"):
        fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        if "physical id" in fields and "core id" in fields:
            cores.add((fields["physical id"], fields["core id"]))
    return len(cores) or None


def windows_core_count() -> int | None:
    """Physical cores from GetLogicalProcessorInformationEx(RelationProcessorCore), as llama.cpp
    counts them on Windows; None elsewhere or when the call fails."""
    try:
        import ctypes
        import struct

        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
        size = ctypes.c_uint32(0)
        kernel32.GetLogicalProcessorInformationEx(0, None, ctypes.byref(size))
        if not size.value:
            return None
        buf = ctypes.create_string_buffer(size.value)
        if not kernel32.GetLogicalProcessorInformationEx(0, buf, ctypes.byref(size)):
            return None
        cores, offset = 0, 0
        while offset + 8 <= size.value:
            relationship, entry = struct.unpack_from("<II", buf.raw, offset)
            if entry <= 0:
                break
            cores += relationship == 0  # RelationProcessorCore: one entry a physical core
            offset += entry
        return cores or None
    except (AttributeError, OSError, ImportError, ValueError):
        return None


# ------------------------------------------------------------------------------ memory

def free_memory() -> int:
    """Bytes of memory free now: MemAvailable (Linux); free, inactive and speculative pages from
    `vm_stat` (macOS; `hw.memsize`, the whole memory, where vm_stat says nothing);
    GlobalMemoryStatusEx's available physical memory (Windows). Elsewhere, or when none of these
    can be read: the machine's whole memory, else FALLBACK_MEMORY."""
    system = platform.system()
    found: int | None = None
    if system == "Darwin":
        found = macos_free_memory() or _sysctl_int("hw.memsize")
    elif system == "Windows":
        found = windows_free_memory()
    else:
        found = linux_available_memory()
    if found:
        return found
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return FALLBACK_MEMORY


def linux_available_memory() -> int | None:
    try:
        with PROC_MEMINFO.open(encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def macos_free_memory() -> int | None:
    """(free + inactive + speculative pages) x the page size, from `vm_stat`."""
    out = run(["vm_stat"])
    if not out:
        return None
    size = re.search(r"page size of (\d+) bytes", out)
    page = int(size.group(1)) if size else _sysctl_int("hw.pagesize") or 4096
    pages = {m.group(1).lower(): int(m.group(2))
             for m in re.finditer(r"^Pages ([\w ]+?):\s+(\d+)\.?\s*$", out, re.MULTILINE)}
    wanted = [pages.get(k) for k in ("free", "inactive", "speculative")]
    if all(v is None for v in wanted):
        return None
    return sum(v or 0 for v in wanted) * page


def windows_free_memory() -> int | None:
    """GlobalMemoryStatusEx's ullAvailPhys; None elsewhere or when the call fails."""
    try:
        import ctypes

        class MemoryStatusEx(ctypes.Structure):
            _fields_ = [("dwLength", ctypes.c_uint32), ("dwMemoryLoad", ctypes.c_uint32),
                        ("ullTotalPhys", ctypes.c_uint64), ("ullAvailPhys", ctypes.c_uint64),
                        ("ullTotalPageFile", ctypes.c_uint64), ("ullAvailPageFile", ctypes.c_uint64),
                        ("ullTotalVirtual", ctypes.c_uint64), ("ullAvailVirtual", ctypes.c_uint64),
                        ("ullAvailExtendedVirtual", ctypes.c_uint64)]

        status = MemoryStatusEx()
        status.dwLength = ctypes.sizeof(MemoryStatusEx)
        if not ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):  # type: ignore[attr-defined]
            return None
        return int(status.ullAvailPhys) or None
    except (AttributeError, OSError, ImportError):
        return None
