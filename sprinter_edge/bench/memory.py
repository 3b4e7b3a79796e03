"""Peak resident memory of this process, resettable per method (Linux), else ru_maxrss
(macOS, the BSDs), else the peak working set (Windows, which has no `resource` module), else
NaN (unknown)."""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path

try:
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]

_STATUS = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")


def reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM); False when this system cannot."""
    with contextlib.suppress(OSError):
        _CLEAR.write_text("5")
        return True
    return False


def peak_rss_mib() -> float:
    """MiB; NaN when this system tells none of the three ways."""
    with contextlib.suppress(OSError):
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    if resource is not None:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss / (1 << 20) if sys.platform == "darwin" else rss / 1024
    if sys.platform == "win32":
        with contextlib.suppress(OSError, AttributeError):
            return _peak_working_set() / (1 << 20)
    return math.nan


def _peak_working_set() -> int:
    """Windows: PeakWorkingSetSize of GetProcessMemoryInfo (psapi), in bytes."""
    import ctypes

    size_t, dword = ctypes.c_size_t, ctypes.c_uint32

    class Counters(ctypes.Structure):  # PROCESS_MEMORY_COUNTERS
        _fields_ = [("cb", dword), ("PageFaultCount", dword), ("PeakWorkingSetSize", size_t),
                    ("WorkingSetSize", size_t), ("QuotaPeakPagedPoolUsage", size_t),
                    ("QuotaPagedPoolUsage", size_t), ("QuotaPeakNonPagedPoolUsage", size_t),
                    ("QuotaNonPagedPoolUsage", size_t), ("PagefileUsage", size_t),
                    ("PeakPagefileUsage", size_t)]

    psapi = ctypes.WinDLL("psapi", use_last_error=True)  # type: ignore[attr-defined]
    psapi.GetProcessMemoryInfo.argtypes = (ctypes.c_void_p, ctypes.POINTER(Counters), dword)
    counters = Counters(cb=ctypes.sizeof(Counters))
    this_process = ctypes.c_void_p(-1)  # GetCurrentProcess()'s pseudo-handle
    if not psapi.GetProcessMemoryInfo(this_process, ctypes.byref(counters), counters.cb):
        raise OSError("GetProcessMemoryInfo failed")
    return counters.PeakWorkingSetSize
