"""The router: a region's gateway on the inter-region overlay (OctopiA SCOT;
docs/event-path.md, step 4; core/scot.py for the mapping of clusters to regions).

Frames arrive on the agents' `Relay.Stream` servicer (`dataplane.relay`), from the region's
agents (events for other
regions) and from other routers. Each message is split by the regions of its
destinations (from the view):

- the router's own region: it roots the LBDD tree over those destination agents, with
  the agents' own data plane (`dataplane.dissemination.DataPlane` over `dataplane.trees.Trees`);
  a message for the region as a whole (`@region`: it has a matcher tier of its own,
  dataplane/tiers.py) is first matched by that tier (`regional.RegionMatch`);
- other regions: SNR or IDR over the SCOT (`overlay.Overlay`), again through a
  `DataPlane`, so per-link output queues (`dataplane.linkset.LinkSet`, byte windows, resend
  on a broken stream), holds, acks aggregated back to the sender, dedup of re-sent
  copies and path update after a router's crash are the code the agents run; both
  planes see the router through the agents' `PlaneHost`.

An incoming frame is acknowledged once both parts are: so an ack means every region it
serves holds it, the agents' guarantee. Every `interval` the router measures each
router link's output queue (`core.idr.CongestionMeter`: CE and q) for IDR's decisions.

Flow control: like an agent relay, a router forwards at once and never waits for room
(links.py says why); what bounds its queues is the publishing agent's byte window on its
link to the router, since the router acknowledges only what every region holds.
"""

from __future__ import annotations

import asyncio

import grpc

from prometheus_client import Counter, Gauge

from echelon.dataplane.dissemination import DataPlane
from echelon.dataplane.gateway import region_view
from echelon.dataplane.links import Link
from echelon.dataplane.linkset import LinkSet, PlaneHost
from echelon.dataplane.relay import RelayServicer
from echelon.dataplane.trees import Trees
from echelon.core.dedup import DedupWindow
from echelon.core.idr import CongestionMeter
from echelon.dataplane.tiers import is_pseudo, region_named
from echelon.dataplane.dissemination import event_of
from echelon.router.control import RouterControl, Stream
from echelon.router.overlay import ANY_ALINK, NO_ALINK, Overlay
from echelon.router.regional import RegionMatch
from echelon.runtime.node import Node, NodeConfig
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import relay_pb2 as rpb
from echelon.v1 import relay_pb2_grpc as rgrpc
from echelon.v1 import router_pb2 as opb
from echelon.v1 import router_pb2_grpc as ogrpc



class RouterMetrics:
    """What `DataPlane` counts (copies, rerouted, lost, parked, unparked), the overlay's
    decisions and the congestion of each link (the per-link queue, enqueued, dequeued and
    byte families are the `LinkSet`'s, as on the agents)."""

    def __init__(self, r):
        self.copies = Counter("echelon_router_frames_sent_total", "Frames sent: as the root of a region's "
                              "LBDD tree, or relayed to a router.", ["as"], registry=r)
        self.rerouted = Counter("echelon_router_rerouted_messages_total", "Messages re-routed by a path "
                                "update after their next hop left the view.", registry=r)
        self.lost = Counter("echelon_router_destinations_lost_total", "Destinations dropped: their agent left "
                            "the view, or its region has no router.", registry=r)
        self.parked = Counter("echelon_router_destinations_parked_total", "Destinations parked: their agent "
                              "was DEAD in this router's view.", registry=r)
        self.unparked = Counter("echelon_router_destinations_unparked_total", "Parked destinations sent on.",
                                registry=r)
        self.decisions = Counter("echelon_router_idr_decisions_total", "Routing decisions by IDR rule (none: "
                                 "no target iLink congested, the same sends as SNR).", ["rule"], registry=r)
        self.messages = Counter("echelon_router_messages_total", "Inter-router messages (one per message per "
                                "next hop), by link kind.", ["link"], registry=r)
        self.events = Counter("echelon_router_events_total", "Messages handed over by this region's agents "
                              "(so messages_total / events_total = inter-router copies per event).", registry=r)
        self.undelivered = Counter("echelon_router_frames_undelivered_total", "Frames whose peer left before "
                                   "acknowledging them (re-routed by the path update).", registry=r)
        self.link_ce = Gauge("echelon_link_congestion_element", "OctopiA's CE of an outgoing link over the last "
                             "interval (enqueued / dequeued; +Inf when nothing left a non-empty queue).", ["peer"],
                             registry=r)
        self.unmatched = Counter("echelon_router_unmatched_total", "Events sent to this router's region that "
                                 "matched no subscription of its tier (the price of routing by region, not by "
                                 "event).", registry=r)
        self.skipped = Counter("echelon_router_regions_skipped_total", "Copies for a region as a whole not "
                               "sent: none of its subgroups matched the event (core/cib.py).", registry=r)
        self.link_congested = Gauge("echelon_link_congested", "1 when the link's CE >= 1 and its queue is "
                                    "longer than delta.", ["peer"], registry=r)


