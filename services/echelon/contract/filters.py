"""Subscription filters: predicates over an event's attributes, in data and in text.

The text form (docs/filters.md has the grammar and examples): predicates as in the
papers, `Symbol = "aapl" and High >= 45`, joined by `and`, `or` and `not` with
parentheses, optionally in braces. Operators: = != < <= > >=, `between A and B`
(inclusive), `prefix "ab"`, `in (A, B, ...)` and `not in (...)`. Keywords are
case-insensitive; strings use double or single quotes with backslash escapes; numbers
without a dot or exponent are ints. The empty filter matches every event of its topic.

Normal form. A `Filter` is a conjunction of predicates: what the papers index (a
Meghdoot point, a CDM entry). Anything with `or` or `not` is compiled into a
`Disjunction` of such conjunctive terms (`not` pushed down to the predicates by De
Morgan, `and` distributed over `or`), so the matcher tier keeps indexing conjunctions
only: the agent registers each term as an entry of its own (`term_ids`) and answers
come back per agent, while the agent's local check evaluates the whole disjunction
once per subscription, so an event that satisfies several terms is still delivered
once (docs/filters.md, "The normal form, and where `or` meets the index").

A missing attribute. An event that lacks an attribute fails every predicate on it:
Meghdoot maps a missing attribute to the whole domain [L, H], which only an
unconstrained subscription covers. With `not` this is SQL's three-valued logic: a
predicate on a missing attribute (or on a value of the other kind) is unknown, and so
is its negation, so `not (Price > 5)` does not match an event without `Price`. That is
what makes the negation of a predicate a predicate (`not Price > 5` is `Price <= 5`).

Caps. Every request is bounded before the work is done, by a `FilterLimits` (defaults
in `DEFAULT_LIMITS`; the agent may be given an operator's): the text's UTF-8 bytes, or
the structured form's encoded size (`max_bytes`), the predicates as written
(`max_predicates`, each value of an `in` list counting), the nesting of parentheses
and `not` (`max_depth`), and the normal form's terms and predicates (`max_terms`,
`max_expanded`), counted before a term is built. `validate` bounds every string
operand by its attribute's `max_length` (schemaless topics by `max_string_bytes`).
Parsing is linear in the text, so a filter of `max_bytes` costs milliseconds, and an
error quotes at most a short excerpt of the input around the caret.

API for a caller that holds operator settings:

    limits = FilterLimits(max_bytes=8192, max_predicates=64)
    flt = parse(text, limits)            # FilterSyntaxError, FilterTooLarge
    flt = contract.wire.filter_from_request(pb_filter, text, limits)
    flt = flt.validate(schema, limits)   # SchemaError; the terms that can match

In the agent every kind of subscription (ephemeral, named, durable) is checked with
`agent.registry.Registry.filter_limits`: the one place to put an operator's settings.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Mapping, Union

from echelon.contract.schema import (DEFAULT_MAX_LENGTH, Attribute, AttrType, Schema, SchemaError, Value, fmt_number,
                                 type_fits, type_name, utf8_length)


class Op(enum.Enum):
    EQ = "="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    BETWEEN = "between"
    PREFIX = "prefix"


@dataclass(frozen=True)
class FilterLimits:
    """What one filter may cost; the defaults are `DEFAULT_LIMITS` (docs/filters.md, "Caps")."""

    max_bytes: int = 16 * 1024  # the text in UTF-8, or the structured form encoded
    max_predicates: int = 256  # predicates as written (each value of an `in` list counts)
    max_depth: int = 16  # parentheses and `not` inside one another
    max_terms: int = 64  # conjunctive terms of the normal form (index entries per subscription)
    max_expanded: int = 512  # predicates over all terms of the normal form
    max_string_bytes: int = DEFAULT_MAX_LENGTH  # a string operand on a schemaless topic

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_predicates", "max_depth", "max_terms", "max_expanded", "max_string_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"FilterLimits.{name} must be at least 1")


DEFAULT_LIMITS = FilterLimits()
EXCERPT = 24  # characters quoted on each side of an error's position


def excerpt(text: str, position: int, width: int = EXCERPT) -> str:
    """`text` around `position` with the caret (U+2038) there: at most `width` characters
    each side, so an error never echoes a large input back."""
    lo, hi = max(0, position - width), min(len(text), position + width)
    return ("\u2026" if lo else "") + text[lo:position] + "\u2038" + text[position:hi] + \
        ("\u2026" if hi < len(text) else "")


def short(s: str, width: int = 2 * EXCERPT) -> str:
    """`s`, cut to `width` characters for an error message."""
    return s if len(s) <= width else s[:width] + "\u2026"


class FilterSyntaxError(ValueError):
    """The text form does not parse; `position` is the 0-based offset of the problem."""

    def __init__(self, message: str, text: str, position: int):
        super().__init__(f"{message} at position {position}: {excerpt(text, position)}")
        self.reason = message
        self.position = position


class FilterTooLarge(ValueError):
    """Past a cap of `FilterLimits`: refused before the work it would cost (INVALID_ARGUMENT)."""


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

    def negated(self) -> tuple["Predicate", ...]:
        """The predicates whose disjunction is `not self` for every value of this
        predicate's kind (a missing value or one of the other kind satisfies neither)."""
        a, v = self.attribute, self.value
        flip = {Op.EQ: Op.NE, Op.NE: Op.EQ, Op.LT: Op.GE, Op.GE: Op.LT, Op.LE: Op.GT, Op.GT: Op.LE}
        if self.op in flip:
            return (Predicate(a, flip[self.op], v),)
        if self.op is Op.BETWEEN:
            return Predicate(a, Op.LT, v), Predicate(a, Op.GT, self.upper)  # type: ignore[arg-type]
        end = _prefix_end(v) if isinstance(v, str) else None  # PREFIX: p <= x < end
        return (Predicate(a, Op.LT, v),) if end is None else (Predicate(a, Op.LT, v), Predicate(a, Op.GE, end))

    def __str__(self) -> str:
        if self.op is Op.BETWEEN:
            return f"{self.attribute} between {_lit(self.value)} and {_lit(self.upper)}"  # type: ignore[arg-type]
        return f"{self.attribute} {self.op.value} {_lit(self.value)}"

    def brief(self) -> str:
        """`str(self)` with long names and strings cut, for an error message."""
        cut = {"value": _cut(self.value), "upper": _cut(self.upper)}
        return str(Predicate(short(self.attribute), self.op, cut["value"], cut["upper"]))  # type: ignore[arg-type]


