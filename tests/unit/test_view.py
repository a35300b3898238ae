"""Versioned views, deltas for watchers, and the routing-plan acceptance rule."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echelon.core.view import TopicRecord, View, ViewLog, check_plan, merge


def topic(name: str, created: int = 1) -> TopicRecord:
    return TopicRecord(name, (("price", "float"),), created)


def test_every_change_is_one_version_and_no_op_changes_make_none():
    log = ViewLog()
    d1 = log.upsert_member("a", {"state": "alive"})
    assert (d1.from_version, d1.version, dict(d1.upserted)) == (0, 1, {"a": {"state": "alive"}})
    assert log.upsert_member("a", {"state": "alive"}) is None
    d2 = log.change(members={"a": {"state": "alive"}, "b": {"state": "alive"}}, topics={"t": topic("t")})
    assert d2.version == 2 and set(d2.upserted) == {"b"} and set(d2.topics_upserted) == {"t"}
    assert log.delete_topic("missing") is None
    d3 = log.delete_topic("t")
    assert d3.topics_deleted == ("t",)
    version, members, topics, _ = log.snapshot()
    assert version == 3 and set(members) == {"a", "b"} and topics == {}


def test_upsert_and_delete_of_one_topic_in_one_change_is_refused():
    with pytest.raises(ValueError, match="both"):
        ViewLog().change(topics={"t": topic("t")}, topics_deleted=["t"])


def test_removing_members_is_one_version_that_watchers_merge():
    log = ViewLog()
    log.change(members={"a": 1, "b": 2, "c": 3})
    watcher = log.snapshot()
    assert log.remove_members(["x"]) is None  # not in the view: no version
    d = log.remove_members(["b", "c", "b"])
    assert (d.from_version, d.version, d.removed, dict(d.upserted)) == (1, 2, ("b", "c"), {})
    assert log.snapshot() == View(2, {"a": 1}, {})
    assert merge(watcher, d) == log.snapshot() and watcher.members == {"a": 1, "b": 2, "c": 3}
    assert log.since(1) == [d]
    d2 = log.upsert_member("b", 4)  # a member back after its removal is an upsert
    assert d2.removed == () and log.snapshot().members == {"a": 1, "b": 4}


def test_upsert_and_removal_of_one_member_in_one_change_is_refused():
    log = ViewLog()
    log.upsert_member("a", 1)
    with pytest.raises(ValueError, match="both"):
        log.change(members={"a": 2}, removed=["a"])
    assert log.snapshot() == View(1, {"a": 1}, {})


def test_since_gives_deltas_while_the_log_holds_them_else_none():
    log = ViewLog(keep=3)
    for i in range(5):
        log.upsert_member(f"m{i}", i)
    assert log.since(5) == []
    assert [d.version for d in log.since(2)] == [3, 4, 5]
    assert log.since(1) is None  # fell behind: snapshot
    assert log.since(0) is None
    assert log.since(9) is None  # another replica's (or another life's) numbering


def test_base_makes_a_foreign_version_miss_the_log():
    a, b = ViewLog(base=1000), ViewLog(base=5000)
    for i in range(3):
        a.upsert_member(f"m{i}", i)
    b.upsert_member("x", 0)
    assert a.snapshot().version == 1003
    assert b.since(a.version) is None and a.since(b.version) is None
    assert ViewLog(base=7).since(0) is None


def test_merge_applies_in_order_ignores_replays_and_refuses_gaps():
    log = ViewLog()
    view = log.snapshot()
    d1 = log.change(members={"a": 1}, topics={"t": topic("t")})
    d2 = log.change(members={"a": 2}, topics_deleted=["t"])
    d3 = log.upsert_member("b", 3)
    assert merge(view, d2) is None
    v1 = merge(view, d1)
    assert merge(v1, d1) is v1
    v3 = merge(merge(v1, d2), d3)
    assert v3 == log.snapshot()
    assert view == View(0, {}, {})  # inputs untouched


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["m", "t", "del", "rm"]), st.sampled_from("abcd"), st.integers(0, 3)),
        max_size=40,
    ),
    keep=st.integers(1, 8),
    start=st.integers(0, 40),
)
def test_a_watcher_that_follows_since_or_snapshots_always_matches(ops, keep, start):
    log = ViewLog(keep=keep)
    for kind, key, val in ops[:start]:
        _apply(log, kind, key, val)
    watcher = log.snapshot()
    for kind, key, val in ops[start:]:
        _apply(log, kind, key, val)
        if val:  # the watcher only catches up now and then
            watcher = _catch_up(log, watcher)
    assert _catch_up(log, watcher) == log.snapshot()


def _catch_up(log: ViewLog, watcher: View) -> View:
    """What `Watch` does: the deltas since the watcher's version, else a snapshot."""
    deltas = log.since(watcher.version)
    if deltas is None:
        return log.snapshot()
    for d in deltas:
        watcher = merge(watcher, d)
    return watcher


def _apply(log: ViewLog, kind: str, key: str, val: int) -> None:
    if kind == "m":
        log.upsert_member(key, val)
    elif kind == "t":
        log.upsert_topic(key, topic(key, val))
    elif kind == "rm":
        log.remove_members([key])
    else:
        log.delete_topic(key)


def test_check_plan_accepts_a_good_plan():
    assert check_plan(5, 4, ["m1", "m2", "m1"], {"m1", "m2", "m3"}, True) is None


def test_check_plan_rejects_a_stale_version_as_a_precondition():
    for version in (3, 4):
        reason = check_plan(version, 4, ["m1"], {"m1"}, True)
        assert isinstance(reason, str) and reason.stale
        assert f"plan version {version} is not above the current 4" == reason


def test_check_plan_rejects_bad_geometry_and_dead_owners_as_invalid():
    reason = check_plan(5, 4, ["m1"], {"m1"}, False)
    assert "tile" in reason and not reason.stale
    reason = check_plan(5, 4, ["m1", "m9", "m8", "m9"], {"m1"}, True)
    assert reason == "zone owners not alive: 'm8', 'm9'" and not reason.stale
    many = [f"x{i}" for i in range(8)]
    assert check_plan(5, 4, many, set(), True).endswith("and 3 more")
