"""A membership replica: join, heartbeats, failure detection, versioned views, topics
(`Admin`) and routing plans (`Control`), replicated with its peers (`Replication`).

Three replicas run side by side with no leader (core/replication.py says why that is
enough): every member beats to all of them and each judges liveness itself with a
`core.detector.Detector`; each numbers its own view (`core.view.ViewLog`, based at the
process start so a stale known_version gets a snapshot); topics and plans are
last-writer-wins and pushed to the peers, with periodic anti-entropy. This module is
the glue: the state lives in `replica.Replica`, the handlers in `servicers`, the
outgoing streams in `streams`, the peers in `sync`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from echelon.core.detector import State, Transition
from echelon.membership.replica import Replica
from echelon.membership.servicers import (RUN_RESULTS, AdminServicer, ControlServicer, MembershipServicer,
                                         ReplicationServicer)
from echelon.membership.store import StateStore
from echelon.membership.streams import Streams
from echelon.membership.sync import Peers
from echelon.runtime.auth import acl_cache
from echelon.runtime.node import Node, NodeConfig
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc

log = logging.getLogger("echelon.membership")

DETECTION_BUCKETS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 5.0, 10.0)


class Metrics:
    """Members by state, transitions, detection latency, refutations, evidence."""

    def __init__(self, node: MembershipNode):
        r, replica = node.registry, node.replica
        members = Gauge("echelon_membership_members", "Members in this replica's view, by state.", ["state"],
                        registry=r)
        for s in State:
            members.labels(s.value).set_function(lambda s=s: replica.counts()[s])
        self.transitions = Counter("echelon_membership_transitions_total", "Member state transitions.",
                                   ["from_state", "to_state"], registry=r)
        self.detection = Histogram("echelon_membership_detection_seconds",
                                   "Silence before a member was declared dead (its last beat to the verdict).",
                                   buckets=DETECTION_BUCKETS, registry=r)
        self.refuted = Counter("echelon_membership_suspicions_refuted_total",
                               "Suspects that proved alive, by how (beat, incarnation, join).", ["kind"], registry=r)
        self.evidence = Counter("echelon_membership_evidence_total",
                                "Stream breaks reported by peers, by outcome (suspected, confirmed, ignored).",
                                ["outcome"], registry=r)
        self.beats = Counter("echelon_membership_heartbeats_total", "Heartbeats received.", registry=r)
        self.plan_pushes = Counter("echelon_membership_plan_pushes_total", "Routing plans pushed to Control, by "
                                   "result (accepted, invalid, stale).", ["result"], registry=r)
        for result in ("accepted", "invalid", "stale"):
            self.plan_pushes.labels(result)
        # Where the routing job's gain is recorded: every push lands here (the job itself is a batch).
        Gauge("echelon_membership_plan_predicted_gain", "What the current routing plan's pusher predicted it "
              "gains over the plan it replaced (largest relative fall of a topic's zone imbalance).",
              registry=r).set_function(lambda: replica.plans.plan.predicted_gain if replica.plans.plan else 0.0)
        # The routing job's runs as it reports them (Control.ReportRun): what the failed- and
        # stale-job alerts read (observe/catalog.py).
        self.replan_runs = Counter("echelon_membership_replan_runs_total", "Routing job runs reported to this "
                                   "replica, by result (pushed, unchanged, refused, failed).", ["result"], registry=r)
        for result in RUN_RESULTS:
            self.replan_runs.labels(result)
        self.replan_success = Gauge("echelon_membership_replan_last_success_timestamp_seconds",
                                    "When the routing job last reported a run that was not a failure (unix "
                                    "seconds; 0: none since this replica's state began).", registry=r)
        self.replan_success.set_function(lambda: replica.last_run_ok)
        for kind in ("beat", "incarnation", "join"):
            self.refuted.labels(kind)
        for outcome in ("suspected", "confirmed", "ignored"):
            self.evidence.labels(outcome)
        node.view_version.set_function(lambda: replica.log.version)
        node.plan_version.set_function(lambda: replica.plans.version)
        r.register(_DetectorStats(replica))

    def record(self, transitions: list[Transition]) -> None:
        for t in transitions:
            if t.old is t.new:
                continue
            self.transitions.labels(t.old.value if t.old else "none", t.new.value).inc()
            if t.new is State.DEAD and t.silence is not None:
                self.detection.observe(t.silence)
            if t.old is State.SUSPECT and t.new is State.ALIVE:
                self.refuted.labels(t.reason.removeprefix("refuted by ") if t.reason.startswith("refuted")
                                    else "join").inc()


class _DetectorStats(Collector):
    """The detector's own counters, read at scrape time."""

    def __init__(self, replica: Replica):
        self.stats = replica.detector.stats

    def collect(self):
        for name, doc, value in (
            ("late_beats", "Beats that arrived more than two intervals after the previous one.", self.stats.late_beats),
            ("stale_claims", "Joins, beats or leaves refused for an old incarnation.", self.stats.stale),
            ("stalls", "Ticks late enough that this replica paused silence verdicts.", self.stats.stalls),
        ):
            yield CounterMetricFamily(f"echelon_membership_{name}", doc, value=value)


