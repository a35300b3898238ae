"""Replica to replica: best-effort pushes of every accepted write, and anti-entropy.

Rules in core/replication.py: a write accepted here is pushed to every peer at once
(fire and forget); every `interval` seconds each peer's digest is compared with ours
and, on a mismatch, the peer's full state (topics with tombstones, one plan) is pulled
and merged. Both sides pull, so a pair converges within one round after any loss. A
replica that starts pulls from every peer it can reach before it serves topics, plans
or views (`ready`), so a restart does not hide the cluster's topics for a moment.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from echelon.core.replication import Entry
from echelon.membership.replica import Replica
from echelon.membership.wire import state_from_pb, state_to_pb
from echelon.runtime.member import membership_channel
from echelon.contract.transport import PLAIN, Transport
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc

log = logging.getLogger("echelon.membership.sync")

RPC_TIMEOUT = 1.0


class Peers:
    """The other replicas, by address (this replica's own address is recognised and dropped)."""

    def __init__(self, replica: Replica, addresses: list[str], registry: CollectorRegistry,
                 interval: float = 2.0, transport: Transport = PLAIN):
        self.replica = replica
        self.transport = transport
        self.interval = interval
        self.ready = asyncio.Event()
        self._addresses = list(dict.fromkeys(addresses))
        self._stubs: dict[str, mgrpc.ReplicationStub] = {}
        self._channels: list[grpc.aio.Channel] = []
        self._reachable: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        self._loop: asyncio.Task | None = None
        self.syncs = Counter("echelon_membership_replica_syncs_total",
                             "Anti-entropy rounds with a peer, by result (equal, pulled, failed).",
                             ["result"], registry=registry)
        self.pushes = Counter("echelon_membership_replica_pushes_total",
                              "Writes pushed to peers, by result (ok, failed).", ["result"], registry=registry)
        Gauge("echelon_membership_replica_peers_reachable", "Peer replicas that answered the last round.",
              registry=registry).set_function(lambda: len(self._reachable))

    async def start(self, own_address: str) -> None:
        """Drop our own address, pull from every reachable peer, then sync periodically."""
        for address in self._addresses:
            if address != own_address:
                ch = membership_channel(address, self.transport)
                self._channels.append(ch)
                self._stubs[address] = mgrpc.ReplicationStub(ch)
        await asyncio.gather(*(self._sync(a) for a in list(self._stubs)))
        self.ready.set()
        self._loop = asyncio.create_task(self._sync_loop(), name="replica-sync")

    async def stop(self) -> None:
        tasks = [t for t in (self._loop, *self._tasks) if t]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(ch.close() for ch in self._channels), return_exceptions=True)

    def push(self, topics: Mapping[str, Entry] | None = None, plan: Entry | None = None,
             acls: Mapping[str, Entry] | None = None) -> None:
        """Send entries just written here to every peer, without waiting."""
        state = state_to_pb(self.replica.origin, topics or {}, plan, acls)
        for address, stub in self._stubs.items():
            task = asyncio.create_task(self._push(address, stub, state))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _push(self, address: str, stub: mgrpc.ReplicationStub, state: mpb.ReplicaState) -> None:
        try:
            await stub.Push(state, timeout=RPC_TIMEOUT)
            self.pushes.labels("ok").inc()
        except grpc.aio.AioRpcError as e:
            self.pushes.labels("failed").inc()  # anti-entropy repairs it
            log.debug("push to %s failed: %s", address, e.code().name)

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await asyncio.gather(*(self._sync(a) for a in list(self._stubs)))

    async def _sync(self, address: str) -> None:
        stub = self._stubs[address]
        origin = self.replica.origin
        try:
            d = await stub.Digest(mpb.DigestRequest(origin=origin), timeout=RPC_TIMEOUT)
            if d.origin == origin:  # our own address under another name
                del self._stubs[address]
                return
            self._reachable.add(address)
            if (d.topics, d.plan, d.acls) == self.replica.digest():
                self.syncs.labels("equal").inc()
                return
            state = await stub.Pull(mpb.PullRequest(origin=origin), timeout=RPC_TIMEOUT)
        except grpc.aio.AioRpcError as e:
            self._reachable.discard(address)
            self.syncs.labels("failed").inc()
            log.debug("sync with %s failed: %s", address, e.code().name)
            return
        self.replica.merge_state(*state_from_pb(state))
        self.syncs.labels("pulled").inc()
