"""Many events per message through real servers: a `batch` request is answered
by one ack per element, in order, each element judged on its own (refusal, duplicate,
published); deliveries come many per message and a cumulative ack (`through`) settles
them; the agent's subscription applies `through` and explicit ids alike."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from echelon.agent.subscriptions import Subscription as AgentSubscription
from echelon.contract.filters import parse
from echelon.contract.wire import attributes_to_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc
from tests.harness import wait_for
from tests.integration.test_publish_checks import publish_raw
from tests.integration.test_pubsub import drain


def element(seq: int, attrs: dict, payload: bytes = b"") -> ppb.PublishRequest:
    return ppb.PublishRequest(topic="t", attributes=attributes_to_pb(attrs), payload=payload, sequence=seq)


async def test_a_batch_gets_one_ack_per_element_in_order(cluster):
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("t")
    agent = cluster.agent_nodes[0]
    unset = ppb.PublishRequest(topic="t", sequence=2)
    unset.attributes["n"].CopyFrom(pb.Value())  # a value with no kind: INVALID_ARGUMENT, the rest goes on
    sliced = element(5, {"n": 5})
    sliced.slice_count = 2  # a batch carries whole events only
    async with c1.subscribe("t", "") as sub:
        replies = await publish_raw(agent.address, [
            ppb.PublishRequest(producer_id="b", batch=[element(1, {"n": 1}, b"a"), unset,
                                                       element(1, {"n": 1}, b"a"),  # a retry inside the batch
                                                       element(3, {"n": 3})]),
            ppb.PublishRequest(producer_id="b", topic="t", attributes=attributes_to_pb({"n": 1}), sequence=1,
                               payload=b"other"),  # the id again for another event, alone
            ppb.PublishRequest(producer_id="b", batch=[element(3, {"n": 3}), element(4, {"n": 4}), sliced]),
        ])
        got = await drain(sub)
    assert len(replies) == 3
    first, lone, last = replies
    invalid, exists = grpc.StatusCode.INVALID_ARGUMENT.value[0], grpc.StatusCode.ALREADY_EXISTS.value[0]
    assert [(a.producer_id, a.sequence, a.code, a.duplicate, a.destinations) for a in first.acks] == [
        ("b", 1, 0, False, 1), ("b", 2, invalid, False, 0), ("b", 1, 0, True, 1), ("b", 3, 0, False, 1)]
    assert "'n'" in first.acks[1].error and not first.sequence
    assert not lone.acks and (lone.sequence, lone.code) == (1, exists)
    assert [(a.sequence, a.code, a.duplicate) for a in last.acks] == [(3, 0, True), (4, 0, False), (5, invalid, False)]
    assert [(m.sequence, m.payload) for m in got] == [(1, b"a"), (3, b""), (4, b"")]  # once each, in order


async def test_deliveries_come_many_per_message_and_a_cumulative_ack_settles_them(cluster):
    c0 = cluster.client(0)
    await c0.create_topic("t")
    agent = cluster.agent_nodes[1]
    async with grpc.aio.insecure_channel(agent.address) as ch:
        call = pgrpc.PubSubStub(ch).Subscribe()
        await call.write(ppb.SubscribeRequest(open=ppb.SubscriptionOpen(topic="t", credits=100,
                                                                        batched_deliveries=True)))
        await call.initial_metadata()
        async with c0.publisher() as pub:
            await pub.publish_batch("t", [{"n": i} for i in range(50)])
        ids, sizes = [], []
        while len(ids) < 50:
            message = await asyncio.wait_for(call.read(), 10)
            batch = list(message.batch) or [message]
            sizes.append(len(batch))
            ids += [d.delivery_id for d in batch]
            assert [d.event.attributes["n"].int_value for d in batch] == list(range(len(ids) - len(batch), len(ids)))
        assert max(sizes) > 1 and ids == sorted(ids)
        (sub,) = agent.subs.values()
        assert len(sub.unacked) == 50
        await call.write(ppb.SubscribeRequest(ack=ppb.SubscriberAck(through=ids[29], delivery_ids=[ids[40]])))
        await wait_for(lambda: len(sub.unacked) == 19, 10)
        assert sorted(sub.unacked) == ids[30:40] + ids[41:]
        call.cancel()


@pytest.mark.parametrize("encoded,sid,on", [(True, 0, 1), (True, 7, 1), (False, 0, 1), (False, 7, 1), (True, 7, 0)])
async def test_a_client_that_reads_encoded_events_gets_them_as_the_publishing_agent_made_them(cluster, encoded, sid,
                                                                                               on):
    """`encoded_events` (client/message.py): an event relayed to the subscriber's agent goes
    on as the root's bytes (`encoded_event`), on a stream of its own or a shared one; a
    client that did not ask (an older one) gets `event`, and so does everyone for events
    that never were bytes (delivered on the publishing agent itself: `on` = 0)."""
    c0 = cluster.client(0)
    await c0.create_topic("t")
    async with grpc.aio.insecure_channel(cluster.agent_nodes[on].address) as ch:
        call = pgrpc.PubSubStub(ch).Subscribe()
        await call.write(ppb.SubscribeRequest(open=ppb.SubscriptionOpen(topic="t", credits=100, sid=sid,
                                                                        encoded_events=encoded,
                                                                        batched_deliveries=True)))
        if sid:
            assert (await asyncio.wait_for(call.read(), 10)).opened
        else:
            await call.initial_metadata()
        async with c0.publisher() as pub:
            await pub.publish_batch("t", [({"n": i}, bytes([i]) * i) for i in range(20)])
        got = []
        while len(got) < 20:
            message = await asyncio.wait_for(call.read(), 10)
            got += list(message.batch) or [message]
        relayed = encoded and on != 0
        assert all(bool(d.encoded_event) == relayed and d.HasField("event") != relayed for d in got)
        events = [pb.Event.FromString(d.encoded_event) if relayed else d.event for d in got]
        assert [(e.attributes["n"].int_value, e.payload) for e in events] == [(i, bytes([i]) * i) for i in range(20)]
        call.cancel()


def test_the_agent_applies_through_and_explicit_ids():
    sub = AgentSubscription("a/s", "s", "t", parse(""), max_backlog=10)
    sub.attach(credits=10)
    for i in range(6):
        assert sub.offer(pb.Event(id=pb.MessageId(producer_id="p", sequence=i)))
    taken = [d for d, _ in sub.take(10)]
    assert taken == [1, 2, 3, 4, 5, 6] and sub.credits == 4
    assert sub.nack([2], 0.0, 0) == 1  # back in the backlog: a later take gives it a new id
    assert sub.ack([5], 1, through=3) == 3  # 1 and 3 cumulatively (2 is gone already), 5 by id
    assert sorted(sub.unacked) == [4, 6] and sub.credits == 5
    (again,) = sub.take(1)
    assert again[0] == 7 and again[1].redeliveries == 1
    assert sub.ack([], 0, through=100) == 3 and not sub.unacked


async def test_acks_of_requests_that_settle_together_share_a_message_when_the_client_asks(cluster):
    """`coalesce_acks`: the acks of consecutive requests already settled go in one message,
    in order; without it, one ack message per request as before. The agent's matching is
    held (a gate in front of the real matcher call) until all five requests are queued, so
    they settle in at most two dispatches."""
    c0 = cluster.client(0)
    await c0.create_topic("t")
    agent = cluster.agent_nodes[0]
    real, gate, matched = agent.matching.send, asyncio.Event(), []

    async def gated(encoded):
        matched.append(len(encoded))
        await gate.wait()
        return await real(encoded)

    agent.matching.send = gated
    try:
        # `lean_acks`: listed acks leave out the producer id; acks sent one per request keep it.
        for coalesce, lean, producer in ((True, False, "c"), (False, False, "s"), (True, True, "l"),
                                         (False, True, "n")):
            gate.clear()
            matched.clear()
            requests = [ppb.PublishRequest(producer_id=producer, topic="t", attributes=attributes_to_pb({"n": i}),
                                           sequence=i, coalesce_acks=coalesce, lean_acks=lean) for i in range(1, 6)]
            async with grpc.aio.insecure_channel(agent.address) as ch:
                call = pgrpc.PubSubStub(ch).Publish(iter(requests))
                # Events matched and queued (a queued unit may hold several: publish_reader.py's runs).
                await wait_for(lambda: matched and matched[0] + sum(len(u[0]) for u in agent.dispatcher._queue._queue)
                               == 5, 10)
                gate.set()
                replies = [reply async for reply in call]
            acks = [a for r in replies for a in (r.acks or [r])]
            named = "" if lean and coalesce else producer
            assert [(a.producer_id, a.sequence, a.code) for a in acks] == [(named, i, 0) for i in range(1, 6)]
            if coalesce:
                assert len(replies) <= 2 and all(r.acks and not r.sequence for r in replies)
            else:
                assert len(replies) == 5 and not any(r.acks for r in replies)
    finally:
        agent.matching.send = real


async def test_frames_of_a_publisher_waiting_alone_ask_for_their_acks_at_once(cluster):
    """A DELIVERED publish with nothing else in flight on its stream (`await publish()` in a
    loop) goes in frames without `ack_may_wait`: no relay delays the ack it waits on. An
    ACCEPTED publisher's frames may have their acks delayed (nobody waits on them)."""
    from echelon.dataplane.links import Link
    from echelon.client import AckLevel

    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("t")
    sent, real = [], Link.send

    def send(self, frame):
        sent.append(frame.ack_may_wait)
        return real(self, frame)

    Link.send = send
    try:
        async with c1.subscribe("t", "") as sub:
            async with c0.publisher(ack_level=AckLevel.DELIVERED) as pub:
                for i in range(3):
                    assert (await pub.publish("t", {"n": i})).destinations == 1
            assert sent == [False] * 3
            async with c0.publisher(ack_level=AckLevel.ACCEPTED) as pub:
                await pub.publish("t", {"n": 3})
            await wait_for(lambda: len(sent) == 4)
            assert sent[3] is True
            assert [m.attributes["n"] for m in await drain(sub)] == [0, 1, 2, 3]
    finally:
        Link.send = real


