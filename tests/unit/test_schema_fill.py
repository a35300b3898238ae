"""The compiled schema check (runtime/_fill.c) against its reference, the Python function
runtime/schema_code.py writes for the same schema: random schemas, random requests near every
edge (bounds, NaN, -0.0, ints for floats, lengths in UTF-8 bytes, the size limit, unknown
and unset attributes) and bad input. Both must give the same answer, leave the Event's map
with the same bytes (also where they say no: the map then partly filled), and raise the same
error. Altering either one (a bound's `<=`, a kind, the size) fails here."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys

import pytest

from echelon.contract.schema import MAX_MAX_ATTRIBUTE_BYTES, Attribute, AttrType, Schema
from echelon.runtime import schema_code
from echelon.runtime.schema_code import compile_schema, python_fill
from echelon.v1 import common_pb2 as pb
from echelon.v1 import pubsub_pb2 as ppb

try:
    from echelon.runtime._fill import Fill
except ImportError:  # no C compiler when this tree was installed: only the reference exists
    Fill = None

needs_compiled = pytest.mark.skipif(Fill is None or schema_code.PURE,
                                    reason="runtime/_fill.c not built (pip install -e . with a C compiler), "
                                           "or ECHELON_PURE set")

NAMES = ["Symbol", "Price", "Volume", "é", "n", "x", "日本", "a" * 40, "other"]
VALUES = [0, 1, -1, -5, -6, 7, 1000, 1001, 2**53 + 1, 2**63 - 1, -(2**63), 0.0, -0.0, 1.0, -0.5, 6.5, 499.5, 500.0,
          500.5, 1e300, -1e300, 5e-324, math.inf, -math.inf, math.nan, "", "a", "ab", "abcd", "abcde", "é", "éé",
          "ééé", "日本", "\U0001f600", "x" * 70]


def random_schema(rnd: random.Random) -> Schema:
    attributes = []
    for name in rnd.sample(NAMES[:-1], rnd.randrange(0, 5)):
        kind = rnd.choice(list(AttrType))
        if kind is AttrType.STRING:
            attributes.append(Attribute(name, kind, max_length=rnd.choice([None, 1, 2, 4, 5, 64])))
            continue
        bounds = [None, -5, 0, 7, 500, -0.5, 6.5, 500.0, -1e300, 1e300]
        if kind is AttrType.INT:
            bounds = [None, -5, 0, 7, 500, 1000, 2**63 - 1, -(2**63)]
        lo, hi = sorted([rnd.choice(bounds[1:]), rnd.choice(bounds[1:])])
        attributes.append(Attribute(name, kind, min=rnd.choice([None, lo]), max=rnd.choice([None, hi])))
    return Schema(tuple(attributes), max_attribute_bytes=rnd.choice([None, 8, 16, 24, 40, 200, MAX_MAX_ATTRIBUTE_BYTES]))


def random_request(rnd: random.Random, schema: Schema):
    """A request's attributes map as the agent gets it: parsed off the wire."""
    names = [a.name for a in schema.attributes] + NAMES
    attrs = {}
    for name in rnd.sample(names, rnd.randrange(0, min(6, len(set(names))))):
        x = rnd.choice(VALUES)
        if rnd.random() < 0.04:
            attrs[name] = pb.Value()  # no kind set
        elif isinstance(x, str):
            attrs[name] = pb.Value(string_value=x)
        elif isinstance(x, int) and -(2**63) <= x < 2**63:
            attrs[name] = pb.Value(int_value=x)
        else:
            attrs[name] = pb.Value(float_value=float(x))
    wire = ppb.PublishRequest(attributes=attrs).SerializeToString()
    return ppb.PublishRequest.FromString(wire).attributes


def outcome(fill, m):
    """What a fill says (its result, each value's type beside it: 1 and 1.0, 0.0 and -0.0
    are other answers), the Event's map after it, and what it raised."""
    event = pb.Event()
    try:
        got = fill(m, event.attributes)
    except Exception as e:  # noqa: BLE001 - compared, not handled
        return ("raised", type(e)), event.SerializeToString(deterministic=True)
    shown = None if got is None else tuple((type(v).__name__, repr(v)) for v in got)
    return shown, event.SerializeToString(deterministic=True)


@needs_compiled
@pytest.mark.parametrize("seed", range(8))
def test_compiled_and_python_fill_agree_on_random_schemas_and_requests(seed):
    rnd = random.Random(seed)
    answers = {"yes": 0, "no": 0}
    for _ in range(40):
        schema = random_schema(rnd)
        compiled, reference = compile_schema(schema), python_fill(schema)
        assert isinstance(compiled, Fill)
        for _ in range(120):
            m = random_request(rnd, schema)
            want, got = outcome(reference, m), outcome(compiled, m)
            assert got == want, (schema, dict(m))
            answers["no" if want[0] is None else "yes"] += 1
    assert answers["yes"] > 300 and answers["no"] > 300  # both answers were exercised


def _request(**attrs):
    return ppb.PublishRequest(attributes={k: v for k, v in attrs.items()}).attributes


EDGE_SCHEMA = Schema((Attribute("Symbol", AttrType.STRING, max_length=4), Attribute("Price", AttrType.FLOAT, 0.0, 500.0),
                      Attribute("Volume", AttrType.INT, -5, 1000)), max_attribute_bytes=36)
