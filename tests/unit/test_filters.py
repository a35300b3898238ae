"""The filter language: parsing, errors with positions, evaluation, and round trips."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from echelon.contract.filters import Filter, FilterSyntaxError, Op, Predicate, parse
from echelon.contract.schema import Attribute, AttrType, Schema, SchemaError
from echelon.contract.wire import filter_from_pb, filter_to_pb


def test_paper_example_parses():
    f = parse('{Symbol = "aapl" and High >= 45}')
    assert f.predicates == (Predicate("Symbol", Op.EQ, "aapl"), Predicate("High", Op.GE, 45))
    assert f.matches({"Symbol": "aapl", "High": 45.0, "Low": 1})
    assert not f.matches({"Symbol": "aapl", "High": 44.9})
    assert not f.matches({"Symbol": "aapl"})  # a missing attribute fails its predicates


@pytest.mark.parametrize("text, preds", [
    ("", ()),
    ("{}", ()),
    ("x between -1 and 2.5", (Predicate("x", Op.BETWEEN, -1, 2.5),)),
    ("s prefix 'a\\'b' AND n != 3e2", (Predicate("s", Op.PREFIX, "a'b"), Predicate("n", Op.NE, 300.0))),
    ("a == 1 and b<2 and c<=3 and d>4 and e>=5", tuple(
        Predicate(n, op, v) for n, op, v in [("a", Op.EQ, 1), ("b", Op.LT, 2), ("c", Op.LE, 3), ("d", Op.GT, 4),
                                             ("e", Op.GE, 5)])),
])
def test_valid_texts(text, preds):
    assert parse(text).predicates == preds


@pytest.mark.parametrize("text, position, reason", [
    ("High >=", 7, "expected a number or a quoted string"),
    ("High >= 4 High < 5", 10, "expected `and`"),
    ("= 3", 0, "expected an attribute name"),
    ("a ~ 3", 2, "unexpected character"),
    ("a between 1 2", 12, "expected `and` in between"),
    ("a prefix 3", 9, "prefix needs a quoted string"),
    ("{a = 1", 6, "expected `}`"),
    ('a = "open', 4, "unexpected character"),
    ("a = 1 }", 6, "unexpected input"),
    ("a is 3", 2, "expected an operator"),
])
def test_errors_name_the_position(text, position, reason):
    with pytest.raises(FilterSyntaxError) as err:
        parse(text)
    assert err.value.position == position and err.value.reason.startswith(reason)
    assert f"position {position}" in str(err.value)


SCHEMA = Schema((Attribute("High", AttrType.FLOAT, 0, 500), Attribute("Symbol", AttrType.STRING),
                 Attribute("Volume", AttrType.INT, 0, 100)))


@pytest.mark.parametrize("text, attribute, reason", [
    ("Price > 1", "Price", "unknown attribute"),
    ('High = "x"', "High", "expected float"),
    ("Volume = 1.5", "Volume", "expected int"),
    ('Volume prefix "1"', "Volume", "expected int"),
    ("High > 500", "High", "no value in [0, 500]"),
    ("High < 0", "High", "no value in [0, 500]"),
    ("High between 3 and 1", "High", "empty range"),
    ("Symbol prefix 'x' and Volume between 200 and 300", "Volume", "no value in [0, 100]"),
])
def test_validation_names_the_predicate(text, attribute, reason):
    with pytest.raises(SchemaError) as err:
        parse(text).validate(SCHEMA)
    assert err.value.attribute == attribute and reason in str(err.value)


values = st.one_of(st.integers(-10**12, 10**12), st.floats(allow_nan=False, allow_infinity=False, width=64),
                   st.text(max_size=8))
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True).filter(
    lambda s: s.lower() not in ("and", "between", "prefix", "or", "not", "in"))


@st.composite
def predicates(draw):
    name, op = draw(names), draw(st.sampled_from(list(Op)))
    if op is Op.PREFIX:
        return Predicate(name, op, draw(st.text(max_size=6)))
    if op is Op.BETWEEN:
        lo, hi = sorted([draw(st.integers(-1000, 1000)), draw(st.integers(-1000, 1000))])
        return Predicate(name, op, lo, hi)
    return Predicate(name, op, draw(values))


@given(st.lists(predicates(), max_size=5))
def test_text_and_proto_forms_round_trip(preds):
    f = Filter(tuple(dict.fromkeys(preds)))  # the text form drops a predicate repeated in a term
    assert parse(str(f)) == f
    assert filter_from_pb(filter_to_pb(f)) == f


@given(st.lists(predicates(), max_size=4), st.dictionaries(names, values, max_size=6))
def test_matches_is_the_conjunction_of_predicates(preds, event):
    f = Filter(tuple(preds))
    assert f.matches(event) == all(p.holds(event.get(p.attribute)) for p in preds)


@pytest.mark.parametrize("text", [
    "High > 10 and High < 5",
    "High >= 5 and High < 5",
    "High = 3 and High != 3",
    "High between 1 and 9 and High > 9",
    "Volume > 1 and Volume < 2",  # no int strictly between 1 and 2
    "Volume >= 1 and Volume <= 2 and Volume != 1 and Volume != 2",
    'Symbol prefix "ab" and Symbol prefix "ac"',
    'Symbol = "b" and Symbol prefix "a"',
    'Symbol > "b" and Symbol <= "a"',
])
def test_predicates_without_a_common_value_are_refused_naming_the_attribute(text):
    with pytest.raises(SchemaError) as err:
        parse(text).validate(SCHEMA)
    name = text.split()[0]
    assert err.value.attribute == name and "have no value in common" in str(err.value)


@pytest.mark.parametrize("text", [
    "High >= 5 and High <= 5", "High > 1 and High < 2", "Volume >= 1 and Volume <= 3 and Volume != 2",
    'Symbol prefix "ab" and Symbol prefix "abc"', 'Symbol prefix "a" and Symbol = "abc"', 'Symbol > "a" and Symbol < "b"',
])
def test_predicates_with_a_common_value_are_kept(text):
    parse(text).validate(SCHEMA)


def test_schemaless_predicates_of_two_kinds_on_one_attribute_are_refused():
    with pytest.raises(SchemaError, match="'x'"):
        parse('x = 1 and x = "a"').validate(Schema())
    parse("x > 1 and x < 2").validate(Schema())  # 1.5 fits: nothing says x is an int


def test_string_operands_longer_than_the_attribute_allows_are_refused():
    """Every operator, and in every term: a string operand is bounded by max_length."""
    schema = Schema((Attribute("s", AttrType.STRING, max_length=4), Attribute("n", AttrType.INT)))
    for text in ('s = "abcde"', 's prefix "abcde"', 's != "abcde"', 's < "abcdefgh"', 's between "a" and "abcde"',
                 's in ("a", "abcde")', 'n = 1 or s >= "abcde"', 'not s = "abcde"'):
        with pytest.raises(SchemaError, match="at most 4 bytes"):
            parse(text).validate(schema)
    parse('s = "abcd" and s < "abce"').validate(schema)


INTS = Attribute("n", AttrType.INT, 0, 20)
FLOATS = Attribute("n", AttrType.FLOAT, 0, 20)
NUM_OPS = [Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.BETWEEN]


@st.composite
def number_predicates(draw, values):
    op = draw(st.sampled_from(NUM_OPS))
    if op is Op.BETWEEN:
        lo, hi = sorted([draw(values), draw(values)])
        return Predicate("n", op, lo, hi)
    return Predicate("n", op, draw(values))


@given(st.lists(number_predicates(st.integers(-2, 22)), min_size=2, max_size=4))
def test_int_intersection_equals_brute_force(preds):
    """Refused exactly when no int of the domain satisfies every predicate."""
    f = Filter(tuple(preds))
    expected = any(f.matches({"n": v}) for v in range(0, 21))
    assert _accepted(f, Schema((INTS,))) == expected


@given(st.lists(number_predicates(st.sampled_from([-1.0, 0.0, 2.5, 3.0, 7.0, 20.0, 21.5])), min_size=2, max_size=4))
def test_float_intersection_equals_brute_force(preds):
    """The oracle tries every bound and a point between each two: exact for ranges."""
    f = Filter(tuple(preds))
    points = sorted({0.0, 20.0, *(p.value for p in preds), *(p.upper for p in preds if p.upper is not None)})
    candidates = [*points, *((a + b) / 2 for a, b in zip(points, points[1:]))]
    expected = any(f.matches({"n": v}) for v in candidates if 0 <= v <= 20)
    assert _accepted(f, Schema((FLOATS,))) == expected


def _accepted(f: Filter, schema: Schema) -> bool:
    try:
        f.validate(schema)
        return True
    except SchemaError:
        return False
