"""Where a cluster's processes run and on which ports: a `Placement`.

`Loopback` puts every process on 127.0.0.1, on ports laid out above a base port (or on
free ports); `loadtest.netns.NetnsPlacement` puts each agent in a network namespace of
its own and the rest on the bridge. The launcher asks a placement three things: the site
of a process (an address to bind, and whatever the placement needs to start it there),
its ports, and how to start an argv on a site.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

# Port layout above a base port; a process's metrics port sits METRICS_OFFSET above its gRPC port.
OFFSETS = {"membership": 0, "matcher": 20, "router": 60, "agent": 100}
METRICS_OFFSET = 1000
PER_ROLE = 40  # processes of one role the layout has room for


@dataclass(frozen=True)
class Site:
    """Where one process runs: the address it binds, and the placement's handle (a
    namespace, None for the root one)."""

    ip: str
    host: object = None


class Placement(Protocol):
    kind: str  # "loopback", "netns": shown in reports

    def site(self, role: str, index: int) -> Site:
        """The site of the index-th process of `role` (any other role, e.g. an auxiliary
        process: the root site, where the membership replicas run)."""

    def ports(self, role: str, index: int) -> tuple[int, int]:
        """(gRPC port, metrics port) of the index-th process of a service role."""

    def popen(self, site: Site, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start argv on the site, in a session of its own."""


def layout(base: int, role: str, index: int) -> tuple[int, int]:
    """The fixed layout: role's offset above `base`, plus the index."""
    if not 0 <= index < PER_ROLE:
        raise ValueError(f"{role} {index}: the port layout holds {PER_ROLE} per role")
    port = base + OFFSETS[role] + index
    return port, port + METRICS_OFFSET


def free_ports(n: int) -> list[int]:
    """n distinct loopback ports free right now: every socket is held until all are
    picked, so the kernel cannot hand out one twice."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def free_port() -> int:
    """A loopback port free right now (the OS picks it; the server binds it soon after)."""
    return free_ports(1)[0]


@dataclass
class Loopback:
    """Every process on 127.0.0.1: ports laid out above `base_port`, or free ones (0)."""

    base_port: int = 7100
    kind: str = "loopback"
    # Free ports handed out already: the kernel may offer a released one again to the next
    # process of the same cluster before the first has bound it.
    given: set[int] = field(default_factory=set, repr=False, compare=False)

    def site(self, role: str, index: int) -> Site:
        return Site("127.0.0.1")

    def ports(self, role: str, index: int) -> tuple[int, int]:
        if self.base_port:
            return layout(self.base_port, role, index)
        for _ in range(100):
            port, metrics = free_ports(2)
            if port not in self.given and metrics not in self.given:
                self.given.update((port, metrics))
                return port, metrics
        raise RuntimeError("no two free loopback ports not handed out already, in 100 tries")

    def popen(self, site: Site, argv: Sequence[str], **kw) -> subprocess.Popen:
        # A new session, so a Ctrl-C at the terminal reaches the launcher only, which
        # then stops the children in order.
        return subprocess.Popen(list(argv), start_new_session=True, **kw)


def stop_processes(procs: Sequence[subprocess.Popen], timeout: float = 5.0) -> None:
    """SIGTERM each (SIGCONT first: a stopped process cannot act on it), wait for all
    until one deadline, SIGKILL what is left: only these pids, in the order given."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout)


def stop_process(p: subprocess.Popen, timeout: float = 5.0) -> int | None:
    """SIGTERM, wait up to `timeout`, then SIGKILL: only this pid."""
    stop_processes([p], timeout)
    return p.returncode
