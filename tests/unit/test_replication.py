"""LWW merge rules of the membership replicas: commutative, idempotent, convergent."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from echelon.core.replication import Entry, LwwMap, PlanRegister, Stamp, watch_target, wins

ORIGINS = ["r0/100", "r1/100", "r2/100"]


def entry_for(version: int, origin: str) -> Entry:
    """Stamps are unique, so everything in an entry is a function of its stamp."""
    deleted = version % 3 == 0
    return Entry(Stamp(version, origin), None if deleted else f"{origin}@{version}", deleted)


states = st.dictionaries(
    st.sampled_from("abcde"),
    st.builds(entry_for, st.integers(1, 20), st.sampled_from(ORIGINS)),
    max_size=5,
)


def merged(*parts) -> dict:
    m = LwwMap("observer")
    for p in parts:
        m.merge_state(p)
    return m.state()


@settings(deadline=None)
@given(states, states)
def test_merge_commutes(a, b):
    assert merged(a, b) == merged(b, a)


@settings(deadline=None)
@given(states, states, states)
def test_merge_associates(a, b, c):
    assert merged(merged(a, b), c) == merged(a, merged(b, c))


@settings(deadline=None)
@given(states, states)
def test_merge_is_idempotent(a, b):
    assert merged(a, b, b, a) == merged(a, b)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(["put", "del", "recv"]),
                  st.sampled_from("abc"), st.integers(0, 10**6)),
        max_size=60,
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_replicas_converge_whatever_the_delivery_order(steps, seed):
    rng = random.Random(seed)
    replicas = [LwwMap(o) for o in ORIGINS]
    sent: list[tuple[str, Entry]] = []
    for r, op, key, val in steps:
        rep = replicas[r]
        if op == "put":
            sent.append((key, rep.put(key, val)))
        elif op == "del":
            e = rep.delete(key)
            if e is not None:
                sent.append((key, e))
        elif sent:  # a push arrives, possibly late or twice
            rep.merge(*sent[rng.randrange(len(sent))])
    for rep in replicas:  # every push eventually arrives, in any order, some twice
        pushes = sent + rng.sample(sent, len(sent) // 2)
        rng.shuffle(pushes)
        for key, e in pushes:
            rep.merge(key, e)
    assert len({rep.digest() for rep in replicas}) == 1
    assert replicas[0].state() == replicas[1].state() == replicas[2].state()
    newest = {}
    for key, e in sent:
        if wins(e, newest.get(key)):
            newest[key] = e
    assert replicas[0].state() == newest


def test_a_write_after_seeing_an_entry_beats_it():
    a, b = LwwMap("r0/1"), LwwMap("r1/1")
    for i in range(5):
        a.put("t", i)
    b.merge("t", a.state()["t"])
    e = b.put("t", "b's")
    assert e.stamp == Stamp(6, "r1/1")
    a.merge("t", e)
    assert a.get("t") == "b's"


def test_delete_beats_the_put_it_removes_and_a_recreate_beats_the_delete():
    a, b = LwwMap("r0/1"), LwwMap("r1/1")
    put = a.put("t", "v1")
    b.merge("t", put)
    tomb = b.delete("t")
    assert a.merge("t", tomb) and "t" not in a and a.get("t") is None
    assert not b.merge("t", put)  # a late duplicate of the old put changes nothing
    assert "t" in a.state() and a.live() == {}
    assert a.delete("t") is None  # nothing visible to delete
    again = a.put("t", "v2")
    assert b.merge("t", again) and b.get("t") == "v2"


def test_a_restarted_replica_pulls_full_state_and_never_reuses_a_stamp():
    a = LwwMap("r0/1")
    for k in "abc":
        a.put(k, k.upper())
    a.delete("b")
    fresh = LwwMap("r0/2", state=a.state())  # same replica, new process
    assert fresh.digest() == a.digest() and fresh.live() == {"a": "A", "c": "C"}
    e = fresh.put("a", "new")
    assert e.stamp.version > a.state()["a"].stamp.version and e.stamp.origin == "r0/2"


plan_entries = st.builds(lambda v, o: Entry(Stamp(v, o), f"plan {v} from {o}"),
                         st.integers(1, 6), st.sampled_from(ORIGINS))


@settings(deadline=None)
@given(st.lists(plan_entries, max_size=12), st.integers(0, 2**32 - 1))
def test_plan_registers_converge_whatever_the_delivery_order(entries, seed):
    rng = random.Random(seed)
    regs = []
    for _ in range(3):
        reg = PlanRegister("x")
        order = entries + entries[: len(entries) // 2]
        rng.shuffle(order)
        for e in order:
            reg.merge(e)
        regs.append(reg)
    assert len({r.digest() for r in regs}) == 1
    assert len({r.current for r in regs}) == 1
    if entries:
        assert regs[0].current.stamp == max(e.stamp for e in entries)


def test_plan_accept_requires_a_higher_version_and_ties_break_by_origin():
    a, b = PlanRegister("r0/1"), PlanRegister("r1/1")
    pa, pb = a.accept(3, "A"), b.accept(3, "B")  # raced pushes with one version
    a.merge(pb)
    b.merge(pa)
    assert a.plan == b.plan == "B" and a.version == 3
    try:
        a.accept(3, "again")
    except ValueError as e:
        assert "not above the current 3" in str(e)
    else:
        raise AssertionError("a stale plan was accepted")
    assert a.accept(4, "C").stamp == Stamp(4, "r0/1")


def test_watch_target_prefers_the_first_reachable_replica():
    reps = ["membership-0", "membership-1", "membership-2"]
    assert watch_target(reps, set(reps)) == "membership-0"
    assert watch_target(reps, {"membership-2", "membership-1"}) == "membership-1"
    assert watch_target(reps, set()) is None
