"""Delivery messages written as bytes (agent/delivery_bytes.py, shared_stream.py `_fill`)
are byte for byte what protobuf serializes for the same fields, on random deliveries:
the client reads them as before (tests/integration/test_previous_contract.py runs the
previous clients against the agents)."""

from __future__ import annotations

import random
from collections import deque
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from echelon.agent import delivery_bytes
from echelon.agent.metrics import AgentMetrics
from echelon.agent.shared_stream import SharedStream
from echelon.agent.subscriptions import Pending, Subscription
from echelon.contract.filters import parse
from echelon.v1 import common_pb2 as pb
from echelon.v1 import pubsub_pb2 as ppb

_MAGNITUDES = [1, 0x7F, 0x80, 4095, 4096, 0x3FFF, 0x4000, 0x1FFFFF, 0x200000, 2**35, 2**63]


def _event(rnd: random.Random) -> pb.Event:
    e = pb.Event(id=pb.MessageId(producer_id=rnd.choice(["p", "p-Ab3dE_9x", "é" * 40]), sequence=rnd.randrange(2**40)),
                 topic=rnd.choice(["t", "bench", "x" * 300]), publish_time_unix_nanos=rnd.randrange(2**62),
                 payload=rnd.randbytes(rnd.choice([0, 16, 200, 5000])))
    e.attributes["Price"].float_value = rnd.random()
    return e


def _id(rnd: random.Random) -> int:
    return max(1, rnd.choice(_MAGNITUDES) + rnd.randint(-3, 3))


def test_one_delivery_and_a_batch_are_protobufs_bytes():
    rnd = random.Random(5)
    for trial in range(2000):
        name = rnd.choice(["", "~s", "orders", "ü" * 70])
        sid = rnd.choice([0, 1, 127, 128, 2**32 - 1])
        elements, expected = [], []
        for _ in range(rnd.choice([1, 2, 17])):
            delivery_id, redeliveries = rnd.choice([0, _id(rnd)]), rnd.choice([0, 0, 1, 300])
            data = _event(rnd).SerializeToString()
            elements.append(delivery_bytes.element(delivery_id, delivery_bytes.names(name, sid), redeliveries, data))
            expected.append(ppb.Delivery(delivery_id=delivery_id, subscription=name, sid=sid,
                                         redelivery_count=redeliveries, encoded_event=data))
        assert elements[0] == expected[0].SerializeToString(), trial
        assert delivery_bytes.batch(elements) == ppb.Delivery(batch=expected).SerializeToString(), trial


def _stream(subs: dict[int, Subscription], encoded: bool, room: int) -> SharedStream:
    stream = SharedStream.__new__(SharedStream)  # the writer's part alone: no gRPC stream under it
    metrics = AgentMetrics(CollectorRegistry())
    stream.metrics, stream.max_deliveries, stream.statuses, stream._turn = metrics, room, deque(), 0
    stream.encoded, stream._counted, stream._named, stream.subs = encoded, {}, {}, subs
    stream.node = SimpleNamespace(metrics=metrics)
    return stream


def test_a_shared_streams_message_is_what_protobuf_built():
    """`_fill` on random backlogs (bytes as received or events alone, redeliveries, ids of
    every varint length, a client reading encoded events or not, statuses first): each
    delivery's bytes are the Delivery protobuf builds of the same taken delivery."""
    rnd = random.Random(9)
    for trial in range(300):
        subs = {}
        for sid in rnd.sample(range(1, 300), rnd.randint(1, 5)):
            sub = subs[sid] = Subscription(f"a/{sid}", rnd.choice(["~x", f"n{sid}", "ü" * 20]), "t", parse(""), 10**6)
            sub.attach(rnd.randint(0, 40))
            sub._next_id = sub._unsettled = _id(rnd)
            for _ in range(rnd.randint(0, 30)):
                e = _event(rnd)
                p = Pending(e, rnd.choice([0, 0, 0, 1, 2]), None, rnd.choice([b"", e.SerializeToString()]))
                sub.backlog.append(p)
        stream = _stream(subs, rnd.random() < 0.8, rnd.choice([1, 7, 256]))
        statuses = [ppb.Delivery(sid=1, opened="a/1"), ppb.Delivery(sid=2, code=5, error="gone")][:rnd.randint(0, 2)]
        stream.statuses.extend(statuses)
        out, sliced, _ = stream._fill()
        assert sliced is None
        assert out[:len(statuses)] == [s.SerializeToString() for s in statuses], trial
        taken = out[len(statuses):]
        assert len(taken) == sum(len(s.unacked) for s in subs.values()), trial
        for raw in taken:
            got = ppb.Delivery.FromString(raw)
            sub = subs[got.sid]
            p = sub.unacked[got.delivery_id]
            want = ppb.Delivery(delivery_id=got.delivery_id, subscription=sub.name, sid=got.sid,
                                redelivery_count=p.redeliveries)
            p.into(want, stream.encoded)
            assert raw == want.SerializeToString(), trial
