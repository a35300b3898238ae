"""The membership service: join, heartbeats, failure detection, versioned views,
topics (`Admin`) and routing plans (`Control`).

Views are versioned by this replica; every change is one delta. A watcher gets a
snapshot, then deltas; one that falls behind (its queue fills) gets a snapshot again.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque

from prometheus_client import Counter, Gauge

from echelon.runtime.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from echelon.runtime.node import Node, NodeConfig
from echelon.runtime.wire import schema_from_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc

log = logging.getLogger("echelon.membership")

TOPIC_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
ALIVE, SUSPECT, DEAD, LEFT = (mpb.MEMBER_STATE_ALIVE, mpb.MEMBER_STATE_SUSPECT, mpb.MEMBER_STATE_DEAD,
                              mpb.MEMBER_STATE_LEFT)
KEEP_DELTAS = 1024
WATCH_QUEUE = 256


class State:
    """This replica's view: members, topics, version, and the recent deltas."""

    def __init__(self, suspect_after: float, dead_after: float):
        self.suspect_after = suspect_after
        self.dead_after = dead_after
        self.members: dict[str, mpb.Member] = {}
        self.last_beat: dict[str, float] = {}
        self.topics: dict[str, pb.Topic] = {}
        self.version = 0
        self.deltas: deque[mpb.ViewDelta] = deque(maxlen=KEEP_DELTAS)
        self.watchers: set[asyncio.Queue] = set()
        self.plan = mpb.RoutingPlan()
        self.plan_watchers: set[asyncio.Queue] = set()

    def commit(self, members=(), topics=(), deleted=()) -> None:
        delta = mpb.ViewDelta(from_version=self.version, version=self.version + 1, upserted=members,
                              topics_upserted=topics, topics_deleted=deleted)
        self.version += 1
        self.deltas.append(delta)
        for q in list(self.watchers):
            try:
                q.put_nowait(delta)
            except asyncio.QueueFull:  # the watcher fell behind: it will start over with a snapshot
                while not q.empty():
                    q.get_nowait()
                q.put_nowait(None)
                self.watchers.discard(q)

    def snapshot(self) -> mpb.View:
        now_ms = int(time.time() * 1000)
        members = []
        for m in self.members.values():
            c = mpb.Member()
            c.CopyFrom(m)
            if m.id in self.last_beat:
                c.last_beat_unix_ms = now_ms - int((time.monotonic() - self.last_beat[m.id]) * 1000)
            members.append(c)
        return mpb.View(version=self.version, members=members, topics=list(self.topics.values()))

    def transition(self, member: mpb.Member, state: int) -> None:
        log.info("member %s: %s -> %s", member.id, mpb.MemberState.Name(member.state), mpb.MemberState.Name(state))
        member.state = state
        self.commit(members=[member])


