"""The gRPC face of durable subscriptions (durables.py): the `Durable` service, which any
agent answers for the whole cluster (`local` requests only from its own copies), and the
relay of a subscriber's stream to the holder that serves it.

Cluster-wide answers: list asks every alive agent for its copies and keeps, per name,
the serving holder's (the one whose backlog the subscriber drains); get and seek go to
the serving holder (seek to every alive holder: each moves its own copy, by time or by
message id, which name the same point in every holder's log).
"""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

import grpc

from echelon.agent.durable.durables import Durables, check_name
from echelon.agent.durable.copies import CALL_TIMEOUT
from echelon.agent.ownership import may_use, owner_of, scoped
from echelon.contract.errors import NotFound, Unavailable, from_rpc_error
from echelon.contract.transport import require_member
from echelon.v1 import durable_pb2 as dpb
from echelon.v1 import durable_pb2_grpc as dgrpc
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc

SERVICE = dpb.DESCRIPTOR.services_by_name["Durable"].full_name
log = logging.getLogger("echelon.agent.durable.durables")


class DurableServicer(dgrpc.DurableServicer):
    def __init__(self, durables):
        self._durables = durables  # a callable: the node's Durables, once started

    @property
    def d(self) -> Durables:
        d = self._durables()
        if d is None:
            raise Unavailable("the agent is starting")
        return d

    async def _record(self, given: str) -> dpb.DurableSubscription:
        """The record of the subscription the caller names, if the caller may use it (its
        owner or an admin of its topic, agent/ownership.py), with the subscribe right on
        its topic; to anyone else it does not exist."""
        access = self.d.access
        name = scoped(access, given)
        check_name(name)
        record = await self.d.peers.locate(name)
        if record is None or not may_use(access, record.name, record.topic):
            raise NotFound(f"durable subscription {given!r} does not exist")
        access.require("subscribe", record.topic, SERVICE)
        return record

    async def _on(self, agent: str, method: str, request):
        try:
            return await getattr(self.d.peers.stub(agent), method)(request, timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None

    async def ListSubscriptions(self, request, context):
        d = self.d
        access = d.access
        self._access(request)
        mine = [s.describe(d.me) for s in list(d.subs.values())
                if not request.owner or owner_of(s.name) == request.owner]
        if request.local:
            return dpb.ListSubscriptionsResponse(subscriptions=mine)

        async def ask(agent: str):
            try:
                return (await d.peers.stub(agent).ListSubscriptions(
                    dpb.ListSubscriptionsRequest(local=True, owner=request.owner), timeout=CALL_TIMEOUT)).subscriptions
            except (grpc.aio.AioRpcError, Unavailable):
                return []
        copies = mine + [s for found in await asyncio.gather(*(ask(a) for a in d.peers.alive() if a != d.me))
                         for s in found]
        best: dict[str, dpb.DurableSubscription] = {}
        for s in copies:
            serving = next((h for h in s.holders if h == d.me or h in d.peers.alive()), None)
            if s.name not in best or s.answered_by == serving:
                best[s.name] = s
        # Only what the caller may use (its own, and those on topics it administers).
        return dpb.ListSubscriptionsResponse(subscriptions=[best[n] for n in sorted(best)
                                                            if may_use(access, n, best[n].topic)])

    async def GetSubscription(self, request, context):
        d = self.d
        self._access(request)
        if request.local:
            sub = d.subs.get(request.name)
            if sub is None:
                raise NotFound(f"durable subscription {request.name!r} is not held here")
            return sub.describe(d.me)
        record = await self._record(request.name)
        serving = d.peers.serving(record)
        if serving == d.me:
            return d.subs[record.name].describe(d.me)
        return await self._on(serving, "GetSubscription", dpb.GetSubscriptionRequest(name=record.name, local=True))

    def _access(self, request) -> None:
        """The `local` forms are one agent asking or telling another: members only
        (runtime/auth.py); a client's request goes through `_record`."""
        if request.local:
            self.d.access.require_member(f"{type(request).__name__} (local)", SERVICE)

    async def Seek(self, request, context):
        d = self.d
        self._access(request)
        if request.local:
            sub = d.subs.get(request.name)
            if sub is None:
                raise NotFound(f"durable subscription {request.name!r} is not held here")
            return dpb.SeekResponse(backlog_messages=d.seek_local(sub, request))
        record = await self._record(request.name)
        serving = d.peers.serving(record)
        local = dpb.SeekRequest()
        local.CopyFrom(request)
        local.name, local.local = record.name, True
        # The serving holder first: a seek it cannot do (not retained) changes nothing anywhere.
        if serving == d.me:
            answer = dpb.SeekResponse(backlog_messages=d.seek_local(d.subs[record.name], local))
        else:
            answer = await self._on(serving, "Seek", local)
        others = [h for h in record.holders if h != serving and h != d.me and h in d.peers.alive()]
        if serving != d.me and d.me in record.holders and record.name in d.subs:
            d.seek_local(d.subs[record.name], local)
        await d.peers.tell(others, dpb.DurableChange(name=record.name, seek=local))
        return answer

    async def DeleteSubscription(self, request, context):
        d = self.d
        self._access(request)
        if request.local:
            d.apply_delete(request.name)
            return dpb.DeleteSubscriptionResponse()
        record = await self._record(request.name)
        await d.delete(record)
        return dpb.DeleteSubscriptionResponse()

    # Between agents only: with TLS the caller's certificate must name an agent (a client
    # could otherwise rewrite a subscription's acks or read its backlog).
    async def Apply(self, request, context):
        require_member(context, None, "agent", "Durable.Apply")
        await self.d.apply(request)
        return dpb.ApplyResponse()

    async def Fetch(self, request, context):
        require_member(context, None, "agent", "Durable.Fetch")
        return self.d.fetch(request.name)


async def relay(ch: grpc.aio.Channel, target: str, first: ppb.SubscribeRequest, requests,
                context) -> AsyncIterator[ppb.Delivery]:
    """Carry a subscriber's stream to the agent serving its durable subscription (`target`,
    over `ch`, closed at the end) and back. Whatever ends either side ends both; the serving
    agent's status reaches the client."""
    name = first.open.subscription
    log.info("durable %s: relaying a stream to %s", name, target)
    routed = ppb.SubscribeRequest()
    routed.CopyFrom(first)
    routed.open.routed = True
    call = pgrpc.PubSubStub(ch).Subscribe()

    async def pump() -> None:
        await call.write(routed)
        async for req in requests:
            await call.write(req)
        await call.done_writing()

    pumper = asyncio.create_task(pump())
    try:
        metadata = await call.initial_metadata()
        await context.send_initial_metadata(tuple((k, v) for k, v in metadata or () if k.startswith("x-echelon")))
        async for delivery in call:
            yield delivery
        if pumper.done() and not pumper.cancelled():
            pumper.result()
    except grpc.aio.AioRpcError as e:
        log.info("durable %s: the stream relayed to %s ended: %s", name, target, e.code().name)
        raise from_rpc_error(e) from None
    finally:
        pumper.cancel()
        call.cancel()
        await ch.close()
