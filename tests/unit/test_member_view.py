"""The member side: applying snapshots, deltas and keepalives; adopting a plan at its
epoch; choosing the replica to watch. No network: the client is never started."""

from __future__ import annotations

import time

from echelon.runtime import member as member_mod
from echelon.runtime.member import MemberClient
from echelon.v1 import common_pb2 as pb
from echelon.v1 import membership_pb2 as mpb

R = ["r0:1", "r1:1", "r2:1"]


def client() -> MemberClient:
    c = MemberClient(mpb.Member(id="me", role=mpb.ROLE_AGENT, address="me:1"), R)
    c.watching = R[0]
    return c


def m(mid: str, state=mpb.MEMBER_STATE_ALIVE) -> mpb.Member:
    return mpb.Member(id=mid, role=mpb.ROLE_AGENT, address=f"{mid}:1", state=state)


def snapshot(version: int, *members: mpb.Member, topics=()) -> mpb.ViewUpdate:
    return mpb.ViewUpdate(snapshot=mpb.View(version=version, members=members, topics=topics))


def delta(v: int, upserted=(), removed=(), topics=(), deleted=()) -> mpb.ViewUpdate:
    return mpb.ViewUpdate(delta=mpb.ViewDelta(from_version=v - 1, version=v, upserted=upserted, removed=removed,
                                              topics_upserted=topics, topics_deleted=deleted))


def test_snapshot_then_deltas_then_removal():
    c = client()
    changes = []
    c.on_change(lambda: changes.append(c.version))
    assert c._apply(snapshot(10, m("a"), m("b"), topics=[pb.Topic(name="t")]))
    assert c._apply(delta(11, upserted=[m("b", mpb.MEMBER_STATE_DEAD)], topics=[pb.Topic(name="u")], deleted=["t"]))
    assert [x.id for x in c.alive(mpb.ROLE_AGENT)] == ["a"] and set(c.topics) == {"u"}
    assert c._apply(delta(12, removed=["b"]))
    assert set(c.members) == {"a"} and c.version == 12 and changes == [10, 11, 12]


def test_a_replay_changes_nothing_and_a_gap_asks_for_a_resync():
    c = client()
    c._apply(snapshot(10, m("a")))
    c._apply(delta(11, upserted=[m("b")]))
    assert c._apply(delta(11, upserted=[m("c")])) and "c" not in c.members  # replay
    assert not c._apply(delta(13, upserted=[m("d")])) and c.version == 11  # gap
    assert c._apply(mpb.ViewUpdate(keepalive=11))
    assert not c._apply(mpb.ViewUpdate(keepalive=12))  # the replica moved on without us


def test_a_plan_is_adopted_once_the_view_reaches_its_epoch():
    c = client()
    adopted = []
    c.on_plan(lambda: adopted.append(c.plan.version))
    c._apply(snapshot(10, m("a")))
    c._pending_plan = mpb.RoutingPlan(version=4, epoch=11)
    c._adopt_plan()
    assert c.plan is None
    c._apply(delta(11, upserted=[m("b")]))
    assert c.plan_version == 4 and adopted == [4]


def test_a_plan_waits_for_a_view_from_the_replica_it_came_from():
    c = client()
    c._apply(snapshot(10, m("a")))
    c.watching = R[1]  # failing over: the view still holds replica 0's numbering
    c._pending_plan = mpb.RoutingPlan(version=4, epoch=5)
    c._adopt_plan()
    assert c.plan is None
    c._apply(snapshot(7, m("a")))
    assert c.plan_version == 4


def test_the_watch_target_is_the_first_reachable_and_a_return_waits_to_settle():
    c = client()
    now = time.monotonic()
    c.watching = None
    c._up = {R[1]: now, R[2]: now}
    assert c._target({}) == R[1]
    c.watching = R[1]
    c._up[R[0]] = now  # replica 0 is back, but only just
    assert c._target({}) == R[1]
    c._up[R[0]] = now - member_mod.PREFER_AFTER
    assert c._target({}) == R[0]
    assert c._target({R[0]: now + 1}) == R[1]  # its watch just failed: skipped for a while
    c._up = {}
    assert c._target({}) is None  # nothing reachable: keep the last view
