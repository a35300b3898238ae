"""The caps on what one filter may cost (contract/filters.py FilterLimits): each refused before
the work it bounds, with a short message."""

import pytest

from echelon.contract import filter_text
from echelon.contract.filters import (DEFAULT_LIMITS, Filter, FilterLimits, FilterSyntaxError, FilterTooLarge, Op,
                                  Predicate, parse)
from echelon.contract.schema import Attribute, AttrType, Schema, SchemaError
from echelon.contract.wire import filter_from_request, filter_to_pb
from echelon.v1 import common_pb2 as pb

SHORT = 300  # characters: an error message quotes an excerpt, never the input


def _refused(text: str, limits: FilterLimits = DEFAULT_LIMITS) -> str:
    with pytest.raises((FilterTooLarge, FilterSyntaxError)) as err:
        parse(text, limits)
    assert len(str(err.value)) < SHORT, str(err.value)[:SHORT]
    return str(err.value)


def _no_tokens(monkeypatch):
    def refuse(text):
        raise AssertionError("tokenized a text past the byte cap")
    monkeypatch.setattr(filter_text, "_tokens", refuse)


def test_bytes_are_checked_before_the_text_is_read(monkeypatch):
    _no_tokens(monkeypatch)
    big = "High >= 1 and " * 130_000  # 1.8 MB, the attack's size
    assert "at most 16384" in _refused(big)
    assert "at most 16384" in _refused('Symbol != "' + "x" * (8 << 20) + '"')  # an 8 MiB operand
    assert "bytes" in _refused("é" * 9000)  # 18,000 UTF-8 bytes in 9,000 characters
    assert "at most 100" in _refused("a = 1 and b = 2 and c = 3 and d = 4 and e = 5 and " * 3,
                                     FilterLimits(max_bytes=100))


def test_predicates_are_counted_as_they_are_read():
    text = " and ".join(f"a{i} = {i}" for i in range(300))
    message = _refused(text)
    assert "more than 256 predicates" in message
    assert f"position {text.index('a256')}" in message  # stopped at the first one past the cap
    assert "more than 3" in _refused("a in (1, 2, 3, 4)", FilterLimits(max_predicates=3))  # each value counts
    parse(" and ".join(f"a{i} = {i}" for i in range(256)))


def test_nesting_is_bounded():
    assert "nesting deeper than 16" in _refused("(" * 17 + "a = 1" + ")" * 17)
    assert "nesting deeper than 16" in _refused("not " * 17 + "a = 1")
    assert "nesting deeper than 16" in _refused("(" * 5000 + "a = 1")  # no recursion past the cap
    parse("(" * 16 + "a = 1" + ")" * 16)
    parse("not " * 16 + "a = 1")


def test_the_normal_form_is_measured_before_it_is_built(monkeypatch):
    def refuse(node, positive):
        raise AssertionError("built the terms of a filter past the cap")
    monkeypatch.setattr(filter_text, "_terms", refuse)
    seven = " and ".join(f"(a{i} = 1 or b{i} = 2)" for i in range(7))  # 2**7 = 128 terms
    assert "more than 64 terms" in _refused(seven)
    negated = "not (" + " or ".join(f"(a{i} = 1 and b{i} = 2)" for i in range(7)) + ")"  # De Morgan: 128 too
    assert "more than 64 terms" in _refused(negated)
    between = "not (" + " and ".join(f"x{i} between 1 and 2" for i in range(7)) + ")"  # 7 terms of 1...
    monkeypatch.undo()
    assert len(parse(between).terms) == 14  # ...each `between` negated into two
    wide = " and ".join(f"c{i} = 1" for i in range(40)) + " and (a = 1 or b = 1) and (c = 1 or d = 1)"
    assert "more than 100 predicates" in _refused(wide, FilterLimits(max_expanded=100))  # 4 terms of 42


@pytest.mark.parametrize("text, reason", [
    ('Symbol = "aapl" or', "expected an attribute name"),
    ("a in ()", "expected a number or a quoted string"),
    ("a in (1 2)", "expected `,` or `)` in the list"),
    ("(a = 1", "expected `)`"),
    ("(a = 1 b = 2)", "expected `and`, `or` or `)`"),
    ("a = 1 xor b = 2", "expected `and`, `or` or the end"),
    ("a = " + "9" * 5000, "number too long"),
])
def test_syntax_errors_quote_a_short_excerpt(text, reason):
    padded = "x" * 10_000 + " = 1 and " + text  # the error lies deep in a long text
    message = _refused(padded, FilterLimits(max_bytes=64 * 1024))
    assert reason in message and "\u2038" in message


def test_error_excerpt_shows_the_caret_where_the_text_is_wrong():
    with pytest.raises(FilterSyntaxError) as err:
        parse("High >= 4 High < 5")
    assert str(err.value) == "expected `and`, `or` or the end at position 10: High >= 4 \u2038High < 5"


SCHEMA = Schema((Attribute("Symbol", AttrType.STRING, max_length=8), Attribute("High", AttrType.FLOAT, 0, 500)))


def test_string_operands_are_bounded_by_the_schema_or_the_schemaless_default():
    with pytest.raises(SchemaError) as err:
        parse('High > 1 or Symbol != "' + "x" * 9000 + '"').validate(SCHEMA)
    assert "at most 8 bytes" in str(err.value) and len(str(err.value)) < SHORT
    with pytest.raises(SchemaError, match="at most 1024 bytes"):
        parse('x < "' + "y" * 1025 + '"').validate(Schema())
    with pytest.raises(SchemaError, match="at most 10 bytes"):
        parse('x < "' + "y" * 11 + '"').validate(Schema(), FilterLimits(max_string_bytes=10))
    parse('x < "' + "y" * 1024 + '"').validate(Schema())


def test_long_attribute_names_are_cut_in_messages():
    with pytest.raises(SchemaError) as err:
        parse("A" * 10_000 + " = 1").validate(SCHEMA)
    assert "unknown attribute" in str(err.value) and len(str(err.value)) < SHORT


def test_the_structured_form_is_bounded_before_it_is_converted(monkeypatch):
    import echelon.contract.wire as wire

    def refuse(f):
        raise AssertionError("converted a structured filter past a cap")
    monkeypatch.setattr(wire, "filter_from_pb", refuse)
    many = pb.Filter()
    for i in range(300):
        many.predicates.add(attribute="a", op=pb.OPERATOR_EQ, value=pb.Value(int_value=i))
    with pytest.raises(FilterTooLarge, match="300 predicates: at most 256"):
        filter_from_request(many, "")
    huge = filter_to_pb(Filter((Predicate("s", Op.NE, "x" * (8 << 20)),)))
    with pytest.raises(FilterTooLarge, match="bytes: at most 16384"):
        filter_from_request(huge, "")
    terms = pb.Filter(any_of=[pb.Filter(predicates=[pb.Predicate(attribute="a", op=pb.OPERATOR_EQ,
                                                                 value=pb.Value(int_value=i))]) for i in range(65)])
    monkeypatch.undo()
    with pytest.raises(FilterTooLarge, match="65 terms in normal form: at most 64"):
        filter_from_request(terms, "")


def test_nested_any_of_is_refused():
    from echelon.contract.errors import InvalidArgument

    inner = pb.Filter(any_of=[pb.Filter(), pb.Filter()])
    with pytest.raises(InvalidArgument, match="a term is a conjunction"):
        filter_from_request(pb.Filter(any_of=[inner, pb.Filter()]), "")


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="max_terms"):
        FilterLimits(max_terms=0)
