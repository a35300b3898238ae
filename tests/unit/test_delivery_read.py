"""DeliveryRead (protos/echelon/v1/pubsub.proto) mirrors Delivery field for field, and
reads the bytes an agent puts in `encoded_event` as the Event they encode."""

from echelon.client.message import Message, event_of
from echelon.contract.wire import attributes_to_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import pubsub_pb2 as ppb


def test_delivery_read_mirrors_delivery():
    sent, read = ppb.Delivery.DESCRIPTOR, ppb.DeliveryRead.DESCRIPTOR
    fields = {f.number: (f.name, f.is_repeated) for f in sent.fields}
    assert {f.number: (f.name, f.is_repeated) for f in read.fields} == fields
    for f in sent.fields:
        g = read.fields_by_number[f.number]
        if f.name == "encoded_event":
            assert (f.type, g.type, g.message_type) == (f.TYPE_BYTES, g.TYPE_MESSAGE, pb.Event.DESCRIPTOR)
        elif f.name == "batch":
            assert (f.message_type, g.message_type) == (sent, read)
        else:
            assert (g.type, g.message_type) == (f.type, f.message_type), f.name


def test_encoded_events_are_read_with_their_delivery():
    events = [pb.Event(id=pb.MessageId(producer_id="p", sequence=i), topic="t", payload=bytes([i]) * i,
                       attributes=attributes_to_pb({"n": i, "s": "x" * i}), publish_time_unix_nanos=i)
              for i in range(1, 5)]
    out = ppb.Delivery()
    for i, e in enumerate(events):
        d = out.batch.add(delivery_id=i + 1, sid=3)
        if i % 2:
            d.encoded_event = e.SerializeToString()  # relayed: the root's bytes
        else:
            d.event.CopyFrom(e)  # delivered where it was published: a message
    read = ppb.DeliveryRead.FromString(out.SerializeToString())
    assert [event_of(d) for d in read.batch] == events
    assert [(m.payload, m.attributes, m.sequence) for m in (Message(d, None) for d in read.batch)] == \
        [(e.payload, {"n": e.id.sequence, "s": "x" * e.id.sequence}, e.id.sequence) for e in events]
