"""The client API (`PubSub`): publish streams (publishing.py), subscription streams,
Unsubscribe.

A subscription stream opens (or resumes) a subscription in the registry (registry.py)
and sends what its credits allow; whatever ends the stream, the cleanup runs without
awaiting anything.

Batching: to a subscriber that asks for it (`SubscriptionOpen.batched_deliveries`, the
SDK does) deliveries go out many per message (whatever the backlog and the credits allow,
up to MAX_DELIVERIES: nothing waits to fill a message, so a lone event goes at once);
to any other, one per message, as the contract was before (docs/event-path.md). Any
subscriber may ack cumulatively (`SubscriberAck.through`).

A sliced delivery goes to the subscriber as a head and then one Delivery per slice, each
written before the slice's hold is released (so a slow subscriber slows the tree, not
this agent's memory).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

import grpc

from echelon.agent.admission import Admission
from echelon.agent.compressed import Accepting, CompressedStreams, compressor
from echelon.agent.durable.caps import check_options
from echelon.agent.durable.rpc import relay
from echelon.agent.ownership import caller_name, check, claim, scoped
from echelon.agent.publish_reader import coalesce
from echelon.agent.quota import check_durables
from echelon.agent.publishing import Publishing
from echelon.agent.redelivery import check_open, handle
from echelon.agent.shared_stream import SharedStream
from echelon.runtime.auth import STREAM, cancel_after
from echelon.contract import zstream
from echelon.contract.errors import EchelonError, InvalidArgument, NotFound, ResourceExhausted
from echelon.contract.transport import SUBSCRIPTION_KEY
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc

if TYPE_CHECKING:
    from echelon.agent.dispatch import Dispatcher
    from echelon.agent.durable import Durables
    from echelon.agent.matching import MatchClient
    from echelon.agent.metrics import AgentMetrics
    from echelon.agent.registry import Registry
    from echelon.agent.topics import Topics
    from echelon.runtime.auth import Access

log = logging.getLogger("echelon.agent")

MAX_DELIVERIES = 256  # deliveries per Delivery message
SERVICE = ppb.DESCRIPTOR.services_by_name["PubSub"].full_name


def _delivery_bytes(message) -> bytes:
    """Subscribe's responses: a Delivery, or its bytes as a shared stream writes them (delivery_bytes.py)."""
    return message if message.__class__ is bytes else message.SerializeToString()


def add_PubSubServicer_to_server(servicer: "PubSubServicer", server) -> None:
    """pubsub_pb2_grpc's, with Subscribe's responses sent as they are when they come as bytes."""

    class Registered:  # takes the generated handlers, to register them with that one changed
        def add_generic_rpc_handlers(self, _):
            pass

        def add_registered_method_handlers(self, name: str, handlers: dict) -> None:
            self.name, self.handlers = name, handlers

    registered = Registered()
    pgrpc.add_PubSubServicer_to_server(servicer, registered)
    handlers = dict(registered.handlers)
    handlers["Subscribe"] = handlers["Subscribe"]._replace(response_serializer=_delivery_bytes)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(registered.name, handlers),))
    server.add_registered_method_handlers(registered.name, handlers)


def final_status(error: EchelonError) -> ppb.Delivery:
    """The last message of a subscription stream that ends in `error`: its status in-band
    (no delivery id), before the status itself. A client writing acks as the stream ends
    may see the status replaced by INTERNAL "Internal error from Core" (grpc/grpc#36066);
    this message reaches it first either way (docs/security.md)."""
    return ppb.Delivery(code=error.code.value[0], error=error.message)


def final_publish_status(error: EchelonError) -> ppb.PublishAck:
    """The last message of a publish stream that ends in `error` (its status, in-band, as
    `final_status` for subscriptions): a writing publisher is the client grpc/grpc#36066
    hits, and INTERNAL would be retried where the real status is final."""
    return ppb.PublishAck(code=error.code.value[0], error=error.message, stream_status=True)


class AgentParts(Protocol):
    """The parts the client API hands requests to, made once the agent has a membership
    view (server.py's `on_start`): read per request, never before one comes
    (admission.Dispatching is a part of it)."""

    subscriptions: Registry
    durables: Durables
    dispatcher: Dispatcher
    matching: MatchClient  # its `timeout`: how long Unsubscribe waits for the tier


