"""A schema compiled into one function (runtime/schema_code.py) against the passes apart:
the request's map converted (wire.attributes_from_pb), checked (Schema.validate_event) and
set into an Event (wire.attributes_into_pb), over random attributes near every edge; and
the content it returns (the digest's) against the Event's bytes."""

import math
import random

import pytest

from echelon.contract.schema import Attribute, AttrType, Schema
from echelon.contract.errors import InvalidArgument
from echelon.runtime.schema_code import compile_schema
from echelon.contract.wire import attributes_from_pb, attributes_into_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import pubsub_pb2 as ppb

SCHEMAS = [
    Schema((Attribute("Symbol", AttrType.STRING, max_length=4), Attribute("Price", AttrType.FLOAT, 0.0, 500.0),
            Attribute("Volume", AttrType.INT, -5, 1000))),
    Schema((Attribute("é", AttrType.STRING), Attribute("n", AttrType.INT), Attribute("x", AttrType.FLOAT)),
           max_attribute_bytes=16),
]
NAMES = ["Symbol", "Price", "Volume", "é", "n", "x", "other"]
VALUES = [0, 1, -5, -6, 1000, 1001, 2**63 - 1, -(2**63), 0.0, -0.0, 1.0, -0.5, 499.5, 500.0, 500.5, math.inf, -math.inf,
          math.nan, "", "ab", "abcd", "abcde", "é", "éé", "ééé", "日本"]


NEGATIVE_ZERO, ZERO = pb.Value(float_value=-0.0).SerializeToString(), pb.Value(float_value=0.0).SerializeToString()


def _passes_apart(m, schema):
    """The Event's attributes' deterministic bytes, or None where the passes apart raise."""
    try:
        attrs = attributes_from_pb(m)
        schema.validate_event(attrs)
    except (InvalidArgument, ValueError):
        return None
    event = pb.Event()
    attributes_into_pb(attrs, event.attributes)
    return event.SerializeToString(deterministic=True)


def _value(x):
    if isinstance(x, str):
        return pb.Value(string_value=x)
    return pb.Value(int_value=x) if isinstance(x, int) else pb.Value(float_value=x)


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_the_compiled_schema_says_yes_exactly_where_the_passes_apart_accept(index):
    schema, rnd = SCHEMAS[index], random.Random(index)
    fill = compile_schema(schema)
    yes, contents = 0, {}
    for step in range(4000):
        attrs = {}
        for name in rnd.sample(NAMES, rnd.randrange(4)):
            attrs[name] = pb.Value() if rnd.random() < 0.03 else _value(rnd.choice(VALUES))  # unset sometimes
        m = ppb.PublishRequest.FromString(ppb.PublishRequest(attributes=attrs).SerializeToString()).attributes
        want = _passes_apart(m, schema)
        event = pb.Event()
        got = fill(m, event.attributes)
        assert (got is not None) == (want is not None), (step, attrs)
        if got is not None:
            yes += 1
            assert event.SerializeToString(deterministic=True) == want, (step, attrs)
            contents.setdefault(got, set()).add(want.replace(NEGATIVE_ZERO, ZERO))
    assert 200 < yes < 3800  # both answers were exercised
    # What it returns tells the events' contents apart as their bytes do (-0.0 is 0.0).
    assert all(len(c) == 1 for c in contents.values())
    assert len({c.pop() for c in contents.values()}) == len(contents)
