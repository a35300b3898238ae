"""Every malformed publish gets an answer (docs/guarantees.md).

- An empty producer id is defaulted, not refused: the stream gets an id of its own, named
  in every ack, and the events are delivered like any other; events without a sequence
  are numbered above every sequence the stream used, so an explicit one never collides.
- A sliced payload whose slices stop (the stream still open) is failed with
  DEADLINE_EXCEEDED once no slice came for the agent's idle bound, and its id is free
  again: a retry of the whole payload under it is published.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from echelon.agent import publishing
from echelon.contract.wire import attributes_to_pb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc
from tests.harness import Cluster
from tests.integration.test_pubsub import drain

pytestmark = pytest.mark.asyncio


async def test_an_empty_producer_id_is_defaulted_and_delivered():
    c = Cluster(agents=3)
    await c.start()
    try:
        clients = [c.client(i) for i in range(3)]
        await clients[0].create_topic("t")
        subs = [clients[i].subscribe("t", "") for i in (1, 2)]
        for s in subs:
            await s.start()
        requests = [ppb.PublishRequest(topic="t", attributes=attributes_to_pb({"n": n}), sequence=seq,
                                       ack_level=ppb.ACK_LEVEL_DELIVERED)
                    for n, seq in enumerate((3, 0, 0, 1, 0))]  # explicit sequences among unnumbered events
        async with grpc.aio.insecure_channel(c.agent_nodes[0].address) as ch:
            acks = [ack async for ack in pgrpc.PubSubStub(ch).Publish(iter(requests))]
        assert [(a.code, a.error, a.destinations) for a in acks] == [(0, "", 2)] * 5
        producers = {a.producer_id for a in acks}
        assert len(producers) == 1 and producers.pop().startswith("agent-0:")
        assert [a.sequence for a in acks] == [3, 4, 5, 1, 6]  # numbered above every sequence used
        for s in subs:
            assert sorted(m.attributes["n"] for m in await drain(s)) == list(range(5))
    finally:
        await c.stop()


async def test_a_sliced_payload_whose_slices_stop_is_failed_after_the_idle_bound(monkeypatch):
    monkeypatch.setattr(publishing, "SLICE_IDLE", 0.5, raising=False)
    c = Cluster(agents=2)
    await c.start()
    try:
        clients = [c.client(i) for i in range(2)]
        await clients[0].create_topic("t")
        sub = clients[1].subscribe("t", "")
        await sub.start()
        size, cut = 3 * 1000, 1000

        def slice_(i: int) -> ppb.PublishRequest:
            return ppb.PublishRequest(topic="t", producer_id="p", sequence=1, slice_index=i, slice_count=3,
                                      payload_size=size, payload=bytes([i]) * cut, ack_level=ppb.ACK_LEVEL_DELIVERED,
                                      attributes=attributes_to_pb({"n": 1}) if i == 0 else None)

        async with grpc.aio.insecure_channel(c.agent_nodes[0].address) as ch:
            stop = asyncio.Event()

            async def stalled():  # slice 0 of 3, then nothing, the stream left open
                yield slice_(0)
                await stop.wait()

            call = pgrpc.PubSubStub(ch).Publish(stalled())
            ack = await asyncio.wait_for(call.read(), 15)
            assert ack.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0], ack
            assert "p:1: slice 1 did not come within 0.5 s" in ack.error
            stop.set()
            call.cancel()
            # The id is free again: the whole payload under it is published and delivered.
            acks = [a async for a in pgrpc.PubSubStub(ch).Publish(iter([slice_(i) for i in range(3)]))]
            assert [(a.code, a.destinations) for a in acks] == [(0, 1)]
        (msg,) = await drain(sub)
        assert msg.payload == bytes([0]) * cut + bytes([1]) * cut + bytes([2]) * cut
    finally:
        await c.stop()
