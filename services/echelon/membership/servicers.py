"""The gRPC face of a membership replica: Membership, Admin (topics), Control (plans)
and Replication (peers). Each handler validates, calls the `Replica`, and answers;
a streaming handler reads what `streams.Streams` queues for it."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from contextlib import aclosing, contextmanager
from typing import TYPE_CHECKING

from echelon.core import acl
from echelon.core.detector import MemberGone, StaleIncarnation, UnknownMember
from echelon.membership import plans
from echelon.membership.wire import STATES, record_from_pb, state_from_pb, state_to_pb
from echelon.runtime.auth import caps_dict
from echelon.contract.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from echelon.contract.transport import INCARNATION_KEY, MEMBER_ROLES, require_member, role_of
from echelon.contract.wire import schema_from_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc

log = logging.getLogger("echelon.membership")
RUN_RESULTS = ("pushed", "unchanged", "refused", "failed")  # Control.ReportRun

if TYPE_CHECKING:
    from echelon.membership.server import MembershipNode

TOPIC_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


@contextmanager
def detector_errors(context=None):
    """The detector's refusals as statuses; a stale join names the recorded incarnation."""
    try:
        yield
    except UnknownMember as e:
        raise NotFound(str(e)) from None
    except StaleIncarnation as e:
        if context is not None:
            context.set_trailing_metadata(((INCARNATION_KEY, str(e.current)),))
        raise FailedPrecondition(str(e)) from None


class MembershipServicer(mgrpc.MembershipServicer):
    def __init__(self, node: MembershipNode):
        self.node = node
        self.replica = node.replica
        self.streams = node.streams

    async def Join(self, request, context):
        record = record_from_pb(request.member)
        require_member(context, record.id, role_of(record.role), "Join")
        with detector_errors(context):
            self.replica.join(record, time.monotonic())
        return mpb.JoinResponse(view=self.streams.snapshot(),
                                heartbeat_interval_ms=int(self.node.config.beat_interval * 1000))

    async def Heartbeat(self, request_iterator, context):
        """Beats in; out, only prompts: SUSPECT (refute), DEAD or LEFT (rejoin).

        A stream that ends without the member being told it is gone (the connection
        closed: a crashed process, or a reset the member will repair by reconnecting) is
        reported to the detector, which declares the member DEAD after a short grace
        unless it beats again (core/detector.py: a crash is not a pause)."""
        replies = self.streams.heartbeat()
        last_beat = 0.0
        gone = False  # the member was told it is DEAD or LEFT: this end is expected

        async def read() -> None:
            nonlocal last_beat, gone
            try:
                async for beat in request_iterator:
                    if not replies.member_id:
                        require_member(context, beat.member_id, self._role(beat.member_id), "Heartbeat")
                        replies.bind(beat.member_id)
                    elif beat.member_id != replies.member_id:
                        raise InvalidArgument(f"one member per stream: {replies.member_id!r}, "
                                              f"then {beat.member_id!r}")
                    topics = (beat.publishes, beat.subscribes) if beat.has_topics else (None, None)
                    last_beat = time.monotonic()
                    self.node.metrics.beats.inc()
                    try:
                        with detector_errors():
                            self.replica.beat(replies.member_id, beat.incarnation, last_beat, *topics)
                    except MemberGone as e:
                        gone = True
                        replies.send(mpb.BeatReply(state=STATES[e.state], incarnation=e.incarnation,
                                                   view_version=self.replica.log.version))
                        return
            finally:
                replies.end()

        reader = asyncio.create_task(read())
        try:
            async for reply in replies:
                yield reply
            await reader  # its error, if any, becomes the stream's status
        finally:
            reader.cancel()
            if replies.release() and not gone:
                self.replica.stream_ended(replies.member_id, time.monotonic(), last_beat)

    async def Watch(self, request, context):
        """A snapshot (or the missed deltas), then deltas; keepalives while idle."""
        await self.node.peers.ready.wait()
        async with aclosing(self.streams.views(request.known_version)) as updates:
            async for update in updates:
                yield update

    def _role(self, member_id: str) -> str | tuple[str, ...]:
        """The role a member joined with (any member role for one this replica does not
        know: the beat is refused as unknown anyway)."""
        try:
            return role_of(self.replica.detector.get(member_id).role)
        except UnknownMember:
            return MEMBER_ROLES

    async def Leave(self, request, context):
        require_member(context, request.member_id, self._role(request.member_id), "Leave")
        with detector_errors():
            self.replica.leave(request.member_id, request.incarnation, time.monotonic())
        return mpb.LeaveResponse()

    async def Suspect(self, request, context):
        if not request.reporter or not request.member_id:
            raise InvalidArgument("reporter and member_id are required")
        require_member(context, request.reporter, self._role(request.reporter), "Suspect")
        ignored = self.replica.detector.stats.evidence_ignored
        with detector_errors():
            moved = self.replica.evidence(request.member_id, request.reporter, time.monotonic(),
                                          request.incarnation or None)
        outcome = "suspected" if moved else \
            "ignored" if self.replica.detector.stats.evidence_ignored > ignored else "confirmed"
        self.node.metrics.evidence.labels(outcome).inc()
        return mpb.SuspectResponse()


