"""Meghdoot space (services/echelon/core/space.py); the hypothesis strategies here serve test_can and test_cdm too."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from echelon.contract.filters import Filter, Op, Predicate
from echelon.contract.schema import Attribute, AttrType, Schema, SchemaError
from echelon.core.space import (
    Space,
    affected_region,
    event_point,
    is_affected,
    prefix_range,
    reflect,
    string_key,
    subscription_point,
)

# Strings that share 6-byte prefixes, differ by trailing NULs, or are multi-byte.
STRINGS = ["", "a", "ab", "ab\x00", "abc", "abcdef", "abcdefg", "abcdefgh", "abcdeg", "b", "ba", "é", "éa", "\U0010ffff", "z"]
NUMBERS = [-(2**63), -(10**6), -3, -1.5, -0.0, 0, 1, 2, 2.5, 3, 7, 100, 2**53 + 1, 10.0**300, 2**63 - 1]


@st.composite
def attributes(draw, name: str) -> Attribute:
    t = draw(st.sampled_from(list(AttrType)))
    if t is AttrType.STRING:
        return Attribute(name, t)
    pool = [v for v in NUMBERS if t is AttrType.FLOAT or isinstance(v, int)]
    lo = draw(st.none() | st.sampled_from(pool))
    hi = draw(st.none() | st.sampled_from([v for v in pool if lo is None or v >= lo]))
    return Attribute(name, t, lo, hi)


@st.composite
def schemas(draw) -> Schema:
    n = draw(st.integers(1, 4))
    return Schema(tuple(draw(attributes(f"a{i}")) for i in range(n)))


def values(attr: Attribute) -> st.SearchStrategy:
    if attr.type is AttrType.STRING:
        return st.sampled_from(STRINGS) | st.text(max_size=8)
    pool = [v for v in NUMBERS if attr.low <= v <= attr.high and (attr.type is AttrType.FLOAT or isinstance(v, int))]
    pool += [attr.low, attr.high]
    if attr.type is AttrType.FLOAT:
        lo, hi = float(attr.low), float(attr.high)
        lo = lo if lo >= attr.low else math.nextafter(lo, math.inf)
        hi = hi if hi <= attr.high else math.nextafter(hi, -math.inf)
        if not lo < hi:  # a one-value domain (or none between two adjacent floats)
            return st.sampled_from(pool)
        return st.sampled_from(pool) | st.floats(min_value=lo, max_value=hi, allow_nan=False)
    lo, hi = max(int(attr.low), -(2**63)), min(int(attr.high), 2**63 - 1)
    return st.sampled_from(pool) | st.integers(lo, hi)


@st.composite
def filters(draw, schema: Schema, max_predicates: int = 3) -> Filter:
    """Schema-valid filters over every operator; invalid draws (empty ranges) are dropped."""
    preds = []
    for _ in range(draw(st.integers(0, max_predicates))):
        attr = draw(st.sampled_from(schema.attributes))
        ops = [o for o in Op if o is not Op.PREFIX or attr.type is AttrType.STRING]
        op = draw(st.sampled_from(ops))
        v = draw(values(attr))
        p = Predicate(attr.name, op, *sorted([v, draw(values(attr))])) if op is Op.BETWEEN else Predicate(attr.name, op, v)
        try:
            Filter((p,)).validate(schema)
        except SchemaError:
            continue
        preds.append(p)
    return Filter(tuple(preds))


@st.composite
def events(draw, schema: Schema) -> dict:
    """Schema-valid events; each attribute unset with probability 1/4."""
    return {a.name: draw(values(a)) for a in schema.attributes if draw(st.integers(0, 3))}


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_matching_event_affects_the_subscription_point(data):
    schema = data.draw(schemas())
    f, e = data.draw(filters(schema)), data.draw(events(schema))
    schema.validate_event(e)
    s, p = subscription_point(f, schema), event_point(e, schema)
    space = Space.of(schema)
    assert len(s) == len(p) == 2 * len(schema.attributes) == space.dims
    assert all(lo <= x <= hi for lo, x, hi in zip(space.low, s, space.high))
    assert all(math.isfinite(x) for x in s + p)
    if f.matches(e):
        assert is_affected(s, p)
    low, high = affected_region(p, space)
    inside = all(lo <= x <= hi for lo, x, hi in zip(low, s, high))
    assert inside >= is_affected(s, p)
    if len(e) == len(schema.attributes):  # for an unset attribute the box is larger
        assert inside == is_affected(s, p)


@given(st.lists(st.sampled_from(STRINGS) | st.text(max_size=10), min_size=2, max_size=2))
def test_string_key_preserves_order(pair):
    a, b = sorted(pair)
    assert 0.0 <= string_key(a) <= string_key(b) < 1.0


@given(st.sampled_from(STRINGS) | st.text(max_size=4), st.sampled_from(STRINGS) | st.text(max_size=10))
def test_prefix_range_holds_every_string_with_the_prefix(p, s):
    lo, hi = prefix_range(p)
    if (p + s).startswith(p):
        assert lo <= string_key(p + s) <= hi


def test_strings_sharing_six_bytes_map_equal_so_the_exact_check_decides():
    assert string_key("abcdefg") == string_key("abcdefgh")
    schema = Schema((Attribute("s", AttrType.STRING),))
    f = Filter((Predicate("s", Op.EQ, "abcdefg"),))
    e = {"s": "abcdefgh"}
    assert is_affected(subscription_point(f, schema), event_point(e, schema)) and not f.matches(e)


def test_points_of_the_paper():
    schema = Schema((Attribute("x", AttrType.INT, 0, 100), Attribute("y", AttrType.FLOAT, 0.0, 10.0)))
    f = Filter((Predicate("x", Op.GE, 5), Predicate("x", Op.LT, 20)))
    assert subscription_point(f, schema) == (5.0, 20.0, 0.0, 10.0)
    assert subscription_point(Filter((Predicate("x", Op.NE, 5),)), schema) == (0.0, 100.0, 0.0, 10.0)
    assert event_point({"x": 7}, schema) == (7.0, 7.0, 0.0, 10.0)
    assert affected_region((7.0, 7.0, 0.0, 10.0), Space.of(schema)) == ((0.0, 7.0, 0.0, 0.0), (7.0, 100.0, 10.0, 10.0))
    assert reflect((5.0, 20.0, 0.0, 10.0)) == (20.0, 5.0, 10.0, 0.0)


def test_unbounded_domains_are_finite():
    schema = Schema((Attribute("f", AttrType.FLOAT), Attribute("i", AttrType.INT)))
    space = Space.of(schema)
    assert space.low == (-1e300, -1e300, float(-(2**63)), float(-(2**63)))
    assert event_point({"f": math.inf, "i": 2**63 - 1}, schema) == (1e300, 1e300, 2.0**63, 2.0**63)