def _cut(v: Value | None) -> Value | None:
    return short(v) if isinstance(v, str) else v


def _string_operands(p: Predicate) -> list[str]:
    return [v for v in (p.value, p.upper) if isinstance(v, str)]


@dataclass(frozen=True)
class Filter:
    """A conjunction of predicates: one term of the normal form, one index entry."""

    predicates: tuple[Predicate, ...] = ()

    @property
    def terms(self) -> tuple["Filter", ...]:
        """The conjunctive terms whose disjunction this is (itself), as `Disjunction.terms`."""
        return (self,)

    def matches(self, attributes: Mapping[str, object]) -> bool:
        return all(p.holds(attributes.get(p.attribute)) for p in self.predicates)

    def __str__(self) -> str:
        return " and ".join(map(str, self.predicates))

    def validate(self, schema: Schema, limits: FilterLimits = DEFAULT_LIMITS) -> "Filter":
        """Raise SchemaError naming the attribute whose predicates cannot fit `schema`;
        else return the filter.

        Unknown attribute, a value of the wrong type or outside the domain, `prefix` on
        a number, a string operand longer than the attribute's `max_length`, an empty
        range (`between 5 and 3`, or `< min`), and predicates on one attribute with no
        value in common (`High > 10 and High < 5`) are rejected, so a subscription that
        can never match is refused instead of silently kept.
        """
        self.check(schema, limits)
        empty = self.why_empty(schema)
        if empty is not None:
            raise empty
        return self

    def check(self, schema: Schema, limits: FilterLimits = DEFAULT_LIMITS) -> None:
        """Raise SchemaError for a predicate that does not fit `schema` at all (malformed,
        unknown attribute, wrong type, a string operand past its bound): a mistake."""
        if len(self.predicates) > limits.max_expanded:
            raise FilterTooLarge(f"a term of {len(self.predicates)} predicates: at most {limits.max_expanded}")
        self.check_shape()
        for p in self.predicates:
            attr = None
            if not schema.empty:
                try:
                    attr = schema.get(p.attribute)
                except SchemaError as e:
                    raise SchemaError(short(p.attribute), f"predicate `{p.brief()}`: {e.reason}") from None
                for v in (p.value, p.upper):
                    if v is not None and not type_fits(attr.type, v):
                        raise SchemaError(p.attribute, f"predicate `{p.brief()}`: expected {attr.type.value}, "
                                                       f"got {type_name(v)}")
                if p.op is Op.PREFIX and attr.type is not AttrType.STRING:
                    raise SchemaError(p.attribute, f"predicate `{p.brief()}`: prefix needs a string attribute")
            bound = limits.max_string_bytes if attr is None else attr.length_limit
            for s in _string_operands(p):
                n = utf8_length(s)
                if n > bound:
                    whose = "a schemaless topic's string operands" if attr is None else "the attribute's values"
                    raise SchemaError(short(p.attribute), f"predicate `{p.brief()}`: a string operand of {n} "
                                                          f"bytes, where {whose} have at most {bound} bytes")

    def why_empty(self, schema: Schema) -> SchemaError | None:
        """Why no event of `schema` can satisfy this (well-formed, `check`ed) conjunction,
        or None when some event can."""
        for p in self.predicates:
            if schema.empty:
                continue
            attr = schema.get(p.attribute)
            if attr.type is AttrType.STRING:
                continue  # a string operand past max_length is refused by `check`
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
                return SchemaError(p.attribute, f"predicate `{p.brief()}`: no value in [{fmt_number(lo)}, "
                                                f"{fmt_number(hi)}] satisfies it")
        by_attribute: dict[str, list[Predicate]] = {}
        for p in self.predicates:
            by_attribute.setdefault(p.attribute, []).append(p)
        for name, preds in by_attribute.items():
            if len(preds) > 1 and not _satisfiable(preds, None if schema.empty else schema.get(name)):
                together = " and ".join(p.brief() for p in preds[:4]) + (" and \u2026" if len(preds) > 4 else "")
                return SchemaError(short(name), f"predicates `{together}` have no value in common")
        return None

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
                raise SchemaError(short(p.attribute), f"predicate on {short(p.attribute)!r}: between needs two "
                                                      "bounds of one kind")
            if p.value > p.upper:  # type: ignore[operator]
                raise SchemaError(short(p.attribute), f"predicate `{p.brief()}`: empty range")
        elif p.upper is not None:
            raise SchemaError(short(p.attribute), f"predicate `{p.brief()}`: only between takes an upper bound")
        if p.op is Op.PREFIX and not isinstance(p.value, str):
            raise SchemaError(short(p.attribute), f"predicate `{p.brief()}`: prefix needs a string")


