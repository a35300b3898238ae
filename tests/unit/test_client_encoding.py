"""The publisher's wire bytes (client/encoding.py) against upb: every event, batch and lone
request parses to the message upb builds from the same input (compared as upb's
deterministic serialization, so NaN and -0.0 count), with the caches cold, warm and
emptied; a value upb refuses is refused with the same exception type."""

from __future__ import annotations

import enum
import random

import pytest

from echelon.client import encoding
from echelon.client.encoding import Encoder
from echelon.contract.errors import InvalidArgument
from echelon.contract.wire import attributes_into_pb, varint
from echelon.v1 import pubsub_pb2 as ppb


class Level(enum.IntEnum):
    HIGH = 7


class Name(str):
    pass


class Ratio(float):
    pass


VALUES = [0, 1, -1, 127, 128, 300, -(1 << 63), (1 << 63) - 1, 0.0, -0.0, 1.5, -2.25e300, float("inf"),
          float("-inf"), float("nan"), "", "a", "ünï", "x" * 200, Level.HIGH, Name("sub"), Ratio(0.5)]
NAMES = ["Symbol", "Price", "", "ñame", "n" * 150]


def upb_event(topic, attributes, payload, ordering_key, seq) -> ppb.PublishRequest:
    req = ppb.PublishRequest(topic=topic, payload=payload, ordering_key=ordering_key, sequence=seq)
    attributes_into_pb(attributes, req.attributes)
    return req


def same(wire: bytes, expected: ppb.PublishRequest) -> bool:
    return ppb.PublishRequest.FromString(wire).SerializeToString(deterministic=True) == \
        expected.SerializeToString(deterministic=True)


def test_varints_are_protobufs():
    for n in [0, 1, 127, 128, 255, 16383, 16384, 2097151, 2097152, 1 << 35, (1 << 64) - 1]:
        assert ppb.PublishRequest.FromString(b"\x30" + varint(n)).sequence == n


@pytest.mark.parametrize("cached", [encoding.CACHED, 3])
def test_events_batches_and_lone_requests_parse_to_what_upb_builds(monkeypatch, cached):
    monkeypatch.setattr(encoding, "CACHED", cached)  # 3: the caches emptied again and again
    rng = random.Random(12)
    enc = Encoder("producer-ü", ppb.ACK_LEVEL_DELIVERED)
    events, expected = [], []
    for seq in [1, 2, 127, 128, 129, 1 << 20, (1 << 63) + 5] + [rng.randrange(1, 1 << 40) for _ in range(300)]:
        names = rng.sample(NAMES, rng.randrange(0, 4))
        attributes = {n: rng.choice(VALUES) for n in names}
        topic = rng.choice(["quotes", "t", "ñ" * 70, ""])
        payload = rng.choice([b"", b"\x00", bytes(range(256)) * rng.randrange(1, 80)])
        key = rng.choice(["", "", "k", "ключ"])
        wire = enc.event(topic, attributes, payload, key, seq)
        want = upb_event(topic, attributes, payload, key, seq)
        assert same(wire, want), (topic, attributes, payload[:8], key, seq)
        events.append(wire)
        expected.append(want)
    batch = ppb.PublishRequest(producer_id="producer-ü", ack_level=ppb.ACK_LEVEL_DELIVERED, coalesce_acks=True,
                               lean_acks=True, batch=expected)
    assert same(enc.request(events), batch)
    lone = ppb.PublishRequest()
    lone.CopyFrom(expected[0])
    lone.producer_id, lone.ack_level, lone.coalesce_acks = "producer-ü", ppb.ACK_LEVEL_DELIVERED, True
    lone.lean_acks = True
    assert same(enc.alone(events[0]), lone)


@pytest.mark.parametrize("attributes, error", [
    ({"b": True}, InvalidArgument), ({"n": None}, InvalidArgument), ({"l": [1]}, InvalidArgument),
    ({"i": 1 << 63}, ValueError), ({"i": -(1 << 63) - 1}, ValueError), ({"s": "\ud800"}, UnicodeEncodeError),
    ({"k\ud800": 1}, UnicodeEncodeError), ({1: 2}, TypeError), ({1: 2.0}, TypeError), ({1: "x"}, TypeError),
])
def test_a_value_upb_refuses_is_refused_alike(attributes, error):
    with pytest.raises(error):
        upb_event("t", attributes, b"", "", 1)
    with pytest.raises(error):
        Encoder("p", 1).event("t", attributes, b"", "", 1)
