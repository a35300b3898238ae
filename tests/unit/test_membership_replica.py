"""A membership replica's state machine under a fake clock: what each detector verdict
does to the view, tombstone expiry, replicated topics and plans, and the wire forms."""

from __future__ import annotations

import pytest

from echelon.core.detector import MemberRecord, State, StaleIncarnation
from echelon.core.view import ViewDelta
from echelon.membership.replica import Replica
from echelon.membership.wire import delta_to_pb, member_to_pb, record_from_pb, state_from_pb, state_to_pb
from echelon.contract.errors import InvalidArgument
from echelon.v1 import common_pb2 as pb
from echelon.v1 import membership_pb2 as mpb

TICK = 0.05
BASE = 1_000_000


def rec(mid: str, inc: int = 1) -> MemberRecord:
    return MemberRecord(id=mid, role="ROLE_AGENT", address=f"{mid}:7000", incarnation=inc)


def replica(name: str = "m0", **kw) -> tuple[Replica, list]:
    r = Replica(name, BASE, **kw)
    deltas: list = []
    r.on_delta.append(deltas.append)
    return r, deltas


def run(r: Replica, start: float, end: float, beating: dict[str, int] | None = None) -> list:
    """Tick every TICK from start to end; members in `beating` beat every 0.2 s."""
    out, n = [], 0
    while start + n * TICK <= end + 1e-9:
        now = start + n * TICK
        if beating and n % 4 == 0:
            for mid, inc in beating.items():
                out += r.beat(mid, inc, now)
        out += r.tick(now)
        n += 1
    return out


def view_state(r: Replica, mid: str) -> State | None:
    m = r.log.snapshot().members.get(mid)
    return m.state if m else None


def test_a_join_is_one_version_and_beats_change_nothing():
    r, deltas = replica()
    r.join(rec("a"), 0.0)
    assert r.log.version == BASE + 1 and list(deltas[0].upserted) == ["a"]
    assert deltas[0].upserted["a"].last_beat == 0.0  # no clock fields in the view
    run(r, 0.0, 3.0, {"a": 1})
    assert r.log.version == BASE + 1 and view_state(r, "a") is State.ALIVE


def test_an_ended_stream_kills_within_two_seconds_and_the_view_follows():
    r, deltas = replica()
    r.join(rec("a"), 0.0)
    r.stream_ended("a", 0.1, last_beat=0.0)
    out = run(r, 0.0, 3.0)
    assert [(t.old, t.new) for t in out] == [(State.ALIVE, State.SUSPECT), (State.SUSPECT, State.DEAD)]
    assert out[1].at < 2.0 and out[1].reason == "stream ended"
    assert [d.upserted["a"].state for d in deltas[1:]] == [State.SUSPECT, State.DEAD]
    assert r.counts()[State.DEAD] == 1 and r.alive() == set()


def test_silence_suspects_early_kills_late_and_the_view_follows():
    r, deltas = replica()
    r.join(rec("a"), 0.0)
    out = run(r, 0.0, 8.0)
    assert [(t.old, t.new) for t in out] == [(State.ALIVE, State.SUSPECT), (State.SUSPECT, State.DEAD)]
    assert out[0].at == pytest.approx(1.0) and out[1].silence == pytest.approx(7.0)
    assert [d.upserted["a"].state for d in deltas[1:]] == [State.SUSPECT, State.DEAD]
    assert r.counts()[State.DEAD] == 1 and r.alive() == set()


def test_evidence_suspects_and_the_next_beat_refutes():
    r, deltas = replica()
    r.join(rec("a"), 0.0)
    r.join(rec("b"), 0.0)
    assert [t.new for t in r.evidence("a", "b", 0.1)] == [State.SUSPECT]
    assert view_state(r, "a") is State.SUSPECT
    [t] = r.beat("a", 1, 0.2)
    assert (t.old, t.new, t.reason) == (State.SUSPECT, State.ALIVE, "refuted by beat")
    assert view_state(r, "a") is State.ALIVE and r.detector.stats.refutations["beat"] == 1


