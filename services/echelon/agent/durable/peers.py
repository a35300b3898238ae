"""The other agents, as a holder of durable subscriptions sees them (durables.py): which are
alive, which serves a subscription, a stub per process lifetime of each, finding a
subscription's record in the view, and telling co-holders of a change."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import grpc

from echelon.agent.durable.copies import CALL_TIMEOUT
from echelon.contract.errors import Unavailable
from echelon.runtime.member import lifetime
from echelon.contract.transport import RECONNECT_OPTIONS
from echelon.v1 import durable_pb2 as dpb
from echelon.v1 import durable_pb2_grpc as dgrpc
from echelon.v1 import membership_pb2 as mpb

if TYPE_CHECKING:
    from echelon.agent.durable.durables import Durables

log = logging.getLogger("echelon.agent.durable.durables")

# An agent seen alive this recently and not alive now may hold a subscription that nobody
# alive does: a crashed holder comes back with its disk, and a view rebuilt by restarted
# membership replicas lists the members again only as they beat. Until then a subscription
# is not created anew under its name (`locate`): that would set an empty copy beside theirs.
RECENT_SECONDS = 120.0


class Peers:
    def __init__(self, d: Durables):
        self.d = d
        self._channels: dict[tuple[str, int], grpc.aio.Channel] = {}  # (address, lifetime) -> channel
        self._seen: dict[str, float] = {}  # agent -> when last seen alive (monotonic)

    def alive(self) -> dict[str, mpb.Member]:
        alive = {m.id: m for m in self.d.host.membership.alive(mpb.ROLE_AGENT)}
        now = time.monotonic()
        for agent in alive:  # durables' maintenance reads this every second
            self._seen[agent] = now
        return alive

    def missing(self) -> list[str]:
        """Agents alive within RECENT_SECONDS and not now, except those that LEFT (they
        handed over: docs/guarantees.md, "Durable subscriptions")."""
        now, alive = time.monotonic(), self.alive()
        members = self.d.host.membership.members
        gone = [a for a, t in self._seen.items() if now - t > RECENT_SECONDS]
        for a in gone:
            del self._seen[a]
        return sorted(a for a in self._seen if a not in alive and a != self.d.me
                      and getattr(members.get(a), "state", None) != mpb.MEMBER_STATE_LEFT)

    def serving(self, record: dpb.DurableSubscription) -> str:
        """The first alive holder."""
        alive = self.alive()
        for h in record.holders:
            if h == self.d.me or h in alive:
                return h
        raise Unavailable(f"no holder of durable subscription {record.name!r} is alive "
                          f"({', '.join(record.holders)})")

    def stub(self, agent: str) -> dgrpc.DurableStub:
        """A stub on a channel per process lifetime of `agent`: a restarted holder is reached
        at once, not after the old channel's reconnect backoff (gRPC's grows to 120 s)."""
        member = self.alive().get(agent)
        if member is None:
            raise Unavailable(f"agent {agent} is not alive")
        key = (member.address, lifetime(member.incarnation))
        ch = self._channels.get(key)
        if ch is None:
            for old in [k for k in self._channels if k[0] == member.address]:
                asyncio.create_task(self._channels.pop(old).close())
            ch = self._channels[key] = self.d.transport.dial(member.address, RECONNECT_OPTIONS)
        return dgrpc.DurableStub(ch)

    def dial(self, agent: str) -> grpc.aio.Channel:
        """A channel of its own to `agent` (a relayed subscriber stream; closed with it)."""
        return self.d.transport.dial(self.alive()[agent].address)

    async def locate(self, name: str) -> dpb.DurableSubscription | None:
        """The record, from here or from any agent of the view that holds it; None only when
        every agent answered that it holds none and none is `missing` (Unavailable
        otherwise: creating it then could make a second one beside copies that did not answer)."""
        if name in self.d.subs:
            return self.d.subs[name].record
        others = [a for a in self.alive() if a != self.d.me]
        silent = []

        async def ask(agent: str):
            try:
                return await self.stub(agent).GetSubscription(dpb.GetSubscriptionRequest(name=name, local=True),
                                                              timeout=CALL_TIMEOUT)
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.NOT_FOUND:
                    silent.append(agent)
            except Unavailable:
                silent.append(agent)
        for found in await asyncio.gather(*(ask(a) for a in others)):
            if found is not None:
                return found
        if silent:
            raise Unavailable(f"durable subscription {name!r}: agents {', '.join(sorted(silent))} did not answer "
                              f"whether they hold it; try again")
        missing = self.missing()
        if missing:
            raise Unavailable(f"durable subscription {name!r}: agents {', '.join(missing)} were alive moments ago "
                              f"and are not in the view now: they may hold it; try again")
        return None

    async def tell(self, agents: list[str], change: dpb.DurableChange) -> None:
        await asyncio.gather(*(self.tell_one(a, change) for a in agents))

    async def tell_one(self, agent: str, change: dpb.DurableChange) -> bool:
        """One change to one agent; False (counted) if it did not take it."""
        try:
            await self.stub(agent).Apply(change, timeout=CALL_TIMEOUT)
            return True
        except (grpc.aio.AioRpcError, Unavailable) as e:
            self.d.replication_failures.inc()
            log.info("durable %s: %s did not take a change: %s", change.name, agent, e)
            return False
