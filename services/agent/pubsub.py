"""The client API (`PubSub`): publish streams, subscription streams, Unsubscribe.

A publish is validated against the topic's schema, given its id (producer id +
sequence) and checked against this agent's window of accepted ids: the same event again
is acknowledged as a duplicate and not published again, a different event under a used
id is refused (ALREADY_EXISTS). Then it is queued for the dispatcher (dispatch.py) and
acknowledged in order, at the level the client asked for. A subscription stream opens
(or resumes) a subscription in the registry (registry.py) and sends what its credits
allow; whatever ends the stream, the cleanup runs without awaiting anything.

A sliced publish (slice_count > 1) is cut through (slices.py): slice 0 is validated and
dispatched at once with a `PayloadStream`, the later slices are put into that stream as
they are read, and reading waits while its window is full. A sliced delivery goes to
the subscriber as a head and then one Delivery per slice, each written before the
slice's hold is released (so a slow subscriber slows the tree, not this agent's memory).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import grpc

from echelon.agent.slices import PayloadStream, payload_error
from echelon.core.dedup import DedupWindow, Entry, Seen
from echelon.runtime.errors import (AlreadyExists, InvalidArgument, NotFound, ResourceExhausted, Unavailable,
                                   status_of)
from echelon.runtime.wire import attributes_from_pb, event_digest
from echelon.v1 import common_pb2 as pb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc

if TYPE_CHECKING:
    from echelon.agent.server import AgentNode

log = logging.getLogger("echelon.agent")

MAX_ACKS_IN_FLIGHT = 1024  # per Publish stream: past it we stop reading (HTTP/2 pushes back)
MAX_PAYLOAD = 1 << 40  # bytes of one sliced payload (a TiB: its slice count fits the wire's uint32)


class PubSubServicer(pgrpc.PubSubServicer):
    def __init__(self, node: AgentNode):
        self.node = node
        self._producers = 0
        self.accepted = DedupWindow(capacity=200_000)  # message ids published here, with digests

    async def _accept(self, req: ppb.PublishRequest, producer: str, seq: int,
                      payload: bytes | PayloadStream) -> asyncio.Future | Entry:
        """Validate and queue (the future of its dispatch), or the window's entry of the first
        copy for a duplicate; raises a domain error for a bad request (nothing queued). A
        payload still arriving is told apart from another by its size and first slice."""
        node = self.node
        topic = await node.topics.get(req.topic)
        attrs = attributes_from_pb(req.attributes)
        node.topics.schema(topic).validate_event(attrs)
        key = (producer, seq)
        content = b"%d:%b" % (len(payload), req.payload) if isinstance(payload, PayloadStream) else payload
        digest = event_digest(topic.name, req.attributes, req.ordering_key, content)
        seen, entry = self.accepted.offer(key, time.monotonic(), digest)
        if seen is Seen.DIFFERENT:
            raise AlreadyExists(f"message id {producer}:{seq} was already used for a different event (within the "
                                f"dedup window): publish it under a new sequence")
        if seen is Seen.SAME:
            return entry  # a duplicate: answered as the first copy, not published again
        event = pb.Event(id=pb.MessageId(producer_id=producer, sequence=seq), topic=topic.name,
                         attributes=req.attributes, ordering_key=req.ordering_key,
                         publish_time_unix_nanos=time.time_ns())
        future = node.dispatcher.submit(event, payload)
        if isinstance(payload, PayloadStream):
            future = _failing_with(future, payload)
        entry.outcome = future

        def settled(f: asyncio.Future) -> None:
            if f.cancelled() or f.exception() is not None:
                self.accepted.forget(key)  # not published: a retry may publish it
                if isinstance(payload, PayloadStream):
                    payload.abort(Unavailable("the payload was not published"))  # its reader must not wait
            else:
                entry.outcome = f.result()[0]  # the destinations, for duplicates to come

        future.add_done_callback(settled)
        return future

    async def _ack(self, req: ppb.PublishRequest, producer: str, seq: int, accepted) -> ppb.PublishAck:
        ack = ppb.PublishAck(producer_id=producer, sequence=seq)
        try:
            if isinstance(accepted, BaseException):
                raise accepted
            if isinstance(accepted, Entry):
                ack.duplicate = True
                first = accepted.outcome
                ack.destinations = first if isinstance(first, int) else (await asyncio.shield(first))[0]
                self.node.metrics.published.labels(req.topic, "duplicate").inc()
                return ack
            destinations, deliveries = await accepted
            ack.destinations = destinations
            if req.ack_level == ppb.ACK_LEVEL_DELIVERED and deliveries:
                await asyncio.gather(*deliveries)
            self.node.metrics.published.labels(req.topic, "ok").inc()
        except Exception as e:  # noqa: BLE001 - reported in the ack, the stream goes on
            code, message = status_of(e) or (grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}")
            if status_of(e) is None:
                log.exception("publish failed")
            ack.code, ack.error = code.value[0], message
            self.node.metrics.published.labels("", code.name.lower()).inc()
        return ack

    async def Publish(self, request_iterator, context):
        self._producers += 1
        default_producer = f"{self.node.config.id}:{self._producers}:{time.time_ns()}"
        pending: asyncio.Queue = asyncio.Queue(MAX_ACKS_IN_FLIGHT)
        streams: dict[tuple[str, int], PayloadStream] = {}  # sliced payloads being read
        auto_seq = 0

        async def read():
            nonlocal auto_seq
            async for req in request_iterator:
                producer = req.producer_id or default_producer
                seq = req.sequence
                if not seq:
                    auto_seq += 1
                    seq = auto_seq
                if req.slice_count > 1 or req.slice_index:
                    await self._slice(req, producer, seq, streams, pending)
                    continue
                try:
                    accepted = await self._accept(req, producer, seq, req.payload)
                except Exception as e:  # noqa: BLE001 - answered in order, in the ack
                    accepted = e
                await pending.put((req, producer, seq, accepted))
            await pending.put(None)

        reader = asyncio.create_task(read())
        try:
            while True:
                item = await pending.get()
                if item is None:
                    break
                yield await self._ack(*item)
            await reader
        finally:
            reader.cancel()
            for key, stream in streams.items():
                self._abort(key, stream, Unavailable("the publish stream ended before the payload's last slice"))

    async def _slice(self, req: ppb.PublishRequest, producer: str, seq: int,
                     streams: dict[tuple[str, int], PayloadStream], pending: asyncio.Queue) -> None:
        """One slice of a sliced publish: slice 0 is accepted (its ack queued in order), the
        rest go into its stream (waiting while the stream's window is full)."""
        key = (producer, seq)
        stream = streams.get(key)
        if req.slice_index == 0:
            if stream is not None:
                del streams[key]
                self._abort(key, stream, InvalidArgument(f"{producer}:{seq} started again before its last slice"))
            error = payload_error(req.payload_size, req.slice_count, MAX_PAYLOAD)
            stream = PayloadStream(req.payload_size)
            try:
                if error is not None:
                    raise error
                accepted = await self._accept(req, producer, seq, stream)
            except Exception as e:  # noqa: BLE001 - answered in order, in the ack
                accepted = e
            await pending.put((req, producer, seq, accepted))
            if not isinstance(accepted, asyncio.Future):
                return  # refused, or a duplicate: its later slices are read and dropped
            streams[key] = stream
        elif stream is None:
            return  # of a refused or duplicate payload (its ack is queued already)
        if req.slice_index != stream.parts:
            del streams[key]
            self._abort(key, stream, InvalidArgument(f"slice {req.slice_index} of {producer}:{seq} out of order "
                                                     f"(expected {stream.parts})"))
            return
        await stream.put(req.payload)
        if stream.parts == req.slice_count or stream.error is not None:
            del streams[key]
            stream.end()

    async def Subscribe(self, request_iterator, context):
        node = self.node
        first = await anext(request_iterator.__aiter__(), None)
        if first is None or not first.HasField("open"):
            raise InvalidArgument("the first request of a subscription must be `open`")
        # Attached and registered; if this await is cancelled, the open closes it itself.
        sub = await node.subscriptions.open(first.open)

        async def read():
            async for req in request_iterator:
                if req.HasField("ack"):
                    node.metrics.acks.labels(sub.topic).inc(sub.ack(req.ack.delivery_ids, req.ack.credits))
                elif req.HasField("nack"):
                    sub.nack(req.nack.delivery_ids, req.nack.delay_ms / 1000, req.nack.credits)
                else:
                    raise InvalidArgument("`open` may only be sent once")

        reader = None
        try:  # entered with no await since the open: every way out below runs the cleanup
            # Headers now: the client's `start()` returns once the subscription is registered.
            await context.send_initial_metadata((("x-echelon-subscription", sub.id),))
            reader = asyncio.create_task(read())
            while True:
                if sub.overflowed:
                    raise ResourceExhausted(f"subscription {sub.name!r} passed its backlog bound of "
                                            f"{sub.max_backlog} messages and was closed")
                if sub.closed:
                    raise NotFound(f"subscription {sub.name!r} was removed")
                if reader.done():
                    reader.result()  # raises the reader's error, if any
                    return  # the client half-closed
                item = sub.take()
                if item is None:
                    sub.changed.clear()
                    waiter = asyncio.create_task(sub.changed.wait())
                    await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    continue
                delivery_id, pending = item
                node.metrics.deliveries.labels(sub.topic).inc()
                if pending.redeliveries:
                    node.metrics.redeliveries.inc()
                if pending.stream is not None:
                    async for delivery in self._chunked(sub, delivery_id, pending, reader):
                        yield delivery
                    continue
                yield ppb.Delivery(delivery_id=delivery_id, subscription=sub.name, event=pending.event,
                                   redelivery_count=pending.redeliveries)
        finally:  # no await here: a cancelled stream runs it to the end
            if reader is not None:
                reader.cancel()
            sub.detach()
            if not sub.named:
                node.subscriptions.close(sub)

    def _abort(self, key: tuple[str, int], stream: PayloadStream, error: Exception) -> None:
        """A payload that will not be whole: ended down the trees, and its id free for a retry."""
        stream.abort(error)
        self.accepted.forget(key)

    @staticmethod
    async def _chunked(sub, delivery_id: int, pending, reader: asyncio.Task):
        """A sliced payload's Deliveries: the head, a chunk per slice as it arrives (its
        hold released once written), then `last` (or `aborted`, slices.py says when)."""
        stream = pending.stream
        yield ppb.Delivery(delivery_id=delivery_id, subscription=sub.name, event=pending.event, chunked=True,
                           payload_size=stream.size)
        offset = 0
        while True:
            item = stream.take()
            if item is None:
                if stream.done:
                    break
                if sub.closed or reader.done():
                    stream.abort("the subscription stream ended")
                    break
                waiter = asyncio.ensure_future(stream.wake.wait())
                await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                continue
            data, hold = item
            try:
                yield ppb.Delivery(delivery_id=delivery_id, chunk=data, chunk_offset=offset)
            finally:
                hold.release()
            offset += len(data)
        yield ppb.Delivery(delivery_id=delivery_id, last=not stream.aborted, aborted=stream.aborted)

    async def Unsubscribe(self, request, context):
        """Gone from this agent at once; the answer waits (up to the matcher timeout) for the
        tier to acknowledge the removal, which is retried after that if it must be."""
        sub = self.node.subscriptions.subs.get(request.subscription)
        if sub is None:
            raise NotFound(f"subscription {request.subscription!r} does not exist on this agent")
        removed = self.node.subscriptions.close(sub)
        await asyncio.wait([removed], timeout=self.node.matching.timeout)
        return ppb.UnsubscribeResponse()


def _failing_with(dispatched: asyncio.Future, stream: PayloadStream) -> asyncio.Future:
    """The dispatch of a payload still arriving, failed if the payload did not arrive whole
    (it is dispatched before its last slice is read: even an ACCEPTED ack must say so)."""
    out = asyncio.get_running_loop().create_future()

    def done(f: asyncio.Future) -> None:
        if out.done():
            return
        if f.cancelled():
            out.cancel()
        elif f.exception() is not None or stream.error is not None:
            out.set_exception(f.exception() or stream.error)
        else:
            out.set_result(f.result())

    dispatched.add_done_callback(done)
    return out