class PubSubServicer(pgrpc.PubSubServicer):
    def __init__(self, agent_id: str, access: Access, metrics: AgentMetrics, topics: Topics, parts: AgentParts,
                 compressed: CompressedStreams | None = None):
        self.access = access  # the caller's rights, subscription count and name scope (runtime/auth.py)
        self.metrics = metrics
        self.topics = topics
        self.parts = parts
        self.publishing = Publishing(agent_id, metrics, Admission(access, topics, parts))
        self.compressed = compressed or CompressedStreams()  # the streams a client's zstd offer was accepted on

    def Publish(self, request_iterator, context):
        stream = STREAM.get()
        if stream is not None:  # a refusal's status in-band (runtime/auth.py)
            stream.final = final_publish_status
        if self.compressed.offered(context):
            return self._compressed_publish(request_iterator, context)
        # publishing.py: its acks; publish_reader.py: single-event requests taken in runs
        return coalesce(self.publishing.stream, request_iterator)

    async def _compressed_publish(self, request_iterator, context):
        """Publish on a stream that offered zstd: accepted (ACCEPT at once) while under the
        bound, its requests then decoded and its acks compressed (compressed.py)."""
        accepted = self.compressed.take()
        acks = coalesce(self.publishing.stream, request_iterator, self.compressed.decompressor() if accepted else None)
        try:  # closed here, not left to the collector: its cleanup runs as the stream ends
            if not accepted:
                async for ack in acks:
                    yield ack
                return
            await context.send_initial_metadata(zstream.ACCEPT)
            compress = compressor()
            async for ack in acks:
                yield ppb.PublishAck(zstd=compress(ack.SerializeToString()))
        finally:
            if accepted:
                self.compressed.release()
            await acks.aclose()

    def Subscribe(self, request_iterator, context):
        if self.compressed.offered(context):
            return self._compressed_subscribe(request_iterator, context)
        return self._subscribe(request_iterator, context)

    async def _compressed_subscribe(self, request_iterator, context):
        """Subscribe on a stream that offered zstd: accepted while under the bound, ACCEPT
        going with the stream's initial metadata, and what is written after it compressed
        (compressed.py)."""
        accepted = self.compressed.take()
        accepting = Accepting(context)
        deliveries = self._subscribe(request_iterator, accepting if accepted else context)
        try:  # closed here, not left to the collector: its cleanup runs as the stream ends
            if not accepted:
                async for delivery in deliveries:
                    yield delivery
                return
            compress, wrap = compressor(), zstream.wrap
            async for delivery in deliveries:
                # A stream's final status stays plain: runtime/auth.py writes it unless it
                # is the last message written, which it then compares with.
                if accepting.sent and (delivery.__class__ is bytes or not delivery.code):
                    delivery = wrap(compress(_delivery_bytes(delivery)))
                yield delivery
        finally:
            if accepted:
                self.compressed.release()
            await deliveries.aclose()

    async def _subscribe(self, request_iterator, context):
        parts, metrics = self.parts, self.metrics
        first = await anext(request_iterator.__aiter__(), None)
        if first is None or not first.HasField("open"):
            raise InvalidArgument("the first request of a subscription must be `open`")
        # A refusal's status goes in-band too once the stream is open (runtime/auth.py); a
        # refused open is the call's status alone (the client awaits it, writing nothing).
        stream = STREAM.get()
        if first.open.sid:  # many subscriptions on this stream (shared_stream.py)
            if stream is not None:
                stream.final = final_status
            shared = SharedStream(self.access, metrics, parts.subscriptions, self._chunked, MAX_DELIVERIES)
            async for delivery in shared.serve(first, request_iterator, context):
                yield delivery
            return
        # The caller's right and subscription count, checked here, before a durable open is
        # relayed to its holder (which sees this agent, a member, as the caller). `release`
        # runs once however the stream ends.
        access = self.access
        release = access.open_subscription(first.open.topic)
        try:
            claim(access, first.open, parts.subscriptions)  # the name in its owner's scope (ownership.py)
            await check_open(self.topics, access, first.open)  # ack deadline, dead-letter topic (redelivery.py)
            if first.open.HasField("durable"):  # durable.py: served by its first alive holder
                check_options(access, first.open, await self.topics.get(first.open.topic),
                              parts.durables.defaults)  # durable/caps.py
                await check_durables(access, parts.durables, first.open.subscription)  # quota.py
                target = await parts.durables.route(first.open)
                if target is not None:
                    try:
                        async for delivery in relay(parts.durables.peers.dial(target), target, first, request_iterator,
                                                    context):
                            yield delivery
                    finally:
                        release()
                    return
                sub = await parts.durables.open(first.open)
            else:
                # Attached and registered; if this await is cancelled, the open closes it itself.
                sub = await parts.subscriptions.open(first.open, caller_name(access))
        except BaseException:
            release()
            raise

        async def read():
            async for req in request_iterator:
                if req.HasField("ack"):
                    metrics.acks.labels(sub.topic).inc(sub.ack(req.ack.delivery_ids, req.ack.credits,
                                                                    req.ack.through))
                elif req.HasField("nack"):
                    sub.nack(req.nack.delivery_ids, req.nack.delay_ms / 1000, req.nack.credits)
                elif not handle(metrics, sub, req):  # term, in_progress (redelivery.py)
                    raise InvalidArgument("`open` may only be sent once")

        if stream is not None:
            stream.final = final_status
        reader = None
        encoded = first.open.encoded_events  # the client reads Delivery.encoded_event
        most = MAX_DELIVERIES if first.open.batched_deliveries else 1  # the client reads Delivery.batch
        delivered = metrics.deliveries.labels(sub.topic)  # once: labels() costs more than the increment
        try:  # entered with no await since the open: every way out below runs the cleanup
            # Headers now: the client's `start()` returns once the subscription is registered.
            await context.send_initial_metadata(((SUBSCRIPTION_KEY, sub.id), *sub.headers()))
            reader = asyncio.create_task(read())
            reader.add_done_callback(lambda _: sub.changed.set())
            while True:
                end = sub.ended if sub.ended is not None else ResourceExhausted(
                    f"subscription {sub.name!r} passed its backlog bound of {sub.max_backlog} messages and was "
                    f"closed") if sub.overflowed else NotFound(f"subscription {sub.name!r} was removed") \
                    if sub.closed else None
                if end is not None:  # in-band first: the status itself may reach the client as INTERNAL
                    cancel_after()
                    yield final_status(end)
                    raise end
                if reader.done():
                    reader.result()  # raises the reader's error, if any
                    return  # the client half-closed
                items = sub.take(most)
                if not items:
                    sub.changed.clear()
                    await sub.changed.wait()  # the reader's end sets it too: no task per wait
                    continue
                delivered.inc(len(items))
                redelivered = sum(1 for _, p in items if p.redeliveries)
                if redelivered:
                    metrics.redeliveries.inc(redelivered)
                if items[0][1].stream is not None:  # taken alone (Subscription.take)
                    async for delivery in self._chunked(sub, *items[0], reader):
                        yield delivery
                    continue
                out = ppb.Delivery()  # filled in place
                for delivery_id, p in items:
                    d = out.batch.add() if len(items) > 1 else out
                    d.delivery_id, d.subscription, d.redelivery_count = delivery_id, sub.name, p.redeliveries
                    p.into(d, encoded)
                yield out
        finally:  # no await here: a cancelled stream runs it to the end
            release()
            if reader is not None:
                reader.cancel()
            sub.detach()
            if not sub.named:
                parts.subscriptions.close(sub)
            elif sub.durable:
                parts.durables.detached(sub)

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
        access = self.access  # the subscribe right on its topic (runtime/auth.py)
        given = request.subscription
        # Ephemeral names (`~N`) are this agent's own and carry their owner; the others are
        # in their owner's scope (ownership.py). Another's is "does not exist".
        name = given if given.startswith("~") else scoped(access, given)
        sub = self.parts.subscriptions.subs.get(name)
        if sub is None or sub.durable:
            record = await self.parts.durables.peers.locate(name) if name else None
            if record is not None:  # a durable subscription: gone from every holder
                check(access, record.name, record.topic, given)
                access.require("subscribe", record.topic, SERVICE)
                await self.parts.durables.delete(record)
                return ppb.UnsubscribeResponse()
        if sub is None:
            raise NotFound(f"subscription {given!r} does not exist on this agent")
        check(access, sub.name, sub.topic, given, sub.owner if sub.name.startswith("~") else None)
        access.require("subscribe", sub.topic, SERVICE)
        removed = self.parts.subscriptions.close(sub)
        await asyncio.wait([removed], timeout=self.parts.matching.timeout)
        return ppb.UnsubscribeResponse()
