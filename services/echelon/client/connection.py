"""What a Client's publishers, subscriptions and shared stream use of it: a `Connection`.

The Client is the application's object (topics, admin calls, drain and close); the
parts that stream hold this narrow one instead of reaching into the Client: the agents'
addresses and channels, the state (open, draining, closed), which members are alive,
the durable subscriptions' acked ids, the agent new streams go to first, and the hooks
fired when a stream is lost and opened again (docs/guarantees.md, "Subscriptions across
an agent's death").
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import grpc

from echelon.client.errors import ClientClosed, EchelonError
from echelon.contract.transport import Transport

log = logging.getLogger("echelon.client")

DEFAULT_AGENT_PORT = 7200  # an address without a port: the first agent of `echelon up`'s layout


def with_port(address: str, port: int = DEFAULT_AGENT_PORT) -> str:
    """`host` -> `host:port` (an IPv6 literal in brackets); an address with a port as it is.
    (gRPC would dial 443 for a bare host: never an agent.)"""
    address = address.strip()
    if address.startswith("["):
        return address if "]:" in address else f"{address}:{port}"
    if ":" in address:
        return address if address.count(":") == 1 else f"[{address}]:{port}"  # a bare IPv6 literal
    return f"{address}:{port}"


@dataclass(frozen=True)
class Reconnect:
    """How a lost stream is opened again: a wait that doubles from `first_wait` up to
    `max_wait` seconds (with jitter) between attempts, at most `max_attempts` (-1: until
    closed), each on the next agent of the client's list."""

    max_attempts: int = 60
    first_wait: float = 0.1
    max_wait: float = 2.0

    def wait(self, attempt: int) -> float:
        """Seconds before attempt `attempt` (1, 2, ...)."""
        base = min(self.max_wait, self.first_wait * 2 ** (attempt - 1))
        return base * random.uniform(0.5, 1.0)

    def gives_up(self, attempt: int) -> bool:
        return 0 <= self.max_attempts < attempt


@dataclass(frozen=True)
class ConnectionEvent:
    """What `on_disconnect` and `on_reconnect` receive.

    `member`: the Subscription or Publisher whose stream it was; `address`: the agent
    lost (on_disconnect) or reached (on_reconnect); `error`: why the stream ended;
    `attempts` and `down_seconds`: what the reopen took; `gap`: events published while
    no stream was open may have been missed (a subscription that is not durable)."""

    kind: str  # "disconnected" or "reconnected"
    member: Any
    address: str
    error: EchelonError | None = None
    attempts: int = 0
    down_seconds: float = 0.0
    gap: bool = False


Hook = Callable[[ConnectionEvent], "Awaitable[None] | None"]


class Connection:
    def __init__(self, addresses: list[str], transport: Transport, timeout: float, reconnect: Reconnect,
                 on_disconnect: Hook | None = None, on_reconnect: Hook | None = None, compress: bool = False):
        self.addresses = addresses
        self.compress = compress  # streams offer zstd (client/compressed.py)
        self.transport = transport
        self.timeout = timeout
        self.reconnect = reconnect
        self.on_disconnect = on_disconnect
        self.on_reconnect = on_reconnect
        self.state = "open"  # open -> draining -> closed
        self.members: set = set()  # open publishers and subscriptions
        self.shared_stream = None  # the stream the subscriptions share (client/shared.py)
        self.current = 0  # the index of the agent new streams go to first
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._acked: dict[str, OrderedDict] = {}  # durable subscription -> message ids acked (client/durable.py)
        self._seeks: dict[str, str] = {}  # durable subscription -> its seek count when last opened
        self._hooks: set[asyncio.Task] = set()

    def check_open(self) -> None:
        if self.state != "open":
            raise ClientClosed(f"client is {self.state}")

    def channel(self, i: int | None = None) -> grpc.aio.Channel:
        """The channel to agent `i` of the list (modulo its length; None: the current one)."""
        address = self.address(self.current if i is None else i)
        if address not in self._channels:
            self._channels[address] = self.transport.dial(address)
        return self._channels[address]

    def address(self, i: int) -> str:
        return self.addresses[i % len(self.addresses)]

    def failed(self, i: int) -> None:
        """Agent `i` lost a stream: new streams go to the next one. Only if it still is the
        current one, so streams lost together move the client one agent on, not several."""
        if i % len(self.addresses) == self.current:
            self.current = (self.current + 1) % len(self.addresses)

    def track(self, member) -> None:
        self.members.add(member)

    def forget(self, member) -> None:
        self.members.discard(member)

    def acked(self, name: str) -> OrderedDict:
        """The message ids acked through this client under durable subscription `name`."""
        return self._acked.setdefault(name, OrderedDict())

    def seen_seeks(self, name: str, seeks: str) -> None:
        """Forget what was acked under `name` when it was sought since."""
        if self._seeks.get(name, seeks) != seeks:
            self._acked.get(name, OrderedDict()).clear()
        self._seeks[name] = seeks

    def notify(self, event: ConnectionEvent) -> None:
        """Run the hook for `event` (sync or async); an exception in it is logged, not raised."""
        hook = self.on_disconnect if event.kind == "disconnected" else self.on_reconnect
        level = logging.WARNING if event.kind == "disconnected" else logging.INFO
        log.log(level, "%s %s: %s%s", type(event.member).__name__, event.kind, event.address,
                f" ({event.error.code.name}: {event.error.message})" if event.error else
                f" after {event.attempts} attempts, {event.down_seconds:.1f}s" + (", events may have been missed"
                                                                                   if event.gap else ""))
        if hook is None:
            return
        try:
            result = hook(event)
        except Exception:  # noqa: BLE001 - the application's hook must not break the stream
            log.exception("the %s hook failed", event.kind)
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            self._hooks.add(task)
            task.add_done_callback(self._hook_done)

    def _hook_done(self, task: asyncio.Task) -> None:
        self._hooks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a connection hook failed", exc_info=task.exception())

    async def close(self) -> None:
        self.state = "closed"
        await asyncio.gather(*(ch.close() for ch in self._channels.values()), return_exceptions=True)
        self._channels.clear()
        for task in list(self._hooks):
            task.cancel()


class Outage:
    """One lost stream, from the loss to the reopen: attempts and their waits."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.started = time.monotonic()
        self.attempts = 0

    async def next_attempt(self) -> bool:
        """Wait before the next attempt; False once the policy gives up."""
        self.attempts += 1
        if self.conn.reconnect.gives_up(self.attempts):
            return False
        await asyncio.sleep(self.conn.reconnect.wait(self.attempts))
        return True

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started
