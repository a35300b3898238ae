"""The client API (`PubSub`): publish streams, subscription streams, Unsubscribe.

A publish is validated against the topic's schema, given its id (producer id +
sequence) and checked against this agent's window of accepted ids: the same event again
is acknowledged as a duplicate and not published again, a different event under a used
id is refused (ALREADY_EXISTS). Then it is queued for the dispatcher (dispatch.py) and
acknowledged in order, at the level the client asked for. A subscription stream opens
(or resumes) a subscription in the registry (registry.py) and sends what its credits
allow; whatever ends the stream, the cleanup runs without awaiting anything.

Batching (issue 12): a request may carry a `batch` of events, admitted, dispatched and
acked as one unit (one future, one ack message); deliveries go out many per message
(whatever the backlog and the credits allow, up to MAX_DELIVERIES: nothing waits to fill
a message, so a lone event goes at once), and a subscriber may ack cumulatively
(`SubscriberAck.through`).

A sliced publish (slice_count > 1; never in a batch: a unit of its own) is cut through
(slices.py): slice 0 is validated and dispatched at once with a `PayloadStream`, the
later slices are put into that stream as they are read, and reading waits while its
window is full. A sliced delivery goes to
the subscriber as a head and then one Delivery per slice, each written before the
slice's hold is released (so a slow subscriber slows the tree, not this agent's memory).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import grpc

from echelon.agent.durable_rpc import relay
from echelon.agent.shared_stream import SharedStream
from echelon.agent.slices import PayloadStream, payload_error
from echelon.core.dedup import DedupWindow, Entry, Seen
from echelon.runtime.errors import (AlreadyExists, InvalidArgument, NotFound, ResourceExhausted, Unavailable,
                                   status_of)
from echelon.runtime.transport import SUBSCRIPTION_KEY
from echelon.runtime.wire import attributes_from_pb, attributes_into_pb, event_digest
from echelon.v1 import common_pb2 as pb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc

if TYPE_CHECKING:
    from echelon.agent.server import AgentNode

log = logging.getLogger("echelon.agent")

MAX_EVENTS_IN_FLIGHT = 8192  # per Publish stream: past it we stop reading (HTTP/2 pushes back)
MAX_DELIVERIES = 256  # deliveries per Delivery message
SERVICE = ppb.DESCRIPTOR.services_by_name["PubSub"].full_name
MAX_PAYLOAD = 1 << 40  # bytes of one sliced payload (a TiB: its slice count fits the wire's uint32)


class _Unit:
    """One request's events on their way to its ack: per element, the event's topic,
    producer, sequence and what became of it (an Entry for a duplicate, an exception
    for a refusal, None for an event dispatched in `future`'s unit)."""

    __slots__ = ("batched", "ack_level", "rows", "future")

    def __init__(self, batched: bool, ack_level: int):
        self.batched = batched
        self.ack_level = ack_level
        self.rows: list[tuple[str, str, int, object]] = []
        self.future: asyncio.Future | None = None


class PubSubServicer(pgrpc.PubSubServicer):
    def __init__(self, node: AgentNode):
        self.node = node
        self._producers = 0
        self.accepted = DedupWindow(capacity=200_000)  # message ids published here, with digests

    def _admit(self, topic: pb.Topic, req: ppb.PublishRequest, producer: str, seq: int,
               payload: bytes | PayloadStream) -> tuple[pb.Event | None, Entry]:
        """Validate and record an event's id: (the event to dispatch, its window entry), or
        (None, the first copy's entry) for a duplicate; raises a domain error for a bad
        request (nothing recorded). No await and no future: the caller dispatches a whole
        request at once. A payload still arriving is told apart from another by its size
        and first slice."""
        attrs = attributes_from_pb(req.attributes)
        self.node.topics.schema(topic).validate_event(attrs)  # parsed once per topic version
        self.node.durables.refuse(topic.name, attrs)  # a full REJECT_PUBLISH durable subscription
        content = b"%d:%b" % (len(payload), req.payload) if isinstance(payload, PayloadStream) else payload
        # The Event's content first (the digest's input), its map filled from the converted
        # attributes (half the cost of copying the request's map); id and time after.
        event = pb.Event(topic=topic.name, ordering_key=req.ordering_key)
        attributes_into_pb(attrs, event.attributes)
        seen, entry = self.accepted.offer((producer, seq), time.monotonic(), event_digest(event, content))
        if seen is Seen.DIFFERENT:
            raise AlreadyExists(f"message id {producer}:{seq} was already used for a different event (within the "
                                f"dedup window): publish it under a new sequence")
        if seen is Seen.SAME:
            return None, entry  # a duplicate: answered as the first copy, not published again
        event.id.producer_id, event.id.sequence = producer, seq
        event.publish_time_unix_nanos = time.time_ns()
        return event, entry

    async def _accept(self, unit: _Unit, reqs, producer: str, seqs: list[int], payloads) -> None:
        """Admit a request's events and queue the fresh ones for dispatch as one unit. A
        duplicate's entry points at its first copy's unit until that one settles."""
        node = self.node
        topics: dict[str, pb.Topic] = {}
        events: list[pb.Event] = []
        kept: list[bytes] = []
        entries: list[tuple[tuple[str, int], Entry]] = []
        for req, seq, payload in zip(reqs, seqs, payloads):
            outcome = None
            try:
                if unit.batched and (req.batch or req.slice_count > 1):
                    raise InvalidArgument(f"batch element {producer}:{seq}: a whole event (no slices, no batch)")
                node.server.access.check_publish(req.topic)  # the caller's right and rate (runtime/auth.py)
                topic = topics.get(req.topic)
                if topic is None:
                    topic = topics[req.topic] = await node.topics.get(req.topic)
                event, entry = self._admit(topic, req, producer, seq, payload)
                if event is None:
                    outcome = entry
                else:
                    entries.append(((producer, seq), entry))
                    events.append(event)
                    kept.append(payload)
            except Exception as e:  # noqa: BLE001 - answered in order, in the ack
                outcome = e
            unit.rows.append((req.topic, producer, seq, outcome))
        if not events:
            return
        future = node.dispatcher.submit(events, kept)
        stream = kept[0] if isinstance(kept[0], PayloadStream) else None  # a sliced publish: a unit alone
        if stream is not None:
            future = _failing_with(future, stream)
        unit.future = future
        for index, (_, entry) in enumerate(entries):
            entry.outcome = (future, index)

        def settled(f: asyncio.Future) -> None:
            failed = f.cancelled() or f.exception() is not None
            counts = None if failed else f.result()[0]
            for index, (key, entry) in enumerate(entries):
                if failed:
                    self.accepted.forget(key)  # not published: a retry may publish it
                    if stream is not None:
                        stream.abort(Unavailable("the payload was not published"))  # its reader must not wait
                else:
                    entry.outcome = counts[index]  # the destinations, for duplicates to come

        future.add_done_callback(settled)

    async def _ack(self, unit: _Unit) -> ppb.PublishAck:
        """The ack of one request (a batch's: one per element, in order), once its events are
        held at the level asked for."""
        dests, error = None, None
        if unit.future is not None:
            try:
                dests, deliveries = await unit.future
                if unit.ack_level == ppb.ACK_LEVEL_DELIVERED and deliveries:
                    await asyncio.gather(*deliveries)
            except Exception as e:  # noqa: BLE001 - reported in the acks, the stream goes on
                error = e
        out = ppb.PublishAck()  # a batch's acks added in place: none built apart and copied in (upb)
        ok: dict[str, int] = {}
        fresh = 0
        for topic, producer, seq, outcome in unit.rows:
            ack = out.acks.add() if unit.batched else out
            ack.producer_id, ack.sequence = producer, seq
            try:
                if outcome is None:
                    if error is not None:
                        raise error
                    ack.destinations = dests[fresh]
                    fresh += 1
                    ok[topic] = ok.get(topic, 0) + 1
                elif isinstance(outcome, BaseException):
                    raise outcome
                else:
                    ack.duplicate = True
                    first = outcome.outcome
                    if not isinstance(first, int):
                        first_future, index = first
                        first = (await asyncio.shield(first_future))[0][index]
                    ack.destinations = first
                    self.node.metrics.published.labels(topic, "duplicate").inc()
            except Exception as e:  # noqa: BLE001 - reported in the ack, the stream goes on
                if outcome is None:
                    fresh += 1
                code, message = status_of(e) or (grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}")
                if status_of(e) is None:
                    log.exception("publish failed")
                ack.code, ack.error = code.value[0], message
                self.node.metrics.published.labels("", code.name.lower()).inc()
        for topic, n in ok.items():
            self.node.metrics.published.labels(topic, "ok").inc(n)
        return out

    async def Publish(self, request_iterator, context):
        """Each request (one event, one slice, or a `batch` of events) becomes one unit:
        admitted as a whole, dispatched as one unit, answered by one ack message. Reading
        stops while MAX_EVENTS_IN_FLIGHT events await their acks."""
        self._producers += 1
        default_producer = f"{self.node.config.id}:{self._producers}:{time.time_ns()}"
        pending: asyncio.Queue = asyncio.Queue()
        room = asyncio.Event()
        room.set()
        in_flight = 0
        streams: dict[tuple[str, int], PayloadStream] = {}  # sliced payloads being read
        auto_seq = 0

        def next_seq(seq: int) -> int:
            nonlocal auto_seq
            if not seq:
                auto_seq += 1
                seq = auto_seq
            return seq

        async def read():
            nonlocal in_flight
            async for req in request_iterator:
                producer = req.producer_id or default_producer
                sliced = req.slice_count > 1 or req.slice_index
                if sliced and req.slice_index:  # a later slice: into its payload's stream, acked with slice 0
                    await self._feed(req, (producer, next_seq(req.sequence)), streams)
                    continue
                unit = _Unit(bool(req.batch), req.ack_level)
                if req.batch:
                    reqs = req.batch
                    seqs = [next_seq(r.sequence) for r in reqs]
                    payloads = [r.payload for r in reqs]
                    await self._accept(unit, reqs, producer, seqs, payloads)
                else:
                    seq = next_seq(req.sequence)
                    if sliced:
                        await self._open_payload(unit, req, producer, seq, streams)
                    else:
                        await self._accept(unit, [req], producer, [seq], [req.payload])
                in_flight += len(unit.rows)
                await pending.put(unit)  # before slice 0's data: acks go in the order of requests
                if sliced:
                    await self._feed(req, (producer, seq), streams)
                if in_flight >= MAX_EVENTS_IN_FLIGHT:
                    room.clear()
                    await room.wait()
            await pending.put(None)

        reader = asyncio.create_task(read())
        try:
            while True:
                unit = await pending.get()
                if unit is None:
                    break
                ack = await self._ack(unit)
                in_flight -= len(unit.rows)
                if in_flight < MAX_EVENTS_IN_FLIGHT:
                    room.set()
                yield ack
            await reader
        finally:
            reader.cancel()
            for key, stream in streams.items():
                self._abort(key, stream, Unavailable("the publish stream ended before the payload's last slice"))

    async def _open_payload(self, unit: _Unit, req: ppb.PublishRequest, producer: str, seq: int,
                            streams: dict[tuple[str, int], PayloadStream]) -> None:
        """Slice 0 of a sliced publish: its payload accepted into `unit` as a stream still
        arriving (dispatched at once); a refused or duplicate payload's slices are dropped."""
        key = (producer, seq)
        old = streams.pop(key, None)
        if old is not None:
            self._abort(key, old, InvalidArgument(f"{producer}:{seq} started again before its last slice"))
        error = payload_error(req.payload_size, req.slice_count, MAX_PAYLOAD)
        if error is not None:
            unit.rows.append((req.topic, producer, seq, error))
            return
        stream = PayloadStream(req.payload_size)
        await self._accept(unit, [req], producer, [seq], [stream])
        if unit.future is not None:
            streams[key] = stream

    async def _feed(self, req: ppb.PublishRequest, key: tuple[str, int],
                    streams: dict[tuple[str, int], PayloadStream]) -> None:
        """A slice into its payload's stream, waiting while the stream's window is full."""
        stream = streams.get(key)
        if stream is None:
            return  # of a refused or duplicate payload (its ack is queued already)
        if req.slice_index != stream.parts:
            del streams[key]
            self._abort(key, stream, InvalidArgument(f"slice {req.slice_index} of {key[0]}:{key[1]} out of order "
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
        if first.open.sid:  # many subscriptions on this stream (shared_stream.py)
            async for delivery in SharedStream(node, self._chunked, MAX_DELIVERIES).serve(first, request_iterator,
                                                                                          context):
                yield delivery
            return
        # The caller's right and subscription count, checked here, before a durable open is
        # relayed to its holder (which sees this agent, a member, as the caller). `release`
        # runs once however the stream ends.
        release = node.server.access.open_subscription(first.open.topic)
        try:
            if first.open.HasField("durable"):  # durable.py: served by its first alive holder
                target = await node.durables.route(first.open)
                if target is not None:
                    try:
                        async for delivery in relay(node.durables.peers.dial(target), first, request_iterator, context):
                            yield delivery
                    finally:
                        release()
                    return
                sub = await node.durables.open(first.open)
            else:
                # Attached and registered; if this await is cancelled, the open closes it itself.
                sub = await node.subscriptions.open(first.open)
        except BaseException:
            release()
            raise

        async def read():
            async for req in request_iterator:
                if req.HasField("ack"):
                    node.metrics.acks.labels(sub.topic).inc(sub.ack(req.ack.delivery_ids, req.ack.credits,
                                                                    req.ack.through))
                elif req.HasField("nack"):
                    sub.nack(req.nack.delivery_ids, req.nack.delay_ms / 1000, req.nack.credits)
                else:
                    raise InvalidArgument("`open` may only be sent once")

        reader = None
        try:  # entered with no await since the open: every way out below runs the cleanup
            # Headers now: the client's `start()` returns once the subscription is registered.
            await context.send_initial_metadata(((SUBSCRIPTION_KEY, sub.id), *sub.headers()))
            reader = asyncio.create_task(read())
            reader.add_done_callback(lambda _: sub.changed.set())
            while True:
                if sub.ended is not None:
                    raise sub.ended
                if sub.overflowed:
                    raise ResourceExhausted(f"subscription {sub.name!r} passed its backlog bound of "
                                            f"{sub.max_backlog} messages and was closed")
                if sub.closed:
                    raise NotFound(f"subscription {sub.name!r} was removed")
                if reader.done():
                    reader.result()  # raises the reader's error, if any
                    return  # the client half-closed
                items = sub.take(MAX_DELIVERIES)
                if not items:
                    sub.changed.clear()
                    await sub.changed.wait()  # the reader's end sets it too: no task per wait
                    continue
                node.metrics.deliveries.labels(sub.topic).inc(len(items))
                redelivered = sum(1 for _, p in items if p.redeliveries)
                if redelivered:
                    node.metrics.redeliveries.inc(redelivered)
                if items[0][1].stream is not None:  # taken alone (Subscription.take)
                    async for delivery in self._chunked(sub, *items[0], reader):
                        yield delivery
                    continue
                out = ppb.Delivery()  # filled in place: each event copied once, a fifth of the cost (upb)
                for delivery_id, p in items:
                    d = out.batch.add() if len(items) > 1 else out
                    d.delivery_id, d.subscription, d.redelivery_count = delivery_id, sub.name, p.redeliveries
                    d.event.CopyFrom(p.event)
                yield out
        finally:  # no await here: a cancelled stream runs it to the end
            release()
            if reader is not None:
                reader.cancel()
            sub.detach()
            if not sub.named:
                node.subscriptions.close(sub)
            elif sub.durable:
                node.durables.touch(sub)

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
        access = self.node.server.access  # the subscribe right on its topic (runtime/auth.py)
        sub = self.node.subscriptions.subs.get(request.subscription)
        if sub is None or sub.durable:
            record = await self.node.durables.peers.locate(request.subscription) if request.subscription else None
            if record is not None:  # a durable subscription: gone from every holder
                access.require("subscribe", record.topic, SERVICE)
                await self.node.durables.delete(record)
                return ppb.UnsubscribeResponse()
        if sub is None:
            raise NotFound(f"subscription {request.subscription!r} does not exist on this agent")
        access.require("subscribe", sub.topic, SERVICE)
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
