"""The agent: the client API (`PubSub`, `Admin`), local delivery, and relaying.

The path of a publish (DESIGN.md): validate and id the event, queue it for the
dispatcher, which matches a whole batch at once on the matcher tier (attributes only:
payloads stay here), then hands the batch to the data plane (`dataplane`), which sends
it down the topic's LBDD trees, or to every destination itself in p2p mode. Frames
from peers arrive on `Relay.Stream`; the data plane delivers, forwards and says when
each may be acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from prometheus_client import Counter, Gauge, Histogram

from echelon.agent.dataplane import PARK_SECONDS, DataPlane
from echelon.agent.links import Link, LinkMetrics
from echelon.agent.matching import MatchClient
from echelon.agent.subscriptions import Subscription
from echelon.agent.trees import Trees, hinted
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
                               "acknowledging (their messages are re-routed).", registry=r)
        self.rerouted = Counter("echelon_agent_rerouted_messages_total", "Messages and slices re-routed by a "
                                "path update after their target left the view.", registry=r)
        self.lost = Counter("echelon_agent_destinations_lost_total", "Destinations dropped from a copy: the "
                            "member left the view, or stayed DEAD past the park time or bound.", registry=r)
        self.parked = Counter("echelon_agent_destinations_parked_total", "Destinations parked because their "
                              "member was DEAD in this agent's view.", registry=r)
        self.unparked = Counter("echelon_agent_destinations_unparked_total", "Parked destinations sent on after "
                                "their member came back ALIVE.", registry=r)
        self.parked_now = Gauge("echelon_agent_parked_destinations", "Destinations parked now, waiting for a "
                                "DEAD member to come back.", registry=r)
        self.reassembling = Gauge("echelon_agent_payloads_reassembling", "Sliced payloads partly received.",
                                  registry=r)


class AgentNode(Node):
    role = mpb.ROLE_AGENT

    def __init__(self, config: NodeConfig, max_backlog: int = 10_000, window_bytes: int = 8 << 20,
                 dissemination: str = "lbdd", slice_bytes: int = 65536, stripes: int = 8,
                 park_seconds: float = PARK_SECONDS):
        super().__init__(config)
        if dissemination not in ("lbdd", "p2p"):
            raise ValueError(f"dissemination {dissemination!r}: lbdd or p2p")
        if not 1024 <= slice_bytes <= 16 << 20:
            raise ValueError(f"slice size {slice_bytes}: 1 KiB to 16 MiB")
        if not 1 <= stripes <= 64:
            raise ValueError(f"stripes {stripes}: 1 to 64")
        self.max_backlog = max_backlog
        self.window_bytes = window_bytes
        self.dissemination = dissemination
        self.slice_bytes = slice_bytes
        self.stripes = stripes
        self.park_seconds = park_seconds
        self.stopping = False
        self.plane: DataPlane | None = None
        self._ready = asyncio.Event()  # the data plane exists: frames may be taken
        self.metrics = AgentMetrics(self.registry)
        self.subs: dict[str, Subscription] = {}  # by name
        self.links: dict[str, Link] = {}
        self.dedup = DedupWindow()
        self.matching: MatchClient | None = None
        self._queue: asyncio.Queue[tuple[pb.Event, bytes, asyncio.Future]] = asyncio.Queue()
        self._dispatcher: asyncio.Task | None = None
        self._expiry: asyncio.Task | None = None
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
        self.metrics.reassembling.set_function(lambda: len(self.plane.reassembler) if self.plane else 0)
        self.metrics.parked_now.set_function(lambda: self.plane.parked_count if self.plane else 0)

    # -- lifecycle -------------------------------------------------------------------

    async def on_start(self) -> None:
        trees = Trees(self.config.id, self.address, self.dissemination, self.stripes)
        trees.update(self.membership.alive(mpb.ROLE_AGENT), self._dead_agents(), hinted(self.membership.plan))
        self.membership.on_plan(self.on_view)
        self.plane = DataPlane(self, trees, self.slice_bytes, park_seconds=self.park_seconds)
        self._ready.set()
        self.matching = MatchClient(self.membership)
        self.matching.on_view()
        self._dispatcher = asyncio.create_task(self._dispatch_loop(), name="dispatcher")
        self._expiry = asyncio.create_task(self._expire_loop(), name="park-expiry")

    async def on_stop(self) -> None:
        self.stopping = True  # from here on nothing is acknowledged or re-routed
        for task in (self._dispatcher, self._expiry):
            if task:
                task.cancel()
        await asyncio.gather(*(link.close() for link in self.links.values()), return_exceptions=True)
        if self.matching:
            await self.matching.close()

    def on_view(self) -> None:
        if self.matching:
            self.matching.on_view()
        agents = self.membership.alive(mpb.ROLE_AGENT)
        if self.plane:
            self.plane.trees.update(agents, self._dead_agents(), hinted(self.membership.plan))  # Algorithm 3
            self.plane.on_view()  # members back from DEAD get what was parked for them
        alive = {m.id for m in agents}
        for peer in [p for p in self.links if p not in alive]:
            self._drop_link(peer)

    def _dead_agents(self) -> set[str]:
        return {m.id for m in self.membership.members.values()
                if m.role == mpb.ROLE_AGENT and m.state == mpb.MEMBER_STATE_DEAD}

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.plane.expire()

    def _drop_link(self, peer: str) -> None:
        """The peer left the view: its unacknowledged frames come back and are re-routed."""
        link = self.links.pop(peer, None)
        if link:
            self.metrics.dropped.inc(len(link.unacked))
            try:
                self.link_queue.remove(peer)
            except KeyError:
                pass
            futures = link.abandon()
            if self.plane:
                self.plane.settle(futures)  # re-routed now, ahead of anything routed on the new view
            asyncio.create_task(link.close())

    def link(self, peer: mpb.Member) -> Link:
        link = self.links.get(peer.id)
        if link is None or link.address != peer.address:
            if link is not None:  # the peer came back on another address
                self._drop_link(peer.id)
            link = self.links[peer.id] = Link(
                self.config.id, peer.id, peer.address, self.window_bytes, on_break=self._peer_broke,
                metrics=LinkMetrics(self.link_enqueued.labels(peer.id), self.link_dequeued.labels(peer.id),
                                    self.sent_bytes.labels(peer.id)))
            self.link_queue.labels(peer.id).set_function(lambda: link.queue_length)
        return link

    def _peer_broke(self, peer: str) -> None:
        if not self.stopping:
            asyncio.create_task(self.membership.report(peer, "relay stream broke"))

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

    def submit(self, event: pb.Event, payload: bytes = b"") -> asyncio.Future:
        """Queue a validated event (its payload apart); the future gives (destinations, delivery futures)."""
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((event, payload, future))
        return future

    async def _dispatch_loop(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                results = await self.matching.match([e for e, _, _ in batch])
                await self._fan_out(batch, results)
            except EchelonError as e:
                for *_, future in batch:
                    if not future.done():
                        future.set_exception(e)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - never let the dispatcher die
                log.exception("dispatch failed")
                for *_, future in batch:
                    if not future.done():
                        future.set_exception(Unavailable(f"dispatch failed: {e}"))

    async def _fan_out(self, batch, results: list[xpb.MatchResult]) -> None:
        """Local delivery here, the rest to the data plane as the root."""
        alive, dead = self.plane.trees.alive, self.plane.trees.dead
        items = []
        for (event, payload, _), result in zip(batch, results):
            # A DEAD destination is parked by the data plane until it comes back (or the park ends).
            dests = [a.agent for a in result.agents if a.agent == self.config.id or alive(a.agent) or a.agent in dead]
            if self.config.id in dests:
                if payload:
                    whole = pb.Event()
                    whole.CopyFrom(event)
                    whole.payload = payload
                    self.deliver_local(whole)
                else:
                    self.deliver_local(event)
            items.append((event, payload, dests))
        # Accepted: held here. The futures report delivery once every destination has it.
        delivered = await self.plane.publish(items)
        for (*_, future), (_, _, dests), done in zip(batch, items, delivered):
            if not future.done():
                future.set_result((len(dests), [done]))

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
            if sub.filter.matches(attrs) and sub.owes(event):
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
        if not self.stopping:  # stopping: the matcher channels are closed; matchers drop us with the view
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

    async def _accept(self, req: ppb.PublishRequest, producer: str, seq: int, payload: bytes) -> asyncio.Future:
        """Validate and queue; raises a domain error for a bad request (nothing queued)."""
        node = self.node
        topic = await node.topic(req.topic)
        attrs = attributes_from_pb(req.attributes)
        node.schema(topic).validate_event(attrs)
        event = pb.Event(id=pb.MessageId(producer_id=producer, sequence=seq), topic=topic.name,
                         attributes=req.attributes, ordering_key=req.ordering_key,
                         publish_time_unix_nanos=time.time_ns())
        return node.submit(event, payload)

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
    """Receives frames from peers; acknowledges each once the data plane says its subtree holds it."""

    def __init__(self, node: AgentNode):
        self.node = node

    async def Stream(self, request_iterator, context):
        peer = dict(context.invocation_metadata()).get("x-echelon-member", "?")
        node = self.node
        received = node.received_bytes.labels(peer if peer in node.membership.members else "unknown")
        acks: asyncio.Queue[int | None] = asyncio.Queue()
        await node._ready.wait()

        async def read():
            async for frame in request_iterator:
                received.inc(frame.ByteSize())
                node.plane.receive(frame, lambda seq=frame.seq: acks.put_nowait(seq))

        reader = asyncio.create_task(read())
        reader.add_done_callback(lambda _: acks.put_nowait(None))
        try:
            while (seq := await acks.get()) is not None:
                seqs = [seq]
                while not acks.empty() and (seq := acks.get_nowait()) is not None:
                    seqs.append(seq)
                yield rpb.RelayAck(seqs=seqs)
                if seq is None:
                    break
            error = reader.exception() if reader.done() and not reader.cancelled() else None
            if error is not None and not isinstance(error, grpc.aio.AioRpcError):
                log.error("relay stream from %s failed", peer, exc_info=error)
        finally:
            reader.cancel()


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
