"""SCOT, SNR and IDR (core/scot.py, core/idr.py) against brute force: the overlay built
from the definition of the Cartesian product, every send checked to be an edge of it,
and notifications walked hop by hop to see every target region served exactly once,
with no router visited twice, for every CIV and every pattern of congested links."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echelon.core.idr import RULES, CongestionMeter, LinkState, congested, congestion_element, idr
from echelon.core.scot import Scot, Send, bits, civ, snr

HOT = LinkState(q=50, ce=math.inf, congested=True)


def brute_edges(scot: Scot) -> set[frozenset]:
    """The overlay from its definition: T's edges (b, parent(b)) in every region, and a
    complete graph between B(a, c) and B(a mod n_c', c') across regions."""
    edges = set()
    for c, n in enumerate(scot.sizes):
        for b in range(1, n):
            edges.add(frozenset({(b, c), ((b - 1) // 2, c)}))
    for (c, n), (d, m) in itertools.permutations(enumerate(scot.sizes), 2):
        for a in range(n):
            edges.add(frozenset({(a, c), (a % m, d)}))
    return edges


def test_uniform_scot_is_the_cartesian_product():
    for t, k in [(1, 1), (1, 4), (3, 3), (7, 2), (14, 5)]:
        scot = Scot.uniform(t, k)
        assert len(scot.routers()) == t * k
        adjacency = {r: set() for r in scot.routers()}
        for e in brute_edges(scot):
            x, y = tuple(e)
            adjacency[x].add(y)
            adjacency[y].add(x)
        for a, c in scot.routers():
            primary, secondary = scot.alink(a, c), scot.ilinks(a, c)
            assert all(r[1] == c for r in primary) and all(r[0] == a for r in secondary)
            assert set(primary) | set(secondary) == adjacency[(a, c)]
            assert len(secondary) == k - 1
        # T is a tree: t - 1 aLinks per region, connected
        for c in range(k):
            seen, stack = {0}, [0]
            while stack:
                for b, _ in scot.alink(stack.pop(), c):
                    if b not in seen:
                        seen.add(b)
                        stack.append(b)
            assert seen == set(range(t))
        assert len(brute_edges(scot)) == k * (t - 1) + t * k * (k - 1) // 2


def test_civ_bits_round_trip():
    assert civ([0, 2]) == 0b101 and bits(0b101) == [0, 2] and bits(0) == []
    with pytest.raises(ValueError):
        civ([-1])


def test_snr_one_copy_per_bit_over_the_ilink():
    scot = Scot.uniform(3, 4)
    assert snr(scot, (1, 0), civ([0, 2, 3])) == [Send((1, 2), 0b100), Send((1, 3), 0b1000)]
    assert snr(scot, (2, 1), civ([1])) == []


@pytest.mark.parametrize("enq,deq,q,ce,hot", [
    (10, 5, 20, 2.0, True),     # more in than out, long queue
    (10, 10, 20, 1.0, True),    # CE = 1 counts
    (5, 10, 20, 0.5, False),    # draining
    (10, 5, 3, 2.0, False),     # short queue: q <= delta
    (10, 0, 7, math.inf, True),  # nothing left the queue
    (0, 0, 0, 0.0, False),      # idle
])
def test_congestion_element(enq, deq, q, ce, hot):
    assert congestion_element(enq, deq, q) == ce
    assert congested(congestion_element(enq, deq, q), q, delta=5) is hot


def test_meter_measures_per_interval():
    m = CongestionMeter(delta=2)
    assert m.sample(10, 0, 10).congested  # CE infinite
    s = m.sample(15, 20, 5)  # interval: 5 in, 20 out
    assert s.ce == 0.25 and not s.congested
    assert m.sample(15, 20, 5).ce == math.inf  # nothing moved, q > 0


def test_the_four_rules():
    scot = Scot.uniform(3, 4)  # B(0, 0) has aLinks to (1, 0), (2, 0); iLinks to (0, 1..3)
    here, v = (0, 0), civ([1, 2, 3])
    assert idr(scot, here, v, {}).rule == "none"
    # (i): (0, 2) congested; its bit rides on the uncongested iLink with the smallest q
    d = idr(scot, here, v, {(0, 2): HOT, (0, 1): LinkState(q=4), (0, 3): LinkState(q=1)})
    assert d.rule == "i" and set(d.sends) == {Send((0, 1), 0b10), Send((0, 3), 0b1100)}
    # (ii): all target iLinks congested; down the uncongested aLink with the smallest q
    states = {(0, o): HOT for o in (1, 2, 3)} | {(1, 0): LinkState(q=3), (2, 0): LinkState(q=2)}
    assert idr(scot, here, v, states) == idr(scot, here, v, states, came_from=[(1, 0)])
    d = idr(scot, here, v, states)
    assert d.rule == "ii" and d.sends == (Send((2, 0), v),)
    # came in on (2, 0): never back
    assert idr(scot, here, v, states, came_from=[(2, 0)]).sends == (Send((1, 0), v),)
    # (iii): no target aLink (a leaf that was entered through its only aLink)
    states = {(1, 1): LinkState(q=9, ce=2, congested=True),
              (1, 2): LinkState(q=7, ce=3, congested=True), (1, 3): HOT}
    d = idr(scot, (1, 0), v, states, came_from=[(0, 0)])
    assert d.rule == "iii" and d.sends == (Send((1, 2), v),)
    # (iv): target aLinks exist but are congested too
    states[(0, 0)] = HOT
    d = idr(scot, (1, 0), v, states)
    assert d.rule == "iv" and d.sends == (Send((1, 2), v),)


routers_per_region = st.integers(1, 7)


@st.composite
def cases(draw):
    sizes = tuple(draw(st.lists(routers_per_region, min_size=1, max_size=6)))
    scot = Scot(sizes)
    routers = scot.routers()
    origin = draw(st.sampled_from(routers))
    v = draw(st.integers(0, (1 << len(sizes)) - 1)) & ~(1 << origin[1])
    links = sorted({(x, y) for x in routers for y in scot.alink(*x) + scot.ilinks(*x)})
    share = draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))  # how much of the overlay is congested
    marks = draw(st.lists(st.floats(0, 1), min_size=len(links), max_size=len(links)))
    hot = {link for link, m in zip(links, marks) if m < share}
    # a link state belongs to the sender's output queue: key by (sender, receiver)
    qs = draw(st.lists(st.integers(0, 100), min_size=len(links), max_size=len(links)))
    return scot, origin, v, hot, dict(zip(links, qs))


def states_at(here, hot, qs):
    """The states one router sees: its own output queues."""
    return {y: LinkState(q=qs[(x, y)], ce=2.0 if (x, y) in hot else 0.5, congested=(x, y) in hot)
            for (x, y) in qs if x == here}


# 100 examples in the default suite; the `slow` twin below draws 400 (make test-slow).
@settings(max_examples=100, deadline=None)
@given(cases())
def test_every_target_region_served_exactly_once_and_no_loops(case):
    scot, origin, v, hot, qs = case
    for route in ("snr", "idr"):
        served, visits, messages = walk(scot, origin, v, hot, qs, route)
        assert served == {c: 1 for c in bits(v)}, route
        assert all(n == 1 for n in visits.values()), f"{route}: a router saw the notification twice"
        if route == "snr":
            assert messages == len(bits(v))  # one iLink copy per target region


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(cases())
def test_every_target_region_served_exactly_once_and_no_loops_thoroughly(case):
    test_every_target_region_served_exactly_once_and_no_loops.hypothesis.inner_test(case)


# 100 examples in the default suite; the `slow` twin below draws 300 (make test-slow).
@settings(max_examples=100, deadline=None)
@given(cases())
def test_each_decision_obeys_its_rule(case):
    scot, origin, v, hot, qs = case
    a, c = origin
    st_ = states_at(origin, hot, qs)
    d = idr(scot, origin, v, st_)
    assert d.rule in RULES
    targets = bits(v)
    ilinks = {o: scot.ilink(a, c, o) for o in targets}
    is_hot = lambda r: st_[r].congested  # noqa: E731
    cool = [o for o in targets if not is_hot(ilinks[o])]
    covered = [o for s in d.sends for o in bits(s.civ)]
    assert sorted(covered) == targets  # a partition of the targets
    if not targets:
        assert d.sends == ()
    elif len(cool) == len(targets):
        assert d.sends == tuple(snr(scot, origin, v))
    elif cool:  # (i): nothing on a congested link, one copy per uncongested target iLink
        assert {s.to for s in d.sends} == {ilinks[o] for o in cool}
        carrier = max(d.sends, key=lambda s: len(bits(s.civ))).to
        assert st_[carrier].q == min(st_[ilinks[o]].q for o in cool)
    else:
        assert len(d.sends) == 1
        free = [r for r in scot.alink(a, c) if not is_hot(r)]
        to = d.sends[0].to
        if free:  # (ii)
            assert to in free and st_[to].q == min(st_[r].q for r in free)
        else:  # (iii)/(iv)
            assert to in ilinks.values() and st_[to].q == min(st_[r].q for r in ilinks.values())


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(cases())
def test_each_decision_obeys_its_rule_thoroughly(case):
    test_each_decision_obeys_its_rule.hypothesis.inner_test(case)


def walk(scot, origin, v, hot, qs, route):
    """Follow every copy from `origin` (handed the notification by an agent): the regions
    served and how often, the routers visited and how often, inter-router messages."""
    served: dict[int, int] = {}
    visits: dict = {}
    edges = brute_edges(scot)
    messages = 0
    frontier = [(origin, v, ())]
    for _ in range(10_000):
        if not frontier:
            break
        here, w, came = frontier.pop()
        visits[here] = visits.get(here, 0) + 1
        if here != origin and w & (1 << here[1]):
            served[here[1]] = served.get(here[1], 0) + 1
        sends = (snr(scot, here, w) if route == "snr"
                 else idr(scot, here, w, states_at(here, hot, qs), came).sends)
        for s in sends:
            assert frozenset({here, s.to}) in edges, f"{here} -> {s.to} is not a SCOT link"
            messages += 1
            frontier.append((s.to, s.civ, (here,) if s.to[1] == here[1] else ()))
    else:
        pytest.fail("a notification loops")
    return served, visits, messages