class MembershipServicer(mgrpc.MembershipServicer):
    def __init__(self, node: "MembershipNode"):
        self.node = node
        self.state = node.state

    async def Join(self, request, context):
        m = request.member
        if not m.id or "/" in m.id or not m.address or m.role == mpb.ROLE_UNSPECIFIED:
            raise InvalidArgument("member: id (without '/'), address and role are required")
        old = self.state.members.get(m.id)
        if old is not None and old.state in (DEAD, LEFT) and m.incarnation <= old.incarnation:
            raise FailedPrecondition(f"member {m.id} was {mpb.MemberState.Name(old.state)} at incarnation "
                                     f"{old.incarnation}: rejoin with a higher one")
        record = mpb.Member()
        record.CopyFrom(m)
        record.state = ALIVE
        if old is not None and old.incarnation > m.incarnation:
            record.incarnation = old.incarnation
        self.state.last_beat[m.id] = time.monotonic()
        if old is None or old != record:
            if old is None or old.state != ALIVE:
                self.node.transitions.labels(mpb.MemberState.Name(old.state) if old else "NONE", "ALIVE").inc()
            self.state.members[m.id] = record
            self.state.commit(members=[record])
        return mpb.JoinResponse(view=self.state.snapshot(),
                                heartbeat_interval_ms=int(self.node.config.beat_interval * 1000))

    async def Heartbeat(self, request_iterator, context):
        async for beat in request_iterator:
            m = self.state.members.get(beat.member_id)
            if m is None:
                raise NotFound(f"member {beat.member_id!r} has not joined")
            if m.state in (DEAD, LEFT):
                yield mpb.BeatReply(state=m.state, incarnation=m.incarnation, view_version=self.state.version)
                continue
            self.state.last_beat[m.id] = time.monotonic()
            changed = False
            if m.state == SUSPECT and beat.incarnation > m.incarnation:
                m.incarnation = beat.incarnation
                m.state = ALIVE
                self.node.refuted.inc()
                self.node.transitions.labels("SUSPECT", "ALIVE").inc()
                changed = True
            if beat.has_topics and (list(m.publishes) != list(beat.publishes)
                                    or list(m.subscribes) != list(beat.subscribes)):
                del m.publishes[:], m.subscribes[:]
                m.publishes.extend(beat.publishes)
                m.subscribes.extend(beat.subscribes)
                changed = True
            if changed:
                self.state.commit(members=[m])
            yield mpb.BeatReply(state=m.state, incarnation=m.incarnation, view_version=self.state.version)

    async def Watch(self, request, context):
        queue: asyncio.Queue = asyncio.Queue(WATCH_QUEUE)
        self.state.watchers.add(queue)
        try:
            known = request.known_version
            gap = known == 0 or known > self.state.version or \
                (known < self.state.version and (not self.state.deltas or self.state.deltas[0].from_version > known))
            if gap:
                yield mpb.ViewUpdate(snapshot=self.state.snapshot())
            else:
                for d in list(self.state.deltas):
                    if d.from_version >= known:
                        yield mpb.ViewUpdate(delta=d)
            while True:
                delta = await queue.get()
                if delta is None:  # fell behind: start over with a snapshot
                    return
                yield mpb.ViewUpdate(delta=delta)
        finally:
            self.state.watchers.discard(queue)

    async def Leave(self, request, context):
        m = self.state.members.get(request.member_id)
        if m is None:
            raise NotFound(f"member {request.member_id!r} is unknown")
        if request.incarnation >= m.incarnation and m.state != LEFT:
            self.node.transitions.labels(mpb.MemberState.Name(m.state), "LEFT").inc()
            self.state.transition(m, LEFT)
        return mpb.LeaveResponse()

    async def Suspect(self, request, context):
        m = self.state.members.get(request.member_id)
        if m is None:
            raise NotFound(f"member {request.member_id!r} is unknown")
        self.node.evidence.inc()
        return mpb.SuspectResponse()


class AdminServicer(pgrpc.AdminServicer):
    def __init__(self, state: State):
        self.state = state

    async def CreateTopic(self, request, context):
        if not TOPIC_NAME.match(request.name):
            raise InvalidArgument(f"topic name {request.name!r}: 1-200 of letters, digits, '.', '_', '-'")
        schema_from_pb(request.schema)  # validates
        old = self.state.topics.get(request.name)
        if old is not None:
            if old.schema == request.schema:
                return old  # idempotent
            raise AlreadyExists(f"topic {request.name!r} exists with another schema")
        topic = pb.Topic(name=request.name, schema=request.schema, created_unix_ms=int(time.time() * 1000))
        self.state.topics[topic.name] = topic
        self.state.commit(topics=[topic])
        return topic

    async def GetTopic(self, request, context):
        if request.name not in self.state.topics:
            raise NotFound(f"topic {request.name!r} does not exist")
        return self.state.topics[request.name]

    async def ListTopics(self, request, context):
        return ppb.ListTopicsResponse(topics=sorted(self.state.topics.values(), key=lambda t: t.name))

    async def DeleteTopic(self, request, context):
        if self.state.topics.pop(request.name, None) is None:
            raise NotFound(f"topic {request.name!r} does not exist")
        self.state.commit(deleted=[request.name])
        return ppb.DeleteTopicResponse()


