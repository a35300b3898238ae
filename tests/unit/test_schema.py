import math

import pytest

from echelon.contract.schema import Attribute, AttrType, Schema, SchemaError, parse_attribute


def test_parse_attribute_forms():
    assert parse_attribute("High:float:0:500") == Attribute("High", AttrType.FLOAT, 0.0, 500.0)
    assert parse_attribute("Symbol:string") == Attribute("Symbol", AttrType.STRING)
    assert parse_attribute("n:int::10") == Attribute("n", AttrType.INT, None, 10.0)
    for bad in ("High", "High:double", "High:float:a:b", "x:int:1"):
        with pytest.raises(SchemaError):
            parse_attribute(bad)


@pytest.mark.parametrize("attrs, reason", [
    ((Attribute("a", AttrType.INT), Attribute("a", AttrType.FLOAT)), "declared twice"),
    ((Attribute("1a", AttrType.INT),), "identifiers"),
    ((Attribute("s", AttrType.STRING, 0, 1),), "numeric attributes only"),
    ((Attribute("n", AttrType.INT, 0.5, 3),), "not a valid int"),
    ((Attribute("x", AttrType.FLOAT, 3, 1),), "min 3 > max 1"),
    ((Attribute("x", AttrType.FLOAT, math.nan, 1),), "not a valid float"),
])
def test_bad_schemas(attrs, reason):
    with pytest.raises(SchemaError, match=reason):
        Schema(attrs)


def test_event_validation():
    s = Schema((Attribute("n", AttrType.INT, 0, 10), Attribute("x", AttrType.FLOAT), Attribute("s", AttrType.STRING)))
    s.validate_event({"n": 10, "x": 3, "s": "ok"})  # int widens to float
    s.validate_event({})  # absent attributes are allowed
    for event, name in [({"n": 11}, "n"), ({"n": True}, "n"), ({"x": "1"}, "x"), ({"q": 1}, "q"),
                        ({"x": math.nan}, "x"), ({"n": 1.0}, "n")]:
        with pytest.raises(SchemaError) as err:
            s.validate_event(event)
        assert err.value.attribute == name
    assert Attribute("i", AttrType.INT).low == -(2**63) and Attribute("f", AttrType.FLOAT).high == math.inf


def test_string_length_limit_default_and_declared():
    s = Schema((Attribute("s", AttrType.STRING), Attribute("t", AttrType.STRING, max_length=3)))
    s.validate_event({"s": "x" * 1024, "t": "abc"})
    for event, name, n in [({"s": "x" * 1025}, "s", 1025), ({"t": "abcd"}, "t", 4), ({"t": "é" * 2}, "t", 4)]:
        with pytest.raises(SchemaError, match=f"string of {n} bytes is longer than the limit") as err:
            s.validate_event(event)
        assert err.value.attribute == name
    with pytest.raises(SchemaError, match="string attributes only"):
        Schema((Attribute("n", AttrType.INT, max_length=3),))
    with pytest.raises(SchemaError, match="max_length 0"):
        Schema((Attribute("s", AttrType.STRING, max_length=0),))
    assert parse_attribute("Symbol:string:16") == Attribute("Symbol", AttrType.STRING, max_length=16)


def test_total_attribute_size_is_bounded_on_schemaless_topics_too():
    small = Schema((Attribute("s", AttrType.STRING, max_length=100), Attribute("n", AttrType.INT)), 20)
    small.validate_event({"s": "x" * 10, "n": 1})  # names and strings in UTF-8, 8 bytes a number: 20
    with pytest.raises(SchemaError, match="take 21 bytes, over the topic's limit of 20"):
        small.validate_event({"s": "x" * 11, "n": 1})
    Schema().validate_event({"k": "x" * 65535})
    with pytest.raises(SchemaError, match="take 65537 bytes, over the topic's limit of 65536"):
        Schema().validate_event({"k": "x" * 65536})
    with pytest.raises(SchemaError, match="max_attribute_bytes 0"):
        Schema((), 0)


def test_fast_path_agrees_with_the_checks():
    """validate_event's one-pass acceptance (`_fits`) against the per-attribute checks
    (`_check`, the oracle) on random events, valid and not: same verdict every time."""
    import random

    s = Schema((Attribute("n", AttrType.INT, -5, 5), Attribute("x", AttrType.FLOAT, 0, 1),
                Attribute("s", AttrType.STRING, max_length=3), Attribute("u", AttrType.FLOAT)),
               max_attribute_bytes=24)
    values = [0, 5, 6, -5, -6, 2**70, 0.5, 1.0, 1.5, -0.0, math.nan, math.inf, True, None, b"x", "", "abc", "abcd",
              "\u00e9\u00e9", "\u00e9\u00e9\u00e9"]
    rnd = random.Random(7)
    for _ in range(3000):
        event = {rnd.choice("nxsuv"): rnd.choice(values) for _ in range(rnd.randint(0, 4))}
        try:
            s._check(event)
            ok = True
        except SchemaError:
            ok = False
        assert s._fits(event) is ok, event
