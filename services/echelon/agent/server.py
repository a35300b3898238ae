"""The agent: the client API (`PubSub`, `Admin`), local delivery, and relaying.

The node wires parts with one job each:

| part | job |
|---|---|
| `topics.Topics` | topics from the view or membership; parsed schemas cached by topic version |
| `registry.Registry` | the subscriptions held here, registered on (and removed from) the tier |
| `delivery.LocalDelivery` | an event to the matching local subscriptions, once per message id |
| `dispatch.Dispatcher` | publishes in batches: matched on the tier, handed to the data plane |
| `dataplane.DataPlane` | LBDD dissemination; sees the agent only through `linkset.PlaneHost` |
| `gateway.Gateway` | a second `DataPlane`'s routes: other regions' destinations to a router of this region |
| `linkset.LinkSet` | the outgoing relay links (of both planes) and their per-peer series |
| `matching.MatchClient`, `reconcile.Reconciler` | the matcher tier's client; reconciliation |
| `pubsub`, `relay`, `admin` | the gRPC services |
| `durable.Durables`, `store.Store` | durable subscriptions: on-disk log, replicas, retention
(`rpc`: their service) |
"""

from __future__ import annotations

import asyncio
import logging

from echelon.agent.admin import AdminProxy
from echelon.dataplane.dissemination import PARK_SECONDS, DataPlane
from echelon.agent.delivery import LocalDelivery
from echelon.agent.dispatch import Dispatcher
from echelon.agent.durable import Defaults, Durables
from echelon.agent.durable.rpc import DurableServicer
from echelon.dataplane.gateway import Gateway, region_view
from echelon.dataplane.tiers import tiers
from echelon.dataplane.root import FRAME_BYTES
from echelon.contract.schema import MAX_MAX_ATTRIBUTE_BYTES
from echelon.dataplane.linkset import LinkSet, PlaneHost
from echelon.agent.matching import MatchClient
from echelon.dataplane.control import AgentFeed
from echelon.agent.metrics import AgentMetrics
from echelon.agent.named import NamedFile
from echelon.agent.compressed import MAX_STREAMS, CompressedStreams
from echelon.agent.pubsub import PubSubServicer, add_PubSubServicer_to_server
from echelon.agent.reconcile import PERIOD, Reconciler
from echelon.agent.redelivery import DeadLetters
from echelon.agent.registry import Registry
from echelon.dataplane.relay import RelayServicer, add_RelayServicer_to_server
from echelon.agent.durable.store import FSYNC_POLICIES, Store
from echelon.agent.subscriptions import MAX_BYTES, STALL_SECONDS, Subscription
from echelon.agent.topics import Topics
from echelon.dataplane.trees import DIRECT_UPTO, Trees, hinted
from echelon.runtime import schema_code
from echelon.runtime.node import Node, NodeConfig
from echelon.v1 import durable_pb2 as dpb
from echelon.v1 import durable_pb2_grpc as dgrpc
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc
from echelon.v1 import relay_pb2 as rpb

log = logging.getLogger("echelon.agent")


