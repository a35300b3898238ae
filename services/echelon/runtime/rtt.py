"""Round-trip latency to the other members, for Kyra's cliques (Cao and Singh, III.A: HAC
over the latency matrix). Exported as `echelon_peer_rtt_seconds{peer}`.

Every PROBE_SECONDS a node calls the standard gRPC health `Check` of each alive member
(any role but membership) over one cached channel per peer and records the smoothed
round trip (EWMA, alpha 0.3). Heartbeats go to membership, not to peers, and relay acks
exist only between agents that carry traffic, so neither gives a full matrix; a health
check is what every server already answers. At most MAX_PEERS peers are probed (the
lowest crc32 of "self/peer"), which bounds the label set; a peer that leaves the view is
dropped from the metric. A failed probe records nothing (the detector judges liveness).
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import Gauge

from echelon.v1 import membership_pb2 as mpb

log = logging.getLogger("echelon.rtt")

PROBE_SECONDS = 5.0
MAX_PEERS = 64
ALPHA = 0.3


class RttProber:
    def __init__(self, me: str, member, registry):
        self.me, self.member = me, member
        self.rtt: dict[str, float] = {}
        self.gauge = Gauge("echelon_peer_rtt_seconds", "Smoothed round trip of a health check to a peer.",
                           ["peer"], registry=registry)
        self._channels: dict[str, tuple[str, grpc.aio.Channel]] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="rtt")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.gather(*(ch.close() for _, ch in self._channels.values()), return_exceptions=True)
        self._channels.clear()

    def peers(self) -> dict[str, str]:
        """id -> address of the members to probe."""
        members = [m for m in self.member.members.values()
                   if m.id != self.me and m.role != mpb.ROLE_MEMBERSHIP
                   and m.state in (mpb.MEMBER_STATE_ALIVE, mpb.MEMBER_STATE_SUSPECT)]
        members.sort(key=lambda m: (zlib.crc32(f"{self.me}/{m.id}".encode()), m.id))
        return {m.id: m.address for m in members[:MAX_PEERS]}

    async def probe_once(self) -> None:
        peers = self.peers()
        for gone in set(self._channels) - set(peers):
            await self._channels.pop(gone)[1].close()
        for gone in set(self.rtt) - set(peers):
            del self.rtt[gone]
            self.gauge.remove(gone)
        await asyncio.gather(*(self._probe(p, a) for p, a in peers.items()))

    async def _probe(self, peer: str, address: str) -> None:
        cached = self._channels.get(peer)
        if cached is None or cached[0] != address:
            if cached:
                await cached[1].close()
            cached = self._channels[peer] = (address, self.member.transport.dial(address))
        start = time.perf_counter()
        try:
            await health_pb2_grpc.HealthStub(cached[1]).Check(health_pb2.HealthCheckRequest(), timeout=2.0)
        except grpc.aio.AioRpcError:
            return
        seconds = time.perf_counter() - start
        old = self.rtt.get(peer)
        self.rtt[peer] = seconds if old is None else old + ALPHA * (seconds - old)
        self.gauge.labels(peer).set(self.rtt[peer])

    async def _loop(self) -> None:
        await asyncio.sleep(1.0)
        while True:
            try:
                await self.probe_once()
            except Exception:  # a probe round must never end the loop
                log.exception("rtt probe round failed")
            await asyncio.sleep(PROBE_SECONDS)
