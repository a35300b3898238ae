"""CAN zones (services/echelon/core/can.py) and a whole matcher tier: ZoneMap routing + per-peer CDM.

The tier test keeps, per peer, the copies it stores (primary and mirror) and a CDM index
of its primaries, changes the zones (split, replicate, move), applies `handoff` to the
stores, adds and deletes subscriptions, loses a zone with all its members and rebuilds
it from `recover` -- and after every step the union over the routed zones must equal
brute-force `Filter.matches`.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echelon.core.can import TilingError, Zone, ZoneMap, check_tiling, handoff, split
from echelon.core.cdm import CountingIndex, Entry
from echelon.contract.schema import Attribute, AttrType, Schema
from echelon.core.space import Space, reflect
from loadtest import stock
from tests.unit.test_space import events, filters, schemas


class Tier:
    """Peers' stores driven by a ZoneMap: what a matcher tier would hold."""

    def __init__(self, space: Space):
        self.space = space
        self.map = ZoneMap(space, owner="p0")
        self.subs: dict[str, Entry] = {}
        self.copies: dict[str, dict[tuple[str, str], Entry]] = {"p0": {}}
        self.index: dict[str, CountingIndex] = {"p0": CountingIndex(base=2, growth=2)}
        self.peers = 1

    def new_peer(self) -> str:
        p = f"p{self.peers}"
        self.peers += 1
        self.copies[p], self.index[p] = {}, CountingIndex(base=2, growth=2)
        return p

    def _store(self, peer: str, role: str, sub: Entry) -> None:
        self.copies[peer][(role, sub.id)] = sub
        if role == "primary":
            self.index[peer].insert(sub)

    def _drop(self, peer: str, role: str, sid: str) -> None:
        del self.copies[peer][(role, sid)]
        if role == "primary":
            self.index[peer].delete(sid)

    def add(self, sub: Entry) -> None:
        self.delete(sub.id)
        self.subs[sub.id] = sub
        primary, mirror = self.map.add(sub.id, self.space.subscription_point(sub.filter))
        for role, zid in (("primary", primary), ("mirror", mirror)):
            for p in self.map.zone(zid).members:
                self._store(p, role, sub)

    def delete(self, sid: str) -> None:
        if sid in self.subs:
            for role, zid in (("primary", self.map.primary[sid]), ("mirror", self.map.mirror[sid])):
                for p in self.map.zone(zid).members:
                    self._drop(p, role, sid)
            self.map.remove(sid)
            del self.subs[sid]

    def change(self, how: str, zone_id: str) -> None:
        old = self.map.copy()
        if how == "split":
            self.map.split(zone_id, f"z{self.peers}", self.new_peer())
        elif how == "replicate":
            self.map.replicate(zone_id, self.new_peer())
        else:
            self.map.set_owner(zone_id, self.new_peer())
        transfers, drops = handoff(old, self.map)
        for t in transfers:
            self._store(t.target, t.role, self.copies[t.source][(t.role, t.subscription)])
        for sid, role, peer in drops:
            self._drop(peer, role, sid)

    def lose_and_recover(self, zone_id: str) -> None:
        """Every member of the zone loses the zone's copies; rebuild them from elsewhere."""
        zone = self.map.zone(zone_id)
        held = [("primary", s) for s in self.map.subscriptions(zone_id)]
        held += [("mirror", s) for s in self.map.mirrored(zone_id)]
        for p in zone.members:
            for role, sid in held:
                self._drop(p, role, sid)
        rec = self.map.recover(zone_id)
        assert not rec.lost or len(self.map.zones) == 1
        for role, sources in (("primary", rec.primaries), ("mirror", rec.mirrors)):
            for sid, src in sources.items():
                source_role = "mirror" if role == "primary" else "primary"
                copy = self.copies[self.map.zone(src).owner][(source_role, sid)]
                for p in zone.members:
                    self._store(p, role, copy)
        for sid in rec.lost:  # one zone: nothing to recover from; reinstall from the client
            for role in ("primary", "mirror"):
                for p in zone.members:
                    self._store(p, role, self.subs[sid])

    def match(self, e: dict) -> set[str]:
        out: set[str] = set()
        for zone, peer in self.map.route(self.space.event_point(e)):
            out.update(self.index[peer].match(e))
        return out

    def check_stores(self) -> None:
        want: dict[str, set] = {p: set() for p in self.copies}
        for sid in self.subs:
            for role, zid in (("primary", self.map.primary[sid]), ("mirror", self.map.mirror[sid])):
                for p in self.map.zone(zid).members:
                    want[p].add((role, sid))
        assert {p: set(c) for p, c in self.copies.items()} == want


