"""Compiled filters (core/filter_code.py) against `Filter.matches` (the brute-force
oracle) on random filters and attribute values of every kind, absent values, bools and
literals the compiler leaves to the predicate's own check; the same read in place from
protobuf attribute maps (`wire`)."""

import math
import random

from echelon.core.filter_code import compile_filters
from echelon.contract.filters import Filter, Op, Predicate, parse
from echelon.contract.wire import attributes_to_pb
from echelon.v1 import common_pb2 as pb

NAMES = ["Symbol", "Price", "Volume", "odd name \" '"]
VALUES = ["a", "ab", "b", "", 0, 1, -3, 2.5, 10.0, 1e300, math.inf, -math.inf, True, False, None]


def _predicate(rnd: random.Random) -> Predicate:
    op = rnd.choice(list(Op))
    value = rnd.choice(VALUES[:-1])  # bool literals too: left to Predicate.holds
    upper = None
    if op is Op.BETWEEN:
        upper = rnd.choice([v for v in VALUES[:-3] if isinstance(v, str) == isinstance(value, str)] or ["z"])
    return Predicate(rnd.choice(NAMES), op, value, upper)


def _attributes(rnd: random.Random) -> dict:
    return {n: rnd.choice(VALUES) for n in NAMES if rnd.random() < 0.8}


def _holds_or_error(flt: Filter, attrs: dict):
    try:
        return flt.matches(attrs)
    except TypeError:
        return TypeError


def test_compiled_filters_match_brute_force():
    rnd = random.Random(12)
    checked = matched = 0
    for _ in range(200):
        filters = [Filter(tuple(_predicate(rnd) for _ in range(rnd.randint(0, 3)))) for _ in range(rnd.randint(0, 12))]
        match = compile_filters(filters)
        batch = []
        for _ in range(50):
            attrs = {k: v for k, v in _attributes(rnd).items() if v is not None}
            if TypeError not in [_holds_or_error(f, attrs) for f in filters]:  # else the oracle has no answer
                batch.append(attrs)
        want = [[j for j, attrs in enumerate(batch) if f.matches(attrs)] for f in filters]
        assert match(batch) == want, (filters, batch)
        assert compile_filters(filters, wire=True)([_wire(attrs) for attrs in batch]) == want, (filters, batch)
        assert [match([attrs]) for attrs in batch[:5]] == [[[0] if j in w else [] for w in want] for j in range(5)]
        checked += len(batch) * len(filters)
        matched += sum(map(len, want))
    assert checked > 20000 and matched > 5000


def _wire(attrs: dict):
    """`attrs` as an event carries them (a protobuf map of Values), as received."""
    event = pb.Event(attributes={k: v for k, v in attributes_to_pb(
        {k: x for k, x in attrs.items() if not isinstance(x, bool)}).items()})
    return pb.Event.FromString(event.SerializeToString()).attributes


def test_wire_values_not_set_or_nan_satisfy_nothing():
    """A value read in place with no kind set, or NaN (refused at publish), is as absent."""
    filters = [parse("Price != 1"), parse("Price >= 0"), parse(""), parse('Symbol != "a"')]
    events = [pb.Event(attributes={"Price": pb.Value(), "Symbol": pb.Value(string_value="b")}),
              pb.Event(attributes={"Price": pb.Value(float_value=math.nan)}), pb.Event()]
    got = compile_filters(filters, wire=True)([pb.Event.FromString(e.SerializeToString()).attributes for e in events])
    assert got == [[], [], [0, 1, 2], [0]]


def test_parsed_filters():
    filters = [parse('Symbol = "a" and Price >= 2'), parse(""), parse('Symbol prefix "a"'),
               parse("Price between 1 and 3"), parse('Symbol != "a"')]
    match = compile_filters(filters)
    batch = [{"Symbol": "ab", "Price": 2}, {"Symbol": "a", "Price": 2.0}, {"Price": True}, {}]  # a bool is no number
    assert match(batch) == [[1], [0, 1, 2, 3], [0, 1], [0, 1], [0]]
    assert match([]) == [[]] * 5
    assert compile_filters([])([{"Symbol": "a"}]) == []
