"""`or`, `not`, `in` and parentheses: the normal form against a brute-force oracle.

The oracle is this file's own: random filter trees, written out as text by this file,
evaluated directly on random events with SQL's three-valued logic (a predicate on a
missing attribute, or on a value of the other kind, is unknown; `not unknown` is
unknown; an event matches when the filter is true). Against it: the parsed filter's
`matches`, the structured form's round trip, the compiled local check
(core/filter_code.py), the counting index the matchers keep, one entry per term
(core/cdm.py, answers mapped back with `subscription_of`), and a schema's pruning.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from echelon.core.cdm import CountingIndex
from echelon.core.cdm import Entry
from echelon.core.filter_code import compile_filters
from echelon.contract.filters import Disjunction, Filter, FilterTooLarge, Op, Predicate, parse, subscription_of, term_ids
from echelon.contract.schema import Attribute, AttrType, Schema, SchemaError
from echelon.core.space import Space
from echelon.contract.wire import filter_from_pb, filter_to_pb
from tests.unit.test_can import Tier

POOLS = {"a": [-2, -1, 0, 1, 2], "b": [0, 0.5, 1, 2.5, 4], "s": ["", "a", "ab", "abc", "b", "ba"]}
SCHEMA = Schema((Attribute("a", AttrType.INT, -2, 2), Attribute("b", AttrType.FLOAT, 0, 4),
                 Attribute("s", AttrType.STRING, max_length=3)))
OPS = ["=", "!=", "<", "<=", ">", ">="]


@st.composite
def literal(draw, attribute: str, typed: bool):
    if typed or draw(st.integers(0, 4)):
        return draw(st.sampled_from(POOLS[attribute]))
    return draw(st.sampled_from([v for pool in POOLS.values() for v in pool]))  # maybe of the other kind


@st.composite
def atom(draw, typed: bool):
    name = draw(st.sampled_from(sorted(POOLS)))
    kind = draw(st.sampled_from(["cmp", "cmp", "between", "prefix", "in", "not in"]))
    if kind == "prefix" and (name == "s" or not typed):
        return ("prefix", name, draw(st.sampled_from(POOLS["s"])))
    if kind == "between":
        lo, hi = sorted([draw(st.sampled_from(POOLS[name])), draw(st.sampled_from(POOLS[name]))], key=_order)
        return ("between", name, lo, hi)
    if kind in ("in", "not in"):
        return (kind, name, draw(st.lists(literal(name, typed), min_size=1, max_size=3)))
    return ("cmp", name, draw(st.sampled_from(OPS)), draw(literal(name, typed)))


def _order(v):
    return (isinstance(v, str), v)


def trees(typed: bool):
    return st.recursive(atom(typed), lambda inner: st.one_of(
        st.tuples(st.just("not"), inner),
        st.tuples(st.sampled_from(["and", "or"]), st.lists(inner, min_size=2, max_size=3))), max_leaves=6)


events = st.dictionaries(st.sampled_from(sorted(POOLS)), st.sampled_from([v for p in POOLS.values() for v in p]),
                         max_size=3)


def typed_events():
    return st.fixed_dictionaries({}, optional={n: st.sampled_from(p) for n, p in POOLS.items()})


def _lit(v) -> str:
    return '"' + v + '"' if isinstance(v, str) else repr(v)


def text(tree, case) -> str:
    """The tree in the text form, keywords in the case `case` picks."""
    kind = tree[0]
    if kind == "cmp":
        return f"{tree[1]} {tree[2]} {_lit(tree[3])}"
    if kind == "between":
        return f"{tree[1]} {case('between')} {_lit(tree[2])} {case('and')} {_lit(tree[3])}"
    if kind == "prefix":
        return f"{tree[1]} {case('prefix')} {_lit(tree[2])}"
    if kind in ("in", "not in"):
        return f"{tree[1]} {case(kind)} ({', '.join(map(_lit, tree[2]))})"
    if kind == "not":
        return f"{case('not')} ({text(tree[1], case)})"
    return f" {case(kind)} ".join(f"({text(c, case)})" for c in tree[1])


def truth(tree, event) -> bool | None:
    """Three-valued: True, False, or None (unknown)."""
    kind = tree[0]
    if kind in ("and", "or"):
        values = [truth(c, event) for c in tree[1]]
        decisive = kind == "or"  # True decides an `or`, False an `and`
        if decisive in values:
            return decisive
        return None if None in values else not decisive
    if kind == "not":
        v = truth(tree[1], event)
        return None if v is None else not v
    if kind in ("in", "not in"):
        v = truth(("or", [("cmp", tree[1], "=", x) for x in tree[2]]), event)
        return v if kind == "in" or v is None else not v
    x = event.get(tree[1])
    literals = [tree[2]] if kind == "prefix" else tree[2:4] if kind == "between" else [tree[3]]
    if x is None or any(isinstance(x, str) != isinstance(c, str) for c in literals):
        return None
    if kind == "prefix":
        return x.startswith(tree[2])
    if kind == "between":
        return tree[2] <= x <= tree[3]
    op, c = tree[2], tree[3]
    return {"=": x == c, "!=": x != c, "<": x < c, "<=": x <= c, ">": x > c, ">=": x >= c}[op]


def _parse(tree, case=str.lower):
    try:
        return parse(text(tree, case))
    except FilterTooLarge:
        assume(False)


# 50 examples in the default suite; the `slow` twin below draws 150 (make test-slow).
@settings(max_examples=50, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(trees(typed=False), min_size=1, max_size=3), st.lists(events, min_size=1, max_size=8),
       st.sampled_from([str.lower, str.upper, str.title]))
def test_every_form_of_matching_equals_the_oracle(tree_list, batch, case):
    filters = [_parse(t, case) for t in tree_list]
    expected = [[j for j, e in enumerate(batch) if truth(t, e) is True] for t in tree_list]
    assert [[j for j, e in enumerate(batch) if f.matches(e)] for f in filters] == expected
    assert [[j for j, e in enumerate(batch) if filter_from_pb(filter_to_pb(f)).matches(e)] for f in filters] == expected
    assert [[j for j, e in enumerate(batch) if parse(str(f)).matches(e)] for f in filters] == expected
    assert compile_filters(filters)(batch) == expected
    index = CountingIndex(Entry(entry, "agent-0", term) for k, f in enumerate(filters)
                          for entry, term in zip(term_ids(f"agent-0/sub{k}", len(f.terms)), f.terms))
    answers = [sorted({subscription_of(i) for i in ids}) for ids in index.match_batch(batch)]
    assert answers == [sorted(f"agent-0/sub{k}" for k, js in enumerate(expected) if j in js)
                       for j in range(len(batch))]


@pytest.mark.slow
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(trees(typed=False), min_size=1, max_size=3), st.lists(events, min_size=1, max_size=8),
       st.sampled_from([str.lower, str.upper, str.title]))
def test_every_form_of_matching_equals_the_oracle_thoroughly(tree_list, batch, case):
    test_every_form_of_matching_equals_the_oracle.hypothesis.inner_test(tree_list, batch, case)


# 35 examples in the default suite; the `slow` twin below draws 100 (make test-slow).
@settings(max_examples=35, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(trees(typed=True), st.lists(typed_events(), min_size=1, max_size=8))
def test_a_schema_drops_only_terms_no_event_of_it_can_satisfy(tree, batch):
    f = _parse(tree)
    try:
        kept = f.validate(SCHEMA)
    except SchemaError as e:
        assert "match" in str(e) or "no value" in str(e) or "common" in str(e) or "empty range" in str(e), str(e)
        assert not any(truth(tree, e) for e in batch)
        return
    assert set(kept.terms) <= set(f.terms)
    assert [kept.matches(e) for e in batch] == [truth(tree, e) is True for e in batch]


@pytest.mark.slow
@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(trees(typed=True), st.lists(typed_events(), min_size=1, max_size=8))
def test_a_schema_drops_only_terms_no_event_of_it_can_satisfy_thoroughly(tree, batch):
    test_a_schema_drops_only_terms_no_event_of_it_can_satisfy.hypothesis.inner_test(tree, batch)


def test_precedence_is_not_then_and_then_or():
    f = parse("a = 1 or b = 2 and not c = 3")
    assert f == Disjunction((Filter((Predicate("a", Op.EQ, 1),)),
                             Filter((Predicate("b", Op.EQ, 2), Predicate("c", Op.NE, 3)))))
    assert parse("(a = 1 or b = 2) and c = 3").terms == (
        Filter((Predicate("a", Op.EQ, 1), Predicate("c", Op.EQ, 3))),
        Filter((Predicate("b", Op.EQ, 2), Predicate("c", Op.EQ, 3))))


def test_in_and_not_in():
    assert parse('s in ("x", "y")') == Disjunction((Filter((Predicate("s", Op.EQ, "x"),)),
                                                     Filter((Predicate("s", Op.EQ, "y"),))))
    assert parse("n NOT IN (1, 2)") == Filter((Predicate("n", Op.NE, 1), Predicate("n", Op.NE, 2)))
    assert parse("n in (1)") == Filter((Predicate("n", Op.EQ, 1),))
    assert parse("n in (1, 1)") == Filter((Predicate("n", Op.EQ, 1),))  # a repeated term is one


def test_negation_reaches_the_predicates():
    assert str(parse('not (High between 1 and 2 or Symbol prefix "ab")')) == \
        '(High < 1 and Symbol < "ab") or (High < 1 and Symbol >= "ac") or ' \
        '(High > 2 and Symbol < "ab") or (High > 2 and Symbol >= "ac")'
    assert parse("not not a = 1") == parse("a = 1")


def test_a_missing_attribute_satisfies_neither_a_predicate_nor_its_negation():
    assert not parse("not Price > 5").matches({"Symbol": "x"})
    assert parse("not Price > 5 or Symbol = 'x'").matches({"Symbol": "x"})


def test_terms_no_event_of_the_schema_can_satisfy_are_dropped():
    kept = parse("(a = 1 or a = 2) and a != 1").validate(SCHEMA)
    assert kept == Filter((Predicate("a", Op.EQ, 2), Predicate("a", Op.NE, 1)))
    assert parse("b > 9 or s = 'x'").validate(SCHEMA) == Filter((Predicate("s", Op.EQ, "x"),))
    try:
        parse("b > 9 or a > 5").validate(SCHEMA)
        raise AssertionError("accepted a filter no event can match")
    except SchemaError as e:
        assert "no term of the filter can match" in str(e) and "'b'" in str(e)


def test_term_ids_are_the_subscription_first_and_map_back():
    ids = term_ids("agent-0/quotes", 3)
    assert ids == ["agent-0/quotes", "agent-0/quotes//1", "agent-0/quotes//2"]
    assert {subscription_of(i) for i in ids} == {"agent-0/quotes"}
    for sid in ("agent-0/~7", "agent-0/#1", "agent-0/3"):  # ephemeral, odd and numeric names
        assert [subscription_of(i) for i in term_ids(sid, 2)] == [sid, sid]


# 20 examples in the default suite; the `slow` twin below draws 60 (make test-slow).
@settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(trees(typed=True), min_size=1, max_size=6), st.lists(st.sampled_from(["split", "replicate", "lose"]),
                                                                        max_size=8),
       st.lists(typed_events(), min_size=1, max_size=8))
def test_zones_of_the_content_space_route_every_term(tree_list, changes, batch):
    """Meghdoot's zones over the schema's space, split and recovered, each term stored at its
    own point with its mirror: the union over the zones an event visits, mapped back to
    subscriptions, equals the oracle."""
    tier = Tier(Space.of(SCHEMA))
    wanted = {}
    for k, tree in enumerate(tree_list):
        try:
            f = _parse(tree).validate(SCHEMA)
        except SchemaError:
            continue
        sid = f"agent-{k % 2}/sub{k}"
        wanted[sid] = tree
        for entry, term in zip(term_ids(sid, len(f.terms)), f.terms):
            tier.add(Entry(entry, f"agent-{k % 2}", term))
    for i, how in enumerate(changes):
        zone = max(tier.map.zones, key=lambda z: len(tier.map.subscriptions(z.id))).id
        try:
            tier.lose_and_recover(zone) if how == "lose" else tier.change(how, zone)
        except ValueError:  # a zone too small to split
            continue
    for e in batch:
        assert {subscription_of(i) for i in tier.match(e)} == {s for s, t in wanted.items() if truth(t, e) is True}


@pytest.mark.slow
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(trees(typed=True), min_size=1, max_size=6), st.lists(st.sampled_from(["split", "replicate", "lose"]),
                                                                        max_size=8),
       st.lists(typed_events(), min_size=1, max_size=8))
def test_zones_of_the_content_space_route_every_term_thoroughly(tree_list, changes, batch):
    test_zones_of_the_content_space_route_every_term.hypothesis.inner_test(tree_list, changes, batch)


def test_a_term_that_implies_another_is_dropped():
    assert parse("a = 1 or (a = 1 and b = 2)") == parse("a = 1")
    assert parse("(a = 1 or b = 2) and (a = 1 or c = 3)").terms == (  # a=1, a=1 and c=3, b=2 and a=1, b=2 and c=3
        Filter((Predicate("a", Op.EQ, 1),)), Filter((Predicate("b", Op.EQ, 2), Predicate("c", Op.EQ, 3))))