class AgentNode(Node):
    role = mpb.ROLE_AGENT

    def __init__(self, config: NodeConfig, max_backlog: int = 10_000, window_bytes: int = 8 << 20,
                 dissemination: str = "lbdd", slice_bytes: int = 65536, stripes: int = 8,
                 direct_upto: int = DIRECT_UPTO, park_seconds: float = PARK_SECONDS, reconcile_seconds: float = PERIOD,
                 data_dir: str | None = None, fsync: str = "batch", fsync_batch_ms: int = 10,
                 durable: Defaults | None = None, max_backlog_bytes: int = MAX_BYTES,
                 stall_seconds: float = STALL_SECONDS, max_compressed_streams: int = MAX_STREAMS):
        self.slice_bytes = slice_bytes  # before the server is made: its receive limit follows (receive_limit)
        super().__init__(config)
        self.max_backlog_bytes = max_backlog_bytes  # each subscription's byte bound (subscriptions.py)
        self.stall_seconds = stall_seconds  # a lagging subscription acking nothing this long is stalled
        # Durable subscriptions' log: data_dir None keeps it in memory (tests, demos: the
        # replica is then all that outlives this process).
        if fsync not in FSYNC_POLICIES or not 1 <= fsync_batch_ms <= 10_000:
            raise ValueError(f"fsync {fsync!r} every {fsync_batch_ms} ms: one of {FSYNC_POLICIES}, 1 to 10000 ms")
        self.data_dir, self.fsync, self.fsync_batch_ms = data_dir, fsync, fsync_batch_ms
        self.durable_defaults = durable or Defaults(max_messages=max_backlog)
        self.durables: Durables | None = None
        if dissemination not in ("lbdd", "p2p"):
            raise ValueError(f"dissemination {dissemination!r}: lbdd or p2p")
        if not 1024 <= slice_bytes <= 16 << 20:
            raise ValueError(f"slice size {slice_bytes}: 1 KiB to 16 MiB")
        if not 1 <= stripes <= 64:
            raise ValueError(f"stripes {stripes}: 1 to 64")
        self._max_backlog = max_backlog
        self.dissemination = dissemination
        self.slice_bytes = slice_bytes
        self.stripes = stripes
        self.direct_upto = direct_upto
        self.park_seconds = park_seconds
        self.reconcile_seconds = reconcile_seconds
        self.ready = asyncio.Event()  # the data plane exists: frames may be taken
        self.metrics = AgentMetrics(self.registry)
        self.metrics.compiled.set(schema_code.COMPILED == "compiled")
        log.info("%s: schema checks %s", config.id, schema_code.COMPILED)
        self.links = LinkSet(config.id, window_bytes, self.registry, self.metrics.dropped, self._peer_broke,
                             self._settle, transport=self.server.transport)
        self.admin = AdminProxy(config.membership, lambda: self.membership, self.server.transport,
                                self.server.access)
        self.topics = Topics(lambda: self.membership, self.admin.call)
        # Made in on_start, once the membership view is there.
        self.plane: DataPlane | None = None
        self.gateway: DataPlane | None = None  # to the region's router, for other regions
        self.host: PlaneHost | None = None
        self.matching: MatchClient | None = None
        self.feed: AgentFeed | None = None
        self.subscriptions: Registry | None = None
        self.dispatcher: Dispatcher | None = None
        self.reconciler: Reconciler | None = None
        self._tasks: list[asyncio.Task] = []
        # The client API sees the parts made on start (subscriptions, durables, dispatcher,
        # matching) through this node, read per request (pubsub.AgentParts).
        self.pubsub = PubSubServicer(config.id, self.server.access, self.metrics, self.topics, self,
                                     CompressedStreams(max_compressed_streams, config.auth.limits.max_request_bytes))
        self.server.add(add_PubSubServicer_to_server, self.pubsub,  # (its Publish: also the dead letters)
                        ppb.DESCRIPTOR.services_by_name["PubSub"].full_name)
        self.server.add(pgrpc.add_AdminServicer_to_server, self.admin,
                        ppb.DESCRIPTOR.services_by_name["Admin"].full_name)
        self.server.add(dgrpc.add_DurableServicer_to_server, DurableServicer(lambda: self.durables),
                        dpb.DESCRIPTOR.services_by_name["Durable"].full_name)
        self.server.add(add_RelayServicer_to_server, RelayServicer(
            self.ready, lambda peer: self.links.received(peer, peer in self.membership.members),
            lambda peer, frame, ack: self.plane.receive(frame, ack)),
                        rpb.DESCRIPTOR.services_by_name["Relay"].full_name)
        self.metrics.compressed_streams.set_function(lambda: self.pubsub.compressed.open)
        self.metrics.reassembling.set_function(lambda: len(self.plane.streams) if self.plane else 0)
        self.metrics.parked_now.set_function(lambda: self.plane.parked_count if self.plane else 0)
        self.metrics.removals_queued.set_function(lambda: self.matching.removals_queued if self.matching else 0)
        self.metrics.backlog_max.set_function(
            lambda: max((s.depth for s in list(self.subs.values())), default=0) if self.subscriptions else 0)
        self.metrics.backlog_bound.set_function(lambda: self.max_backlog)

    def receive_limit(self, config: NodeConfig) -> int:
        """What the agent's server receives: a client's largest request (`--limits
        max_request_bytes`) or a relay frame (FRAME_BYTES of small events and one more of
        up to `slice_bytes`, plus attributes), whichever is larger. A larger message, a
        Subscribe's filter of megabytes say, is refused by gRPC core before the event loop
        copies it (docs/security.md, "The agent's receive limit")."""
        frame = FRAME_BYTES + self.slice_bytes + MAX_MAX_ATTRIBUTE_BYTES + (64 << 10)
        return max(config.auth.limits.max_request_bytes, frame)

    @property
    def subs(self) -> dict[str, Subscription]:
        """The subscriptions held here, by name."""
        return self.subscriptions.subs

    @property
    def max_backlog(self) -> int:
        return self.subscriptions.max_backlog if self.subscriptions else self._max_backlog

    @max_backlog.setter
    def max_backlog(self, n: int) -> None:
        self._max_backlog = n
        if self.subscriptions:
            self.subscriptions.max_backlog = n

    @property
    def stopping(self) -> bool:
        return self.host is not None and self.host.stopping

    # -- lifecycle -------------------------------------------------------------------

    async def on_start(self) -> None:
        me = self.config.id
        self.matching = MatchClient(self.membership, region=self.config.region)
        # The region's routers hold its subscriptions too (OctopiA's subgroup: router/control.py).
        self.feed = AgentFeed(me, self.config.region, lambda: self.matching.subscriptions,
                              self.membership.transport.dial)
        self.matching.changed = self.feed.changed
        self.pubsub.publishing.producing = self.feed.producing  # what this agent's producers advertise
        self.subscriptions = Registry(me, self.topics, self.matching, self.metrics,
                                      lambda topics: self.membership.set_topics(set(), topics), self._max_backlog)
        self.subscriptions.filter_limits = self.server.access.config.limits.filters()  # the operator's (--limits)
        self.subscriptions.dead_letters = DeadLetters(me, self.pubsub.Publish, self.metrics)
        self.durables = Durables(me, self, self.server.access, self.server.transport,  # durables.py's Host
                                 Store(self.data_dir, self.fsync), self.durable_defaults)
        durable_tasks = self.durables.start()
        delivery = LocalDelivery(lambda: self.subscriptions.subs, self.metrics, self.subscriptions.close)
        self.subscriptions.max_bytes = self.max_backlog_bytes
        self.subscriptions.stall_seconds = self.stall_seconds
        self.subscriptions.saved = NamedFile(self.data_dir)
        self.subscriptions.restore()  # before frames are taken: what was kept for them comes back (named.py)
        self.host = PlaneHost(me, self.address, self.metrics, self.links, delivery.dedup, delivery.deliver_many,
                              delivery.open_stream, delivery.take_full)
        trees = Trees(me, self.address, self.dissemination, self.stripes, direct_upto=self.direct_upto)
        self.plane = DataPlane(self.host, trees, self.slice_bytes, park_seconds=self.park_seconds)
        self.gateway = DataPlane(self.host, Gateway(me, self.config.region), self.slice_bytes)
        self._update_routes()
        self.ready.set()
        self.dispatcher = Dispatcher(me, self.matching, self.plane, self.gateway, delivery.deliver_root)
        self.reconciler = Reconciler(me, self.matching, self.subscriptions.close_orphans, self.metrics.reconciled,
                                     self.reconcile_seconds)
        self.matching.start()
        self.matching.on_view()
        self.feed.on_view(self.membership)
        self.membership.on_plan(self.on_view)  # cliques move members between regions; bucket hints change the trees
        self._tasks = [asyncio.create_task(self.dispatcher.run(), name="dispatcher"),
                       asyncio.create_task(self._expire_loop(), name="park-expiry"),
                       asyncio.create_task(self.reconciler.run(), name="reconcile"), *durable_tasks]

    async def on_stop(self) -> None:
        if self.host:
            self.host.stopping = True  # from here on nothing is acknowledged or re-routed
        for task in self._tasks:
            task.cancel()
        if self.subscriptions:
            # Ephemeral subscriptions end with this process: their removals go out with the flush.
            self.subscriptions.close_ephemeral()
        await self.links.close()
        if self.matching:
            await self.matching.close()
        if self.feed:
            await self.feed.close()
        if self.durables:
            self.durables.store.close()

    def on_view(self) -> None:
        if self.matching:
            self.matching.on_view()
        if self.feed:
            self.feed.on_view(self.membership)
        if self.plane:
            alive = self._update_routes()
            self.plane.on_view()  # members back from DEAD get what was parked for them
            self.gateway.on_view()  # and regions whose router is back (dataplane/tiers.py)
            self.links.keep(alive)

    def _update_routes(self) -> set[str]:
        """Algorithm 3: every route uses the new view (trees over this region's agents,
        the hand-off to its router). Returns the ids this agent may hold links to."""
        regions, here, agents, dead = region_view(self.membership, self.config.id, self.config.region)
        left = {m.id for m in self.membership.members.values() if m.state == mpb.MEMBER_STATE_LEFT}
        self.plane.trees.update(agents, dead, hinted(self.membership.plan), left)  # bucket hints: the leaves
        far = tiers(self.membership).far(self.config.region)  # regions matched by their own tier
        self.gateway.trees.update(self.membership.alive(mpb.ROLE_ROUTER), regions, here, far)
        if self.feed:
            self.feed.hosted_by(self.gateway.trees.router)  # its advertisements go to that router
        return {m.id for m in agents} | set(self.gateway.trees.table.members)

    def _settle(self, futures) -> None:
        """A dropped link's unacknowledged frames: each plane re-routes those it sent."""
        for plane in (self.plane, self.gateway):
            if plane:
                plane.settle(futures)

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.plane.expire()
            self.gateway.expire()
            self.plane.streams.sweep()

    def _peer_broke(self, peer: str) -> None:
        if not self.stopping:
            asyncio.create_task(self.membership.report(peer, "relay stream broke"))
