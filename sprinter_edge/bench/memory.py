"""Peak resident memory of this process, resettable per method (Linux), else ru_maxrss."""

from __future__ import annotations

import contextlib
import resource
import sys
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")


def reset_peak() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM); False when this system cannot."""
    with contextlib.suppress(OSError):
        _CLEAR.write_text("5")
        return True
    return False


def peak_rss_mib() -> float:
    with contextlib.suppress(OSError):
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1 << 20) if sys.platform == "darwin" else rss / 1024
