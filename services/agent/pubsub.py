"""The client API (`PubSub`): publish streams, subscription streams, Unsubscribe.

A publish is validated against the topic's schema, given its id (producer id +
sequence) and checked against this agent's window of accepted ids: the same event again
is acknowledged as a duplicate and not published again, a different event under a used
id is refused (ALREADY_EXISTS). Then it is queued for the dispatcher (dispatch.py) and
acknowledged in order, at the level the client asked for. A subscription stream opens
(or resumes) a subscription in the registry (registry.py) and sends what its credits
allow; whatever ends the stream, the cleanup runs without awaiting anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import grpc

from echelon.core.dedup import DedupWindow, Entry, Seen
from echelon.runtime.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted, status_of
from echelon.runtime.wire import attributes_from_pb, event_digest
from echelon.v1 import common_pb2 as pb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc

if TYPE_CHECKING:
    from echelon.agent.server import AgentNode

log = logging.getLogger("echelon.agent")

MAX_ACKS_IN_FLIGHT = 1024  # per Publish stream: past it we stop reading (HTTP/2 pushes back)


class PubSubServicer(pgrpc.PubSubServicer):
    def __init__(self, node: AgentNode):
        self.node = node
        self._producers = 0
        self.accepted = DedupWindow(capacity=200_000)  # message ids published here, with digests

    async def _accept(self, req: ppb.PublishRequest, producer: str, seq: int,
                      payload: bytes) -> asyncio.Future | Entry:
        """Validate and queue (the future of its dispatch), or the window's entry of the first
        copy for a duplicate; raises a domain error for a bad request (nothing queued)."""
        node = self.node
        node.server.access.check_publish(req.topic)  # the caller's right and rate (runtime/auth.py)
        topic = await node.topics.get(req.topic)
        attrs = attributes_from_pb(req.attributes)
        node.topics.schema(topic).validate_event(attrs)
        key = (producer, seq)
        digest = event_digest(topic.name, req.attributes, req.ordering_key, payload)
        seen, entry = self.accepted.offer(key, time.monotonic(), digest)
        if seen is Seen.DIFFERENT:
            raise AlreadyExists(f"message id {producer}:{seq} was already used for a different event (within the "
                                f"dedup window): publish it under a new sequence")
        if seen is Seen.SAME:
            return entry  # a duplicate: answered as the first copy, not published again
        event = pb.Event(id=pb.MessageId(producer_id=producer, sequence=seq), topic=topic.name,
                         attributes=req.attributes, ordering_key=req.ordering_key,
                         publish_time_unix_nanos=time.time_ns())
        future = entry.outcome = node.dispatcher.submit(event, payload)

        def settled(f: asyncio.Future) -> None:
            if f.cancelled() or f.exception() is not None:
                self.accepted.forget(key)  # not published: a retry may publish it
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
        slices: dict[tuple[str, int], tuple[ppb.PublishRequest, list[bytes]]] = {}
        auto_seq = 0

        async def read():
            nonlocal auto_seq
            async for req in request_iterator:
                producer = req.producer_id or default_producer
                seq = req.sequence
                if not seq:
                    auto_seq += 1
                    seq = auto_seq
                payload = None
                if req.slice_count > 1:
                    first, parts = slices.setdefault((producer, seq), (req, []))
                    if req.slice_index != len(parts):
                        slices.pop((producer, seq))
                        await pending.put((req, producer, seq, InvalidArgument(
                            f"slice {req.slice_index} of {producer}:{seq} out of order (expected {len(parts)})")))
                        continue
                    parts.append(req.payload)
                    if len(parts) < req.slice_count:
                        continue
                    del slices[(producer, seq)]
                    req = first  # the first slice carries the attributes
                    payload = b"".join(parts)
                try:
                    accepted = await self._accept(req, producer, seq, req.payload if payload is None else payload)
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

    async def Subscribe(self, request_iterator, context):
        node = self.node
        first = await anext(request_iterator.__aiter__(), None)
        if first is None or not first.HasField("open"):
            raise InvalidArgument("the first request of a subscription must be `open`")
        release = node.server.access.open_subscription(first.open.topic)  # the caller's right and count
        try:
            # Attached and registered; if this await is cancelled, the open closes it itself.
            sub = await node.subscriptions.open(first.open)
        except BaseException:
            release()
            raise

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
                yield ppb.Delivery(delivery_id=delivery_id, subscription=sub.name, event=pending.event,
                                   redelivery_count=pending.redeliveries)
        finally:  # no await here: a cancelled stream runs it to the end
            release()
            if reader is not None:
                reader.cancel()
            sub.detach()
            if not sub.named:
                node.subscriptions.close(sub)

    async def Unsubscribe(self, request, context):
        """Gone from this agent at once; the answer waits (up to the matcher timeout) for the
        tier to acknowledge the removal, which is retried after that if it must be."""
        sub = self.node.subscriptions.subs.get(request.subscription)
        if sub is None:
            raise NotFound(f"subscription {request.subscription!r} does not exist on this agent")
        removed = self.node.subscriptions.close(sub)
        await asyncio.wait([removed], timeout=self.node.matching.timeout)
        return ppb.UnsubscribeResponse()
