"""The member side of membership, shared by agents, matchers and routers.

A member joins every membership replica and heartbeats to each of them: every replica
judges liveness from the beats it sees itself, so losing one replica changes nothing
for the others. The view is watched from one replica at a time and fails over to the
next when its stream breaks; if none answers, the member goes on with its last view
(`view_age()` grows, and the services export it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

import grpc

from echelon.runtime.server import channel
from echelon.v1 import common_pb2 as pb
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc

log = logging.getLogger("echelon.member")

ALIVE = mpb.MEMBER_STATE_ALIVE


class MemberClient:
    def __init__(self, member: mpb.Member, replicas: list[str], beat_interval: float = 0.2):
        if not replicas:
            raise ValueError("at least one membership address is needed")
        self.member = mpb.Member()
        self.member.CopyFrom(member)
        if not self.member.incarnation:
            # Wall-clock milliseconds: a restarted process always comes back higher.
            self.member.incarnation = int(time.time() * 1000)
        self.member.state = ALIVE
        self.replicas = list(replicas)
        self.beat_interval = beat_interval
        self.version = 0
        self.members: dict[str, mpb.Member] = {}
        self.topics: dict[str, pb.Topic] = {}
        self.watching: str | None = None
        self._last_view = 0.0
        self._listeners: list[Callable[[], None]] = []
        self._tasks: list[asyncio.Task] = []
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._topics_dirty = True
        self._has_view = asyncio.Event()

    @property
    def id(self) -> str:
        return self.member.id

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call `callback()` after every view change (snapshot or delta applied)."""
        self._listeners.append(callback)

    def alive(self, role: int) -> list[mpb.Member]:
        """Members of `role` that the view holds ALIVE or SUSPECT (suspects still get traffic)."""
        return sorted((m for m in self.members.values() if m.role == role and
                       m.state in (mpb.MEMBER_STATE_ALIVE, mpb.MEMBER_STATE_SUSPECT)), key=lambda m: m.id)

    def view_age(self) -> float:
        return time.monotonic() - self._last_view if self._last_view else float("inf")

    def set_topics(self, publishes: set[str], subscribes: set[str]) -> None:
        """The LBDD peer table entry; sent with the next beat."""
        if set(self.member.publishes) == publishes and set(self.member.subscribes) == subscribes:
            return
        del self.member.publishes[:], self.member.subscribes[:]
        self.member.publishes.extend(sorted(publishes))
        self.member.subscribes.extend(sorted(subscribes))
        self._topics_dirty = True

    async def start(self, timeout: float = 30.0) -> None:
        """Join and wait for the first view; raises TimeoutError if no replica answers."""
        for address in self.replicas:
            self._channels[address] = channel(address)
            self._tasks.append(asyncio.create_task(self._beat_loop(address), name=f"beat-{address}"))
        self._tasks.append(asyncio.create_task(self._watch_loop(), name="watch"))
        await asyncio.wait_for(self._has_view.wait(), timeout)

    async def stop(self, leave: bool = True) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if leave:
            req = mpb.LeaveRequest(member_id=self.id, incarnation=self.member.incarnation)
            await asyncio.gather(*(mgrpc.MembershipStub(ch).Leave(req, timeout=1.0)
                                   for ch in self._channels.values()), return_exceptions=True)
        await asyncio.gather(*(ch.close() for ch in self._channels.values()), return_exceptions=True)

    async def report(self, member_id: str, reason: str) -> None:
        """Evidence from the data plane: a peer's stream broke."""
        target = self.members.get(member_id)
        req = mpb.SuspectRequest(reporter=self.id, member_id=member_id, reason=reason,
                                 incarnation=target.incarnation if target else 0)
        await asyncio.gather(*(mgrpc.MembershipStub(ch).Suspect(req, timeout=1.0)
                               for ch in self._channels.values()), return_exceptions=True)

    async def _beat_loop(self, address: str) -> None:
        stub = mgrpc.MembershipStub(self._channels[address])
        backoff = self.beat_interval
        while True:
            try:
                await stub.Join(mpb.JoinRequest(member=self.member), timeout=2.0)
                sent_topics = False

                async def beats():
                    nonlocal sent_topics
                    while True:
                        beat = mpb.Beat(member_id=self.id, incarnation=self.member.incarnation)
                        if self._topics_dirty or not sent_topics:
                            beat.has_topics = True
                            beat.publishes.extend(self.member.publishes)
                            beat.subscribes.extend(self.member.subscribes)
                            sent_topics = True
                        yield beat
                        await asyncio.sleep(self.beat_interval)

                call = stub.Heartbeat(beats())
                backoff = self.beat_interval
                async for reply in call:
                    self._topics_dirty = False
                    if reply.state == mpb.MEMBER_STATE_SUSPECT and reply.incarnation >= self.member.incarnation:
                        # Refute: a higher incarnation than the one suspected.
                        self.member.incarnation = reply.incarnation + 1
                    elif reply.state in (mpb.MEMBER_STATE_DEAD, mpb.MEMBER_STATE_LEFT):
                        log.warning("declared %s by %s: rejoining", mpb.MemberState.Name(reply.state), address)
                        self.member.incarnation = max(self.member.incarnation, reply.incarnation) + 1
                        break
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as e:
                log.debug("membership %s: %s", address, e.code().name)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _watch_loop(self) -> None:
        i = 0
        while True:
            address = self.replicas[i % len(self.replicas)]
            try:
                await self._watch(address)
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as e:
                log.info("view stream from %s broke (%s): failing over", address, e.code().name)
            i += 1
            await asyncio.sleep(0.1 if i % len(self.replicas) else 0.5)

    async def _watch(self, address: str) -> None:
        stub = mgrpc.MembershipStub(self._channels[address])
        # Versions are per replica: after a failover, ask for a snapshot.
        known = self.version if address == self.watching else 0
        self.watching = address
        async for update in stub.Watch(mpb.WatchRequest(member_id=self.id, known_version=known)):
            if update.HasField("snapshot"):
                snap = update.snapshot
                self.members = {m.id: m for m in snap.members}
                self.topics = {t.name: t for t in snap.topics}
                self.version = snap.version
            else:
                d = update.delta
                if d.from_version != self.version:
                    self.version = 0
                    return  # a gap: reconnect for a snapshot
                for m in d.upserted:
                    self.members[m.id] = m
                for t in d.topics_upserted:
                    self.topics[t.name] = t
                for name in d.topics_deleted:
                    self.topics.pop(name, None)
                self.version = d.version
            self._last_view = time.monotonic()
            self._has_view.set()
            for callback in self._listeners:
                callback()
