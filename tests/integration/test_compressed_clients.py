"""Compressed client streams (agent/compressed.py, client/compressed.py, docs/compression.md),
through real agents on loopback.

The SDK with `compress=True` publishes and subscribes over streams the agents accepted;
each compressed subscription receives exactly what a plain subscription of the same
filter receives in the same run (the plain one is the oracle), on shared and own streams.
On the wire, a raw subscriber that offers zstd receives messages that decode to exactly the
plain subscriber's bytes, in clearly fewer bytes. A hostile publisher (raw stubs) that
sends a compressed request it was not granted, a garbage block or a bomb has its stream
ended with INVALID_ARGUMENT, nothing of it published, and the agent serves on. Past the
agent's bound a stream that offers stays plain and works; the count is released when a
stream ends."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from echelon.client import Client
from echelon.contract import zstream
from echelon.contract.filters import parse
from echelon.contract.wire import attributes_to_pb, filter_to_pb
from echelon.v1 import pubsub_pb2 as ppb
from tests.harness import Cluster, wait_for

PUBLISH = "/echelon.v1.PubSub/Publish"
SUBSCRIBE = "/echelon.v1.PubSub/Subscribe"
FILTER = "n < 60"


def compressed_client(c: Cluster, i: int) -> Client:
    client = Client(c.agent_nodes[i].address, compress=True)
    c.clients.append(client)
    return client


async def received(sub, n: int) -> list[tuple]:
    got = []
    while len(got) < n:
        m = await sub.next(timeout=10)
        got.append((m.attributes["n"], m.attributes["i"], m.payload, m.producer_id, m.sequence))
        await m.ack()
    return got


@pytest.mark.timeout(90)
async def test_compressed_sdk_streams_deliver_exactly_what_a_plain_subscriber_receives():
    c = Cluster(agents=2, matchers=1)
    try:
        await c.start()
        await c.client(0).create_topic("t", ["n:int:0:99", "i:int"])
        plain = c.client(1).subscribe("t", FILTER, max_outstanding=1000)
        zclient = compressed_client(c, 1)
        zshared = zclient.subscribe("t", FILTER, max_outstanding=1000)
        zown = zclient.subscribe("t", FILTER, max_outstanding=1000, shared=False)
        for s in (plain, zshared, zown):
            await s.start()
        assert c.agent_nodes[1].pubsub.compressed.open == 2  # the shared stream and the own one
        publisher = compressed_client(c, 0).publisher()
        events = [(i * 37 % 100, i) for i in range(400)]
        for lo in range(0, len(events), 40):  # in bursts (batches) and one by one (single requests)
            chunk = events[lo:lo + 40]
            if lo % 80:
                await asyncio.gather(*(publisher.publish_nowait("t", {"n": n, "i": i}, payload=b"p%d" % i)
                                       for n, i in chunk))
            else:
                await publisher.publish_batch("t", [({"n": n, "i": i}, b"p%d" % i) for n, i in chunk])
        assert c.agent_nodes[0].pubsub.compressed.open == 1  # the publisher's stream
        want = sum(1 for n, _ in events if n < 60)
        oracle = await received(plain, want)
        assert sorted(x[:3] for x in oracle) == sorted((n, i, b"p%d" % i) for n, i in events if n < 60)
        assert await received(zshared, want) == oracle
        assert await received(zown, want) == oracle
        await publisher.close()
        for s in (plain, zshared, zown):
            await s.close()
        # Every compressed stream ended: its count released.
        await wait_for(lambda: [a.pubsub.compressed.open for a in c.agent_nodes] == [0, 0], what="counts released")
    finally:
        await c.stop()


async def raw_deliveries(ch, offer: bool, n: int) -> tuple[list[bytes], int, bool]:
    """A raw subscriber's Delivery messages (their bytes, decoded if compressed), the bytes
    the messages took on the wire, and whether the agent accepted."""
    call = ch.stream_stream(SUBSCRIBE, request_serializer=ppb.SubscribeRequest.SerializeToString,
                            response_deserializer=None)(metadata=zstream.OFFER if offer else ())
    await call.write(ppb.SubscribeRequest(open=ppb.SubscriptionOpen(topic="t", filter=filter_to_pb(parse(FILTER)),
                                                                          credits=n)))
    accepted = zstream.accepted(await call.initial_metadata())
    decompressor = zstream.Decompressor(1 << 20, zstream.CLIENT_WINDOW_LOG)
    messages, wire, count = [], 0, 0
    while count < n:
        data = await asyncio.wait_for(call.read(), 10)
        wire += len(data)
        block = zstream.unwrap(data)
        if block is not None:
            data = decompressor.message(block)
        messages.append(data)
        d = ppb.Delivery.FromString(data)
        count += len(d.batch) or (1 if d.delivery_id else 0)
    call.cancel()
    return messages, wire, accepted


def unnamed(message: bytes) -> bytes:
    """A Delivery's bytes without its subscription's name (each stream's own)."""
    d = ppb.Delivery.FromString(message)
    d.subscription = ""
    return d.SerializeToString()


@pytest.mark.timeout(60)
async def test_a_raw_subscriber_that_offers_gets_the_plain_bytes_compressed():
    c = Cluster(agents=1, matchers=1)
    try:
        await c.start()
        await c.client(0).create_topic("t", ["n:int:0:99", "i:int"])
        async with grpc.aio.insecure_channel(c.agent_nodes[0].address) as ch:
            n = 200
            tasks = [asyncio.create_task(raw_deliveries(ch, offer, n)) for offer in (False, True)]
            await wait_for(lambda: c.agent_nodes[0].pubsub.compressed.open == 1, what="the offer accepted")
            await asyncio.sleep(0.5)  # both registered at the matcher (no await for it in a raw open)
            publisher = c.client(0).publisher()
            for i in range(n):  # one by one: one Delivery message per event on each stream
                await publisher.publish("t", {"n": i % 60, "i": i}, payload=b"x" * 16)
            (plain, plain_wire, plain_accepted), (zmsgs, zwire, zaccepted) = await asyncio.gather(*tasks)
        assert not plain_accepted and zaccepted
        assert len(zmsgs) == len(plain) == n  # one delivery per message (the opens asked for no batches)
        assert [unnamed(m) for m in zmsgs] == [unnamed(m) for m in plain]  # the same messages, once decoded
        assert zwire * 2 < plain_wire, (zwire, plain_wire)
    finally:
        await c.stop()


def request(i: int) -> ppb.PublishRequest:
    return ppb.PublishRequest(topic="t", attributes=attributes_to_pb({"n": 1, "i": i}), producer_id="raw", sequence=i,
                              ack_level=ppb.ACK_LEVEL_ACCEPTED)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["not offered", "bomb", "garbage", "block and fields"])