class RouterNode(Node):
    role = mpb.ROLE_ROUTER

    def __init__(self, config: NodeConfig, routing: str = "idr", delta: int = 10, interval: float = 0.5,
                 park_seconds: float = 30.0, control: str = "scot"):
        super().__init__(config)
        if routing not in ("snr", "idr"):
            raise ValueError(f"routing {routing!r}: snr or idr")
        if delta < 0:
            raise ValueError("delta must be >= 0")
        if not 0.01 <= interval <= 60:
            raise ValueError(f"interval {interval}: 0.01 to 60 s")
        self.routing = routing
        self.delta = delta
        self.interval = interval
        self.park_seconds = park_seconds
        self.metrics = RouterMetrics(self.registry)
        # The Link's default window: a router never waits for room (see above).
        self.links = LinkSet(config.id, 8 << 20, self.registry, self.metrics.undelivered, self._peer_broke,
                             self._settle, transport=self.server.transport)
        self.meters: dict[str, tuple[Link, CongestionMeter]] = {}  # by peer, for the link it measures
        self.host: PlaneHost | None = None
        self.overlay = Overlay(config.id, config.region, routing, self.metrics)
        self.local: DataPlane | None = None  # roots LBDD trees over this region's agents
        self.relay: DataPlane | None = None  # SNR / IDR to other regions
        # Events sent to the region itself (`@region`) are matched by its own tier.
        self.matching = RegionMatch(lambda: self.membership, config.region,
                                    lambda agent: self.overlay.region_name.get(agent) == self.overlay.region,
                                    self.metrics.unmatched, self.metrics.lost, lambda: self.stopping,
                                    park_seconds)
        # OctopiA's control plane: this region's subgroups out, the others' summaries in.
        self.control = RouterControl(config.id, config.region, lambda: self.membership,
                                     lambda address: self.membership.transport.dial(address), lambda: self.overlay,
                                     control)
        self._ready = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.server.add(rgrpc.add_RelayServicer_to_server, RelayServicer(
            self._ready, lambda peer: self.links.received(peer, peer in self.membership.members), self.receive),
                        rpb.DESCRIPTOR.services_by_name["Relay"].full_name)
        self.server.add(ogrpc.add_RouterServicer_to_server, RouterServicer(self),
                        opb.DESCRIPTOR.services_by_name["Router"].full_name)

    async def on_start(self) -> None:
        # A router holds no subscriptions and is never a destination: nothing to deliver here.
        self.host = PlaneHost(self.config.id, self.address, self.metrics, self.links, DedupWindow(), lambda _: 0)
        self.local = DataPlane(self.host, Trees(self.config.id, self.address), park_seconds=self.park_seconds)
        self.relay = DataPlane(self.host, self.overlay, park_seconds=self.park_seconds)
        self.on_view()
        self.membership.on_plan(self.on_view)  # a plan's cliques may move members between regions
        self._ready.set()
        self._tasks = [asyncio.create_task(self._measure_loop(), name="measure"),
                       asyncio.create_task(self._expire_loop(), name="park-expiry")]

    @property
    def stopping(self) -> bool:
        return self.host is not None and self.host.stopping

    async def on_stop(self) -> None:
        if self.host:
            self.host.stopping = True  # from here on nothing is acknowledged or re-routed
        for task in self._tasks:
            task.cancel()
        await self.matching.close()
        await self.control.close()
        await self.links.close()

    def on_view(self) -> None:
        if self.local is None:
            return
        regions, _, mine, dead = region_view(self.membership, self.config.id, self.config.region)
        routers = self.membership.alive(mpb.ROLE_ROUTER)
        left = {m.id for m in self.membership.members.values() if m.state == mpb.MEMBER_STATE_LEFT}
        self.local.trees.update(mine, dead, left=left)
        self.local.on_view()
        known = {m.region for m in self.membership.members.values()
                 if m.role == mpb.ROLE_ROUTER and m.state != mpb.MEMBER_STATE_LEFT}
        self.overlay.update(routers, self.membership.alive(mpb.ROLE_AGENT), regions, known)
        self.relay.on_view()  # regions back: what was parked for them goes
        self.links.keep({m.id for m in mine} | {m.id for m in routers})
        self.control.on_view()

    def _settle(self, futures) -> None:
        """A dropped link's unacknowledged frames: each plane re-routes those it sent (path update)."""
        for plane in (self.local, self.relay):
            if plane:
                plane.settle(futures)

    def _peer_broke(self, peer: str) -> None:
        if not self.stopping:
            asyncio.create_task(self.membership.report(peer, "relay stream broke"))

    def measure(self) -> None:
        """One interval of OctopiA's link status table: CE and q of every router link."""
        links = self.links.links
        for peer in [p for p, (link, _) in self.meters.items() if links.get(p) is not link]:
            del self.meters[peer]  # dropped (or re-made on a new address: its counters start over)
            for family in (self.metrics.link_ce, self.metrics.link_congested):
                try:
                    family.remove(peer)
                except KeyError:
                    pass
        for peer, link in links.items():
            if self.overlay.kind(peer) == "agent":
                continue
            if peer not in self.meters:
                self.meters[peer] = (link, CongestionMeter(self.delta))
            state = self.meters[peer][1].sample(link.enqueued, link.dequeued, link.queue_length)
            self.overlay.states[self.overlay.position[peer]] = state
            self.metrics.link_ce.labels(peer).set(state.ce)
            self.metrics.link_congested.labels(peer).set(int(state.congested))

    async def _measure_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.measure()

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.local.expire()
            self.relay.expire()

    # -- one incoming frame ------------------------------------------------------------

    def receive(self, peer: str, frame: rpb.RelayFrame, ack) -> None:
        """Split `frame` by region: this region's agents get it down an LBDD tree rooted
        here, the rest goes on over the SCOT; `ack()` once both parts are acknowledged."""
        if self.stopping:
            return
        position = self.overlay.position.get(peer)
        if position is None:
            self.metrics.events.inc(len(frame.messages))
            frame = self._summarised(frame)
        region_of, here = self.overlay.region_name, self.overlay.region
        local = rpb.RelayFrame(source=self.config.id, source_key=self.address)
        remote = rpb.RelayFrame(source=frame.source, source_key=frame.source_key)
        for msg in frame.messages:
            mine = [d for d in msg.destinations if region_of.get(d) == here]
            rest = [d for d in msg.destinations if d not in mine]
            for part, ds in ((local, mine), (remote, rest)):
                if ds:
                    m = part.messages.add()
                    m.CopyFrom(msg)
                    m.ClearField("destinations")
                    m.destinations.extend(ds)
        parts = [p for p in (local, remote) if p.messages]
        pending = [len(parts)]

        def one_done():
            pending[0] -= 1
            if pending[0] == 0:
                ack()

        if not parts:
            ack()
            return
        if local.messages:
            if self.matching.busy or any(is_pseudo(d) for m in local.messages for d in m.destinations):
                once = [one_done]

                def done_once() -> None:  # acknowledged early while the tier is all DEAD (regional.py)
                    if once:
                        once.pop()()

                def deliver(resolved: rpb.RelayFrame) -> None:
                    if resolved.messages:
                        self.local.receive(resolved, done_once)
                    else:
                        done_once()
                self.matching.submit(local, deliver, done_once)
            else:
                self.local.receive(local, one_done)
        if remote.messages:
            # Arrived on an aLink: not back down it (IDR's target aLinks lead away).
            same = position is not None and self.overlay.here is not None and position[1] == self.overlay.here[1]
            self.overlay.came_from = (position,) if same else ANY_ALINK
            try:
                self.relay.receive(remote, one_done)
            finally:
                self.overlay.came_from = NO_ALINK


    def _summarised(self, frame: rpb.RelayFrame) -> rpb.RelayFrame:
        """A frame from an agent of this region (this router is its events' host broker):
        each region named as a whole (`@R`) stays only if R's summary wants the event
        (core/cib.py). A sliced payload keeps every region: its later slices carry no
        attributes to decide by."""
        if not self.control.summaries.complete:
            return frame  # no region's summary yet: every region gets everything
        out = None
        for k, msg in enumerate(frame.messages):
            far = [d for d in msg.destinations if is_pseudo(d)]
            if not far or msg.slice_count > 1 or msg.aborted:
                if out is not None:
                    out.messages.add().CopyFrom(msg)
                continue
            ev = event_of(msg)
            drop = [d for d in far if not self.control.wants(region_named(d), ev.topic, ev.attributes)]
            if drop and out is None:
                out = rpb.RelayFrame(source=frame.source, source_key=frame.source_key,
                                     ack_may_wait=frame.ack_may_wait)
                out.messages.extend(frame.messages[:k])
            if out is None:
                continue
            self.metrics.skipped.inc(len(drop))
            keep = [d for d in msg.destinations if d not in drop]
            if keep:
                m = out.messages.add()
                m.CopyFrom(msg)
                m.ClearField("destinations")
                m.destinations.extend(keep)
        return frame if out is None else out