# 20 examples in the default suite; the `slow` twin below draws 60 (make test-slow).
@settings(max_examples=20, deadline=None)
@given(st.data())
def test_tier_equals_brute_force_through_splits_replicas_handoffs_and_recovery(data):
    schema = data.draw(schemas())
    tier = Tier(Space.of(schema))
    ids = st.integers(0, 30).map(lambda i: f"s{i}")
    for i in range(data.draw(st.integers(0, 25))):
        tier.add(Entry(data.draw(ids), f"a{i % 4}", data.draw(filters(schema))))
    for _ in range(data.draw(st.integers(1, 14))):
        action = data.draw(st.sampled_from(["split", "split", "replicate", "move", "add", "delete", "lose", "match"]))
        zone = data.draw(st.sampled_from(tier.map.zones)).id
        if action in ("split", "replicate", "move"):
            try:
                tier.change(action, zone)
            except ValueError:  # a zone too small to split
                continue
        elif action == "add":
            tier.add(Entry(data.draw(ids), "a9", data.draw(filters(schema))))
        elif action == "delete" and tier.subs:
            tier.delete(data.draw(st.sampled_from(sorted(tier.subs))))
        elif action == "lose":
            tier.lose_and_recover(zone)
        else:
            for e in data.draw(st.lists(events(schema), max_size=4)):
                assert tier.match(e) == {s.id for s in tier.subs.values() if s.filter.matches(e)}
        tier.check_stores()
        check_tiling(tier.map.zones, tier.space)
    for e in data.draw(st.lists(events(schema), min_size=1, max_size=4)):
        assert tier.match(e) == {s.id for s in tier.subs.values() if s.filter.matches(e)}


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(st.data())
def test_tier_equals_brute_force_through_splits_replicas_handoffs_and_recovery_thoroughly(data):
    test_tier_equals_brute_force_through_splits_replicas_handoffs_and_recovery.hypothesis.inner_test(data)


def test_stock_tier_with_many_zones():
    space = Space.of(stock.STOCK_SCHEMA)
    tier = Tier(space)
    for i, f in enumerate(stock.subscriptions(1500, seed=2)):
        tier.add(Entry(f"s{i}", f"a{i % 5}", f))
    for _ in range(40):
        busiest = max(tier.map.zones, key=lambda z: len(tier.map.subscriptions(z.id)))
        tier.change("split", busiest.id)
    tier.change("replicate", tier.map.zones[3].id)
    tier.lose_and_recover(tier.map.zones[5].id)
    tier.check_stores()
    counts = [len(tier.map.subscriptions(z.id)) for z in tier.map.zones]
    assert max(counts) <= 2 * min(counts) + 2  # splits divide subscription load evenly
    batch = stock.events(150, seed=3)
    assert all(tier.match(e) == {s.id for s in tier.subs.values() if s.filter.matches(e)} for e in batch)
    visited = [len(tier.map.zones_for_event(space.event_point(e))) for e in batch]
    assert sum(visited) / len(visited) < 0.3 * len(tier.map.zones)


def square() -> Space:
    return Space.of(Schema((Attribute("x", AttrType.FLOAT, 0.0, 10.0),)))


def test_check_tiling_rejects_overlaps_gaps_and_strays():
    space = square()
    good = [Zone("a", (0.0, 0.0), (5.0, 10.0)), Zone("b", (5.0, 0.0), (10.0, 10.0))]
    check_tiling(good, space)
    cases = {
        "overlap": [Zone("a", (0.0, 0.0), (6.0, 10.0)), Zone("b", (5.0, 0.0), (10.0, 10.0))],
        "gaps": [Zone("a", (0.0, 0.0), (4.0, 10.0)), Zone("b", (5.0, 0.0), (10.0, 10.0))],
        "outside": [Zone("a", (0.0, 0.0), (5.0, 10.0)), Zone("b", (5.0, 0.0), (11.0, 10.0))],
        "empty": [*good, Zone("c", (5.0, 0.0), (5.0, 10.0))],
        "duplicate": [good[0], good[0]],
        "dimensions": [Zone("a", (0.0,), (10.0,))],
    }
    for reason, zones in cases.items():
        with pytest.raises(TilingError):
            check_tiling(zones, space)
    with pytest.raises(TilingError):
        ZoneMap(space, cases["gaps"])


def test_zone_boundaries_are_half_open_and_closed_at_the_top():
    zm = ZoneMap(square(), [Zone("a", (0.0, 0.0), (5.0, 10.0), "p"), Zone("b", (5.0, 0.0), (10.0, 10.0), "q")])
    assert zm.zone_of((5.0, 5.0)).id == "b" and zm.zone_of((4.99, 10.0)).id == "a" and zm.zone_of((10.0, 10.0)).id == "b"
    assert [z.id for z in zm.neighbours("a")] == ["b"]


def test_split_divides_subscriptions_evenly_and_mirrors_move_out_of_the_primary_zone():
    zone = Zone("z", (0.0, 0.0), (10.0, 10.0), "p", ("r",))
    pts = [(1.0, 2.0), (2.0, 3.0), (3.0, 9.0), (8.0, 9.0)]
    low, high = split(zone, pts, new_id="n", new_owner="q", space=square())
    assert low.replicas == ("r",) and high.owner == "q" and high.replicas == ()
    assert sum(1 for p in pts if p[0] < low.high[0] and p[1] < low.high[1]) == 2
    zm = ZoneMap(square(), owner="p")
    for i, p in enumerate(pts):
        zm.add(f"s{i}", p)
    zm.split("z0", "z1", "q")
    for sid, point in zm.points.items():
        assert zm.mirror[sid] != zm.primary[sid]
        if zm.zone_of(reflect(point)).id != zm.primary[sid]:
            assert zm.mirror[sid] == zm.zone_of(reflect(point)).id
    assert zm.recover("z0").lost == frozenset()


def test_replicas_are_picked_round_robin():
    zm = ZoneMap(square(), owner="p")
    zm.replicate("z0", "q")
    zm.replicate("z0", "r")
    assert [peer for _ in range(6) for _, peer in zm.route((1.0, 1.0))] == ["p", "q", "r", "p", "q", "r"]
