"""Watching the membership replicas: a Watch stream on each, every member state change
timed, so a verdict's detection time is measured on every replica."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import grpc

from echelon.runtime.member import membership_channel
from echelon.contract.transport import PLAIN, Transport
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc

DEAD, SUSPECT, ALIVE = mpb.MEMBER_STATE_DEAD, mpb.MEMBER_STATE_SUSPECT, mpb.MEMBER_STATE_ALIVE
STATE = {ALIVE: "alive", SUSPECT: "suspect", DEAD: "dead", mpb.MEMBER_STATE_LEFT: "left"}


@dataclass(frozen=True)
class Change:
    at: float
    replica: int
    member: str
    state: int
    incarnation: int


class Observer:
    """A Watch stream on every replica; every member state change, timed."""

    def __init__(self, replicas: list[str], transport: Transport = PLAIN):
        self.transport = transport  # the cluster's (with its admin token under --auth: Watch is the admin's)
        self.replicas = replicas
        self.changes: list[Change] = []
        self.views: list[dict[str, mpb.Member]] = [{} for _ in replicas]
        self._tasks: list[asyncio.Task] = []
        self._calls: dict[int, grpc.aio.UnaryStreamCall] = {}

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._watch(i)) for i in range(len(self.replicas))]

    async def stop(self, timeout: float = 5.0) -> None:
        """Cancel the calls, then the tasks. A cancelled task alone can wait in grpc's
        read until the next view change, which on a quiet cluster never comes."""
        for call in self._calls.values():
            call.cancel()
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout)

    def _set(self, i: int, members: dict[str, mpb.Member]) -> None:
        now = time.monotonic()
        old = self.views[i]
        for mid, m in members.items():
            o = old.get(mid)
            if o is None or (o.state, o.incarnation) != (m.state, m.incarnation):
                self.changes.append(Change(now, i, mid, m.state, m.incarnation))
        self.views[i] = members

    async def _watch(self, i: int) -> None:
        while True:
            ch = membership_channel(self.replicas[i], self.transport)
            try:
                call = self._calls[i] = mgrpc.MembershipStub(ch).Watch(mpb.WatchRequest(member_id="chaos-observer"))
                while True:
                    u = await asyncio.wait_for(call.read(), 3.0)
                    if u is grpc.aio.EOF:
                        break
                    kind = u.WhichOneof("kind")
                    if kind == "snapshot":
                        self._set(i, {m.id: m for m in u.snapshot.members})
                    elif kind == "delta":
                        members = dict(self.views[i])
                        members.update({m.id: m for m in u.delta.upserted})
                        for mid in u.delta.removed:
                            members.pop(mid, None)
                        self._set(i, members)
            except (grpc.aio.AioRpcError, asyncio.TimeoutError):
                pass
            finally:
                await ch.close()
            await asyncio.sleep(0.3)

    def first(self, member: str, state: int, after: float, before: float = float("inf")) -> dict[int, float]:
        """Replica -> the first time after `after` it held `member` in `state`."""
        out: dict[int, float] = {}
        for c in self.changes:
            if c.member == member and c.state == state and after <= c.at < before and c.replica not in out:
                out[c.replica] = c.at
        return out

    def all_alive(self, i: int, members: list[str]) -> bool:
        v = self.views[i]
        return all(m in v and v[m].state == ALIVE for m in members)