class RouterServicer(ogrpc.RouterServicer):
    def __init__(self, node: RouterNode):
        self.node = node

    async def Control(self, request_iterator, context):
        stream = Stream()
        try:
            # Read, not iterated: a stream cancelled at stop leaves no generator to finalize.
            while (m := await context.read()) is not grpc.aio.EOF:
                self.node.control.receive(stream, m, context)
        finally:
            self.node.control.ended(stream)
        return opb.ControlReply()

    async def Describe(self, request, context):
        node, ov = self.node, self.node.overlay
        here = ov.here or (0, 0)
        out = opb.DescribeResponse(router_id=node.config.id, region=ov.region, position=here[0],
                                   region_index=here[1], regions=ov.regions, routing=node.routing)
        control = node.control
        out.subgroups, out.complete = len(control.subgroups.count), control.complete
        summaries = control.summaries
        for region in sorted(set(summaries.region_of.values())):
            out.summaries.add(region=region, complete=summaries.known(region),
                              subgroups=len(summaries.keys(region)), answered=len(summaries.answers(region)))
        out.advertisements = len(control.advertised.count)
        out.srt = sum(len(a) for a in control.srt.values())
        out.control_sent.update(control.counts)
        out.control, out.control_applied_ns = control.mode, control.applied_ns
        out.advertisement_applied_ns = control.adv_applied_ns
        for peer, link in sorted(node.links.links.items()):
            s = ov.state(peer)
            out.links.add(peer=peer, kind=ov.kind(peer), queue_length=link.queue_length,
                          congestion_element=s.ce, congested=s.congested)
        return out
