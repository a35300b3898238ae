"""What a matcher reads of an event: contract/wire.py `attributes_read` takes the
named attributes only, checked as `attributes_from_pb` checks them (the oracle);
core/cdm.py `CountingIndex.attributes` names what its live subscriptions use, through
inserts, replacements and deletes (oracle: the filters held); an event kept for the
routing job's sample has all its attributes, its good ones when one is unset or NaN."""

from __future__ import annotations

import random

import pytest

from echelon.core.cdm import CountingIndex, Entry
from echelon.contract.filters import parse
from echelon.matcher.server import _sampled
from echelon.contract.errors import InvalidArgument
from echelon.contract.wire import attributes_from_pb, attributes_read, attributes_to_pb
from echelon.v1 import common_pb2 as pb


def test_reads_the_named_attributes_as_attributes_from_pb():
    rnd = random.Random(5)
    values = [0, -7, 2**40, 1.5, -0.0, "", "s07", "é"]
    for _ in range(200):
        attrs = {n: rnd.choice(values) for n in rnd.sample("abcde", rnd.randint(0, 5))}
        # each name's expected field right or wrong: a value elsewhere is read by its kind
        fields = ["string_value", "int_value", "float_value"]
        names = {n: rnd.choice(fields) for n in rnd.sample("abcdef", rnd.randint(0, 6))}
        event = pb.Event(topic="t", attributes=attributes_to_pb(attrs))
        want = {n: x for n, x in attributes_from_pb(event.attributes).items() if n in names}
        got = attributes_read([event], names)[0]
        assert got == want and all(type(got[n]) is type(want[n]) for n in got)


def test_a_named_value_unset_or_nan_is_refused_an_unnamed_one_is_not_read():
    event = pb.Event(topic="t", attributes={"a": pb.Value(string_value="x"), "b": pb.Value(),
                                            "c": pb.Value(float_value=float("nan"))})
    assert attributes_read([event], {"a": "string_value"}) == [{"a": "x"}]
    with pytest.raises(InvalidArgument, match="'b': value not set"):
        attributes_read([event], {"a": "string_value", "b": "string_value"})
    for field in ("float_value", "string_value"):
        with pytest.raises(InvalidArgument, match="'c': NaN"):
            attributes_read([event], {"c": field})


def test_index_attributes_follow_its_live_subscriptions():
    rnd = random.Random(9)
    index = CountingIndex(base=2, growth=2)
    held: dict[str, str] = {}
    filters = ["x = 1", "y > 2 and x < 5", 'z prefix "a"', "", "x = 1 and x < 3", "w != 0"]
    for step in range(300):
        sid = f"s{rnd.randrange(12)}"
        if rnd.random() < 0.35:
            index.delete(sid)
            held.pop(sid, None)
        else:
            held[sid] = rnd.choice(filters)
            index.insert(Entry(sid, "a", parse(held[sid])))
        assert set(index.attributes()) == {p.attribute for f in held.values() for p in parse(f).predicates}


def test_an_event_kept_for_the_sample_has_all_its_attributes_or_its_good_ones():
    good = pb.Event(topic="t", attributes=attributes_to_pb({"a": "x", "b": 2, "c": 1.5}))
    assert _sampled(good) == {"a": "x", "b": 2, "c": 1.5}
    bad = pb.Event(topic="t", attributes={"a": pb.Value(string_value="x"), "b": pb.Value(),
                                          "c": pb.Value(float_value=float("nan")), "d": pb.Value(int_value=0)})
    assert _sampled(bad) == {"a": "x", "d": 0}