async def test_a_batch_mixing_valid_and_invalid_events_refuses_exactly_those_and_records_nothing_for_them(cluster):
    """Each refused element gets its own precise status, in order; its id is not recorded
    (the same sequence publishes afterwards as a first copy) and nothing of it is delivered;
    the valid elements around it are published once, in order."""
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("q", ["n:int:0:9", "s:string:4"])
    agent = cluster.agent_nodes[0]

    def q(seq: int, attrs: dict, topic: str = "q") -> ppb.PublishRequest:
        return ppb.PublishRequest(topic=topic, attributes=attributes_to_pb(attrs), sequence=seq)

    nested = q(8, {"n": 8})
    nested.batch.add(topic="q", sequence=80)
    bad = [q(2, {"n": 10}), q(3, {"x": 1}), q(4, {"n": "a"}), q(5, {"s": "toolong"}), q(6, {"n": 6}, "nope"), nested]
    invalid, missing = grpc.StatusCode.INVALID_ARGUMENT.value[0], grpc.StatusCode.NOT_FOUND.value[0]
    async with c1.subscribe("q", "") as sub:
        (reply,) = await publish_raw(agent.address, [ppb.PublishRequest(
            producer_id="m", ack_level=ppb.ACK_LEVEL_DELIVERED, batch=[q(1, {"n": 1}), *bad[:5], q(7, {"n": 7}),
                                                                      bad[5]])])
        assert [(a.sequence, a.code, a.duplicate, a.destinations) for a in reply.acks] == [
            (1, 0, False, 1), (2, invalid, False, 0), (3, invalid, False, 0), (4, invalid, False, 0),
            (5, invalid, False, 0), (6, missing, False, 0), (7, 0, False, 1), (8, invalid, False, 0)]
        errors_ = [a.error for a in reply.acks]
        assert "'n'" in errors_[1] and "'x'" in errors_[2] and "'n'" in errors_[3] and "'s'" in errors_[4]
        assert "'nope'" in errors_[5] and "whole event" in errors_[7]
        # The refused sequences are free: the same ids with valid events publish as first copies.
        (again,) = await publish_raw(agent.address, [ppb.PublishRequest(
            producer_id="m", ack_level=ppb.ACK_LEVEL_DELIVERED,
            batch=[q(1, {"n": 1}), *(q(s, {"n": s}) for s in range(2, 7)), q(8, {"n": 8})])])
        assert [(a.sequence, a.code, a.duplicate) for a in again.acks] == [
            (1, 0, True), *((s, 0, False) for s in range(2, 7)), (8, 0, False)]
        got = await drain(sub)
    assert [m.sequence for m in got] == [1, 7, 2, 3, 4, 5, 6, 8]  # once each, in the order published
    assert [m.attributes["n"] for m in got] == [1, 7, 2, 3, 4, 5, 6, 8]


