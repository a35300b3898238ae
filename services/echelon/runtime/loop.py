"""The event loop a service process runs on: uvloop (libuv) when it is installed
and not turned off, asyncio's own otherwise.

grpc.aio runs on either: it reads its completion queue in a thread of its own and wakes the
loop through a socket the loop watches (`add_reader`), which uvloop implements. What uvloop
saves is the loop's own work per wakeup (its timers, handles and epoll calls are C): each
gRPC message wakes a loop once on each side, so at low rates, where every event travels
alone, that is a share of every hop (docs/performance-history.md, "Event loop: uvloop").

`ECHELON_EVENT_LOOP=asyncio` turns it off (a debugging aid: asyncio's debug mode and some
profilers know only asyncio's loop); `uvloop` is the default when importable.
"""

from __future__ import annotations

import asyncio
import gc
import os
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")
ENV = "ECHELON_EVENT_LOOP"
CHOICES = ("uvloop", "asyncio")


def chosen() -> str:
    """The loop `run` will use: ECHELON_EVENT_LOOP if set (uvloop or asyncio), else uvloop
    when it can be imported."""
    want = os.environ.get(ENV, "").strip().lower()
    if want and want not in CHOICES:
        raise ValueError(f"{ENV}={want!r}: one of {', '.join(CHOICES)}")
    if want == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if want == "uvloop":
            raise
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the chosen loop."""
    if chosen() == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def running() -> str:
    """The name of the running loop's implementation (for logs)."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"


# At saturation most young objects are still in flight when a pass comes (events held for
# their acks), so each pass scans and promotes them, and every 10th scans them again: fewer,
# larger young passes cost the busiest agents less of their CPU in the GC, with no longer a
# worst pass (docs/performance-history.md, "Measurements once in docstrings").
# Cyclic garbage waits at most that many allocations longer.
YOUNG = 100_000


def started() -> None:
    """Call once a process has built what it runs with (modules, protobuf descriptors, the
    view, a benchmark's cluster): that lives as long as the process, so it goes out of the
    cyclic GC's passes (`gc.freeze`), and young passes run every `YOUNG` allocations, not
    700: one publish allocates dozens of objects, and an older-generation pass stalls the
    loop for as long as it scans (`loadtest.trace_hops` counts the passes)."""
    gc.freeze()
    gc.set_threshold(YOUNG, 10, 10)
