"""One delivery as the application holds it (`Message`), and the sliced payloads a
subscription is receiving (`Sliced`, `_Incoming`), for client/subscription.py.

A Message wraps the Delivery it came in: its fields are read from it when
asked, and `attributes` is converted to Python values on first use, not for every
message received (an application that reads only the payload never pays for it). A
relayed event comes as the bytes the publishing agent serialized (`encoded_event`: the
subscriber's agent neither copies nor re-encodes it), read as an Event by the parse of
the whole Delivery (`subscribe_call`: DeliveryRead).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Callable

import grpc

from echelon.client.compressed import OFFER, reader
from echelon.client.errors import DataLoss, EchelonError, FailedPrecondition, InvalidArgument
from echelon.contract.schema import Value
from echelon.contract.wire import attributes_from_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import pubsub_pb2 as ppb

if TYPE_CHECKING:
    from echelon.client.subscription import Subscription

log = logging.getLogger("echelon.client")

SUBSCRIBE = f"/{ppb.DESCRIPTOR.services_by_name['PubSub'].full_name}/Subscribe"
MAX_NACK_DELAY = 600.0  # seconds; the agent refuses more
CHUNKS_AHEAD = 64  # chunks of a streamed payload received ahead of the application (64 KiB each by default)


class Message:
    """One delivery. Settle it with `ack()` or `nack(delay=...)`; the first settles, later calls do nothing."""

    __slots__ = ("_delivery", "_subscription", "_chunks", "_attributes", "_decoded", "delivery_id", "settled")

    def __init__(self, delivery: "ppb.DeliveryRead | _Incoming", subscription: "Subscription"):
        """`delivery`: as it came, or the head of a payload streamed to `chunks()`."""
        if type(delivery) is _Incoming:
            self._chunks = delivery
            delivery = delivery.head
        else:
            self._chunks = None
        self._delivery = delivery
        self._subscription = subscription
        self._attributes: dict[str, Value] | None = None
        self._decoded: pb.Event | None = None
        self.delivery_id: int = delivery.delivery_id
        self.settled = False

    @property
    def _event(self) -> pb.Event:
        event = self._decoded
        if event is None:  # event_of, inlined: once per message
            d = self._delivery
            event = self._decoded = d.encoded_event if d.HasField("encoded_event") else d.event
        return event

    @property
    def attributes(self) -> dict[str, Value]:
        if self._attributes is None:
            self._attributes = attributes_from_pb(self._event.attributes)
        return self._attributes

    @property
    def topic(self) -> str:
        return self._event.topic

    @property
    def payload(self) -> bytes:
        # The one field most applications read, without `_event`'s HasField: an unset
        # Event's payload is empty, so the other form's is the payload then.
        d = self._delivery
        return d.encoded_event.payload or d.event.payload

    @property
    def producer_id(self) -> str:
        return self._event.id.producer_id

    @property
    def sequence(self) -> int:
        return self._event.id.sequence

    @property
    def ordering_key(self) -> str:
        return self._event.ordering_key

    @property
    def redelivery_count(self) -> int:
        return self._delivery.redelivery_count

    @property
    def publish_time_ns(self) -> int:
        return self._event.publish_time_unix_nanos

    @property
    def payload_size(self) -> int:
        """Its payload's size (of a streamed payload too, whose `payload` is empty: read `chunks()`)."""
        return self._delivery.payload_size or len(self._event.payload)

    @property
    def streamed(self) -> bool:
        """Is the payload to be read with `chunks()` (it was above `max_whole`)?"""
        return self._chunks is not None

    def __repr__(self) -> str:
        return (f"Message(topic={self.topic!r}, attributes={self.attributes!r}, producer_id={self.producer_id!r}, "
                f"sequence={self.sequence}, redelivery_count={self.redelivery_count}, "
                f"payload_size={self.payload_size})")

    async def chunks(self):
        """The payload as it arrives, chunk by chunk (once); DataLoss if it was lost on
        the way (its publishing agent died, or this subscription fell behind)."""
        if self._chunks is None:
            if self.payload:
                yield self.payload
            return
        incoming = self._chunks
        if incoming.read:
            raise FailedPrecondition("a streamed payload's chunks can be read once")
        incoming.read = True
        while (item := await incoming.queue.get()) is not None:
            if isinstance(item, EchelonError):
                raise item
            yield item

    async def ack(self) -> None:
        """Processed: the agent forgets it and may send one more (queued for the stream at
        once, written with a later flush: client/acks.py; raises ClientClosed if the stream
        has ended). A streamed payload's unread chunks are dropped."""
        self._subscription._settle((self,), None)

    async def nack(self, delay: float = 0.0) -> None:
        """Not processed: the agent redelivers it after `delay` seconds (0 to 600)."""
        self._subscription._settle((self,), check_delay(delay))

    async def in_progress(self) -> None:
        """Still being worked on: its ack deadline starts again, at the agent (which is told)
        and here (client/deadlines.py)."""
        from echelon.client.deadlines import in_progress

        in_progress(self)

    async def term(self) -> None:
        """Never to be processed, nor redelivered: settled for good (the agent counts it
        terminated; an older agent takes it as an ack), and counted in the subscription's
        `terminated` (a poison message)."""
        sub = self._subscription
        if not self.settled and hasattr(sub, "terminated"):
            sub.terminated += 1
        sub._settle((self,), None, term=True)


