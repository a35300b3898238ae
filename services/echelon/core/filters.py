"""Subscription filters: conjunctions of attribute predicates, in data and in text.

Text form, as in the papers: `Symbol = "aapl" and High >= 45`, optionally in braces.
Operators: = != < <= > >= `between A and B` (inclusive) and `prefix "ab"`.
Keywords are case-insensitive; strings use double or single quotes with backslash
escapes; numbers without a dot or exponent are ints. The empty filter matches every
event of its topic.

An event that lacks an attribute fails every predicate on it: Meghdoot maps a missing
attribute to the whole domain [L, H], which only an unconstrained subscription covers.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from typing import Mapping

from echelon.core.schema import (Attribute, AttrType, Schema, SchemaError, Value, fmt_number, type_fits, type_name,
                                 utf8_length)


class Op(enum.Enum):
    EQ = "="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    BETWEEN = "between"
    PREFIX = "prefix"


class FilterSyntaxError(ValueError):
    """The text form does not parse; `position` is the 0-based offset of the problem."""

    def __init__(self, message: str, text: str, position: int):
        super().__init__(f"{message} at position {position}: {text[:position]}\u2038{text[position:]}")
        self.reason = message
        self.position = position


@dataclass(frozen=True)
class Predicate:
    attribute: str
    op: Op
    value: Value
    upper: Value | None = None  # BETWEEN only

    def holds(self, x: object) -> bool:
        """Does an event value satisfy this predicate? Values of another kind never do."""
        if x is None or isinstance(x, bool) or isinstance(x, str) != isinstance(self.value, str):
            return False
        v, op = self.value, self.op
        if op is Op.EQ:
            return x == v
        if op is Op.NE:
            return x != v
        if op is Op.LT:
            return x < v  # type: ignore[operator]
        if op is Op.LE:
            return x <= v  # type: ignore[operator]
        if op is Op.GT:
            return x > v  # type: ignore[operator]
        if op is Op.GE:
            return x >= v  # type: ignore[operator]
        if op is Op.BETWEEN:
            return v <= x <= self.upper  # type: ignore[operator]
        return isinstance(x, str) and x.startswith(v)  # type: ignore[arg-type]

    def __str__(self) -> str:
        if self.op is Op.BETWEEN:
            return f"{self.attribute} between {_lit(self.value)} and {_lit(self.upper)}"  # type: ignore[arg-type]
        return f"{self.attribute} {self.op.value} {_lit(self.value)}"


@dataclass(frozen=True)
class Filter:
    predicates: tuple[Predicate, ...] = ()

    def matches(self, attributes: Mapping[str, object]) -> bool:
        return all(p.holds(attributes.get(p.attribute)) for p in self.predicates)

    def __str__(self) -> str:
        return " and ".join(map(str, self.predicates))

    def validate(self, schema: Schema) -> None:
        """Raise SchemaError naming the attribute whose predicates cannot fit `schema`.

        Unknown attribute, a value of the wrong type or outside the domain, `prefix` on
        a number, a string longer than the attribute's `max_length` under `=` or
        `prefix`, an empty range (`between 5 and 3`, or `< min`), and predicates on one
        attribute with no value in common (`High > 10 and High < 5`) are rejected, so a
        subscription that can never match is refused instead of silently kept.
        """
        self.check_shape()
        for p in self.predicates:
            if schema.empty:
                continue
            try:
                attr = schema.get(p.attribute)
            except SchemaError as e:
                raise SchemaError(p.attribute, f"predicate `{p}`: {e.reason}") from None
            values = [p.value] if p.upper is None else [p.value, p.upper]
            for v in values:
                if not type_fits(attr.type, v):
                    raise SchemaError(p.attribute, f"predicate `{p}`: expected {attr.type.value}, got {type_name(v)}")
            if p.op is Op.PREFIX and attr.type is not AttrType.STRING:
                raise SchemaError(p.attribute, f"predicate `{p}`: prefix needs a string attribute")
            if attr.type is AttrType.STRING:
                if p.op in (Op.EQ, Op.PREFIX) and utf8_length(p.value) > attr.length_limit:  # type: ignore[arg-type]
                    raise SchemaError(p.attribute, f"predicate `{p}`: no string of at most {attr.length_limit} "
                                                   "bytes satisfies it")
                continue
            lo, hi = attr.low, attr.high
            empty = {
                Op.EQ: not lo <= p.value <= hi,
                Op.LT: p.value <= lo,
                Op.LE: p.value < lo,
                Op.GT: p.value >= hi,
                Op.GE: p.value > hi,
                Op.BETWEEN: p.upper is not None and (p.value > hi or p.upper < lo),
            }.get(p.op, False)
            if empty:
                raise SchemaError(p.attribute, f"predicate `{p}`: no value in [{fmt_number(lo)}, {fmt_number(hi)}] satisfies it")
        by_attribute: dict[str, list[Predicate]] = {}
        for p in self.predicates:
            by_attribute.setdefault(p.attribute, []).append(p)
        for name, preds in by_attribute.items():
            if len(preds) > 1 and not _satisfiable(preds, None if schema.empty else schema.get(name)):
                together = " and ".join(map(str, preds))
                raise SchemaError(name, f"predicates `{together}` have no value in common")

    def check_shape(self) -> None:
        """Raise SchemaError for a malformed predicate (between with one bound, prefix on a
        number...); a well-formed filter that can never match passes (CDM indexes it)."""
        for p in self.predicates:
            self._validate_shape(p)

    @staticmethod
    def _validate_shape(p: Predicate) -> None:
        if not p.attribute:
            raise SchemaError(p.attribute, "predicate without an attribute")
        if p.op is Op.BETWEEN:
            if p.upper is None or isinstance(p.upper, str) != isinstance(p.value, str):
                raise SchemaError(p.attribute, f"predicate on {p.attribute!r}: between needs two bounds of one kind")
            if p.value > p.upper:  # type: ignore[operator]
                raise SchemaError(p.attribute, f"predicate `{p}`: empty range")
        elif p.upper is not None:
            raise SchemaError(p.attribute, f"predicate `{p}`: only between takes an upper bound")
        if p.op is Op.PREFIX and not isinstance(p.value, str):
            raise SchemaError(p.attribute, f"predicate `{p}`: prefix needs a string")


@dataclass
class _Range:
    """The range one attribute may take: from `lo` to `hi` (None: unbounded), each end
    open or closed (the points `!=` removes are kept apart)."""

    lo: Value | None = None
    lo_open: bool = False
    hi: Value | None = None
    hi_open: bool = False

    def above(self, v: Value, open_: bool) -> None:
        if self.lo is None or v > self.lo or (v == self.lo and open_):  # type: ignore[operator]
            self.lo, self.lo_open = v, open_

    def below(self, v: Value, open_: bool) -> None:
        if self.hi is None or v < self.hi or (v == self.hi and open_):  # type: ignore[operator]
            self.hi, self.hi_open = v, open_


def _prefix_end(p: str) -> str | None:
    """The least string above every string that starts with `p` (None: there is none)."""
    while p and ord(p[-1]) == 0x10FFFF:
        p = p[:-1]
    return p[:-1] + chr(ord(p[-1]) + 1) if p else None


def _satisfiable(preds: list[Predicate], attr: Attribute | None) -> bool:
    """Do the predicates on one attribute (`attr` from the schema; None: schemaless) have a
    value in common? Each predicate is a range (`!=` a removed point, `prefix p` the
    range [p, p's successor)); their intersection with the domain must hold a value."""
    if len({isinstance(p.value, str) for p in preds}) > 1:
        return False  # no value is both a string and a number
    r = _Range()
    if attr is not None and attr.type is not AttrType.STRING:
        r.above(attr.low, False)
        r.below(attr.high, False)
    excluded = set()
    for p in preds:
        v = p.value
        if p.op is Op.EQ:
            r.above(v, False)
            r.below(v, False)
        elif p.op is Op.NE:
            excluded.add(v)
        elif p.op in (Op.LT, Op.LE):
            r.below(v, p.op is Op.LT)
        elif p.op in (Op.GT, Op.GE):
            r.above(v, p.op is Op.GT)
        elif p.op is Op.BETWEEN:
            r.above(v, False)
            r.below(p.upper, False)  # type: ignore[arg-type]
        else:  # PREFIX
            r.above(v, False)
            end = _prefix_end(v)  # type: ignore[arg-type]
            if end is not None:
                r.below(end, True)
    if r.lo is None or r.hi is None:
        return True
    if attr is not None and attr.type is AttrType.INT:
        lo = math.floor(r.lo) + 1 if r.lo_open else math.ceil(r.lo)  # type: ignore[arg-type]
        hi = math.ceil(r.hi) - 1 if r.hi_open else math.floor(r.hi)  # type: ignore[arg-type]
        return lo <= hi and (hi - lo + 1 > len(excluded) or any(x not in excluded for x in range(lo, hi + 1)))
    if r.lo > r.hi:  # type: ignore[operator]
        return False
    if r.lo == r.hi:
        return not (r.lo_open or r.hi_open) and r.lo not in excluded
    # Between two strings s and s + "\0" there is no third.
    return not (r.lo_open and r.hi_open and isinstance(r.lo, str) and r.hi == r.lo + "\0")


def _lit(v: Value) -> str:
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)


_TOKEN = re.compile(
    r"""\s*(?:
      (?P<num>-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
    | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<op><=|>=|!=|==|=|<|>)
    | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<punct>[{}])
    )""",
    re.VERBOSE,
)
_ESCAPE = re.compile(r"\\(.)")


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip() == "":
                break
            start = len(text) - len(text[pos:].lstrip())
            raise FilterSyntaxError("unexpected character", text, start)
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind), m.start(kind)))
        pos = m.end()
    return out


