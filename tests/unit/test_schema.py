import math

import pytest

from echelon.core.schema import Attribute, AttrType, Schema, SchemaError, parse_attribute


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