EDGES = [
    {},
    {"Symbol": pb.Value(string_value="abcd")},  # at the length limit
    {"Symbol": pb.Value(string_value="abcde")},  # one past it
    {"Symbol": pb.Value(string_value="éé")},  # 4 bytes, 2 characters
    {"Symbol": pb.Value(string_value="ééé")},  # 6 bytes, 3 characters
    {"Symbol": pb.Value(int_value=1)},  # the wrong kind
    {"Symbol": pb.Value()},  # no kind
    {"Price": pb.Value(float_value=500.0)},
    {"Price": pb.Value(float_value=500.0000001)},
    {"Price": pb.Value(float_value=-0.0)},
    {"Price": pb.Value(float_value=math.nan)},
    {"Price": pb.Value(float_value=math.inf)},
    {"Price": pb.Value(int_value=500)},  # an int taken by a float attribute as it is
    {"Price": pb.Value(int_value=501)},
    {"Price": pb.Value(string_value="1")},
    {"Volume": pb.Value(int_value=-5)},
    {"Volume": pb.Value(int_value=-6)},
    {"Volume": pb.Value(float_value=1.0)},  # an int attribute takes no float
    {"Volume": pb.Value(int_value=1), "other": pb.Value(int_value=1)},  # an unknown attribute
    # The size: each name's UTF-8 bytes, a string's bytes, 8 per number. 6 + 2 + 5 + 8 + 6 + 8 = 35:
    {"Volume": pb.Value(int_value=1000), "Price": pb.Value(float_value=1.5), "Symbol": pb.Value(string_value="ab")},
    # 6 + 3 + 5 + 8 + 6 + 8 = 36, at the limit; then 37, past it.
    {"Symbol": pb.Value(string_value="abc"), "Price": pb.Value(float_value=1.0), "Volume": pb.Value(int_value=2)},
    {"Symbol": pb.Value(string_value="abcd"), "Price": pb.Value(float_value=1.0), "Volume": pb.Value(int_value=2)},
]


@needs_compiled
@pytest.mark.parametrize("index", range(len(EDGES)))
def test_compiled_and_python_fill_agree_on_edges(index):
    m = _request(**EDGES[index])
    assert outcome(compile_schema(EDGE_SCHEMA), m) == outcome(python_fill(EDGE_SCHEMA), m)


def test_the_edges_say_what_the_schema_says():
    """The reference itself on the edges above (an oracle both are held to)."""
    fill = python_fill(EDGE_SCHEMA)
    said = [fill(_request(**e), pb.Event().attributes) is not None for e in EDGES]
    assert said == [True, True, False, True, False, False, False, True, False, True, False, False, True, False, False,
                    True, False, False, False, True, True, False]


BAD = [
    ("a dict of plain values", {"Price": 1.0}, "attributes"),  # no WhichOneof
    ("a dict of Values", {"Price": pb.Value(float_value=1.0)}, "attributes"),
    ("not a map", 5, "attributes"),
    ("an out that takes nothing", None, "out"),
    ("a dict for out", None, "dict"),
]


@needs_compiled
@pytest.mark.parametrize("case", BAD, ids=[b[0] for b in BAD])
def test_compiled_and_python_fill_raise_alike_on_bad_input(case):
    _, value, which = case
    results = []
    for fill in (compile_schema(EDGE_SCHEMA), python_fill(EDGE_SCHEMA)):
        m = value if which == "attributes" else _request(Price=pb.Value(float_value=1.0))
        out = {"out": object(), "dict": {}}.get(which, pb.Event().attributes)
        try:
            results.append(("returned", fill(m, out)))
        except Exception as e:  # noqa: BLE001
            results.append(("raised", type(e)))
    assert results[0] == results[1]


@needs_compiled
def test_the_compiled_type_refuses_malformed_constants():
    with pytest.raises(ValueError):
        Fill(("a",), (), (), (), (), (), 10)  # one entry per attribute
    with pytest.raises(ValueError):
        Fill(("a",), (7,), (0,), (1,), (0,), (9,), 10)
    with pytest.raises(TypeError):
        Fill((1,), (1,), (0,), (1,), (0,), (9,), 10)
    with pytest.raises(TypeError):
        Fill(("a",), (1,), (0,), (1,), (0,), (9,), 10)(pb.Event().attributes)  # one argument


def test_echelon_pure_forces_the_python_reference():
    code = "from echelon.runtime import schema_code as s, _fill; print(s.COMPILED); print(type(s.compile_schema(" \
           "__import__('echelon.contract.schema', fromlist=['x']).Schema((__import__('echelon.contract.schema', " \
           "fromlist=['x']).Attribute('a', __import__('echelon.contract.schema', fromlist=['x']).AttrType.INT),))))" \
           ".__name__)"
    env = {**os.environ, "ECHELON_PURE": "1"}
    out = subprocess.run([sys.executable, "-c", code.replace(", _fill", "")], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["pure", "Python", "(ECHELON_PURE)", "function"]
    if Fill is not None:
        assert schema_code.COMPILED == "compiled" or os.environ.get("ECHELON_PURE")
