"""Matcher to matcher: what the matchers of a tier tell each other (layout statuses,
copies, drops, zone matches), the transport interface the protocol (tier.py) uses, and
its gRPC implementation.

Zone matches travel on one long-lived `Match` stream per peer in holder mode
(MatchRequest.layout set), not as unary calls: on this machine a unary call costs the
entry several times a stream message (call object, deadline, HTTP/2 stream opened and
closed each time: `UnaryUnaryCall._invoke` was the entry's largest cost at 1,000 events/s).
A peer answers a stream's requests in order, so replies are matched to requests
first in, first out; a layout the peer does not hold comes back as `stale` on a live
stream. A broken stream fails every request waiting on it (PeerUnavailable) and the
next request opens a new one."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import AbstractSet, Callable, Mapping, Protocol, Sequence

import grpc

from echelon.core.can import Zone
from echelon.contract.schema import Schema
from echelon.matcher.layout import Copy
from echelon.runtime.member import MemberClient
from echelon.contract.transport import RECONNECT_OPTIONS
from echelon.contract.wire import attributes_into_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import matcher_pb2_grpc as xgrpc

TIMEOUTS = {"Store": 30.0, "Drop": 5.0, "Match": 5.0, "Sync": 2.0, "Holdings": 5.0, "Revoke": 5.0}

Matches = dict[str, str]  # the matching subscriptions of one event -> their agents
Agents = AbstractSet[str]  # the agents of one event's matching subscriptions (agents_only)
ZoneRef = tuple[str, str, str]  # (topic, layout key, zone): a zone promised empty (empty.py)


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
    """The layout a holder-mode Match request names is not held here (retired, or from an earlier lifetime)."""


@dataclass(frozen=True)
class Status:
    """One topic's layout state at one matcher (the Sync message)."""

    adopted: str
    pushed: bool
    filled: bool
    active: str
    complete: bool = False  # holds every subscription its layouts give it (refill.py)


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
                          zones: dict[str, list[int]], agents_only: bool = False,
                          wire: Sequence[pb.Event] | None = None) -> list[Matches] | list[Agents]:
        """Per event, its matches in the named zones at `peer` (the agents only if asked);
        `wire`: the same events as received (copied, not re-encoded); StaleLayout if the
        peer does not hold the layout."""

    async def sync(self, peer: str, seq: int, status: dict[str, Status]) -> tuple[float, list[ZoneRef]] | None:
        """This matcher's status to `peer`; the answer: (lease in seconds, zones `peer`
        promises empty to this matcher)."""

    async def revoke(self, peer: str, zones: list[ZoneRef]) -> None: ...


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
        self.stubs: dict[str, xgrpc.MatcherStub] = {}  # by address: a stub builds every method's callable
        self.streams: dict[str, ZoneStream] = {}
        self._reported: dict[str, float] = {}

    def _stub(self, peer: str) -> tuple[xgrpc.MatcherStub, str]:
        member = self.membership()
        m = member.members.get(peer) if member else None
        if m is None or not m.address:
            raise PeerUnavailable(peer, "(not in the view)")
        stub = self.stubs.get(m.address)
        if stub is None:  # reconnect fast: a restarted matcher comes back on its address
            ch = self.channels[m.address] = member.transport.dial(m.address, RECONNECT_OPTIONS)
            stub = self.stubs[m.address] = xgrpc.MatcherStub(ch)
        return stub, m.address

    async def _call(self, peer: str, method: str, request):
        stub, _ = self._stub(peer)
        try:
            return await getattr(stub, method)(request, timeout=TIMEOUTS[method])
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                raise StaleLayout(e.details()) from None
            raise self._failed(peer, method, e) from None

    def _failed(self, peer: str, method: str, e: grpc.aio.AioRpcError) -> PeerUnavailable:
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            self._report(peer, f"{method}: {e.code().name}")
        return PeerUnavailable(peer, f"({method}: {e.code().name} {e.details()})")

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
                          zones: dict[str, list[int]], agents_only: bool = False,
                          wire: Sequence[pb.Event] | None = None) -> list[Matches] | list[Agents]:
        req = xpb.MatchRequest(topic=topic, layout=layout, agents_only=agents_only,
                               zones=[xpb.ZoneEvents(zone=z, events=idxs) for z, idxs in zones.items()])
        add = req.events.add
        if wire is not None:
            for e in wire:  # as received: a copy in C, not a re-encoding (nor a map merge, costlier still)
                add().CopyFrom(e)
        else:
            for e in events:
                attributes_into_pb(e, add().attributes)
        stub, address = self._stub(peer)
        stream = self.streams.get(peer)
        if stream is None or stream.address != address or stream.broken:
            if stream is not None:
                stream.close()
            stream = self.streams[peer] = ZoneStream(peer, stub, address)
        try:
            r = await stream.ask(req, TIMEOUTS["Match"])
        except grpc.aio.AioRpcError as e:
            raise self._failed(peer, "Match", e) from None
        except TimeoutError:
            raise PeerUnavailable(peer, "(Match: no answer in time)") from None
        if r.stale:
            raise StaleLayout(r.stale)
        if len(r.results) != len(events):
            raise PeerUnavailable(peer, f"(Match: {len(r.results)} results for {len(events)} events)")
        if agents_only:
            return [{a.agent for a in m.agents} for m in r.results]
        return [{s: a.agent for a in m.agents for s in a.subscriptions} for m in r.results]

    async def sync(self, peer: str, seq: int, status: dict[str, Status]) -> tuple[float, list[ZoneRef]]:
        req = xpb.SyncRequest(member=self.me, incarnation=self.incarnation(), seq=seq,
                              layouts=[xpb.LayoutStatus(topic=t, adopted=s.adopted, pushed=s.pushed, filled=s.filled,
                                                        active=s.active, complete=s.complete)
                                       for t, s in status.items()])
        r = await self._call(peer, "Sync", req)
        return r.lease_ms / 1000, [(z.topic, z.layout, z.zone) for z in r.empty]

    async def revoke(self, peer: str, zones: list[ZoneRef]) -> None:
        await self._call(peer, "Revoke", xpb.RevokeRequest(
            sender=self.me, zones=[xpb.ZoneRef(topic=t, layout=k, zone=z) for t, k, z in zones]))

    async def holdings(self, peer: str, agent: str) -> list[tuple[str, int]]:
        r = await self._call(peer, "Holdings", xpb.HoldingsRequest(agent=agent))
        return [(h.id, h.version) for h in r.holdings]

    async def close(self) -> None:
        for stream in self.streams.values():
            stream.close()
        await asyncio.gather(*(ch.close() for ch in self.channels.values()), return_exceptions=True)