async def test_a_retried_batch_is_answered_as_its_first_copies_whatever_its_shape(cluster):
    """A batch sent again (a reconnect's resend) on another stream: each element already
    published is a duplicate with its first copy's destinations, an element reusing an id
    for another event is ALREADY_EXISTS, a new one is published; the retry may come as
    lone requests (the SDK resends as it packs) and is still recognised. Delivered once."""
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("t")
    agent = cluster.agent_nodes[0]
    exists = grpc.StatusCode.ALREADY_EXISTS.value[0]
    async with c1.subscribe("t", "n >= 2") as sub:
        (first,) = await publish_raw(agent.address, [ppb.PublishRequest(
            producer_id="r", ack_level=ppb.ACK_LEVEL_DELIVERED,
            batch=[element(1, {"n": 1}, b"a"), element(2, {"n": 2}, b"b"), element(3, {"n": 3}, b"c")])])
        assert [(a.sequence, a.code, a.destinations) for a in first.acks] == [(1, 0, 0), (2, 0, 1), (3, 0, 1)]
        ok = agent.metrics.published.labels("t", "ok")
        assert ok._value.get() == 3  # counted once per event published
        (retry,) = await publish_raw(agent.address, [ppb.PublishRequest(
            producer_id="r", ack_level=ppb.ACK_LEVEL_DELIVERED, coalesce_acks=True,
            batch=[element(1, {"n": 1}, b"a"), element(2, {"n": 2}, b"b"), element(3, {"n": 3}, b"changed"),
                   element(4, {"n": 4}, b"d")])])
        assert [(a.sequence, a.code, a.duplicate, a.destinations) for a in retry.acks] == [
            (1, 0, True, 0), (2, 0, True, 1), (3, exists, False, 0), (4, 0, False, 1)]
        assert ok._value.get() == 4 and agent.metrics.published.labels("t", "duplicate")._value.get() == 2
        lone = []
        for seq, attrs, payload in ((2, {"n": 2}, b"b"), (4, {"n": 4}, b"d")):
            r = element(seq, attrs, payload)
            r.producer_id, r.ack_level, r.coalesce_acks = "r", ppb.ACK_LEVEL_DELIVERED, True
            lone.append(r)
        replies = await publish_raw(agent.address, lone)
        assert [(a.sequence, a.code, a.duplicate, a.destinations) for r in replies for a in r.acks] == [
            (2, 0, True, 1), (4, 0, True, 1)]
        got = await drain(sub)
    assert [(m.sequence, m.payload) for m in got] == [(2, b"b"), (3, b"c"), (4, b"d")]
