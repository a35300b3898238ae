"""A shared subscription stream (agent/shared_stream.py, client/shared.py)
through a real agent: the wire contract read raw, then the client's subscriptions on it.

Pinned: an event matching two subscriptions of the stream comes as one message; opens
are answered in the stream and a refused one ends only itself; one subscription's
overflow or close leaves the others receiving; acks of several subscriptions go in one
request; what the stream's end leaves of a named subscription is redelivered; protocol
errors end the stream; the writer, which waits once a fill took all there was, finds a
backlog past one message and a sliced payload behind small events without another
wakeup."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from echelon.client import AckLevel, errors
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc
from tests.harness import wait_for


async def publish(cluster, events: list[dict]) -> None:
    # ACCEPTED: a DELIVERED publish to a named subscription with its client attached waits
    # for that client's ack (docs/guarantees.md), and these tests read only afterwards.
    async with cluster.client(0).publisher(ack_level=AckLevel.ACCEPTED) as pub:
        await pub.publish_batch("t", events)


def elements(message: ppb.Delivery) -> list[ppb.Delivery]:
    return list(message.batch) or [message]


async def read_until(call, n: int) -> list[ppb.Delivery]:
    """Delivery messages until `n` elements came."""
    got: list[ppb.Delivery] = []
    messages = []
    while len(got) < n:
        message = await asyncio.wait_for(call.read(), 10)
        messages.append(message)
        got += elements(message)
    return messages


async def test_the_wire_one_message_for_many_subscriptions_and_per_subscription_status(cluster):
    c0 = cluster.client(0)
    await c0.create_topic("t")
    agent = cluster.agent_nodes[1]
    async with grpc.aio.insecure_channel(agent.address) as ch:
        call = pgrpc.PubSubStub(ch).Subscribe()
        await call.write(ppb.SubscribeRequest(open=ppb.SubscriptionOpen(topic="t", filter_text="n >= 0", credits=10,
                                                                        subscription="a", sid=7,
                                                                        batched_deliveries=True)))
        await call.write(ppb.SubscribeRequest(batch=[
            ppb.SubscribeRequest(open=ppb.SubscriptionOpen(topic="t", filter_text="n >= 1", credits=10, sid=9)),
            ppb.SubscribeRequest(open=ppb.SubscriptionOpen(topic="nope", credits=10, sid=11)),
            ppb.SubscribeRequest(open=ppb.SubscriptionOpen(topic="t", credits=10, sid=12, subscription="d",
                                                           durable=ppb.DurableOptions()))]))
        statuses = [d for m in await read_until(call, 4) for d in elements(m)]
        assert all(not d.delivery_id for d in statuses)
        by_sid = {d.sid: d for d in statuses}
        assert by_sid[7].opened == agent.subs["a"].id and by_sid[9].opened.split("/")[1].startswith("~")
        assert by_sid[11].code == grpc.StatusCode.NOT_FOUND.value[0] and "nope" in by_sid[11].error
        assert by_sid[12].code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        await publish(cluster, [{"n": 0}, {"n": 1}])
        got = [d for m in await read_until(call, 3) for d in elements(m)]
        assert sorted((d.sid, d.event.attributes["n"].int_value) for d in got) == [(7, 0), (7, 1), (9, 1)]
        # Both subscriptions' acks in one request; the first is closed as asked, the other goes on.
        ids = {(d.sid, d.event.attributes["n"].int_value): d.delivery_id for d in got}
        await call.write(ppb.SubscribeRequest(batch=[
            ppb.SubscribeRequest(ack=ppb.SubscriberAck(sid=7, through=ids[(7, 0)], credits=1)),
            ppb.SubscribeRequest(ack=ppb.SubscriberAck(sid=9, delivery_ids=[ids[(9, 1)]], credits=1)),
            ppb.SubscribeRequest(close=ppb.SubscriptionClose(sid=7))]))
        (closed,) = elements(await asyncio.wait_for(call.read(), 10))
        assert (closed.sid, closed.delivery_id, closed.code, closed.opened) == (7, 0, 0, "")
        assert agent.metrics.acks.labels("t")._value.get() == 2  # both acks of the request, counted
        named = agent.subs["a"]
        assert not named.attached and [p.event.attributes["n"].int_value for p in named.backlog] == [1]
        await publish(cluster, [{"n": 2}])
        (d,) = elements(await asyncio.wait_for(call.read(), 10))
        assert (d.sid, d.event.attributes["n"].int_value) == (9, 2)
        assert agent.metrics.deliveries.labels("t")._value.get() == 4  # every delivery sent, counted
        # A sid never opened here is the client's bug: the stream ends.
        await call.write(ppb.SubscribeRequest(ack=ppb.SubscriberAck(delivery_ids=[1])))
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await asyncio.wait_for(call.read(), 10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await wait_for(lambda: not [s for s in agent.subs.values() if not s.named], 10, what="the ephemeral one closed")


async def test_client_subscriptions_share_one_stream_and_end_alone(cluster):
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("t")
    agent = cluster.agent_nodes[1]
    async with c1.subscribe("t", "n >= 0", name="all", max_outstanding=100) as every, \
            c1.subscribe("t", "n >= 5", max_outstanding=100) as tail:
        stream = c1._shared_stream
        assert stream is not None and every._shared is stream and tail._shared is stream
        with pytest.raises(errors.NotFound):
            async with c1.subscribe("t-missing", ""):
                pass
        small = c1.subscribe("t", "n = 3", max_outstanding=100)
        await small.start()
        assert small._shared is stream
        held = agent.subs[small.id.split("/", 1)[1]]
        held.max_backlog, held.evict = 0, True  # overflows with its first event (evicted: it chose to be)
        await publish(cluster, [{"n": i} for i in range(10)])
        with pytest.raises(errors.ResourceExhausted):
            await small.next(timeout=10)
        got_every = [m.attributes["n"] for m in await take(every, 10)]
        got_tail = [m.attributes["n"] for m in await take(tail, 5)]
        assert got_every == list(range(10)) and got_tail == list(range(5, 10))
        assert c1._shared_stream is stream  # the others went on on the same stream
    assert c1._shared_stream is None or c1._shared_stream._closing
    await wait_for(lambda: not agent.subs["all"].attached, 10, what="the named one detached")


async def take(sub, n: int) -> list:
    got = []
    while len(got) < n:
        batch = await sub.receive(n - len(got), timeout=10)
        await sub.ack(batch)
        got += batch
    return got


async def test_the_stream_lost_ends_every_subscription_and_a_named_one_resumes(cluster):
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("t")
    agent = cluster.agent_nodes[1]
    sub = c1.subscribe("t", "", name="keep", max_outstanding=100, reconnect=False)  # (reconnecting: test_resilient)
    other = c1.subscribe("t", "", max_outstanding=100)
    await sub.start()
    await other.start()
    await publish(cluster, [{"n": i} for i in range(4)])
    first = await take(sub, 2)
    unacked = [m.attributes["n"] for m in await sub.receive(2, timeout=10)]
    unacked += [m.attributes["n"] for m in await sub.receive(1, timeout=10)] if len(unacked) < 2 else []
    assert unacked == [2, 3]
    await sub.flush()
    await wait_for(lambda: len(agent.subs["keep"].unacked) + len(agent.subs["keep"].backlog) == 2, 10,
                   what="the acks applied")
    c1._shared_stream.call.cancel()  # the stream breaks under both
    for s in (sub, other):
        with pytest.raises(errors.EchelonError):
            while True:
                await s.next(timeout=10)
    await sub.close()
    await other.close()
    async with c1.subscribe("t", "", name="keep") as again:
        rest = await take(again, 2)
    assert [m.attributes["n"] for m in first + rest] == [0, 1, 2, 3]
    assert all(m.redelivery_count == 1 for m in rest)


async def test_a_sliced_payload_behind_small_events_follows_them_without_another_wakeup(cluster):
    """Three small events and a sliced payload owed to one subscription, then credits for all
    in one ack: the writer's fill takes the small ones and stops at the payload (it goes
    alone); nothing else happens (no event, no ack), so the writer must find it by itself.
    A writer that waited after a fill not full hung here (`echelon demo` did, b2d3caf)."""
    await cluster.client(0).create_topic("t")
    agent = cluster.agent_nodes[1]
    data = bytes(range(256)) * 1200  # 300 KiB: 5 relay slices
    async with grpc.aio.insecure_channel(agent.address) as ch:
        call = pgrpc.PubSubStub(ch).Subscribe()
        await call.write(ppb.SubscribeRequest(open=ppb.SubscriptionOpen(topic="t", credits=0, sid=1,
                                                                        batched_deliveries=True)))
        assert (await asyncio.wait_for(call.read(), 10)).opened
        async with cluster.client(0).publisher(ack_level=AckLevel.DELIVERED) as pub:
            small = asyncio.ensure_future(pub.publish_batch("t", [{"n": i} for i in range(3)]))
            big = asyncio.ensure_future(pub.publish("t", {"n": 3}, payload=data))
            (sub,) = [s for s in agent.subs.values() if s.topic == "t"]
            await wait_for(lambda: len(sub.backlog) == 4 and sub.backlog[-1].stream is not None, 10,
                           what="the small events and the payload's head owed")
            await call.write(ppb.SubscribeRequest(ack=ppb.SubscriberAck(sid=1, credits=4)))
            got = []
            while not got or not (got[-1].last or got[-1].aborted):
                got += elements(await asyncio.wait_for(call.read(), 10))
            await asyncio.wait_for(asyncio.gather(small, big), 10)
    assert [d.event.attributes["n"].int_value for d in got if d.delivery_id and not (d.chunk or d.last)] == [0, 1, 2, 3]
    assert got[-1].last and b"".join(d.chunk for d in got) == data


async def test_a_backlog_past_one_message_goes_out_in_full_messages_without_another_wakeup(cluster):
    """600 events owed, then credits for them in one ack: the stream sends MAX_DELIVERIES per
    message until none is left, without waiting for anything else to happen."""
    from echelon.agent.pubsub import MAX_DELIVERIES

    await cluster.client(0).create_topic("t")
    agent = cluster.agent_nodes[1]
    async with grpc.aio.insecure_channel(agent.address) as ch:
        call = pgrpc.PubSubStub(ch).Subscribe()
        await call.write(ppb.SubscribeRequest(open=ppb.SubscriptionOpen(topic="t", credits=0, sid=1,
                                                                        batched_deliveries=True)))
        assert (await asyncio.wait_for(call.read(), 10)).opened
        await publish(cluster, [{"n": i} for i in range(600)])
        (sub,) = [s for s in agent.subs.values() if s.topic == "t"]
        await wait_for(lambda: len(sub.backlog) == 600, 10, what="every event owed")
        await call.write(ppb.SubscribeRequest(ack=ppb.SubscriberAck(sid=1, credits=600)))
        messages = await read_until(call, 600)
        assert [len(elements(m)) for m in messages] == [MAX_DELIVERIES, MAX_DELIVERIES, 600 - 2 * MAX_DELIVERIES]
        assert [d.event.attributes["n"].int_value for m in messages for d in elements(m)] == list(range(600))
        call.cancel()