def parse(text: str) -> Filter:
    """Parse the text form into a Filter; FilterSyntaxError names the offending position."""
    toks = _tokens(text)
    i = 0

    def peek() -> tuple[str, str, int]:
        return toks[i] if i < len(toks) else ("end", "", len(text))

    def take(kind: str, what: str) -> str:
        nonlocal i
        k, v, pos = peek()
        if k != kind:
            raise FilterSyntaxError(f"expected {what}", text, pos)
        i += 1
        return v

    def literal() -> Value:
        nonlocal i
        k, v, pos = peek()
        i += 1
        if k == "num":
            return float(v) if any(c in v for c in ".eE") else int(v)
        if k == "str":
            return _ESCAPE.sub(r"\1", v[1:-1])
        raise FilterSyntaxError("expected a number or a quoted string", text, pos)

    braced = peek()[:2] == ("punct", "{")
    if braced:
        i += 1
    preds: list[Predicate] = []
    while peek()[0] not in ("end",) and peek()[:2] != ("punct", "}"):
        if preds:
            k, v, pos = peek()
            if not (k == "word" and v.lower() == "and"):
                raise FilterSyntaxError("expected `and`", text, pos)
            i += 1
        name = take("word", "an attribute name")
        k, v, pos = peek()
        if k == "op":
            i += 1
            preds.append(Predicate(name, Op("=" if v == "==" else v), literal()))
        elif k == "word" and v.lower() == "between":
            i += 1
            low = literal()
            k2, v2, pos2 = peek()
            if not (k2 == "word" and v2.lower() == "and"):
                raise FilterSyntaxError("expected `and` in between", text, pos2)
            i += 1
            preds.append(Predicate(name, Op.BETWEEN, low, literal()))
        elif k == "word" and v.lower() == "prefix":
            i += 1
            k2, _, pos2 = peek()
            if k2 != "str":
                raise FilterSyntaxError("prefix needs a quoted string", text, pos2)
            preds.append(Predicate(name, Op.PREFIX, literal()))
        else:
            raise FilterSyntaxError("expected an operator (= != < <= > >= between prefix)", text, pos)
    if braced:
        take("punct", "`}`")
    if i < len(toks):
        raise FilterSyntaxError("unexpected input", text, toks[i][2])
    return Filter(tuple(preds))
