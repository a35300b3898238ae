"""The agent: the client API (`PubSub`, `Admin`), local delivery, and relaying.

The path of a publish (DESIGN.md): validate and id the event, queue it for the
dispatcher, which matches a whole batch at once on the matcher tier, then hands each
destination agent one frame holding all of the batch's events for it. Because the
dispatcher queues frames in publish order and every link is FIFO, a producer's events
reach each subscription in order while the view is stable.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from prometheus_client import Counter, Gauge, Histogram

from echelon.agent.links import Link
from echelon.agent.matching import MatchClient
from echelon.agent.subscriptions import Subscription
from echelon.core.dedup import DedupWindow
from echelon.core.schema import Schema
from echelon.runtime.errors import (AlreadyExists, EchelonError, FailedPrecondition, InvalidArgument, NotFound,
                                    ResourceExhausted, Unavailable, status_of)
from echelon.runtime.metrics import LATENCY_BUCKETS
from echelon.runtime.node import Node, NodeConfig
from echelon.runtime.server import channel
from echelon.runtime.wire import attributes_from_pb, filter_from_request, filter_to_pb, schema_from_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc
from echelon.v1 import relay_pb2 as rpb
from echelon.v1 import relay_pb2_grpc as rgrpc

log = logging.getLogger("echelon.agent")

MAX_BATCH = 512
MAX_ACKS_IN_FLIGHT = 1024  # per Publish stream: past it we stop reading (HTTP/2 pushes back)


class AgentMetrics:
    def __init__(self, r):
        self.published = Counter("echelon_agent_published_total", "Publish requests, by result.", ["result"],
                                 registry=r)
        self.deliveries = Counter("echelon_agent_deliveries_total", "Deliveries sent to subscriber streams.",
                                  registry=r)
        self.redeliveries = Counter("echelon_agent_redeliveries_total", "Deliveries sent again after a stream "
                                    "ended unacknowledged.", registry=r)
        self.duplicates = Counter("echelon_agent_duplicates_dropped_total", "Messages dropped by the dedup window.",
                                  registry=r)
        self.overflows = Counter("echelon_agent_backlog_overflows_total", "Subscriptions closed past their "
                                 "backlog bound (RESOURCE_EXHAUSTED).", registry=r)
        self.subscriptions = Gauge("echelon_agent_subscriptions", "Subscriptions held.", registry=r)
        self.latency = Histogram("echelon_agent_delivery_latency_seconds", "Publish to local enqueue.",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.copies = Counter("echelon_agent_copies_sent_total", "Frames sent, as tree root or as relay.",
                              ["as"], registry=r)
        self.dropped = Counter("echelon_agent_frames_undelivered_total", "Frames whose peer left before "
                               "acknowledging.", registry=r)


class AgentNode(Node):
    role = mpb.ROLE_AGENT

    def __init__(self, config: NodeConfig, max_backlog: int = 10_000, window_bytes: int = 8 << 20):
        super().__init__(config)
        self.max_backlog = max_backlog
        self.window_bytes = window_bytes
        self.metrics = AgentMetrics(self.registry)
        self.subs: dict[str, Subscription] = {}  # by name
        self.links: dict[str, Link] = {}
        self.dedup = DedupWindow()
        self.matching: MatchClient | None = None
        self._queue: asyncio.Queue[tuple[pb.Event, asyncio.Future]] = asyncio.Queue()
        self._dispatcher: asyncio.Task | None = None
        self._ephemeral = 0
        pubsub = PubSubServicer(self)
        self.server.add(pgrpc.add_PubSubServicer_to_server, pubsub, ppb.DESCRIPTOR.services_by_name["PubSub"].full_name)
        self.server.add(pgrpc.add_AdminServicer_to_server, AdminProxy(self),
                        ppb.DESCRIPTOR.services_by_name["Admin"].full_name)
        self.server.add(rgrpc.add_RelayServicer_to_server, RelayServicer(self),
                        rpb.DESCRIPTOR.services_by_name["Relay"].full_name)
        self.link_queue = Gauge("echelon_link_queue_length", "Unacknowledged frames per outgoing link.", ["peer"],
                                registry=self.registry)
        self.link_enqueued = Counter("echelon_link_enqueued_total", "Frames enqueued per outgoing link.", ["peer"],
                                     registry=self.registry)
        self.link_dequeued = Counter("echelon_link_dequeued_total", "Frames acknowledged per outgoing link.",
                                     ["peer"], registry=self.registry)
        self.sent_bytes = Counter("echelon_relay_sent_bytes_total", "Bytes sent per peer.", ["peer"],
                                  registry=self.registry)
        self.received_bytes = Counter("echelon_relay_received_bytes_total", "Bytes received per peer.", ["peer"],
                                      registry=self.registry)

    # -- lifecycle -------------------------------------------------------------------

    async def on_start(self) -> None:
        self.matching = MatchClient(self.membership)
        self.matching.on_view()
        self._dispatcher = asyncio.create_task(self._dispatch_loop(), name="dispatcher")

    async def on_stop(self) -> None:
        if self._dispatcher:
            self._dispatcher.cancel()
        await asyncio.gather(*(link.close() for link in self.links.values()), return_exceptions=True)
        if self.matching:
            await self.matching.close()

    def on_view(self) -> None:
        if self.matching:
            self.matching.on_view()
        alive = {m.id for m in self.membership.alive(mpb.ROLE_AGENT)}
        for peer in [p for p in self.links if p not in alive]:
            asyncio.create_task(self._drop_link(peer))

    async def _drop_link(self, peer: str) -> None:
        link = self.links.pop(peer, None)
        if link:
            undelivered = len(link.unacked)
            await link.close()
            self.metrics.dropped.inc(undelivered)

    def link(self, peer: mpb.Member) -> Link:
        link = self.links.get(peer.id)
        if link is None or link.address != peer.address:
            link = self.links[peer.id] = Link(self.config.id, peer.id, peer.address, self.window_bytes,
                                             on_break=self._peer_broke)
        return link

    def _peer_broke(self, peer: str) -> None:
        asyncio.create_task(self.membership.report(peer, "relay stream broke"))

    def export_link_metrics(self) -> None:
        for peer, link in self.links.items():
            self.link_queue.labels(peer).set(link.queue_length)

    # -- topics ----------------------------------------------------------------------

    async def topic(self, name: str) -> pb.Topic:
        """The topic from the view, or from membership when the view has not caught up."""
        if not name:
            raise InvalidArgument("topic is required")
        t = self.membership.topics.get(name)
        if t is None:
            try:
                t = await AdminProxy(self).call("GetTopic", ppb.GetTopicRequest(name=name))
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    raise NotFound(f"topic {name!r} does not exist") from None
                raise Unavailable(f"membership unreachable: {e.details()}") from None
            self.membership.topics.setdefault(name, t)
        return t

    def schema(self, topic: pb.Topic) -> Schema:
        return schema_from_pb(topic.schema)

    # -- publish ---------------------------------------------------------------------

    def submit(self, event: pb.Event) -> asyncio.Future:
        """Queue a validated event; the future gives (destinations, delivery futures)."""
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((event, future))
        return future

    async def _dispatch_loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                results = await self.matching.match([e for e, _ in batch])
            except EchelonError as e:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(e)
                continue
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - never let the dispatcher die
                log.exception("dispatch failed")
                for _, future in batch:
                    if not future.done():
                        future.set_exception(Unavailable(f"dispatch failed: {e}"))
                continue
            self._fan_out(batch, results)

    def _fan_out(self, batch, results: list[xpb.MatchResult]) -> None:
        """Point-to-point: one frame per destination agent holding all its events."""
        agents = {m.id: m for m in self.membership.alive(mpb.ROLE_AGENT)}
        frames: dict[str, rpb.RelayFrame] = {}
        per_event: list[list[str]] = []
        for (event, _), result in zip(batch, results):
            dests = [a.agent for a in result.agents if a.agent in agents]
            per_event.append(dests)
            for d in dests:
                if d == self.config.id:
                    continue
                frame = frames.get(d)
                if frame is None:
                    frame = frames[d] = rpb.RelayFrame(source=self.config.id)
                frame.messages.add(event=event, destinations=[d])
        sent = {d: self.link(agents[d]).send(f) for d, f in frames.items()}
        for d, f in frames.items():
            self.metrics.copies.labels("root").inc()
            self.link_enqueued.labels(d).inc()
            self.sent_bytes.labels(d).inc(f.ByteSize())
        for (event, future), dests in zip(batch, per_event):
            if self.config.id in dests:
                self.deliver_local(event)
            if not future.done():
                future.set_result((len(dests), [sent[d] for d in dests if d in sent]))
        self.export_link_metrics()

    # -- local delivery --------------------------------------------------------------

    def deliver_local(self, event: pb.Event) -> int:
        """Offer an event to every matching local subscription, once per message id."""
        if not self.dedup.first_time((event.id.producer_id, event.id.sequence), time.monotonic()):
            self.metrics.duplicates.inc()
            return 0
        attrs = None
        offered = 0
        for sub in list(self.subs.values()):
            if sub.topic != event.topic:
                continue
            attrs = attrs if attrs is not None else attributes_from_pb(event.attributes)
            if sub.filter.matches(attrs):
                if sub.offer(event):
                    offered += 1
                else:
                    self._overflow(sub)
        if offered:
            self.metrics.latency.observe(max(0.0, time.time() - event.publish_time_unix_nanos / 1e9))
        return offered

    def _overflow(self, sub: Subscription) -> None:
        if sub.closed:
            return
        self.metrics.overflows.inc()
        log.warning("subscription %s overflowed its backlog of %d", sub.id, sub.max_backlog)
        asyncio.create_task(self.close_subscription(sub))

    async def close_subscription(self, sub: Subscription) -> None:
        sub.closed = True
        sub.changed.set()
        if self.subs.get(sub.name) is sub:
            del self.subs[sub.name]
        self.metrics.subscriptions.set(len(self.subs))
        self._advertise()
        await self.matching.remove([sub.id])

    def _advertise(self) -> None:
        self.membership.set_topics(set(), {s.topic for s in self.subs.values()})

    async def open_subscription(self, open_: ppb.SubscriptionOpen) -> Subscription:
        topic = await self.topic(open_.topic)
        flt = filter_from_request(open_.filter, open_.filter_text)
        flt.validate(self.schema(topic))
        name = open_.subscription
        if name:
            if name.startswith("~") or "/" in name:
                raise InvalidArgument(f"subscription name {name!r}: no leading '~' and no '/'")
            sub = self.subs.get(name)
            if sub is not None:
                if sub.attached:
                    raise AlreadyExists(f"subscription {name!r} is attached to another stream")
                if sub.topic != topic.name:
                    raise FailedPrecondition(f"subscription {name!r} is on topic {sub.topic!r}")
                if sub.filter != flt:
                    await self._register(sub.id, topic.name, flt)
                    sub.filter = flt
                return sub
        else:
            self._ephemeral += 1
            name = f"~{self._ephemeral}"
        sub = Subscription(f"{self.config.id}/{name}", name, topic.name, flt, self.max_backlog)
        await self._register(sub.id, topic.name, flt)
        self.subs[name] = sub
        self.metrics.subscriptions.set(len(self.subs))
        self._advertise()
        return sub

    async def _register(self, sid: str, topic: str, flt) -> None:
        try:
            await self.matching.register([xpb.Subscription(id=sid, agent=self.config.id, topic=topic,
                                                           filter=filter_to_pb(flt))])
        except grpc.aio.AioRpcError as e:
            raise InvalidArgument(e.details()) if e.code() == grpc.StatusCode.INVALID_ARGUMENT \
                else Unavailable(e.details()) from None


class PubSubServicer(pgrpc.PubSubServicer):
    def __init__(self, node: AgentNode):
        self.node = node
        self._producers = 0

    async def _accept(self, req: ppb.PublishRequest, producer: str, seq: int) -> asyncio.Future:
        """Validate and queue; raises a domain error for a bad request (nothing queued)."""
        node = self.node
        topic = await node.topic(req.topic)
        attrs = attributes_from_pb(req.attributes)
        node.schema(topic).validate_event(attrs)
        event = pb.Event(id=pb.MessageId(producer_id=producer, sequence=seq), topic=topic.name,
                         attributes=req.attributes, payload=req.payload, ordering_key=req.ordering_key,
                         publish_time_unix_nanos=time.time_ns())
        return node.submit(event)

    async def _ack(self, req: ppb.PublishRequest, producer: str, seq: int, accepted) -> ppb.PublishAck:
        ack = ppb.PublishAck(producer_id=producer, sequence=seq)
        try:
            if isinstance(accepted, BaseException):
                raise accepted
            destinations, deliveries = await accepted
            ack.destinations = destinations
            if req.ack_level == ppb.ACK_LEVEL_DELIVERED and deliveries:
                await asyncio.gather(*deliveries)
            self.node.metrics.published.labels("ok").inc()
        except Exception as e:  # noqa: BLE001 - reported in the ack, the stream goes on
            code, message = status_of(e) or (grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}")
            if status_of(e) is None:
                log.exception("publish failed")
            ack.code, ack.error = code.value[0], message
            self.node.metrics.published.labels(code.name.lower()).inc()
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
                    req = ppb.PublishRequest()
                    req.CopyFrom(first)  # the first slice carries the attributes
                    req.payload = b"".join(parts)
                try:
                    accepted = await self._accept(req, producer, seq)
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
        sub = await node.open_subscription(first.open)
        sub.attach(first.open.credits)
        # Headers now: the client's `start()` returns once the subscription is registered.
        await context.send_initial_metadata((("x-echelon-subscription", sub.id),))

        async def read():
            async for req in request_iterator:
                if req.HasField("ack"):
                    sub.ack(req.ack.delivery_ids, req.ack.credits)
                else:
                    raise InvalidArgument("`open` may only be sent once")

        reader = asyncio.create_task(read())
        try:
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
                node.metrics.deliveries.inc()
                if pending.redeliveries:
                    node.metrics.redeliveries.inc()
                yield ppb.Delivery(delivery_id=delivery_id, subscription=sub.name, event=pending.event,
                                   redelivery_count=pending.redeliveries)
        finally:
            reader.cancel()
            sub.detach()
            if not sub.named and not sub.closed:
                await node.close_subscription(sub)

    async def Unsubscribe(self, request, context):
        sub = self.node.subs.get(request.subscription)
        if sub is None:
            raise NotFound(f"subscription {request.subscription!r} does not exist on this agent")
        await self.node.close_subscription(sub)
        return ppb.UnsubscribeResponse()


class RelayServicer(rgrpc.RelayServicer):
    """Receives frames from peers: delivers locally, then acknowledges."""

    def __init__(self, node: AgentNode):
        self.node = node

    async def Stream(self, request_iterator, context):
        peer = dict(context.invocation_metadata()).get("x-echelon-member", "?")
        node = self.node
        known = {m.id for m in node.membership.members.values()}
        label = peer if peer in known else "unknown"
        async for frame in request_iterator:
            node.received_bytes.labels(label).inc(frame.ByteSize())
            for msg in frame.messages:
                if node.config.id in msg.destinations:
                    node.deliver_local(msg.event)
            yield rpb.RelayAck(seqs=[frame.seq])


class AdminProxy(pgrpc.AdminServicer):
    """Topic administration is stored by membership; the agent forwards, failing over."""

    def __init__(self, node: AgentNode):
        self.node = node

    async def call(self, method: str, request):
        last = None
        for address in self.node.config.membership:
            async with channel(address) as ch:
                try:
                    return await getattr(pgrpc.AdminStub(ch), method)(request, timeout=5.0)
                except grpc.aio.AioRpcError as e:
                    if e.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                    last = e
        raise last

    async def _forward(self, method: str, request, context):
        try:
            response = await self.call(method, request)
        except grpc.aio.AioRpcError as e:
            await context.abort(e.code(), e.details())
        if method == "CreateTopic":
            self.node.membership.topics[response.name] = response
        elif method == "DeleteTopic":
            self.node.membership.topics.pop(request.name, None)
        return response

    async def CreateTopic(self, request, context):
        return await self._forward("CreateTopic", request, context)

    async def GetTopic(self, request, context):
        return await self._forward("GetTopic", request, context)

    async def ListTopics(self, request, context):
        return await self._forward("ListTopics", request, context)

    async def DeleteTopic(self, request, context):
        return await self._forward("DeleteTopic", request, context)