class AdminServicer(pgrpc.AdminServicer):
    """Topics: a last-writer-wins map replicated to the peers."""

    def __init__(self, node: MembershipNode):
        self.node = node
        self.replica = node.replica

    async def CreateTopic(self, request, context):
        await self.node.peers.ready.wait()
        if not TOPIC_NAME.match(request.name):
            raise InvalidArgument(f"topic name {request.name!r}: 1-200 of letters, digits, '.', '_', '-'")
        schema_from_pb(request.schema)  # validates
        old = self.replica.topics.get(request.name)
        if old is not None:
            if old.schema == request.schema and (old.retention_bytes, old.retention_seconds, old.durable_caps) == \
                    (request.retention_bytes, request.retention_seconds, request.durable_caps):
                return old  # idempotent
            raise AlreadyExists(f"topic {request.name!r} exists with another schema, retention or caps")
        topic = pb.Topic(name=request.name, schema=request.schema, created_unix_ms=int(time.time() * 1000),
                         retention_bytes=request.retention_bytes, retention_seconds=request.retention_seconds,
                         durable_caps=request.durable_caps)
        self.node.peers.push(topics={topic.name: self.replica.put_topic(topic.name, topic)})
        return topic

    async def GetTopic(self, request, context):
        await self.node.peers.ready.wait()
        topic = self.replica.topics.get(request.name)
        if topic is None or not self.node.server.access.sees(request.name):  # describe rights
            raise NotFound(f"topic {request.name[:200]!r} does not exist")
        return topic

    async def ListTopics(self, request, context):
        await self.node.peers.ready.wait()
        sees = self.node.server.access.sees  # describe rights (runtime/auth.py)
        return ppb.ListTopicsResponse(topics=[t for n, t in sorted(self.replica.topics.live().items()) if sees(n)])

    async def DeleteTopic(self, request, context):
        await self.node.peers.ready.wait()
        entry = self.replica.delete_topic(request.name)
        if entry is None:
            raise NotFound(f"topic {request.name!r} does not exist")
        self.node.peers.push(topics={request.name: entry})
        return ppb.DeleteTopicResponse()

    # ACL rules: a last-writer-wins map like topics; the interceptor admitted only the cluster admin.

    async def GrantAcl(self, request, context):
        await self.node.peers.ready.wait()
        rule = acl_rule(request)
        new = acl.grant(self._rule(rule.key), rule)
        self.node.peers.push(acls={rule.key: self.replica.put_acl(rule.key, acl_to_pb(new))})
        return acl_to_pb(new)

    async def RevokeAcl(self, request, context):
        await self.node.peers.ready.wait()
        rule = acl_rule(request)
        old = self._rule(rule.key)
        if old is None:
            raise NotFound(f"no ACL rule for {rule.principal} on {rule.pattern!r}")
        new = acl.revoke(old, rule)
        entry = self.replica.put_acl(rule.key, acl_to_pb(new)) if new else self.replica.delete_acl(rule.key)
        self.node.peers.push(acls={rule.key: entry})
        return acl_to_pb(new) if new else pb.AclRule(principal=rule.principal, pattern=rule.pattern)

    async def ListAcls(self, request, context):
        await self.node.peers.ready.wait()
        return ppb.ListAclsResponse(rules=[r for _, r in sorted(self.replica.acls.live().items())
                                           if r.pattern != acl.CAPS_PATTERN])

    # Caps per identity: entries of the same map under the pattern CAPS_PATTERN (core/acl.py).

    async def SetCaps(self, request, context):
        await self.node.peers.ready.wait()
        key = acl.rule_key(request.principal, acl.CAPS_PATTERN)
        old = self.replica.acls.get(key)
        caps = caps_dict(old.caps) if old is not None else {}
        try:
            bad = [f for f in request.clear if f not in acl.CAP_FIELDS]
            if bad:
                raise acl.AclError(f"clear {', '.join(map(repr, bad))}: one of {', '.join(acl.CAP_FIELDS)}")
            caps = acl.make_caps(request.principal, {**{k: v for k, v in caps.items() if k not in request.clear},
                                                     **caps_dict(request.caps)})
        except acl.AclError as e:
            raise InvalidArgument(str(e)) from None
        entry = pb.AclRule(principal=request.principal, pattern=acl.CAPS_PATTERN, caps=pb.IdentityCaps(**caps))
        if caps:
            self.node.peers.push(acls={key: self.replica.put_acl(key, entry)})
        elif old is not None:
            self.node.peers.push(acls={key: self.replica.delete_acl(key)})
        return entry

    async def ListCaps(self, request, context):
        await self.node.peers.ready.wait()
        return ppb.ListAclsResponse(rules=[r for _, r in sorted(self.replica.acls.live().items())
                                           if r.pattern == acl.CAPS_PATTERN])

    def _rule(self, key: str) -> acl.Rule | None:
        r = self.replica.acls.get(key)
        return None if r is None else acl.Rule(r.principal, r.pattern, frozenset(r.rights))


