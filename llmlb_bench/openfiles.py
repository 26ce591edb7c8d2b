"""The open-file limit, raised for processes that hold one socket per stream.

Many systems start processes with a soft limit of 1,024 open files, far
below the thousands of concurrent streams a replay (or a server under one)
holds; the hard limit is usually much higher, and raising the soft limit up
to it needs no privilege.
"""

from __future__ import annotations

import resource


def raise_open_files_limit() -> int:
    """Lift the soft open-file limit to the hard one (or 2**20 when unlimited); returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return target