class MembershipNode(Node):
    role = mpb.ROLE_MEMBERSHIP

    def __init__(self, config: NodeConfig, peers: list[str] | tuple[str, ...] = (), tombstone_ttl: float = 300.0,
                 sync_interval: float = 2.0, keepalive: float = 1.0, watch_queue: int = 256,
                 data_dir: str | Path | None = None):
        """`peers`: every replica's address (this one may be included: it is recognised).
        `data_dir`: where topics, ACLs and the plan are kept across restarts
        (membership/store.py); None: in memory, restored only from a live peer."""
        super().__init__(config)
        self.replica = Replica(config.id, time.time_ns() // 1000, config.beat_interval, tombstone_ttl)
        self.store = StateStore(data_dir) if data_dir is not None else None
        if self.store is not None:
            self._restore(self.store)
        self.peers = Peers(self.replica, list(peers), self.registry, sync_interval, transport=self.server.transport)
        self.streams = Streams(self.replica, keepalive, watch_queue)
        self.metrics = Metrics(self)
        self.server.access.acl = acl_cache(lambda: self.replica.log.version, self.replica.acls.live)
        self.replica.on_transitions.append(self._transitions)
        for add, servicer, service in (
            (mgrpc.add_MembershipServicer_to_server, MembershipServicer(self),
             mpb.DESCRIPTOR.services_by_name["Membership"]),
            (mgrpc.add_ControlServicer_to_server, ControlServicer(self), mpb.DESCRIPTOR.services_by_name["Control"]),
            (mgrpc.add_ReplicationServicer_to_server, ReplicationServicer(self),
             mpb.DESCRIPTOR.services_by_name["Replication"]),
            (pgrpc.add_AdminServicer_to_server, AdminServicer(self), ppb.DESCRIPTOR.services_by_name["Admin"]),
        ):
            self.server.add(add, servicer, service.full_name)
        self._ticker: asyncio.Task | None = None

    def _restore(self, store: StateStore) -> None:
        """Load what the last process kept, then commit every later write as it happens."""
        topics, plan, acls, meta = store.load()
        self.replica.merge_state(topics, plan, acls)
        self.replica.last_run_ok = meta.get("replan_last_success", 0.0)
        log.info("restored %d topics, %d ACL rules and plan %d from %s", len(self.replica.topics.live()),
                 len(self.replica.acls.live()), self.replica.plans.version, store.path)
        self.replica.on_write.append(store.save)
        self.replica.on_run.append(lambda: store.save_meta("replan_last_success", self.replica.last_run_ok))

    async def on_start(self) -> None:
        self._ticker = asyncio.create_task(self._tick_loop(), name="membership-tick")
        await self.peers.start(self.address)

    async def on_stop(self) -> None:
        if self._ticker:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
        await self.peers.stop()
        if self.store is not None:
            self.store.close()

    async def _tick_loop(self) -> None:
        period = self.config.beat_interval / 4
        while True:
            await asyncio.sleep(period)
            self.replica.tick(time.monotonic())

    def _transitions(self, transitions: list[Transition]) -> None:
        self.metrics.record(transitions)
        for t in transitions:
            if t.old is t.new:
                continue
            log.info("member %s: %s -> %s (%s)", t.member_id, t.old.value if t.old else "new", t.new.value,
                     t.reason)
