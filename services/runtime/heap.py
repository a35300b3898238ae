"""The C heap of a process that moves bulk payloads: glibc's malloc, told not to hoard.

glibc serves an allocation above its mmap threshold with mmap, and a free returns it to
the kernel; below, from an arena that keeps freed memory for reuse. The threshold is
dynamic: each free of an mmapped block raises it to that size, up to 32 MiB, so after
the first 4 MiB publish slices every later one (and every 64 KiB relay slice around
it) comes from arenas, and glibc makes up to 8 arenas per core for gRPC's threads. An
agent's peak RSS then crept up with the payload size (measured: the publishing agent
131 -> 167 -> 247 MiB after 64 MiB, 256 MiB and 4 GiB payloads; 113 -> 137 -> 137 with
these settings). Fixing the threshold keeps big buffers mmapped; two arenas are enough
for a process whose Python runs on one thread. The same as MALLOC_MMAP_THRESHOLD_=131072
MALLOC_ARENA_MAX=2 in the environment, but set by the process itself, so it holds
however the agent is started (launcher, container, by hand). A no-op off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("echelon.heap")

M_MMAP_THRESHOLD = -3  # mallopt parameters (malloc.h)
M_ARENA_MAX = -8
MMAP_THRESHOLD = 128 << 10
ARENA_MAX = 2


def bound_heap() -> bool:
    """Set glibc's mmap threshold and arena count (module doc); False where it cannot."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        log.info("no glibc mallopt here: the C heap keeps its defaults")
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_ARENA_MAX, ARENA_MAX))
