"""Matcher to matcher: what the matchers of a tier tell each other (layout statuses,
copies, drops, zone matches), the transport interface the protocol (tier.py) uses, and
its gRPC implementation."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

import grpc

from echelon.core.can import Zone
from echelon.core.schema import Schema
from echelon.matcher.layout import Copy
from echelon.runtime.member import MemberClient
from echelon.runtime.transport import RECONNECT_OPTIONS
from echelon.runtime.wire import attributes_into_pb
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import matcher_pb2_grpc as xgrpc

TIMEOUTS = {"Store": 30.0, "Drop": 5.0, "MatchZones": 5.0, "Sync": 2.0, "Holdings": 5.0}

Matches = dict[str, str]  # the matching subscriptions of one event -> their agents


async def wait(event: asyncio.Event, timeout: float) -> None:
    """Wait for `event` at most `timeout` seconds. (asyncio.wait_for in 3.11 may swallow a
    cancellation that arrives as the event fires; asyncio.timeout does not.)"""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        pass


class PeerUnavailable(Exception):
    def __init__(self, peer: str, reason: str = ""):
        super().__init__(f"matcher {peer} unavailable {reason}".strip())
        self.peer = peer


class StaleLayout(Exception):
    """The layout a MatchZones call names is not held here (retired, or from an earlier lifetime)."""


@dataclass(frozen=True)
class Status:
    """One topic's layout state at one matcher (the Sync message)."""

    adopted: str
    pushed: bool
    filled: bool
    active: str


@dataclass(frozen=True)
class TierView:
    """What the layouts are computed from: the alive matchers, the topics, the plan."""

    matchers: Mapping[str, int]  # alive matcher id -> process lifetime (runtime.member.lifetime)
    topics: Mapping[str, Schema]
    plan_zones: Mapping[str, Sequence[Zone]] = field(default_factory=dict)
    plan_version: int = 0


class Transport(Protocol):
    """Matcher-to-matcher calls; raise PeerUnavailable when the peer cannot be reached."""

    async def store(self, peer: str, topic: str, layouts: list[str], copies: list[Copy]) -> None: ...

    async def drop(self, peer: str, items: list[tuple[str, int]], sent_to: list[str]) -> list[str]: ...

    async def match_zones(self, peer: str, topic: str, layout: str, events: list[Mapping[str, object]],
                          zones: dict[str, list[int]]) -> list[Matches]: ...

    async def sync(self, peer: str, seq: int, status: dict[str, Status]) -> None: ...


class GrpcTransport:
    """Transport over gRPC; every failure but FAILED_PRECONDITION is PeerUnavailable.
    Peers' addresses come from the membership view. A peer whose connection fails
    (UNAVAILABLE) is reported to membership as evidence for the failure detector, which
    takes evidence to mean a broken stream (core.detector). A call that only missed its
    deadline is not reported: on a busy machine a live matcher answers late (a Sync
    behind a handoff of tens of thousands of copies), and suspecting it makes it refute;
    a hung process stops beating too, and the detector's silence rule finds it."""

    def __init__(self, me: str, membership: Callable[[], MemberClient | None], incarnation: Callable[[], int]):
        self.me, self.membership, self.incarnation = me, membership, incarnation
        self.channels: dict[str, grpc.aio.Channel] = {}
        self._reported: dict[str, float] = {}

    async def _call(self, peer: str, method: str, request):
        member = self.membership()
        m = member.members.get(peer) if member else None
        if m is None or not m.address:
            raise PeerUnavailable(peer, "(not in the view)")
        ch = self.channels.get(m.address)
        if ch is None:  # reconnect fast: a restarted matcher comes back on its address
            ch = self.channels[m.address] = member.transport.dial(m.address, RECONNECT_OPTIONS)
        try:
            return await getattr(xgrpc.MatcherStub(ch), method)(request, timeout=TIMEOUTS[method])
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise StaleLayout(e.details()) from None
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                self._report(peer, f"{method}: {e.code().name}")
            raise PeerUnavailable(peer, f"({method}: {e.code().name} {e.details()})") from None

    def _report(self, peer: str, reason: str) -> None:
        """Evidence for the failure detector, at most once a second per peer."""
        now = time.monotonic()
        member = self.membership()
        if now - self._reported.get(peer, 0.0) > 1.0 and member:
            self._reported[peer] = now
            asyncio.get_running_loop().create_task(member.report(peer, reason))

    async def store(self, peer: str, topic: str, layouts: list[str], copies: list[Copy]) -> None:
        await self._call(peer, "Store", xpb.StoreRequest(sender=self.me, topic=topic, layouts=layouts,
                                                         subscriptions=[c.wire for c in copies]))

    async def drop(self, peer: str, items: list[tuple[str, int]], sent_to: list[str]) -> list[str]:
        r = await self._call(peer, "Drop", xpb.DropRequest(sender=self.me, ids=[i for i, _ in items],
                                                           versions=[v for _, v in items], sent_to=sent_to))
        return list(r.removed)

    async def match_zones(self, peer: str, topic: str, layout: str, events: list[Mapping[str, object]],
                          zones: dict[str, list[int]]) -> list[Matches]:
        req = xpb.MatchZonesRequest(topic=topic, layout=layout,
                                    zones=[xpb.ZoneEvents(zone=z, events=idxs) for z, idxs in zones.items()])
        for e in events:
            attributes_into_pb(e, req.events.add().attributes)
        r = await self._call(peer, "MatchZones", req)
        return [dict(zip(m.subscriptions, m.agents)) for m in r.results]

    async def sync(self, peer: str, seq: int, status: dict[str, Status]) -> None:
        req = xpb.SyncRequest(member=self.me, incarnation=self.incarnation(), seq=seq,
                              layouts=[xpb.LayoutStatus(topic=t, adopted=s.adopted, pushed=s.pushed, filled=s.filled,
                                                        active=s.active) for t, s in status.items()])
        await self._call(peer, "Sync", req)

    async def holdings(self, peer: str, agent: str) -> list[tuple[str, int]]:
        r = await self._call(peer, "Holdings", xpb.HoldingsRequest(agent=agent))
        return [(h.id, h.version) for h in r.holdings]

    async def close(self) -> None:
        await asyncio.gather(*(ch.close() for ch in self.channels.values()), return_exceptions=True)
