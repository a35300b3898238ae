"""Acks of a durable subscription, from the holder serving it to the other holders
(durables.py): logged there first, then sent on in order, batched, within milliseconds.

A holder that does not take them (unreachable: partitioned, paused, dead) gets them
again every second while it is in the view, oldest first, so its copy does not keep
what was acked while it was away (the retry is bounded: past RETRY_KEYS the oldest are
dropped and counted; a holder that restarted takes an older holder's whole copy anyway).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

from echelon.agent.durable.subscription import crash_point
from echelon.agent.durable.store import Key
from echelon.v1 import common_pb2 as pb
from echelon.v1 import durable_pb2 as dpb

if TYPE_CHECKING:
    from echelon.agent.durable.durables import Durables

log = logging.getLogger("echelon.agent.durable.durables")

BATCH = 2000  # message ids per Apply
GATHER = 0.005  # seconds acks gather before they go (one Apply for many, not one per ack)
RETRY_KEYS = 1_000_000  # acks waiting for unreachable holders, in all


class AckReplicator:
    def __init__(self, durables: Durables):
        self.d = durables
        self._outbox: dict[str, list[Key]] = {}
        self._retry: OrderedDict[tuple[str, str], list[Key]] = OrderedDict()  # (agent, name) -> acks
        self._wake = asyncio.Event()

    def add(self, name: str, keys: list[Key]) -> None:
        self._outbox.setdefault(name, []).extend(keys)
        self._wake.set()

    def forget(self, name: str) -> None:
        self._outbox.pop(name, None)
        for k in [k for k in self._retry if k[1] == name]:
            del self._retry[k]

    @property
    def waiting(self) -> int:
        return sum(len(v) for v in self._retry.values())

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(GATHER)
            self._wake.clear()
            outbox, self._outbox = self._outbox, {}
            sends = []
            for name, keys in outbox.items():
                sub = self.d.subs.get(name)
                if sub is not None:
                    sends += [self._send(h, name, keys) for h in sub.holders if h != self.d.me]
            await asyncio.gather(*sends)
            crash_point("ack-replicated")

    async def retry(self) -> None:
        """Acks a holder did not take, again (the housekeeping's second)."""
        members = self.d.host.membership.members
        pending, self._retry = self._retry, OrderedDict()
        sends = []
        for (agent, name), keys in pending.items():
            if agent in members and name in self.d.subs:  # gone from the view: it syncs when it joins again
                sends.append(self._send(agent, name, keys))
        await asyncio.gather(*sends)

    async def _send(self, agent: str, name: str, keys: list[Key]) -> None:
        for i in range(0, len(keys), BATCH):
            chunk = keys[i:i + BATCH]
            change = dpb.DurableChange(name=name, acks=dpb.DurableAcks(
                ids=[pb.MessageId(producer_id=p, sequence=s) for p, s in chunk]))
            if agent not in self.d.peers.alive() or not await self.d.peers.tell_one(agent, change):
                self._retry.setdefault((agent, name), []).extend(keys[i:])
                self._bound()
                return

    def _bound(self) -> None:
        excess = self.waiting - RETRY_KEYS
        while excess > 0 and self._retry:
            key, keys = next(iter(self._retry.items()))
            drop = min(excess, len(keys))
            del keys[:drop]
            excess -= drop
            self.d.replication_failures.inc(drop)
            if not keys:
                del self._retry[key]
        if excess < 0:
            return
        log.warning("durable acks waiting for unreachable holders passed %d: the oldest were dropped "
                    "(those holders redeliver them if they serve)", RETRY_KEYS)