@dataclass(frozen=True)
class Disjunction:
    """Conjunctive terms, at least two: an event matches when it satisfies one (the normal
    form of a filter with `or` or `not`; see the module doc)."""

    terms: tuple[Filter, ...]

    def matches(self, attributes: Mapping[str, object]) -> bool:
        return any(t.matches(attributes) for t in self.terms)

    def __str__(self) -> str:
        return " or ".join(str(t) if len(t.predicates) == 1 else f"({t})" for t in self.terms)

    def validate(self, schema: Schema, limits: FilterLimits = DEFAULT_LIMITS) -> "Expression":
        """Raise SchemaError for a mistake in any term (as `Filter.check`), or when no term
        can match (the first term's reason); else the terms that can match (a term
        that cannot is dropped: `(a or b) and not a` leaves `a and not a` behind)."""
        check_size(self, limits)
        for t in self.terms:
            t.check(schema, limits)
        reasons = [t.why_empty(schema) for t in self.terms]
        kept = tuple(t for t, r in zip(self.terms, reasons) if r is None)
        if not kept:
            first = reasons[0]
            raise SchemaError(first.attribute, f"no term of the filter can match; the first: {first.reason}")
        return kept[0] if len(kept) == 1 else Disjunction(kept)


Expression = Union[Filter, Disjunction]


def check_size(f: Expression, limits: FilterLimits = DEFAULT_LIMITS) -> None:
    """FilterTooLarge when the normal form is past the term or predicate caps."""
    n = sum(len(t.predicates) for t in f.terms)
    if len(f.terms) > limits.max_terms:
        raise FilterTooLarge(f"the filter is {len(f.terms)} terms in normal form: at most {limits.max_terms}")
    if n > limits.max_expanded:
        raise FilterTooLarge(f"the filter is {n} predicates in normal form: at most {limits.max_expanded}")


def overlaps(a: Expression, b: Expression, schema: Schema) -> bool:
    """Can one event of `schema` satisfy both `a` and `b` (well-formed, `check`ed)? An
    advertisement matches a subscription when they overlap (OctopiA section I). Attributes
    are independent, so two conjunctions overlap when each attribute's predicates together
    have a value in its domain. Never a false negative; the one false positive is a
    float or string interval with no representable value inside (adjacent floats, strings
    past `max_length`): a copy the exact match downstream then drops."""
    for s in a.terms:
        for t in b.terms:
            by_attribute: dict[str, list[Predicate]] = {}
            for p in s.predicates + t.predicates:
                by_attribute.setdefault(p.attribute, []).append(p)
            if all(_satisfiable(preds, None if schema.empty else schema.get(name))
                   for name, preds in by_attribute.items()):
                return True
    return False


def term_ids(sid: str, n: int) -> list[str]:
    """The matcher entries of subscription `sid` (`<agent>/<name>`) with `n` terms: the
    first is `sid` itself (a conjunction is registered as it always was), the others
    `sid//k`: a name never holds `/` and is never empty, so no subscription's id ends so."""
    return [sid] + [f"{sid}//{k}" for k in range(1, n)]


def subscription_of(entry_id: str) -> str:
    """The subscription a matcher entry (`term_ids`) belongs to."""
    head, sep, k = entry_id.rpartition("//")
    return head if sep and k.isdigit() else entry_id


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


def parse(text: str, limits: FilterLimits = DEFAULT_LIMITS) -> Expression:
    """Parse the text form into its normal form (filter_text.py): a Filter when it is one
    conjunction, else a Disjunction; FilterSyntaxError names the offending position,
    FilterTooLarge the cap passed."""
    from echelon.contract.filter_text import parse_text  # the grammar builds on this module's types

    return parse_text(text, limits)