def test_a_dead_member_rejoins_only_with_a_higher_incarnation():
    r, _ = replica()
    r.join(rec("a", 5), 0.0)
    run(r, 0.0, 8.0)
    assert view_state(r, "a") is State.DEAD
    with pytest.raises(StaleIncarnation) as e:
        r.join(rec("a", 5), 2.1)
    assert e.value.current == 5
    r.join(rec("a", 6), 2.2)
    assert view_state(r, "a") is State.ALIVE and r.log.snapshot().members["a"].incarnation == 6


def test_tombstones_leave_the_view_after_their_time_and_a_return_is_an_upsert():
    r, deltas = replica(tombstone_ttl=10.0)
    r.join(rec("a"), 0.0)
    r.join(rec("b"), 0.0)
    r.leave("b", 1, 0.5)
    run(r, 0.0, 10.4, {"a": 1})
    assert view_state(r, "b") is State.LEFT  # 9.9 s after the leave
    run(r, 10.5, 12.0, {"a": 1})
    assert "b" not in r.log.snapshot().members and view_state(r, "a") is State.ALIVE
    removal = deltas[-1]
    assert isinstance(removal, ViewDelta) and removal.removed == ("b",)
    assert r.log.since(removal.from_version) == [removal]  # the log serves it like any delta
    assert delta_to_pb(removal, lambda _: 0).removed == ["b"]
    r.join(rec("b", 2), 12.1)
    assert view_state(r, "b") is State.ALIVE


def test_topics_and_plans_converge_between_replicas_and_reach_the_views():
    a, _ = replica("m0")
    b, _ = replica("m1")
    t = pb.Topic(name="quotes")
    a.put_topic("quotes", t)
    a.put_topic("gone", pb.Topic(name="gone"))
    a.delete_topic("gone")
    plan = mpb.RoutingPlan(version=3)
    entry = a.accept_plan(3, plan)
    assert a.plan_epoch == a.log.version
    b.merge_state(a.topics.state(), a.plans.current)
    assert b.digest() == a.digest()
    assert dict(b.log.snapshot().topics) == {"quotes": t} == dict(a.log.snapshot().topics)
    assert b.plans.plan == plan and b.plan_epoch == b.log.version
    assert not b.merge_plan(entry)  # a replay changes nothing


def test_the_replicated_state_survives_the_wire():
    a, _ = replica()
    a.put_topic("quotes", pb.Topic(name="quotes", created_unix_ms=5))
    a.put_topic("x", pb.Topic(name="x"))
    a.delete_topic("x")
    a.accept_plan(2, mpb.RoutingPlan(version=2, origin="job"))
    a.put_acl("user:ann quotes", pb.AclRule(principal="user:ann", pattern="quotes", rights=["publish"]))
    a.put_acl("user:bob *", pb.AclRule(principal="user:bob", pattern="*", rights=["admin"]))
    a.delete_acl("user:bob *")
    topics, plan, acls = state_from_pb(state_to_pb(a.origin, a.topics.state(), a.plans.current, a.acls.state()))
    assert topics == a.topics.state() and plan == a.plans.current and acls == a.acls.state()
    b, _ = replica("m1")
    b.merge_state(topics, plan, acls)
    assert b.digest() == a.digest() and dict(b.log.snapshot().acls) == dict(a.log.snapshot().acls)
    assert list(b.log.snapshot().acls) == ["user:ann quotes"]


def test_member_records_round_trip_and_bad_joins_are_refused():
    m = mpb.Member(id="agent-1", role=mpb.ROLE_AGENT, address="h:1", region="eu", capacity=3, incarnation=7,
                   subscribes=["b", "a"], metrics_address="h:2")
    back = member_to_pb(record_from_pb(m), 99)
    assert back.subscribes == ["a", "b"] and back.state == mpb.MEMBER_STATE_ALIVE and back.last_beat_unix_ms == 99
    back.ClearField("state"), back.ClearField("last_beat_unix_ms"), back.ClearField("subscribes")
    m.ClearField("subscribes")
    assert back == m
    for bad in (mpb.Member(role=mpb.ROLE_AGENT, address="h:1"), mpb.Member(id="a/b", role=1, address="h:1"),
                mpb.Member(id="a", address="h:1"), mpb.Member(id="a", role=1)):
        with pytest.raises(InvalidArgument):
            record_from_pb(bad)
