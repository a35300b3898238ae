"""Messages sent as bytes put together from serialized parts (runtime.wire.length_delimited:
the agent's Match requests and the root's whole events), against protobuf's own
serialization of the same message as the oracle."""

from echelon.agent.matching import EVENTS_TAG
from echelon.agent.root import PAYLOAD_TAG, encode
from echelon.runtime.wire import attributes_to_pb, length_delimited
from echelon.v1 import common_pb2 as pb
from echelon.v1 import matcher_pb2 as xpb

SIZES = [0, 1, 127, 128, 300, 16383, 16384, 2_097_152]  # each side of every varint length boundary


def event(i: int) -> pb.Event:
    e = pb.Event(topic="t", attributes=attributes_to_pb({"x": i, "s": "a" * i}), ordering_key=str(i % 3))
    e.id.producer_id, e.id.sequence = "p", i
    return e


def test_a_length_delimited_field_is_what_protobuf_writes():
    for n in SIZES:
        payload = bytes(range(256)) * (n // 256) + bytes(n % 256)
        field = length_delimited(PAYLOAD_TAG, payload)
        assert pb.Event.FromString(field) == pb.Event(payload=payload)
        if n:  # protobuf leaves an empty field out
            assert field == pb.Event(payload=payload).SerializeToString()


def test_a_match_request_from_serialized_events_parses_as_the_one_built():
    events = [event(i) for i in range(0, 400, 7)]
    built = xpb.MatchRequest(batch_id=9, agents_only=True, events=events)
    joined = xpb.MatchRequest(batch_id=9, agents_only=True).SerializeToString() + \
        b"".join(length_delimited(EVENTS_TAG, e.SerializeToString()) for e in events)
    assert xpb.MatchRequest.FromString(joined) == built


def test_the_roots_bytes_are_the_event_with_its_payload_whether_serialized_before_or_not():
    for n in SIZES[:6]:
        e, payload = event(n), b"\x07" * n
        whole = pb.Event()
        whole.CopyFrom(e)
        whole.payload = payload
        assert pb.Event.FromString(encode(e, payload)) == whole
        assert encode(e, payload, e.SerializeToString()) == encode(e, payload)