async def test_a_hostile_compressed_publish_ends_its_stream_and_publishes_nothing(case):
    c = Cluster(agents=1, matchers=1)
    try:
        await c.start()
        await c.client(0).create_topic("t", ["n:int:0:99", "i:int"])
        watcher = c.client(0).subscribe("t", max_outstanding=1000)
        await watcher.start()
        good = request(1).SerializeToString()
        bad = {"not offered": zstream.wrap(zstream.Compressor(zstream.CLIENT_WINDOW_LOG).block(good)),
               "bomb": zstream.wrap(zstream.Compressor(zstream.CLIENT_WINDOW_LOG).block(bytes(80 << 20))),
               "garbage": zstream.wrap(b"\x28\xb5\x2f\xfd not a block"),
               "block and fields": good + zstream.wrap(zstream.Compressor(zstream.CLIENT_WINDOW_LOG).block(good))}[case]
        async with grpc.aio.insecure_channel(c.agent_nodes[0].address) as ch:
            call = ch.stream_stream(PUBLISH, response_deserializer=ppb.PublishAck.FromString)(
                metadata=() if case == "not offered" else zstream.OFFER)
            await call.write(bad)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                async for ack in call:
                    assert ack.stream_status and ack.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], ack
            assert zstream.accepted(await call.initial_metadata()) == (case != "not offered")
            assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT, failed.value
            assert "compressed" in failed.value.details(), failed.value.details()
            # The agent serves on: a granted, compressed publish is acked (compressed) and delivered.
            compressor = zstream.Compressor(zstream.CLIENT_WINDOW_LOG)
            decompressor = zstream.Decompressor(1 << 20, zstream.CLIENT_WINDOW_LOG)
            call = ch.stream_stream(PUBLISH, response_deserializer=ppb.PublishAck.FromString)(metadata=zstream.OFFER)
            assert zstream.accepted(await call.initial_metadata())
            await call.write(zstream.wrap(compressor.block(request(2).SerializeToString())))
            ack = await asyncio.wait_for(call.read(), 10)
            assert ack.zstd and not ppb.PublishAck.FromString(decompressor.message(ack.zstd)).code
            await call.done_writing()
        m = await watcher.next(timeout=10)
        assert m.attributes["i"] == 2  # the bad request's event never went out
        with pytest.raises(Exception):
            await watcher.next(timeout=0.5)
        await wait_for(lambda: c.agent_nodes[0].pubsub.compressed.open == 0, what="counts released")
    finally:
        await c.stop()