class ControlServicer(mgrpc.ControlServicer):
    def __init__(self, state: State):
        self.state = state

    async def GetPlan(self, request, context):
        return self.state.plan

    async def PushPlan(self, plan, context):
        if plan.version <= self.state.plan.version:
            raise FailedPrecondition(f"plan version {plan.version} is not above the current "
                                     f"{self.state.plan.version}")
        for z in plan.zones:
            if len(z.low) != len(z.high) or any(lo > hi for lo, hi in zip(z.low, z.high)):
                raise InvalidArgument(f"zone {z.id!r}: low and high must have one entry per dimension, low <= high")
            for owner in [z.owner, *z.replicas]:
                m = self.state.members.get(owner)
                if m is None or m.state not in (ALIVE, SUSPECT):
                    raise InvalidArgument(f"zone {z.id!r}: owner {owner!r} is not alive")
        self.state.plan = plan
        for q in list(self.state.plan_watchers):
            q.put_nowait(plan)
        return mpb.PushPlanResponse(version=plan.version)

    async def WatchPlan(self, request, context):
        queue: asyncio.Queue = asyncio.Queue()
        self.state.plan_watchers.add(queue)
        try:
            if self.state.plan.version > request.known_version:
                yield self.state.plan
            while True:
                yield await queue.get()
        finally:
            self.state.plan_watchers.discard(queue)


class MembershipNode(Node):
    role = mpb.ROLE_MEMBERSHIP

    def __init__(self, config: NodeConfig, suspect_after: float = 1.0, dead_after: float = 1.8):
        super().__init__(config)
        self.state = State(suspect_after, dead_after)
        r = self.registry
        self.transitions = Counter("echelon_membership_transitions_total", "Member state transitions.",
                                   ["from_state", "to_state"], registry=r)
        self.refuted = Counter("echelon_membership_suspicions_refuted_total", "Suspects that proved alive.",
                               registry=r)
        self.evidence = Counter("echelon_membership_evidence_total", "Stream breaks reported by peers.",
                                registry=r)
        self.by_state = Gauge("echelon_membership_members", "Members by state.", ["state"], registry=r)
        self.view_version = Gauge("echelon_membership_view_version", "This replica's view version.", registry=r)
        self.view_version.set_function(lambda: self.state.version)
        self.server.add(mgrpc.add_MembershipServicer_to_server, MembershipServicer(self),
                        mpb.DESCRIPTOR.services_by_name["Membership"].full_name)
        self.server.add(mgrpc.add_ControlServicer_to_server, ControlServicer(self.state),
                        mpb.DESCRIPTOR.services_by_name["Control"].full_name)
        self.server.add(pgrpc.add_AdminServicer_to_server, AdminServicer(self.state),
                        ppb.DESCRIPTOR.services_by_name["Admin"].full_name)
        self._ticker: asyncio.Task | None = None

    async def on_start(self) -> None:
        self._ticker = asyncio.create_task(self._tick_loop())

    async def on_stop(self) -> None:
        if self._ticker:
            self._ticker.cancel()

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.beat_interval / 2)
            now = time.monotonic()
            counts = {s: 0 for s in (ALIVE, SUSPECT, DEAD, LEFT)}
            for m in list(self.state.members.values()):
                silent = now - self.state.last_beat.get(m.id, now)
                if m.state == ALIVE and silent > self.state.suspect_after:
                    self.transitions.labels("ALIVE", "SUSPECT").inc()
                    self.state.transition(m, SUSPECT)
                elif m.state == SUSPECT and silent > self.state.dead_after:
                    self.transitions.labels("SUSPECT", "DEAD").inc()
                    self.state.transition(m, DEAD)
                counts[m.state] = counts.get(m.state, 0) + 1
            for s, n in counts.items():
                self.by_state.labels(mpb.MemberState.Name(s).removeprefix("MEMBER_STATE_").lower()).set(n)
