"""A client written from the protos to the contract before batched deliveries: raw
generated stubs, one event per PublishRequest, one delivery per Delivery message (it never
looks at `Delivery.batch`), its own small credits, each delivery acked by id with one
credit back. Against the current agents it receives every delivery, in order, on the
publishing agent and on the others (relayed), on a stream of its own or a shared one.
Batched deliveries go only to a subscriber that asks (`batched_deliveries`):
docs/event-path.md."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from echelon.contract.wire import attributes_to_pb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc

EVENTS = 300
CREDITS = 4  # far fewer than the events: a client that missed deliveries would stall


async def old_subscriber(address: str, opened: asyncio.Event, sid: int = 0) -> list[int]:
    """The old client: every Delivery is one delivery; ack it by id, one credit back."""
    got: list[int] = []
    async with grpc.aio.insecure_channel(address) as ch:
        call = pgrpc.PubSubStub(ch).Subscribe()
        await call.write(ppb.SubscribeRequest(open=ppb.SubscriptionOpen(topic="t", credits=CREDITS, sid=sid)))
        if sid:
            assert (await asyncio.wait_for(call.read(), 10)).opened
        else:
            await call.initial_metadata()
        opened.set()
        while len(got) < EVENTS:
            d = await asyncio.wait_for(call.read(), 20)
            assert not len(d.batch) and d.delivery_id and d.sid == sid, d  # one delivery per message
            got.append(d.event.attributes["n"].int_value)
            await call.write(ppb.SubscribeRequest(ack=ppb.SubscriberAck(delivery_ids=[d.delivery_id], credits=1,
                                                                        sid=sid)))
        call.cancel()
    return got


async def old_publisher(address: str) -> list[ppb.PublishAck]:
    """One event per request, all written before the acks are read (many in flight)."""
    requests = [ppb.PublishRequest(topic="t", attributes=attributes_to_pb({"n": i}), producer_id="old",
                                   sequence=i + 1, ack_level=ppb.ACK_LEVEL_DELIVERED) for i in range(EVENTS)]
    async with grpc.aio.insecure_channel(address) as ch:
        return [ack async for ack in pgrpc.PubSubStub(ch).Publish(iter(requests))]


@pytest.mark.parametrize("sid", [0, 5])
async def test_a_client_of_the_previous_contract_receives_every_delivery(cluster, sid):
    await cluster.client(0).create_topic("t")
    agents = [a.address for a in cluster.agent_nodes]
    opened = [asyncio.Event() for _ in agents]
    subscribers = [asyncio.create_task(old_subscriber(a, e, sid)) for a, e in zip(agents, opened)]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in opened)), 20)
    acks = await old_publisher(agents[0])
    assert [(a.sequence, a.code, len(a.acks)) for a in acks] == [(i + 1, 0, 0) for i in range(EVENTS)]
    for got in await asyncio.wait_for(asyncio.gather(*subscribers), 60):
        assert got == list(range(EVENTS))  # every delivery, once, in order
