"""Precise refusals through real servers (docs/guarantees.md, "Bad input"): a filter whose predicates have no
common value, a (producer, sequence) reused for a different event, attributes over the
topic's size limits. Each refusal changes nothing: no subscription held, nothing
delivered."""

from __future__ import annotations

import grpc
import pytest

from echelon.client import errors
from echelon.contract.schema import Attribute, AttrType, Schema
from echelon.contract.wire import attributes_to_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc
from tests.integration.test_pubsub import drain


async def publish_raw(address: str, requests: list[ppb.PublishRequest]) -> list[ppb.PublishAck]:
    """One Publish stream carrying `requests` as given (ids set by the caller)."""
    async with grpc.aio.insecure_channel(address) as ch:
        call = pgrpc.PubSubStub(ch).Publish(iter(requests))
        return [ack async for ack in call]


def request(seq: int, attrs: dict, payload: bytes = b"") -> ppb.PublishRequest:
    return ppb.PublishRequest(topic="t", attributes=attributes_to_pb(attrs), payload=payload, producer_id="dup",
                              sequence=seq)


async def test_unsatisfiable_filter_is_refused_naming_the_attribute(cluster):
    c = cluster.client(1)
    await c.create_topic("t", ["High:float:0:500", "Symbol:string:8"])
    for text, needle in [("High > 10 and High < 5", "'High': predicates `High > 10 and High < 5` have no value"),
                         ('Symbol = "aaaaaaaaa"', "'Symbol'")]:
        with pytest.raises(errors.InvalidArgument) as err:
            await c.subscribe("t", text).start()
        assert needle in err.value.message
    assert cluster.agent_nodes[1].subs == {} and len(cluster.matcher_nodes[0].tier.store) == 0


async def test_a_reused_id_is_a_duplicate_for_the_same_event_and_refused_for_another(cluster):
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("t")
    agent = cluster.agent_nodes[0]
    async with c1.subscribe("t", "") as sub:
        acks = await publish_raw(agent.address, [request(1, {"n": 1}, b"p"), request(1, {"n": 1}, b"p"),
                                                 request(1, {"n": 2}, b"p"), request(1, {"n": 1}, b"other"),
                                                 request(2, {"n": 2})])
        assert [(a.code, a.duplicate, a.destinations) for a in acks] == [
            (0, False, 1), (0, True, 1), (grpc.StatusCode.ALREADY_EXISTS.value[0], False, 0),
            (grpc.StatusCode.ALREADY_EXISTS.value[0], False, 0), (0, False, 1)]
        assert "dup:1 was already used for a different event" in acks[2].error
        # Later, on another stream: still a duplicate (the window outlives the stream).
        (again,) = await publish_raw(agent.address, [request(2, {"n": 2})])
        assert again.code == 0 and again.duplicate and again.destinations == 1
        got = await drain(sub)
    assert [(m.sequence, m.attributes, m.payload) for m in got] == [(1, {"n": 1}, b"p"), (2, {"n": 2}, b"")]
    results = {s.labels["result"]: s.value for m in agent.metrics.published.collect() for s in m.samples
               if s.name.endswith("_total")}
    assert results == {"ok": 2, "duplicate": 2, "already_exists": 2}


async def test_a_failed_publish_does_not_use_up_its_id(cluster):
    c0 = cluster.client(0)
    await c0.create_topic("t", ["n:int:0:9"])
    acks = await publish_raw(cluster.agent_nodes[0].address, [request(1, {"n": 10}), request(1, {"n": 1})])
    assert acks[0].code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and (acks[1].code, acks[1].duplicate) == (0, False)


async def test_attribute_sizes_are_bounded(cluster):
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("t", Schema((Attribute("Symbol", AttrType.STRING, max_length=8),
                                       Attribute("Note", AttrType.STRING)), max_attribute_bytes=1000))
    await c0.create_topic("free")
    address = cluster.agent_nodes[0].address
    async with c1.subscribe("t", "") as sub:
        cases = [({"Symbol": "x" * (1 << 20)}, "'Symbol': string of 1048576 bytes is longer than the limit of 8"),
                 ({"Note": "x" * 1025}, "'Note': string of 1025 bytes is longer than the limit of 1024"),
                 ({"Symbol": "x" * 8, "Note": "y" * 1000}, "take 1018 bytes, over the topic's limit of 1000")]
        acks = await publish_raw(address, [ppb.PublishRequest(topic="t", attributes=attributes_to_pb(a))
                                           for a, _ in cases])
        for ack, (_, needle) in zip(acks, cases):
            assert ack.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and needle in ack.error, ack.error
        (ok,) = await publish_raw(address, [ppb.PublishRequest(topic="t", attributes=attributes_to_pb(
            {"Symbol": "x" * 8, "Note": "y" * 982}))])  # 6 + 8 + 4 + 982 = 1000 bytes: at the limit
        assert ok.code == 0
        assert [m.attributes["Symbol"] for m in await drain(sub)] == ["x" * 8]
    big = {f"k{i}": "v" * 1000 for i in range(70)}  # 70 * 1002 bytes > 64 KiB, on a schemaless topic
    (ack,) = await publish_raw(address, [ppb.PublishRequest(topic="free", attributes=attributes_to_pb(big))])
    assert ack.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "over the topic's limit of 65536" in ack.error
    spec = pb.AttributeSpec(name="s", type=pb.ATTRIBUTE_TYPE_STRING, max_length=1 << 20)
    async with grpc.aio.insecure_channel(address) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pgrpc.AdminStub(ch).CreateTopic(ppb.CreateTopicRequest(name="bad", schema=pb.Schema(attributes=[spec])))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_length 1048576: 1 to 65536" in err.value.details()


async def test_a_recreated_topic_is_validated_with_its_new_schema(cluster):
    """The agent caches parsed schemas by topic version (creation time): a topic deleted and
    created again with another schema is checked against the new one."""
    c0 = cluster.client(0)
    address = cluster.agent_nodes[0].address
    await c0.create_topic("t", ["n:int:0:9"])
    assert [a.code for a in await publish_raw(address, [request(1, {"n": 1})])] == [0]
    await c0.delete_topic("t")
    await c0.create_topic("t", ["s:string"])
    acks = await publish_raw(address, [request(2, {"s": "x"}), request(3, {"n": 1})])
    assert acks[0].code == 0
    assert acks[1].code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "'n': unknown attribute" in acks[1].error
