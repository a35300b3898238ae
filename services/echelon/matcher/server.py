"""The matcher service: the gRPC face of the tier protocol (tier.py) at one matcher.

Agents call `Register`, `Remove`, `Match` and `Reconcile` on any matcher (the entry);
matchers call each other's `Store`, `Drop`, `Match` in holder mode, `Sync` and
`Holdings`. A `Match` answer suggests the agent's next entry (fanout.py says why). Zones
come from the routing plan when it names the topic, else from the default plan
(layout.py). Agents remain the owners of their subscriptions: they refill a matcher that
comes back with a new incarnation (agent/matching.py), a safety net under the mirrors,
and reconcile what the tier holds for them (reconcile.py); the copies of an agent gone
for the park time are reaped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from operator import attrgetter

import grpc
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from echelon.core.can import Zone
from echelon.contract.schema import SchemaError
from echelon.dataplane.dissemination import PARK_SECONDS
from echelon.matcher.answer import Answers
from echelon.matcher.layout import Copy
from echelon.dataplane.tiers import tiers
from echelon.matcher.peers import GrpcTransport, StaleLayout, Status, TierView
from echelon.matcher.reconcile import Reaper, holdings, reconcile
from echelon.matcher.refill import TIMEOUT as REFILL_TIMEOUT
from echelon.matcher.refill import Refill
from echelon.matcher.sample import EventSampler, sample
from echelon.matcher.tier import Tier
from echelon.contract.errors import InvalidArgument
from echelon.runtime.member import lifetime
from echelon.runtime.metrics import LATENCY_BUCKETS
from echelon.runtime.node import Node, NodeConfig
from echelon.contract import zstream
from echelon.contract.transport import MAX_MESSAGE_BYTES, require_member
from echelon.contract.wire import attributes_from_pb, attributes_read, filter_from_pb, schema_from_pb, value_field
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import matcher_pb2_grpc as xgrpc
from echelon.v1 import membership_pb2 as mpb

log = logging.getLogger("echelon.matcher")

AHEAD = 16  # an agent's Match batches matched at once on one stream (it sends at most 4)
QUIET = 1.5  # seconds without a call from another matcher (they Sync every second): drained
SERVICE = xpb.DESCRIPTOR.services_by_name["Matcher"].full_name


def _sampled(event) -> dict:
    """An event kept for Sample: all its attributes. One whose value is unset or NaN where
    no zone or index here looked (the agent checks every attribute against the schema
    before it asks; a value nothing here reads is not this matcher's to refuse) keeps the
    rest: its point gives such an attribute the whole domain."""
    try:
        return attributes_from_pb(event.attributes)
    except InvalidArgument:
        out: dict = {}
        for name in event.attributes:
            try:
                out.update(attributes_read((event,), {name: value_field(None)})[0])
            except InvalidArgument:
                pass
        return out


def copy_from_pb(s: xpb.Subscription) -> Copy:
    return Copy(s.id, s.agent, s.topic, s.version, filter_from_pb(s.filter), s)


def add_matcher_servicer(servicer: xgrpc.MatcherServicer, server) -> None:
    """The generated registration, but `Match` answers go out as the bytes answer.py built
    (a message still serialized: the holder's `stale` answer)."""
    handlers = {}

    class Capture:
        def add_generic_rpc_handlers(self, _):
            pass

        def add_registered_method_handlers(self, _, found):
            handlers.update(found)

    xgrpc.add_MatcherServicer_to_server(servicer, Capture())
    match = handlers["Match"]
    handlers["Match"] = grpc.stream_stream_rpc_method_handler(
        match.stream_stream, match.request_deserializer, lambda r: r if type(r) is bytes else r.SerializeToString())
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


def tier_view(member, region: str | None = None) -> TierView:
    """What the layouts depend on, from the membership client: over the matchers of
    `region`'s tier only (dataplane/tiers.py; None: every matcher)."""
    topics = {}
    for name, t in member.topics.items():
        try:
            topics[name] = schema_from_pb(t.schema)
        except InvalidArgument:
            log.warning("topic %s has an invalid schema: ignored", name)
    zones: dict[str, list[Zone]] = defaultdict(list)
    for z in member.plan.zones if member.plan else ():
        zones[z.topic].append(Zone(z.id, tuple(z.low), tuple(z.high), z.owner, tuple(z.replicas)))
    alive = member.alive(mpb.ROLE_MATCHER)
    if region is not None:
        alive = [m for m in alive if m.region == region]  # a matcher serves the region it joined with
    return TierView({m.id: lifetime(m.incarnation) for m in alive}, topics, zones,
                    member.plan_version)


class MatcherMetrics:
    """Per-zone metrics (labels topic and zone: bounded by the plan) and the entry's."""

    def __init__(self, registry, tier: Tier):
        self.tier = tier
        labels = ["topic", "zone"]
        self.zone_events = Counter("echelon_matcher_zone_events_total", "Events matched in a zone.", labels,
                                   registry=registry)
        self.zone_matches = Counter("echelon_matcher_zone_matches_total", "(event, subscription) matches a zone "
                                    "produced.", labels, registry=registry)
        self.zone_latency = Histogram("echelon_matcher_zone_match_seconds", "Time to match one batch in a zone.",
                                      labels, buckets=LATENCY_BUCKETS, registry=registry)
        self.events = Counter("echelon_matcher_events_total", "Events answered as the entry matcher.",
                              registry=registry)
        self.held_events = Counter("echelon_matcher_holder_events_total", "Events matched here for another "
                                   "matcher's entry (holder mode): each one a matcher-to-matcher message's share.",
                                   registry=registry)
        self.batch = Histogram("echelon_matcher_batch_seconds", "Time to answer one Match batch as the entry.",
                               buckets=LATENCY_BUCKETS, registry=registry)
        self.copies = Gauge("echelon_matcher_copies", "Subscription copies held (primaries and mirrors).",
                            registry=registry)
        self.reaped = Counter("echelon_matcher_copies_reaped_total", "Subscription copies dropped because "
                              "their agent was DEAD, LEFT or out of the view for the park time.", registry=registry)
        self.copies.set_function(lambda: len(tier.store))
        self.refill_timeouts = Counter("echelon_matcher_refill_timeouts_total", "Agents alive in the view that "
                                       "had not refilled this restarted matcher when it stopped waiting for them "
                                       "(their subscriptions may be missing until they reconcile).",
                                       registry=registry)
        self.complete = Gauge("echelon_matcher_complete", "1 once this matcher holds every alive agent's "
                              "subscriptions (refilled after its start); Match waits until then.", registry=registry)
        self.complete.set_function(lambda: float(tier.refill.done()))
        self.handoffs = Counter("echelon_matcher_handoffs_total", "Layouts this matcher finished pushing (a "
                                "plan or membership change moved zones).", registry=registry)
        self.handoff_copies = Counter("echelon_matcher_handoff_copies_total", "Subscription copies sent to their "
                                      "new holders in hand-offs.", registry=registry)
        registry.register(self)
        self._zone: dict[tuple[str, str], tuple] = {}  # (topic, zone) -> its children of the three
        tier.zones.observe = self.observe
        tier.on_change = self.prune
        tier.layouts.on_handoff = self.handoff

    def observe(self, topic: str, zone: str, events: int, matches: int, seconds: float) -> None:
        children = self._zone.get((topic, zone))
        if children is None:  # labels() looked up once per zone, not three times per batch
            children = self._zone[topic, zone] = tuple(m.labels(topic, zone) for m in (
                self.zone_events, self.zone_matches, self.zone_latency))
        children[0].inc(events)
        children[1].inc(matches)
        children[2].observe(seconds)

    def handoff(self, copies: int) -> None:
        self.handoffs.inc()
        self.handoff_copies.inc(copies)

    def prune(self) -> None:
        """Forget the label sets of zones this matcher holds no more."""
        held = {(t, z) for t, ts in self.tier.layouts.topics.items() for L in ts.layouts() for z in L.index}
        for key in set(self._zone) - held:
            del self._zone[key]
            for metric in (self.zone_events, self.zone_matches, self.zone_latency):
                try:
                    metric.remove(*key)
                except KeyError:
                    pass

    def describe(self):
        return []

    def collect(self):
        g = GaugeMetricFamily("echelon_matcher_zone_subscriptions", "Subscriptions stored in a zone (primary "
                              "copies this matcher indexes, active layout).", labels=["topic", "zone"])
        for topic, ts in sorted(self.tier.layouts.topics.items()):
            if ts.active is not None:
                for zone, index in sorted(ts.active.index.items()):
                    g.add_metric([topic, zone], len(index))
        yield g


class MatcherServicer(xgrpc.MatcherServicer):
    def __init__(self, node: "MatcherNode"):
        self.node = node
        self.tier = node.tier
        self.answers = Answers()

    async def Register(self, request: xpb.RegisterRequest, context) -> xpb.RegisterResponse:
        copies = []
        stamp = time.time_ns()
        if request.refill:
            require_member(context, request.refill, "agent", "Register (refill)")
        for i, s in enumerate(request.subscriptions):  # validate all before changing anything
            if not s.id or not s.agent or not s.topic:
                raise InvalidArgument(f"subscription #{i} {s.id!r}: id, agent and topic are required")
            require_member(context, s.agent, "agent", f"Register of subscription {s.id!r}")
            flt = filter_from_pb(s.filter)
            if len(flt.terms) != 1:  # an agent registers each term of a disjunction as its own entry
                raise InvalidArgument(f"subscription {s.id!r}: an entry is one conjunction, not any_of")
            schema = await self.tier.schema(s.topic)
            try:
                flt.validate(schema)
            except SchemaError as e:
                raise InvalidArgument(f"subscription {s.id!r}: {e}") from None
            if not s.version:
                s = xpb.Subscription(id=s.id, agent=s.agent, topic=s.topic, filter=s.filter, version=stamp + i)
            copies.append(Copy(s.id, s.agent, s.topic, s.version, flt, s))
        return xpb.RegisterResponse(registered=await self.tier.register(copies, request.refill))

    async def Remove(self, request: xpb.RemoveRequest, context) -> xpb.RemoveResponse:
        require_member(context, None, "agent", "Remove")
        removed = await self.tier.remove(list(request.ids), request.version or time.time_ns())
        return xpb.RemoveResponse(removed=removed)

    async def Match(self, request_iterator, context):
        # Routers too: one matches what other regions send its own (router/regional.py).
        require_member(context, None, ("agent", "matcher", "router"), "Match")
        # An agent sends another batch when one is late (agent/dispatch.py): each is matched
        # as it is read, its answer goes back in order; past AHEAD unanswered, reading waits.
        # A batch alone is matched here, inline; one read while another is matched, beside
        # it as a task (no task per lone event).
        answers: asyncio.Queue = asyncio.Queue(AHEAD)
        busy = [False]
        # An agent offers zstd: its requests may then come compressed, and the answers go so
        # (contract/zstream.py, docs/compression.md).
        compressor = decompressor = None
        if zstream.enabled() and zstream.offered(context.invocation_metadata()):
            compressor, decompressor = zstream.Compressor(), zstream.Decompressor(MAX_MESSAGE_BYTES)
            await context.send_initial_metadata(zstream.ACCEPT)

        async def read():
            try:
                async for batch in request_iterator:
                    if batch.zstd:
                        batch = zstream.decoded(batch, decompressor)
                    if batch.layout:
                        await answers.put(self._holder(batch))
                    else:
                        await answers.put(asyncio.ensure_future(self._entry(batch)) if busy[0] or answers.qsize()
                                          else batch)
            except Exception as e:  # noqa: BLE001 - ends the stream after the answers before it
                await answers.put(e)
            await answers.put(None)

        reader = asyncio.create_task(read())
        try:
            while (answer := await answers.get()) is not None:
                if isinstance(answer, Exception):
                    raise answer
                if isinstance(answer, xpb.MatchRequest):
                    busy[0] = True
                    try:
                        answer = await self._entry(answer)
                    finally:
                        busy[0] = False
                answer = answer if isinstance(answer, (bytes, xpb.MatchResponse)) else await answer
                if compressor is not None:
                    answer = zstream.wrap(compressor.block(
                        answer if type(answer) is bytes else answer.SerializeToString()))
                yield answer
        finally:
            reader.cancel()
            while not answers.empty():
                if isinstance(answer := answers.get_nowait(), asyncio.Future):
                    answer.cancel()

    async def _entry(self, batch: xpb.MatchRequest) -> bytes:
        """An agent's batch: every zone its events meet, here or at their holders."""
        start = time.perf_counter()
        wire = batch.events
        topics = list(map(attrgetter("topic"), wire))
        self.node.events.add(topics, wire, _sampled)
        weights: dict[str, int] = {}
        results = await self.tier.match(None, batch.agents_only, wire, weights, topics)  # reads what it matches on
        best = max(weights, key=weights.__getitem__, default=self.tier.me)
        response = self.answers.response(batch.batch_id, results, batch.agents_only,
                                         best if weights.get(best, 0) > weights.get(self.tier.me, 0) else "")
        self.node.metrics.events.inc(len(batch.events))
        self.node.metrics.batch.observe(time.perf_counter() - start)
        return response

    def _holder(self, batch: xpb.MatchRequest) -> bytes | xpb.MatchResponse:
        """Another matcher's request: the named zones of one layout held here, nothing more."""
        wire = batch.events
        zones = {z.zone: list(z.events) for z in batch.zones}
        if any(i >= len(wire) for idxs in zones.values() for i in idxs):
            raise InvalidArgument("zone event positions out of range")
        if any(a >= b for idxs in zones.values() for a, b in zip(idxs, idxs[1:])):  # as an entry sends them
            raise InvalidArgument("zone event positions not increasing")
        try:  # reads only the attributes the layout uses
            results = self.tier.match_zones(batch.topic, batch.layout, None, zones, batch.agents_only, wire)
        except StaleLayout as e:
            return xpb.MatchResponse(batch_id=batch.batch_id, stale=str(e))
        self.node.metrics.held_events.inc(len(wire))
        return self.answers.response(batch.batch_id, results, batch.agents_only)

    async def Store(self, request: xpb.StoreRequest, context) -> xpb.StoreResponse:
        require_member(context, request.sender, "matcher", "Store")
        copies = [copy_from_pb(s) for s in request.subscriptions]
        stored, _ = await self.tier.accept(request.topic, copies, request.sender, list(request.layouts))
        return xpb.StoreResponse(stored=stored)

    async def Drop(self, request: xpb.DropRequest, context) -> xpb.DropResponse:
        require_member(context, request.sender, "matcher", "Drop")
        if len(request.ids) != len(request.versions):
            raise InvalidArgument("one version per id")
        removed = await self.tier.drop(list(zip(request.ids, request.versions)), request.sender, list(request.sent_to))
        return xpb.DropResponse(removed=removed)

    async def Sync(self, request: xpb.SyncRequest, context) -> xpb.SyncResponse:
        require_member(context, request.member, "matcher", "Sync")
        status = {s.topic: Status(s.adopted, s.pushed, s.filled, s.active, s.complete) for s in request.layouts}
        empty = self.tier.on_status(request.member, lifetime(request.incarnation), request.seq, status)
        return xpb.SyncResponse(empty=[xpb.ZoneRef(topic=t, layout=k, zone=z) for t, k, z in empty],
                                lease_ms=round(self.tier.empty.lease * 1000))

    async def Revoke(self, request: xpb.RevokeRequest, context) -> xpb.RevokeResponse:
        require_member(context, request.sender, "matcher", "Revoke")
        if any(not (z.topic and z.layout and z.zone) for z in request.zones):
            raise InvalidArgument("a revoked zone needs its topic, layout and zone")
        self.tier.empty.revoked([(z.topic, z.layout, z.zone) for z in request.zones])
        return xpb.RevokeResponse()

    async def Reconcile(self, request: xpb.ReconcileRequest, context) -> xpb.ReconcileResponse:
        require_member(context, request.agent, "agent", "Reconcile")
        return await reconcile(self.tier, self.node.transport, request)

    async def Holdings(self, request: xpb.HoldingsRequest, context) -> xpb.HoldingsResponse:
        require_member(context, None, "matcher", "Holdings")
        return xpb.HoldingsResponse(holdings=[xpb.Holding(id=i, version=v)
                                              for i, v in holdings(self.tier, request.agent)])

    async def ListZones(self, request: xpb.ListZonesRequest, context) -> xpb.ListZonesResponse:
        tier = self.tier
        out = xpb.ListZonesResponse(member=tier.me, copies=len(tier.store))
        for topic, ts in sorted(tier.layouts.topics.items()):
            if request.topic and topic != request.topic:
                continue
            t = out.topics.add(topic=topic, active=ts.active.key if ts.active else "",
                               pending=ts.pending.key if ts.pending else "")
            if ts.active is None:
                continue
            t.source = ts.active.source
            held = tier.zones.held(topic, ts.active)
            for z in ts.active.zones:
                t.zones.add(topic=topic, id=z.id, low=z.low, high=z.high, members=z.members,
                            subscriptions=held[z.id][0], mirrors=held[z.id][1])
        return out

    async def Sample(self, request: xpb.SampleRequest, context) -> xpb.SampleResponse:
        return sample(self.tier, self.node.events, request)


class MatcherNode(Node):
    role = mpb.ROLE_MATCHER

    def __init__(self, config: NodeConfig, deadline: float = 8.0, park_seconds: float = PARK_SECONDS,
                 refill_seconds: float = REFILL_TIMEOUT):
        super().__init__(config)
        self.transport = GrpcTransport(config.id, lambda: self.membership, self.incarnation)
        refill = Refill(self._owed_refills, refill_seconds)
        self.tier = Tier(config.id, self.transport, self.lifetime, deadline, refill=refill)
        self.metrics = MatcherMetrics(self.registry, self.tier)
        refill.on_timeout = self.metrics.refill_timeouts.inc
        self.reaper = Reaper(self.tier, lambda: [m.id for m in self.membership.alive(mpb.ROLE_AGENT)],
                             self.metrics.reaped, park_seconds)
        self._reaping: asyncio.Task | None = None
        self.events = EventSampler()  # for Sample: the routing job's event points
        self.matcher = MatcherServicer(self)
        self.server.add(add_matcher_servicer, self.matcher, SERVICE)

    def _owed_refills(self) -> list[str]:
        """The agents whose refill the barrier waits for: alive, and DEAD too (not LEFT). A
        DEAD agent's messages are parked for it (dataplane/parking.py), and one declared
        DEAD by a stall comes back with its subscriptions: answering without them lost the
        events they matched (refill.py bounds the wait)."""
        served = tiers(self.membership)
        return [m.id for m in self.membership.members.values() if m.role == mpb.ROLE_AGENT
                and m.state != mpb.MEMBER_STATE_LEFT and served.serving(m.region) == self.config.region]

    def incarnation(self) -> int:
        return self.membership.member.incarnation if self.membership else 0

    def lifetime(self) -> int:
        """This process's lifetime: what the tier keys layouts by (not the incarnation, which
        a refuted suspicion bumps while every copy here stays)."""
        return lifetime(self.incarnation())

    async def on_start(self) -> None:
        self.tier.start()
        self.membership.on_plan(self.on_view)
        self.on_view()
        self._reaping = asyncio.create_task(self.reaper.run(), name="reaper")

    async def on_drain(self, deadline: float) -> None:
        # Leave first: the other matchers adopt layouts without this one (its zones
        # recovered from the mirrors) while it still answers those routing by the old one.
        if self.membership is not None:
            await self.membership.stop(leave=True)
        await self.tier.quiet(QUIET, deadline)

    async def on_stop(self) -> None:
        if self._reaping:
            self._reaping.cancel()
        await self.tier.stop()
        await self.transport.close()

    def on_view(self) -> None:
        if self.membership is not None:
            self.tier.update_view(tier_view(self.membership, self.config.region))