class ZoneStream:
    """One long-lived holder-mode Match stream to a peer: requests written in order, each
    answered by the next reply (the peer answers in order)."""

    def __init__(self, peer: str, stub: xgrpc.MatcherStub, address: str):
        self.peer, self.address = peer, address
        self.call = stub.Match()
        self.waiting: deque[asyncio.Future] = deque()
        self.broken = False
        self._lock = asyncio.Lock()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def ask(self, request: xpb.MatchRequest, timeout: float) -> xpb.MatchResponse:
        future = asyncio.get_running_loop().create_future()
        async with self._lock:  # one write at a time, futures queued in the order written
            if self.broken:
                raise PeerUnavailable(self.peer, "(Match stream closed)")
            self.waiting.append(future)
            try:
                await self.call.write(request)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as e:
                self._fail(e)
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            self.close()  # a hung peer: the next request starts afresh (and waits again)
            raise

    async def _read(self) -> None:
        error: BaseException | None = None
        try:
            while True:
                r = await self.call.read()
                if r is grpc.aio.EOF or not self.waiting:  # ended, or a reply nobody asked for
                    break
                future = self.waiting.popleft()
                if not future.done():
                    future.set_result(r)
        except asyncio.CancelledError:
            pass
        except Exception as e:  # noqa: BLE001 - whatever broke the stream fails its requests
            error = e
        self._fail(error)

    def _fail(self, error: BaseException | None) -> None:
        self.broken = True
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(error if isinstance(error, grpc.aio.AioRpcError)
                                     else PeerUnavailable(self.peer, "(Match stream closed)"))

    def close(self) -> None:
        self._fail(None)
        self.call.cancel()
        self._reader.cancel()