@pytest.mark.timeout(60)
async def test_past_the_bound_a_stream_that_offers_stays_plain_and_works():
    c = Cluster(agents=1, matchers=1, agent_kwargs={"max_compressed_streams": 1})
    try:
        await c.start()
        await c.client(0).create_topic("t", ["n:int:0:99", "i:int"])
        sub = compressed_client(c, 0).subscribe("t", max_outstanding=1000)
        await sub.start()  # takes the one compressed stream
        assert c.agent_nodes[0].pubsub.compressed.open == 1
        async with grpc.aio.insecure_channel(c.agent_nodes[0].address) as ch:
            call = ch.stream_stream(PUBLISH, response_deserializer=ppb.PublishAck.FromString)(metadata=zstream.OFFER)
            await call.write(request(1).SerializeToString())
            ack = await asyncio.wait_for(call.read(), 10)
            assert not zstream.accepted(await call.initial_metadata() or ())  # sent with the first ack
            assert not ack.zstd and not ack.code and ack.sequence == 1  # plain
            await call.done_writing()
        # The SDK past the bound: plain, and it works.
        publisher = compressed_client(c, 0).publisher()
        await publisher.publish("t", {"n": 2, "i": 2})
        assert c.agent_nodes[0].pubsub.compressed.open == 1
        assert [(await sub.next(timeout=10)).attributes["i"] for _ in range(2)] == [1, 2]
        await sub.close()
        await wait_for(lambda: c.agent_nodes[0].pubsub.compressed.open == 0, what="the count released")
    finally:
        await c.stop()


def test_compress_without_zstd_names_the_extra(monkeypatch):
    from echelon.client import errors

    monkeypatch.setattr(zstream, "zstd", None)
    with pytest.raises(errors.FailedPrecondition, match=r"echelon-pubsub\[zstd\]"):
        Client("127.0.0.1:1", compress=True)


@pytest.mark.timeout(90)
async def test_a_durable_subscription_relayed_to_its_holder_arrives_compressed(tmp_path, monkeypatch):
    """Through an agent that does not hold it (durable/rpc.py relays the stream): the
    relaying agent accepts, its holder's initial metadata goes on with ACCEPT added, and
    what it relays goes compressed."""
    from echelon.core.durability import holders
    from echelon.v1.membership_pb2 import ROLE_AGENT

    c = Cluster(agents=0, matchers=1)
    try:
        await c.start()
        for i in range(3):
            await c.add_agent(i, data_dir=str(tmp_path / f"agent-{i}"))
        await wait_for(lambda: all(len(a.membership.alive(ROLE_AGENT)) == 3 for a in c.agent_nodes),
                       what="every agent sees every agent")
        ids = [a.config.id for a in c.agent_nodes]
        name = "d0"
        other = next(i for i, a in enumerate(ids) if a not in holders(name, ids, 2))
        await c.client(0).create_topic("t", ["n:int:0:99", "i:int"])
        wrapped = []  # the messages the agents compressed on client streams (agent/pubsub.py's compressor())
        from echelon.agent import pubsub

        def counting(made=pubsub.compressor):
            block = made()
            return lambda data: wrapped.append(data) or block(data)

        monkeypatch.setattr(pubsub, "compressor", counting)
        sub = compressed_client(c, other).subscribe("t", name=name, durable=True, max_outstanding=100)
        await sub.start()
        assert c.agent_nodes[other].pubsub.compressed.open == 1  # the relaying agent accepted
        assert all(c.agent_nodes[i].pubsub.compressed.open == 0 for i in range(3) if i != other)
        publisher = c.client(other).publisher()
        for i in range(20):
            await publisher.publish("t", {"n": 1, "i": i})
        assert [x[1] for x in await received(sub, 20)] == list(range(20))
        deliveries = [d for m in wrapped for d in (ppb.Delivery.FromString(m).batch or [ppb.Delivery.FromString(m)])
                      if d.delivery_id]
        assert len(deliveries) == 20  # every delivery went compressed
        await sub.close()
        await wait_for(lambda: c.agent_nodes[other].pubsub.compressed.open == 0, what="the count released")
    finally:
        await c.stop()