def acl_rule(request: ppb.AclRequest) -> acl.Rule:
    try:
        return acl.make_rule(request.rule.principal, request.rule.pattern, request.rule.rights)
    except acl.AclError as e:
        raise InvalidArgument(str(e)) from None


def acl_to_pb(rule: acl.Rule) -> pb.AclRule:
    return pb.AclRule(principal=rule.principal, pattern=rule.pattern,
                      rights=[r for r in acl.RIGHTS if r in rule.rights])


class ControlServicer(mgrpc.ControlServicer):
    """Routing plans: validated here once, then a last-writer-wins register."""

    def __init__(self, node: MembershipNode):
        self.node = node
        self.replica = node.replica

    async def GetPlan(self, request, context):
        await self.node.peers.ready.wait()
        return self.node.streams.plan()

    async def PushPlan(self, plan, context):
        await self.node.peers.ready.wait()
        rejection = plans.check(plan, self.replica.plans.version, self.replica.alive(), self.replica.topics.live(),
                                self.replica.live_members())
        if rejection is not None:
            self.node.metrics.plan_pushes.labels("stale" if rejection.stale else "invalid").inc()
            raise (FailedPrecondition if rejection.stale else InvalidArgument)(str(rejection))
        stored = mpb.RoutingPlan()
        stored.CopyFrom(plan)
        if not stored.created_unix_ms:
            stored.created_unix_ms = int(time.time() * 1000)
        self.node.peers.push(plan=self.replica.accept_plan(plan.version, stored))
        self.node.metrics.plan_pushes.labels("accepted").inc()
        return mpb.PushPlanResponse(version=plan.version)

    async def ReportRun(self, request, context):
        if request.result not in RUN_RESULTS:
            raise InvalidArgument(f"run result {request.result!r}: one of {', '.join(RUN_RESULTS)}")
        self.node.metrics.replan_runs.labels(request.result).inc()
        if request.result == "failed":
            log.warning("routing job run failed: %s", request.reason[:500])
        else:
            self.replica.record_run(time.time())
        return mpb.ReportRunResponse()

    async def WatchPlan(self, request, context):
        await self.node.peers.ready.wait()
        async with aclosing(self.node.streams.plans(request.known_version)) as adopted:
            async for plan in adopted:
                yield plan


class ReplicationServicer(mgrpc.ReplicationServicer):
    def __init__(self, node: MembershipNode):
        self.replica = node.replica

    async def Digest(self, request, context):
        require_member(context, None, "membership", "Replication.Digest")
        topics, plan, acls = self.replica.digest()
        return mpb.DigestResponse(origin=self.replica.origin, topics=topics, plan=plan, acls=acls)

    async def Pull(self, request, context):
        require_member(context, None, "membership", "Replication.Pull")
        return state_to_pb(self.replica.origin, self.replica.topics.state(), self.replica.plans.current,
                           self.replica.acls.state())

    async def Push(self, request, context):
        require_member(context, None, "membership", "Replication.Push")
        if request.origin != self.replica.origin:
            self.replica.merge_state(*state_from_pb(request))
        return mpb.PushResponse()