def subscribe_call(channel: grpc.aio.Channel, compress: bool = False) -> grpc.aio.StreamStreamCall:
    """A Subscribe call whose Deliveries are read as DeliveryRead. `compress`: offering
    zstd, the agent's compressed Deliveries decoded (client/compressed.py)."""
    if not compress:
        return channel.stream_stream(SUBSCRIBE, request_serializer=ppb.SubscribeRequest.SerializeToString,
                                     response_deserializer=ppb.DeliveryRead.FromString)()
    return channel.stream_stream(SUBSCRIBE, request_serializer=ppb.SubscribeRequest.SerializeToString,
                                 response_deserializer=reader(ppb.DeliveryRead))(metadata=OFFER)


def event_of(d: ppb.DeliveryRead) -> pb.Event:
    """A delivery's event: as it came in the agent's bytes (`encoded_event`), or as a message."""
    return d.encoded_event if d.HasField("encoded_event") else d.event


def check_delay(delay: float) -> float:
    if not 0 <= delay <= MAX_NACK_DELAY:
        raise InvalidArgument(f"nack delay {delay}s: 0 to {MAX_NACK_DELAY:g}s")
    return delay


class _Incoming:
    """A sliced payload being received: assembled (`whole`), or queued for `chunks()`."""

    __slots__ = ("head", "whole", "parts", "queue", "read", "dropped")

    def __init__(self, head: ppb.DeliveryRead, whole: bool):
        self.head = head
        self.whole = whole
        self.parts: list[bytes] = []
        self.queue: asyncio.Queue = asyncio.Queue(CHUNKS_AHEAD)
        self.read = False
        self.dropped = False

    async def put(self, item) -> None:
        if not self.dropped:
            await self.queue.put(item)

    def drop(self) -> None:
        """Unread chunks are dropped, and so is what comes after (the reader is not held up)."""
        self.dropped = True
        while not self.queue.empty():
            self.queue.get_nowait()


class Sliced:
    """A subscription's sliced payloads being received, by delivery id (protos: Delivery):
    one up to `max_whole` bytes is assembled and handed whole, a larger one is handed at
    its head and read with `chunks()`."""

    def __init__(self, max_whole: int, hand: Callable[[object], None], lost: Callable[[int], None]):
        self.max_whole = max_whole
        self.hand = hand  # into the inbox: a Delivery (whole) or an _Incoming (streamed)
        self.lost = lost  # a payload lost before it was handed out: settled
        self.incoming: dict[int, _Incoming] = {}

    def __contains__(self, delivery_id: int) -> bool:
        return delivery_id in self.incoming

    async def receive(self, d: ppb.DeliveryRead) -> None:
        """A sliced payload's head or one of its pieces."""
        if d.chunked:
            incoming = self.incoming[d.delivery_id] = _Incoming(d, d.payload_size <= self.max_whole)
            if not incoming.whole:
                self.hand(incoming)
            return
        incoming = self.incoming[d.delivery_id]
        if d.chunk:
            if incoming.whole:
                incoming.parts.append(d.chunk)
            else:
                await incoming.put(d.chunk)  # waits while the application is CHUNKS_AHEAD behind
        if not (d.last or d.aborted):
            return
        del self.incoming[d.delivery_id]
        if not incoming.whole:
            await incoming.put(DataLoss(f"the payload was lost on its way: {d.aborted}") if d.aborted else None)
        elif d.aborted:
            log.warning("a %d-byte payload was lost on its way: %s", incoming.head.payload_size, d.aborted)
            self.lost(d.delivery_id)
        else:
            incoming.head.event.payload = b"".join(incoming.parts)
            self.hand(incoming.head)

    def abandon(self, error: EchelonError) -> None:
        """The stream was lost: payloads half received end with DataLoss for their readers."""
        incoming, self.incoming = self.incoming, {}
        for item in incoming.values():
            if not item.whole and not item.dropped:
                if item.queue.full():  # the reader is behind: it gets the end after what it has
                    item.queue.get_nowait()
                item.queue.put_nowait(DataLoss(f"the payload was lost with its stream: {error.message}"))
