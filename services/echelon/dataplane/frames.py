"""Relay frames as bytes (relay.proto's RelayFrame, written field by field; docs/event-path.md, step 3).

A frame leaves a node as the concatenation of its header's bytes and, per message, the
message's field: no RelayMessage built per event and per target, no frame serialized
again (far cheaper per copy than adding the messages to a RelayFrame). A whole message
is its destinations' bytes (one per target, shared by every message to it) and the
root's event bytes as they came; a slice is its own message, serialized. The frame is
parsed back only when it must be re-routed (`messages`), which is rare.

`peek` reads a whole message's key and topic off the front of the root's bytes, so an
inner relay forwards a message without decoding it (the root serializes the Event's
fields in field-number order: its id, then its topic).
"""

from __future__ import annotations

from echelon.contract.wire import varint
from echelon.v1 import common_pb2 as pb
from echelon.v1 import relay_pb2 as rpb
from echelon.v1.tags import Event, RelayFrame, RelayMessage

_MESSAGE = varint(RelayFrame.messages)
_ENCODED = varint(RelayMessage.encoded_event)
_DESTINATION = varint(RelayMessage.destinations)
_SEQ = varint(RelayFrame.seq)
# `peek` and `key_of` read an Event's id and topic off the front of its bytes by their tags,
# which must stay one byte each (field numbers below 16).
_ID, _TOPIC = Event.id, Event.topic
assert _ID < 0x80 and _TOPIC < 0x80, "Event.id and Event.topic must keep one-byte tags (frames.peek)"
_ID_TAG = bytes((_ID,))


def destinations(ds: list[str]) -> bytes:
    """RelayMessage.destinations' bytes."""
    return b"".join([_DESTINATION + varint(len(b)) + b for b in (d.encode() for d in ds)])


def whole_tail(ds: list[str]) -> bytes:
    """What a whole message's bytes start with after their length: its destinations and the
    encoded event's tag (one per target, shared by every message to it)."""
    return destinations(ds) + _ENCODED


class OutFrame:
    """A frame being sent: its header's fields (read by the link, which merges frames of
    one source and ack policy) and its bytes in pieces, joined once when written."""

    __slots__ = ("source", "source_key", "ack_may_wait", "parts", "ordered")

    def __init__(self, source: str, source_key: str, ack_may_wait: bool = False):
        self.source, self.source_key, self.ack_may_wait = source, source_key, ack_may_wait
        self.ordered = False  # carries a message of the first stripe, which sets the order (dissemination.py)
        self.parts = [rpb.RelayFrame(source=source, source_key=source_key, ack_may_wait=ack_may_wait).SerializeToString()]

    def add_whole(self, tail: bytes, data: bytes) -> None:
        """A whole message: `tail` from `whole_tail`, `data` the root's event bytes."""
        length = varint(len(data))
        self.parts += (b"%b%b%b%b" % (_MESSAGE, varint(len(tail) + len(length) + len(data)), tail, length), data)

    def add_message(self, dests: bytes, body: bytes) -> None:
        """A message serialized without its destinations (a slice): `dests` from `destinations`."""
        self.parts += (_MESSAGE + varint(len(dests) + len(body)) + dests, body)

    @property
    def size(self) -> int:
        """Bytes, without the seq."""
        return sum(map(len, self.parts))

    def data(self, seq: int) -> list[bytes]:
        """The frame's bytes as pieces, numbered `seq`."""
        return [_SEQ + varint(seq), *self.parts]

    @property
    def messages(self):
        """The frame's messages, parsed back (re-routing, tests)."""
        return rpb.RelayFrame.FromString(b"".join(self.parts)).messages


def id_key(producer_id: str, sequence: int) -> bytes:
    """The key of the message (producer_id, sequence) as `peek` reads it off the root's
    bytes: its id serialized (the agent's dedup window's key too, delivery.py)."""
    return pb.MessageId(producer_id=producer_id, sequence=sequence).SerializeToString()


def key_of(data: bytes, event: pb.Event) -> bytes:
    """A whole message's key (its id's bytes, the dedup window's and the holds'): read off
    the front of the root's bytes as `peek` reads it (a fifth of the cost of reading the
    decoded id's fields), else the decoded id serialized (b"" data: none received)."""
    if data[:1] == _ID_TAG and data[1] < 0x80 and len(data) >= data[1] + 2:
        return data[2:data[1] + 2]
    return event.id.SerializeToString()


def peek(data: bytes) -> tuple[bytes, str] | None:
    """A whole message's key (its Event's serialized id) and topic from the front of the
    root's bytes; None when they are not laid out as the root writes them (decode it)."""
    if len(data) > 4 and data[0] == _ID and data[1] < 0x80:
        n = data[1] + 2
        if len(data) > n + 1 and data[n] == _TOPIC and data[n + 1] < 0x80:
            return data[2:n], data[n + 2:n + 2 + data[n + 1]].decode()
    return None


def slice_body(msg: rpb.RelayMessage) -> bytes:
    """A message sent as its own (a slice): serialized without its destinations (each
    copy's go in front)."""
    if msg.destinations:
        copy = rpb.RelayMessage()
        copy.CopyFrom(msg)
        copy.ClearField("destinations")
        msg = copy
    return msg.SerializeToString()
