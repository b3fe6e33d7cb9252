"""A process's resident memory from /proc (Linux), for the benchmarks. Imports no JAX, so a
command may read it before JAX starts.

The peak is the kernel's high-water mark VmHWM, which writing "5" to /proc/self/clear_refs
resets; `ru_maxrss` is not a substitute after a reset: the kernel folds the high-water marks
of exited threads into it, so it can keep reporting a peak from before the reset.
"""

from __future__ import annotations

import resource
import sys


def _status_mib(field: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def rss_mib() -> float | None:
    """The resident set now (VmRSS), or None without /proc."""
    return _status_mib("VmRSS")


def peak_rss_mib() -> float:
    """The resident set's high-water mark since the start or the last `reset_peak_rss`."""
    peak = _status_mib("VmHWM")
    if peak is not None:
        return peak
    # No /proc: the lifetime peak (KiB on Linux, bytes on macOS).
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / (1024 * 1024) if sys.platform == "darwin" else maxrss / 1024


def reset_peak_rss() -> bool:
    """Resets the high-water mark to the current resident set; False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
