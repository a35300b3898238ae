"""Messages sent as bytes put together from serialized parts (contract.wire.length_delimited:
the agent's Match requests and the root's whole events; agent.frames: relay frames), against
protobuf's own serialization of the same message as the oracle."""

from echelon.dataplane.frames import OutFrame, destinations, peek, whole_tail
from echelon.agent.matching import EVENTS_TAG
from echelon.dataplane.root import PAYLOAD_TAG, encode, encode_all
from echelon.contract.wire import attributes_to_pb, length_delimited, varint
from echelon.v1 import common_pb2 as pb
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import relay_pb2 as rpb

# Each side of every varint length boundary, and of wire.varint's table.
SIZES = [0, 1, 127, 128, 300, 4095, 4096, 16383, 16384, 2_097_152]


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
    for n in SIZES[:8]:
        e, payload = event(n), b"\x07" * n
        whole = pb.Event()
        whole.CopyFrom(e)
        whole.payload = payload
        assert pb.Event.FromString(encode(e, payload)) == whole
        assert encode(e, payload, e.SerializeToString()) == encode(e, payload)


def test_a_batchs_bytes_are_each_event_with_its_payload():
    """`encode_all` in C (payloads of 1 to 4,095 bytes) and event by event (an empty payload,
    a longer one, one still arriving: its event alone) gives what `encode` gives."""
    events = [event(n) for n in SIZES]
    encoded = [e.SerializeToString() for e in events]
    short = [b"\x07" * n for n in (1, 127, 128, 300, 4095)]
    assert encode_all(encoded[:5], short) == [encode(e, p) for e, p in zip(events, short)]
    mixed = [b"\x07" * n for n in SIZES[:8]]
    assert encode_all(encoded[:8], mixed) == [encode(e, p) for e, p in zip(events, mixed)]
    arriving = object()
    assert encode_all(encoded[:2], [b"x", arriving]) == [encode(events[0], b"x"), encoded[1]]
    assert encode_all([], []) == []


def test_a_frame_built_as_bytes_is_the_relay_frame_protobuf_writes():
    """Whole messages and slices, destination lists of 0-3 ids, events and bodies on each side
    of the varint length boundaries; numbered, and two frames side by side parse as one (their
    messages in order, the last seq)."""
    frames, built = [], []
    for k, seq in enumerate((1, 300, 2**40)):
        out = OutFrame(f"agent-{k}", f"127.0.0.1:{7000 + k}", ack_may_wait=bool(k % 2))
        oracle = rpb.RelayFrame(seq=seq, source=out.source, source_key=out.source_key, ack_may_wait=out.ack_may_wait)
        for i, n in enumerate(SIZES[:6]):
            ds = [f"agent-{j}" for j in range(i % 4)]
            data = event(n).SerializeToString()
            out.add_whole(whole_tail(ds), data)
            oracle.messages.add(destinations=ds, encoded_event=data)
            piece = rpb.RelayMessage(event=pb.Event(payload=b"s" * n), slice_index=i, slice_count=9, stripe=3)
            out.add_message(destinations(ds), piece.SerializeToString())
            oracle.messages.add().CopyFrom(piece)
            oracle.messages[-1].destinations.extend(ds)
        wire = b"".join(out.data(seq))
        assert rpb.RelayFrame.FromString(wire) == oracle  # (the header's fields first: other bytes, the same frame)
        assert out.size == len(wire) - len(out.data(seq)[0])
        assert list(out.messages) == list(oracle.messages)
        frames.append(wire)
        built.append(oracle)
    merged = rpb.RelayFrame.FromString(frames[1] + frames[2])  # as a link merges frames
    assert list(merged.messages) == list(built[1].messages) + list(built[2].messages) and merged.seq == 2**40


def test_peek_reads_the_key_and_topic_a_decode_reads_or_declines():
    for n in SIZES[:8]:
        for topic in ("t", "x" * 127, "y" * 128):
            e = event(n)
            e.topic = topic
            e.id.producer_id = "p" * (n % 200)
            data = e.SerializeToString()
            front = peek(data)
            short = len(e.id.SerializeToString()) < 128 and len(topic.encode()) < 128
            assert (front is not None) == short
            if front is not None:
                assert front == (e.id.SerializeToString(), topic)
    assert peek(pb.Event(topic="t").SerializeToString()) is None  # no id: decoded instead
    assert peek(b"") is None and peek(b"\x0a\x01\x0a") is None


def test_the_generated_tags_are_the_descriptors_numbers():
    """echelon.v1.tags (written by `make proto` from protoc's descriptor set) against the
    descriptors the generated messages carry, for every field of every message."""
    from google.protobuf.descriptor import FieldDescriptor as F

    from echelon.v1 import common_pb2, durable_pb2, membership_pb2, pubsub_pb2, router_pb2, tags

    def wire(f) -> int:
        if f.is_repeated and f.type not in (F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_MESSAGE):
            return 2
        return {F.TYPE_DOUBLE: 1, F.TYPE_FIXED64: 1, F.TYPE_SFIXED64: 1, F.TYPE_FLOAT: 5, F.TYPE_FIXED32: 5,
                F.TYPE_SFIXED32: 5, F.TYPE_STRING: 2, F.TYPE_BYTES: 2, F.TYPE_MESSAGE: 2}.get(f.type, 0)

    def check(descriptor, cls) -> int:
        n = 0
        for f in descriptor.fields:
            assert getattr(cls, f.name) == f.number << 3 | wire(f), f.full_name
            n += 1
        for nested in descriptor.nested_types:
            n += check(nested, getattr(cls, nested.name))
        return n

    count = 0
    for module in (common_pb2, durable_pb2, xpb, membership_pb2, pubsub_pb2, rpb, router_pb2):
        for name, descriptor in module.DESCRIPTOR.message_types_by_name.items():
            count += check(descriptor, getattr(tags, name))
    assert count > 200
    # The hand-written encoders' tags, one by one, against protobuf's own writing of the field.
    assert pb.Event(payload=b"x").SerializeToString()[:1] == bytes((tags.Event.payload,))
    assert rpb.RelayMessage(encoded_event=b"x").SerializeToString()[:2] == varint(tags.RelayMessage.encoded_event)
