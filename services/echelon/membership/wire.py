"""Conversions between the membership contract and the replica's plain data."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from echelon.core.detector import MemberRecord, State
from echelon.core.replication import Entry, Stamp
from echelon.core.view import View, ViewDelta
from echelon.contract.errors import InvalidArgument
from echelon.v1 import membership_pb2 as mpb

STATES = {State.ALIVE: mpb.MEMBER_STATE_ALIVE, State.SUSPECT: mpb.MEMBER_STATE_SUSPECT,
          State.DEAD: mpb.MEMBER_STATE_DEAD, State.LEFT: mpb.MEMBER_STATE_LEFT}


def record_from_pb(m: mpb.Member) -> MemberRecord:
    """A joining member's record; validated here, before any state changes."""
    if not m.id or any(c in m.id for c in "/ \t\n"):
        raise InvalidArgument(f"member id {m.id!r}: non-empty, without '/' or spaces")
    if not m.address:
        raise InvalidArgument(f"member {m.id!r}: address is required")
    if m.role not in mpb.Role.values() or m.role == mpb.ROLE_UNSPECIFIED:
        raise InvalidArgument(f"member {m.id!r}: role is required")
    return MemberRecord(id=m.id, role=mpb.Role.Name(m.role), address=m.address, region=m.region,
                        capacity=m.capacity, incarnation=m.incarnation, publishes=frozenset(m.publishes),
                        subscribes=frozenset(m.subscribes), metrics_address=m.metrics_address)


def unix_ms(t: float) -> int:
    """A `time.monotonic()` instant (what the detector runs on) as wall-clock ms (the wire)."""
    return int((time.time() - (time.monotonic() - t)) * 1000)


def member_to_pb(rec: MemberRecord, last_beat_ms: int = 0) -> mpb.Member:
    return mpb.Member(id=rec.id, role=mpb.Role.Value(rec.role), address=rec.address, region=rec.region,
                      capacity=rec.capacity, incarnation=rec.incarnation, state=STATES[rec.state],
                      publishes=sorted(rec.publishes), subscribes=sorted(rec.subscribes),
                      last_beat_unix_ms=last_beat_ms, metrics_address=rec.metrics_address)


def view_to_pb(view: View, last_beat_ms: Callable[[str], int]) -> mpb.View:
    return mpb.View(version=view.version,
                    members=[member_to_pb(r, last_beat_ms(i)) for i, r in sorted(view.members.items())],
                    topics=[t for _, t in sorted(view.topics.items())],
                    acls=[a for _, a in sorted(view.acls.items())])


def delta_to_pb(d: ViewDelta, last_beat_ms: Callable[[str], int]) -> mpb.ViewDelta:
    return mpb.ViewDelta(from_version=d.from_version, version=d.version,
                         upserted=[member_to_pb(r, last_beat_ms(i)) for i, r in sorted(d.upserted.items())],
                         topics_upserted=[t for _, t in sorted(d.topics_upserted.items())],
                         topics_deleted=list(d.topics_deleted),
                         removed=list(d.removed),
                         acls_upserted=[a for _, a in sorted(d.acls_upserted.items())],
                         acls_deleted=list(d.acls_deleted))


def _stamp(s: Stamp) -> mpb.Stamp:
    return mpb.Stamp(version=s.version, origin=s.origin)


def state_to_pb(origin: str, topics: Mapping[str, Entry], plan: Entry | None,
                acls: Mapping[str, Entry] | None = None) -> mpb.ReplicaState:
    out = mpb.ReplicaState(origin=origin)
    for name, e in sorted(topics.items()):
        t = out.topics.add(name=name, stamp=_stamp(e.stamp), deleted=e.deleted)
        if not e.deleted:
            t.topic.CopyFrom(e.value)
    for key, e in sorted((acls or {}).items()):
        a = out.acls.add(key=key, stamp=_stamp(e.stamp), deleted=e.deleted)
        if not e.deleted:
            a.rule.CopyFrom(e.value)
    if plan is not None:
        out.plan.stamp.CopyFrom(_stamp(plan.stamp))
        out.plan.plan.CopyFrom(plan.value)
    return out


def state_from_pb(s: mpb.ReplicaState) -> tuple[dict[str, Entry], Entry | None, dict[str, Entry]]:
    """(topics, plan, acls): the arguments of `Replica.merge_state`."""
    topics = {t.name: Entry(Stamp(t.stamp.version, t.stamp.origin), None if t.deleted else t.topic, t.deleted)
              for t in s.topics}
    plan = None
    if s.HasField("plan"):
        plan = Entry(Stamp(s.plan.stamp.version, s.plan.stamp.origin), s.plan.plan)
    acls = {a.key: Entry(Stamp(a.stamp.version, a.stamp.origin), None if a.deleted else a.rule, a.deleted)
            for a in s.acls}
    return topics, plan, acls
