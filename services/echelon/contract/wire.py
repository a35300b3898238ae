"""Conversions between the protobuf contract and the plain data of `echelon.core`.

Everything that arrives from outside passes through here, so every malformed message
raises InvalidArgument naming the field, before any state changes.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from echelon.contract.filters import (DEFAULT_LIMITS, Disjunction, Expression, Filter, FilterLimits, FilterTooLarge, Op,
                                  Predicate, check_size, parse, short)
from echelon.contract.schema import Attribute, AttrType, Schema, SchemaError, Value
from echelon.contract.errors import InvalidArgument
from echelon.v1 import common_pb2 as pb

_OPS = {
    pb.OPERATOR_EQ: Op.EQ, pb.OPERATOR_NE: Op.NE, pb.OPERATOR_LT: Op.LT, pb.OPERATOR_LE: Op.LE,
    pb.OPERATOR_GT: Op.GT, pb.OPERATOR_GE: Op.GE, pb.OPERATOR_BETWEEN: Op.BETWEEN, pb.OPERATOR_PREFIX: Op.PREFIX,
}
_OPS_BACK = {v: k for k, v in _OPS.items()}
_TYPES = {pb.ATTRIBUTE_TYPE_INT: AttrType.INT, pb.ATTRIBUTE_TYPE_FLOAT: AttrType.FLOAT,
          pb.ATTRIBUTE_TYPE_STRING: AttrType.STRING}
_TYPES_BACK = {v: k for k, v in _TYPES.items()}


def value_from_pb(v: pb.Value, where: str, name: str = "") -> Value:
    """The value of `v`; InvalidArgument names `where` (with `name` quoted after it: the
    message is built only on error, this runs once per attribute of every event)."""
    kind = v.WhichOneof("kind")
    if kind is None:
        raise InvalidArgument(f"{where}{name and f' {name!r}'}: value not set")
    x = getattr(v, kind)
    if kind == "float_value" and x != x:  # NaN
        raise InvalidArgument(f"{where}{name and f' {name!r}'}: NaN is not a value")
    return x


def value_to_pb(x: Value) -> pb.Value:
    if isinstance(x, bool) or not isinstance(x, (int, float, str)):
        raise InvalidArgument(f"unsupported value {x!r}: use int, float or str")
    if isinstance(x, str):
        return pb.Value(string_value=x)
    if isinstance(x, int):
        return pb.Value(int_value=x)
    return pb.Value(float_value=x)


def attributes_from_pb(attrs: Mapping[str, pb.Value]) -> dict[str, Value]:
    # By key, not `.items()`: upb's map goes through the generic ItemsView, far slower on a
    # freshly parsed message. The value
    # read inline (once per attribute of every event); value_from_pb only to refuse one.
    out = {}
    for name in attrs:
        v = attrs[name]
        kind = v.WhichOneof("kind")
        x = getattr(v, kind) if kind is not None else None
        if x is None or x != x:  # unset, or NaN
            value_from_pb(v, "attribute", name)
        out[name] = x
    return out


def attributes_read(events: Iterable[pb.Event], fields: Mapping[str, str]) -> list[dict[str, Value]]:
    """Per event, only its attributes named in `fields` (those it has), checked as
    attributes_from_pb checks them: a matcher reads what its zones and index use, not every
    attribute into a dict (which was much of the matching matcher's CPU).
    `fields`: name -> the Value field its values are expected in (value_field), read
    first; only a value not there (zero, empty, another kind, unset, NaN) is read by kind."""
    out = []
    for e in events:
        attrs = e.attributes
        got = {}
        for name, field in fields.items():
            if name in attrs:
                v = attrs[name]
                x = getattr(v, field)
                if not x or x != x:
                    kind = v.WhichOneof("kind")
                    x = getattr(v, kind) if kind is not None else None
                    if x is None or x != x:  # unset, or NaN
                        value_from_pb(v, "attribute", name)
                got[name] = x
        out.append(got)
    return out


def value_field(attr: Attribute | None) -> str:
    """The Value field an attribute's values are in (a guess for one no schema names)."""
    return _FIELDS[attr.type] if attr is not None else "string_value"


_FIELDS = {AttrType.INT: "int_value", AttrType.FLOAT: "float_value", AttrType.STRING: "string_value"}


def attributes_to_pb(attrs: Mapping[str, Value]) -> dict[str, pb.Value]:
    return {name: value_to_pb(v) for name, v in attrs.items()}


def attributes_into_pb(attrs: Mapping[str, Value], out) -> None:
    """Set `attrs` into a message's (empty) attributes map in place: cheaper than
    building a Value each and copying the map into the message (once per event)."""
    for name, x in attrs.items():
        t = type(x)
        if t is str:
            out[name].string_value = x
        elif t is float:
            out[name].float_value = x
        elif t is int:
            out[name].int_value = x
        else:  # a subclass, or refused (InvalidArgument) as value_to_pb says
            v = value_to_pb(x)
            out[name].CopyFrom(v)


def filter_from_pb(f: pb.Filter) -> Expression:
    """A filter in its structured form: `predicates`, and when `any_of` is set, every term
    of it joined with them (the normal form, as contract/filters.py)."""
    common = _predicates_from_pb(f.predicates, "predicate")
    if not f.any_of:
        return Filter(common)
    terms = []
    for k, t in enumerate(f.any_of):
        if t.any_of:
            raise InvalidArgument(f"any_of[{k}]: a term is a conjunction (its own any_of must be empty)")
        terms.append(Filter(tuple(dict.fromkeys(common + _predicates_from_pb(t.predicates, f"any_of[{k}] predicate")))))
    terms = list(dict.fromkeys(terms))
    return terms[0] if len(terms) == 1 else Disjunction(tuple(terms))


def _predicates_from_pb(predicates, what: str) -> tuple[Predicate, ...]:
    preds = []
    for i, p in enumerate(predicates):
        where = f"{what} {i} ({short(p.attribute) or '?'})"
        if p.op not in _OPS:
            raise InvalidArgument(f"{where}: operator not set")
        upper = value_from_pb(p.upper, where) if p.HasField("upper") else None
        preds.append(Predicate(p.attribute, _OPS[p.op], value_from_pb(p.value, where), upper))
    return tuple(preds)


def filter_to_pb(f: Expression) -> pb.Filter:
    out = pb.Filter()
    if isinstance(f, Disjunction):
        for t in f.terms:
            out.any_of.append(filter_to_pb(t))
        return out
    for p in f.predicates:
        q = out.predicates.add(attribute=p.attribute, op=_OPS_BACK[p.op], value=value_to_pb(p.value))
        if p.upper is not None:
            q.upper.CopyFrom(value_to_pb(p.upper))
    return out


def filter_from_request(f: pb.Filter, text: str, limits: FilterLimits = DEFAULT_LIMITS) -> Expression:
    """A subscription's filter from either form (both at once is ambiguous), each bounded
    by `limits` before it is read (FilterTooLarge, FilterSyntaxError: INVALID_ARGUMENT)."""
    written = bool(text) and not text.isspace()
    if written and (f.predicates or f.any_of):
        raise InvalidArgument("give the filter in one form: `filter` or `filter_text`, not both")
    if written:
        return parse(text, limits)
    size = f.ByteSize()
    if size > limits.max_bytes:
        raise FilterTooLarge(f"a filter of {size} bytes: at most {limits.max_bytes}")
    written = len(f.predicates) + sum(len(t.predicates) for t in f.any_of)
    if written > limits.max_predicates:
        raise FilterTooLarge(f"a filter of {written} predicates: at most {limits.max_predicates}")
    flt = filter_from_pb(f)
    check_size(flt, limits)
    return flt


def schema_from_pb(s: pb.Schema) -> Schema:
    attrs = []
    for a in s.attributes:
        if a.type not in _TYPES:
            raise InvalidArgument(f"attribute {a.name!r}: type not set")
        attrs.append(Attribute(a.name, _TYPES[a.type], a.min if a.HasField("min") else None,
                               a.max if a.HasField("max") else None, a.max_length or None))
    try:
        return Schema(tuple(attrs), s.max_attribute_bytes or None)
    except SchemaError as e:
        raise InvalidArgument(str(e)) from None


def schema_to_pb(s: Schema) -> pb.Schema:
    out = pb.Schema(max_attribute_bytes=s.max_attribute_bytes or 0)
    for a in s.attributes:
        spec = out.attributes.add(name=a.name, type=_TYPES_BACK[a.type], max_length=a.max_length or 0)
        if a.min is not None:
            spec.min = a.min
        if a.max is not None:
            spec.max = a.max
    return out


def varint(n: int) -> bytes:
    """`n` (>= 0) as a protobuf varint: from a table below _SHORT (message lengths on the
    hot path: a lookup instead of the loop)."""
    if n < _SHORT:
        return _VARINTS[n]
    head = bytearray()
    while n > 0x7F:
        head.append(n & 0x7F | 0x80)
        n >>= 7
    head.append(n)
    return bytes(head)


_SHORT = 4096
_VARINTS = [bytes((n,)) if n < 0x80 else bytes((n & 0x7F | 0x80, n >> 7)) for n in range(_SHORT)]


def varints(ns: list[int]) -> Iterable[bytes]:
    """`varint` of each of `ns` (lengths of a batch's parts): looked up in C, no Python
    call per number, when all are below the table's end."""
    return map(_VARINTS.__getitem__, ns) if not ns or max(ns) < _SHORT else map(varint, ns)


def length_delimited(tag: int, data: bytes) -> bytes:
    """A serialized length-delimited field (`tag` = field number << 3 | 2, below 128): appended
    to a serialized message, it parses as that field set (protobuf concatenation), so a
    message can be sent or extended without building it again."""
    return _VARINTS[tag] + varint(len(data)) + data


def event_digest(content: pb.Event, payload: bytes) -> int:
    """A digest of what a publish carries (not its id or time): tells a retry of an event
    from a different event under the same id (core/dedup.py). `content` is the Event
    before its id, time and payload are set (topic, attributes, ordering key); its
    deterministic serialisation orders the map by key, and the value's oneof keeps 1 and
    1.0 apart. Python's hash of the bytes (SipHash, 64 bits, keyed per process): the
    digest never leaves this agent's window, and cheaper than blake2b."""
    return hash((content.SerializeToString(deterministic=True), payload))
