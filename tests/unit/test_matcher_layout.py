"""Layouts of the matcher tier (services/echelon/matcher/layout.py): the default plan, dead
members replaced, holders of a subscription, and batch routing equal to ZoneMap's."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echelon.core.can import Zone, ZoneMap, check_tiling
from echelon.contract.filters import parse
from echelon.contract.schema import Attribute, AttrType, Schema
from echelon.core.space import Space
from echelon.matcher.layout import SMALL, Copy, Layout, default_zones, effective_zones, layout_key
from loadtest import stock
from tests.unit.test_space import events, filters, schemas


def test_default_zones_slice_the_space_one_zone_per_matcher_the_same_on_every_node():
    space = Space.of(stock.STOCK_SCHEMA)
    zones, source = default_zones("quotes", space, ["m2", "m0", "m1"])
    assert source == "default" and len(zones) == 3
    check_tiling(zones, space)
    assert sorted(z.owner for z in zones) == ["m0", "m1", "m2"]
    assert [z.low[0] for z in zones] == [0.0, 1 / 3, 2 / 3]  # Date's l axis, equal widths
    assert default_zones("quotes", space, ["m0", "m1", "m2"]) == (zones, source)
    owners = {t: default_zones(t, space, ["m0", "m1", "m2"])[0][0].owner for t in ("a", "b", "c", "d", "e")}
    assert len(set(owners.values())) > 1  # topics start on different matchers


def test_default_zones_skip_one_value_domains_and_schemaless_topics_get_one_replicated_zone():
    flat = Schema((Attribute("k", AttrType.INT, 5, 5), Attribute("x", AttrType.FLOAT, 0.0, 1.0)))
    zones, _ = default_zones("t", Space.of(flat), ["m0", "m1"])
    check_tiling(zones, Space.of(flat))
    assert len(zones) == 2 and zones[0].high[2] == 0.5  # cut along x's l axis
    zones, source = default_zones("t", Space.of(Schema()), ["m0", "m1", "m2"])
    assert source == "schemaless" and len(zones) == 1 and len(zones[0].members) == 2
    assert zones[0].low == zones[0].high == ()


def test_dead_members_are_left_out_and_a_zone_without_any_gets_a_new_owner():
    space = Space.of(Schema((Attribute("x", AttrType.FLOAT, 0.0, 1.0),)))
    plan = [Zone("a", (0.0, 0.0), (0.5, 1.0), "m0", ("m1",)), Zone("b", (0.5, 0.0), (1.0, 1.0), "m2")]
    zones = effective_zones("t", space, plan, ["m1", "m3"])
    assert zones[0].members == ("m1",) and zones[1].owner in ("m1", "m3")
    assert effective_zones("t", space, plan, ["m1", "m3"]) == zones
    alive = {"m1": 7, "m3": 2}
    assert layout_key("t", Schema(), zones, alive) != layout_key("t", Schema(), zones, {**alive, "m3": 3})


def test_every_subscription_has_two_holders_even_when_one_matcher_owns_both_zones():
    schema = Schema((Attribute("x", AttrType.FLOAT, 0.0, 1.0),))
    space = Space.of(schema)
    zones = [Zone("a", (0.0, 0.0), (0.5, 1.0), "m0"), Zone("b", (0.5, 0.0), (1.0, 1.0), "m0")]
    layout = Layout("t", schema, zones, "m0", {"m0": 1, "m1": 1}, "plan 1")
    subs = [Copy(f"s{i}", "a", "t", 1, parse(text)) for i, text in enumerate(["x <= 0.2", "x >= 0.7", "x = 0.5"])]
    layout.add(subs, {c.id: space.subscription_point(c.filter) for c in subs})
    assert all(set(layout.targets(c.id)) == {"m0", "m1"} for c in subs)
    assert all(layout.holds(c.id) for c in subs)


# 25 examples in the default suite; the `slow` twin below draws 80 (make test-slow).
@settings(max_examples=25, deadline=None)
@given(st.data(), schemas())
def test_batch_routing_equals_zone_map_affected(data, schema):
    space = Space.of(schema)
    zm = ZoneMap(space, owner="m0")
    subs = data.draw(st.lists(filters(schema), max_size=30))
    for i, f in enumerate(subs):
        zm.add(f"s{i}", space.subscription_point(f))
    for k in range(data.draw(st.integers(0, 6))):
        try:
            zm.split(data.draw(st.sampled_from(zm.zones)).id, f"n{k}", "m0")
        except ValueError:
            pass
    layout = Layout("t", schema, zm.zones, "m0", {"m0": 1}, "test")
    batch = data.draw(st.lists(events(schema), max_size=8))
    routed = layout.route(batch)
    for i, e in enumerate(batch):
        want = {zm.zones[j].id for j in zm.affected(space.event_point(e))}
        assert {z for z, idxs in routed.items() if i in idxs} == want
    # the same batch in numpy (larger than SMALL): the same zones for its first copy
    wide = layout.route(batch * (SMALL + 1))
    assert {z: [i for i in idxs if i < len(batch)] for z, idxs in wide.items() if idxs[0] < len(batch)} == routed
    assert layout.route(batch * (SMALL + 1)) == wide  # again: from what the layout kept per string


@pytest.mark.slow
@settings(max_examples=80, deadline=None)
@given(st.data(), schemas())
def test_batch_routing_equals_zone_map_affected_thoroughly(data, schema):
    test_batch_routing_equals_zone_map_affected.hypothesis.inner_test(data, schema)


def test_routing_on_one_string_attribute_equals_zone_map_affected_from_kept_rows():
    """The default plan of a schema led by a string (bench_events' shape): the zones each
    value meets are kept per string; every batch, new values or not, values of another
    kind or unset among them, equals ZoneMap.affected."""
    schema = Schema((Attribute("Symbol", AttrType.STRING), Attribute("Price", AttrType.FLOAT, 0, 100)))
    space = Space.of(schema)
    zones, _ = default_zones("t", space, ["m0", "m1", "m2"])
    zm = ZoneMap(space, zones)
    layout = Layout("t", schema, zones, "m0", {"m0": 1, "m1": 1, "m2": 1}, "default")
    rnd = random.Random(4)
    values = ["", "a", "s07", "s49", "zz", "\uffff", "M", 3, 2.5, None]
    for _ in range(30):
        batch = [{"Price": 1.0} | ({} if v is None else {"Symbol": v})
                 for v in (rnd.choice(values) for _ in range(rnd.choice([SMALL + 1, 40, 470])))]
        routed = layout.route(batch)
        for i, e in enumerate(batch):
            want = {zm.zones[j].id for j in zm.affected(space.event_point(e))}
            assert {z for z, idxs in routed.items() if i in idxs} == want


# 25 examples in the default suite; the `slow` twin below draws 80 (make test-slow).
@settings(max_examples=25, deadline=None)
@given(st.data(), schemas())
def test_batch_placement_equals_zone_map_add(data, schema):
    space = Space.of(schema)
    zm = ZoneMap(space, owner="m0")
    subs = [Copy(f"s{i}", "a", "t", 1, f) for i, f in enumerate(data.draw(st.lists(filters(schema), max_size=30)))]
    points = {c.id: space.subscription_point(c.filter) for c in subs}
    for c in subs:
        zm.add(c.id, points[c.id])
    for k in range(data.draw(st.integers(0, 6))):
        try:
            zm.split(data.draw(st.sampled_from(zm.zones)).id, f"n{k}", "m0")
        except ValueError:
            pass
    fresh = ZoneMap(space, zm.zones)  # placed from scratch, as a matcher adopting the zones does
    for c in subs:
        fresh.add(c.id, points[c.id])
    layout = Layout("t", schema, zm.zones, "m0", {"m0": 1}, "test")
    layout.add(subs, points)
    assert layout.primary == fresh.primary and layout.mirror == fresh.mirror
    assert {z: {s.id for s in idx.subscriptions()} for z, idx in layout.index.items()} == \
        {z.id: fresh.subscriptions(z.id) for z in zm.zones}


@pytest.mark.slow
@settings(max_examples=80, deadline=None)
@given(st.data(), schemas())
def test_batch_placement_equals_zone_map_add_thoroughly(data, schema):
    test_batch_placement_equals_zone_map_add.hypothesis.inner_test(data, schema)
