"""Delivery messages written as bytes (pubsub.proto's `Delivery`, field by field; docs/event-path.md, step 6).

A shared stream's message carries many deliveries (shared_stream.py). Built as protobuf
objects, each was an element added, four fields set (the event's bytes copied in) and
the whole serialized again. Written here, each is its fields' bytes in field-number
order, as protobuf serializes them, around the event's bytes as received: the client
reads exactly what the protobuf-built message was (tests/unit/test_delivery_bytes.py
holds them equal on random deliveries), so no client changes.
"""

from __future__ import annotations

from echelon.contract.wire import varint
from echelon.v1.tags import Delivery

ID = varint(Delivery.delivery_id)
_REDELIVERY = varint(Delivery.redelivery_count)
ENCODED = varint(Delivery.encoded_event)
_BATCH = varint(Delivery.batch)


# A delivery id's field, written inline by the shared stream (shared_stream.py `_fill`):
# its tag and low 7 bits' byte (LOW, or ALONE below 128), then the varint of the rest,
# which consecutive ids share. Ids grow without bound, past varint's table.
LOW = [ID + bytes((n | 0x80,)) for n in range(0x80)]
ALONE = [ID + bytes((n,)) for n in range(0x80)]


def names(subscription: str, sid: int) -> tuple[bytes, bytes]:
    """A subscription's own fields of each of its deliveries: `subscription`'s bytes and
    `sid`'s, which `redelivery_count` goes between (empty when unset, as protobuf omits them)."""
    name = subscription.encode()
    return (varint(Delivery.subscription) + varint(len(name)) + name if name else b"",
            varint(Delivery.sid) + varint(sid) if sid else b"")


def element(delivery_id: int, named: tuple[bytes, bytes], redeliveries: int, data: bytes) -> bytes:
    """One delivery of the encoded event `data` (non-empty) by a subscription of `names`."""
    head = ID + varint(delivery_id) if delivery_id else b""
    middle = named[0] + _REDELIVERY + varint(redeliveries) + named[1] if redeliveries else named[0] + named[1]
    return b"%b%b%b%b%b" % (head, middle, ENCODED, varint(len(data)), data)


def batch(elements: list[bytes]) -> bytes:
    """A Delivery whose `batch` is the deliveries `elements` (each one's bytes), in order."""
    return b"".join([b"%b%b%b" % (_BATCH, varint(len(e)), e) for e in elements])
