"""OctopiA's control plane (core/scot_control.py) against brute force.

The oracle is this file's own: a schema of two small int attributes, so every event of
the schema (each attribute one of its values or missing) can be listed, and two filters
overlap when some listed event satisfies both. Random advertisements, subscriptions
(disjunctions among them), unsubscriptions and unadvertisements are issued while the
messages of earlier ones are still in flight, links delivered in a random interleaving
(each link FIFO). Once quiet: every table is what the paper says it is, and every
event of every advertisement, routed hop by hop from the summaries, enters exactly the
clusters with an overlapping subscription and is delivered exactly once to exactly the
subscriptions it matches.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from echelon.contract.filters import Disjunction, Filter, Op, Predicate, overlaps
from echelon.contract.schema import Attribute, AttrType, Schema
from echelon.core.scot import Scot, bits
from echelon.core.scot_control import Advertisement, ControlPlane, Kind, Subscription, exact_overlap

DOMAIN = range(0, 4)
SCHEMA = Schema((Attribute("x", AttrType.INT, 0, 3), Attribute("y", AttrType.INT, 0, 3)))
EVENTS = [{k: v for k, v in (("x", x), ("y", y)) if v is not None}
          for x, y in itertools.product([None, *DOMAIN], repeat=2)]
OPS = [Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.BETWEEN]


def brute_overlap(a, b) -> bool:
    return any(a.matches(e) and b.matches(e) for e in EVENTS)


@st.composite
def predicate(draw):
    name, op = draw(st.sampled_from("xy")), draw(st.sampled_from(OPS))
    v = draw(st.integers(-1, 4))
    if op is Op.BETWEEN:
        return Predicate(name, op, min(v, w := draw(st.integers(-1, 4))), max(v, w))
    return Predicate(name, op, v)


conjunction = st.lists(predicate(), max_size=3).map(lambda ps: Filter(tuple(ps)))
expression = st.one_of(conjunction, st.lists(conjunction, min_size=2, max_size=3).map(
    lambda ts: Disjunction(tuple(ts))))


@given(a=expression, b=expression)
@settings(max_examples=200, deadline=None)
def test_overlap_is_exact_on_an_int_schema(a, b):
    assert overlaps(a, b, SCHEMA) == brute_overlap(a, b)


@st.composite
def scenario(draw):
    t, k = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    routers = Scot.uniform(t, k).routers()
    ops, advs, subs = [], [], []
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["adv", "sub", "sub", "sub", "unsub", "unadv"]))
        if kind == "adv":
            advs.append(Advertisement(f"a{len(advs)}", draw(conjunction), draw(st.sampled_from(routers))))
            ops.append(("adv", advs[-1]))
        elif kind == "sub":
            subs.append(Subscription(f"s{len(subs)}", draw(expression), draw(st.sampled_from(routers))))
            ops.append(("sub", subs[-1]))
        elif kind == "unsub" and subs:
            ops.append(("unsub", draw(st.sampled_from(subs))))
        elif kind == "unadv" and advs:
            ops.append(("unadv", draw(st.sampled_from(advs))))
        ops.append(("run", draw(st.integers(0, 6))))  # deliver a few messages before the next call
    return t, k, ops, draw(st.integers(0, 2**32))


@given(scenario())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_tables_and_routes_against_brute_force(case):
    t, k, ops, seed = case
    scot = Scot.uniform(t, k)
    plane = ControlPlane(scot, exact_overlap(SCHEMA))
    rng = random.Random(seed)
    pick = lambda n: rng.randrange(n)  # noqa: E731
    advs, subs = {}, {}
    for op, x in ops:
        if op == "run":
            for _ in range(x):
                plane.step(pick)
            continue
        if op == "adv":
            advs[x.id] = x
            plane.post(plane.brokers[x.host].advertise(x))
        elif op == "unadv":
            advs.pop(x.id, None)
            plane.post(plane.brokers[x.host].unadvertise(x.id))
        elif op == "sub":
            subs[x.id] = x
            plane.post(plane.brokers[x.host].subscribe(x))
        else:
            subs.pop(x.id, None)
            plane.post(plane.brokers[x.host].unsubscribe(x.id))
    plane.settle(pick)

    for c in range(k):  # subscription subgrouping: every broker of c holds exactly c's subgroup
        group = {s for s, sub in subs.items() if sub.host[1] == c}
        for a in range(t):
            assert set(plane.brokers[(a, c)].prt) == group
    for adv in advs.values():
        a, c = adv.host
        holders = {r for r, b in plane.brokers.items() if adv.id in b.srt}
        assert holders == {(a, o) for o in range(k)}  # the publisher's region only
        wanted = {s.host[1] for s in subs.values() if brute_overlap(adv.filter, s.filter)}
        civ = plane.brokers[adv.host].srt[adv.id].civ
        assert set(bits(civ)) == {c} | (wanted - {c})  # context bit and the STCs
        for o in range(k):
            if o != c:
                scb = bool(plane.brokers[(a, o)].srt[adv.id].civ & (1 << o))
                assert scb == (o in wanted)
        for event in EVENTS:
            if not adv.filter.matches(event):
                continue
            delivered, _, entered = plane.publish(adv, event)
            expect = sorted(s for s, sub in subs.items() if sub.filter.matches(event))
            assert sorted(delivered) == expect  # each matching subscription exactly once
            assert entered == wanted - {c}
            reached = {subs[s].host[1] for s in delivered}
            assert reached == {subs[s].host[1] for s in expect}


def test_message_counts_follow_the_paper():
    """ADV: one per secondary broker, tree of length 1; SUB: one per aLink of the host
    cluster; CIB_SET: one per (advertisement, cluster) however many subscriptions overlap."""
    scot = Scot.uniform(14, 5)
    plane = ControlPlane(scot, exact_overlap(SCHEMA))
    adv = Advertisement("p", Filter((Predicate("x", Op.EQ, 1),)), (3, 0))
    plane.post(plane.brokers[adv.host].advertise(adv))
    plane.settle()
    assert plane.sent[Kind.ADV] == 4 and plane.sent[Kind.CIB_SET] == 0
    for i, host in enumerate([(0, 2), (5, 2), (9, 2), (1, 4)]):
        plane.post(plane.brokers[host].subscribe(Subscription(f"s{i}", Filter((Predicate("x", Op.LE, 2),)), host)))
        plane.settle()
    assert plane.sent[Kind.SUB] == 4 * 13
    assert plane.sent[Kind.CIB_SET] == 2  # clusters 2 and 4, once each
    assert bits(plane.brokers[(3, 0)].srt["p"].civ) == [0, 2, 4]
    assert sum(len(b.srt) for b in plane.brokers.values()) == 5
    for i in range(3):
        plane.post(plane.brokers[[(0, 2), (5, 2), (9, 2)][i]].unsubscribe(f"s{i}"))
        plane.settle()
    assert plane.sent[Kind.CIB_CLEAR] == 1 and bits(plane.brokers[(3, 0)].srt["p"].civ) == [0, 4]


def test_wrong_host_is_refused():
    plane = ControlPlane(Scot.uniform(2, 2), exact_overlap(SCHEMA))
    with pytest.raises(ValueError):
        plane.brokers[(0, 0)].advertise(Advertisement("p", Filter(), (1, 0)))
    with pytest.raises(ValueError):
        plane.brokers[(0, 0)].subscribe(Subscription("s", Filter(), (0, 1)))


@given(scenario(), st.data())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_view_change_keeps_routes_exact(case, data):
    """Routers leave (positions re-numbered in each region): the survivors' tables are
    rebuilt; until the answers are in, each host's CIV is a superset of what it must be
    (no cluster misses an event), and once quiet every check above holds again."""
    t, k, ops, seed = case
    scot = Scot.uniform(t, k)
    plane = ControlPlane(scot, exact_overlap(SCHEMA))
    advs, subs = {}, {}
    for op, x in ops:
        if op in ("adv", "sub"):
            (advs if op == "adv" else subs)[x.id] = x
            b = plane.brokers[x.host]
            plane.post(b.advertise(x) if op == "adv" else b.subscribe(x))
        elif op in ("unadv", "unsub"):
            (advs if op == "unadv" else subs).pop(x.id, None)
            b = plane.brokers[x.host]
            plane.post(b.unadvertise(x.id) if op == "unadv" else b.unsubscribe(x.id))
    plane.settle()
    where, sizes = {}, []
    for c in range(k):
        keep = sorted(data.draw(st.sets(st.integers(0, t - 1), min_size=1), label=f"region {c}"))
        where.update({(a, c): (i, c) for i, a in enumerate(keep)})
        sizes.append(len(keep))
    new = Scot(tuple(sizes))
    plane.reindex(new, where)
    advs = {i: Advertisement(i, a.filter, where[a.host]) for i, a in advs.items() if a.host in where}
    subs = {i: Subscription(i, s.filter, where[s.host]) for i, s in subs.items() if s.host in where}
    wanted = {i: {s.host[1] for s in subs.values() if brute_overlap(a.filter, s.filter)} - {a.host[1]}
              for i, a in advs.items()}
    for i, a in advs.items():
        assert set(bits(plane.brokers[a.host].srt[i].civ)) >= wanted[i] | {a.host[1]}
    plane.settle(random.Random(seed).randrange)
    for c in range(k):
        group = {s for s, sub in subs.items() if sub.host[1] == c}
        for a in range(sizes[c]):
            assert set(plane.brokers[(a, c)].prt) == group
    for i, adv in advs.items():
        holders = {r for r, b in plane.brokers.items() if i in b.srt}
        assert holders == {adv.host, *new.ilinks(*adv.host)}
        assert set(bits(plane.brokers[adv.host].srt[i].civ)) == wanted[i] | {adv.host[1]}
        for event in EVENTS:
            if adv.filter.matches(event):
                delivered, _, entered = plane.publish(adv, event)
                assert sorted(delivered) == sorted(s for s, sub in subs.items() if sub.filter.matches(event))
                assert entered == wanted[i]


def test_a_view_change_clears_a_bit_and_rederives_last_hops():
    """Two cases the random one may miss: the router that hosted a cluster's only
    overlapping subscription leaves (the host's bit must clear), and the tree re-forms
    so that last hops point elsewhere (routes must still reach every subscriber)."""
    x1 = Filter((Predicate("x", Op.EQ, 1),))
    plane = ControlPlane(Scot.uniform(3, 2), exact_overlap(SCHEMA))
    adv = Advertisement("p", x1, (0, 0))
    plane.post(plane.brokers[(0, 0)].advertise(adv))
    for i, host in enumerate([(2, 1), (2, 0), (1, 0)]):
        plane.post(plane.brokers[host].subscribe(Subscription(f"s{i}", x1, host)))
    plane.settle()
    assert bits(plane.brokers[(0, 0)].srt["p"].civ) == [0, 1]
    # region 0 loses position 0's router (not the publisher's: its advertisement moves to
    # the survivors' first place only if its router survives), region 1 loses position 2.
    plane.reindex(Scot((2, 2)), {(0, 0): (0, 0), (2, 0): (1, 0), (0, 1): (0, 1), (1, 1): (1, 1)})
    plane.settle()
    assert bits(plane.brokers[(0, 0)].srt["p"].civ) == [0]  # s0 left with its router
    assert plane.brokers[(0, 0)].prt["s1"].last_hop == (1, 0)  # was (2, 0) in the old tree
    delivered, _, entered = plane.publish(Advertisement("p", x1, (0, 0)), {"x": 1})
    assert delivered == ["s1"] and entered == set()
    with pytest.raises(ValueError):
        plane.reindex(Scot((3, 2)), {(0, 0): (0, 0), (1, 0): (1, 0), (0, 1): (0, 1), (1, 1): (1, 1)})
