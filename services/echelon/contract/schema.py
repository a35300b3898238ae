"""Topic schemas: typed attributes with domains, and event validation.

Values are plain Python `int`, `float` and `str`. An `int` is accepted for a float
attribute (widening); nothing else converts. Numeric domains are inclusive
`[min, max]`; unset bounds mean the type's own range.

Sizes are bounded so one event cannot fill the matchers' indexes or a relay's window
with attributes: a string value has at most `max_length` UTF-8 bytes (per attribute,
default 1024, as Google Pub/Sub bounds attribute values), and all attributes of an
event together at most `max_attribute_bytes` (names and strings in UTF-8, 8 bytes per
number; default 64 KiB), schemaless topics included. Payloads are not attributes.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Mapping, Union

Value = Union[int, float, str]

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
DEFAULT_MAX_LENGTH = 1024
MAX_MAX_LENGTH = 65536
DEFAULT_MAX_ATTRIBUTE_BYTES = 65536
MAX_MAX_ATTRIBUTE_BYTES = 1 << 20
NUMBER_BYTES = 8


class AttrType(enum.Enum):
    INT = "int"
    FLOAT = "float"
    STRING = "string"


class SchemaError(ValueError):
    """An event or filter does not fit the schema; `attribute` names the culprit."""

    def __init__(self, attribute: str, reason: str):
        super().__init__(f"attribute {attribute!r}: {reason}" if attribute else reason)
        self.attribute = attribute
        self.reason = reason


@dataclass(frozen=True)
class Attribute:
    name: str
    type: AttrType
    min: float | None = None
    max: float | None = None
    max_length: int | None = None  # strings only; None: DEFAULT_MAX_LENGTH

    @property
    def length_limit(self) -> int:
        """The longest string value accepted, in UTF-8 bytes."""
        return self.max_length or DEFAULT_MAX_LENGTH

    @property
    def low(self) -> float:
        """Lower end of the domain (L_i in Meghdoot)."""
        if self.min is not None:
            return self.min
        return INT64_MIN if self.type is AttrType.INT else -math.inf

    @property
    def high(self) -> float:
        """Upper end of the domain (H_i in Meghdoot)."""
        if self.max is not None:
            return self.max
        return INT64_MAX if self.type is AttrType.INT else math.inf

    def check(self, value: object) -> None:
        """Raise SchemaError unless `value` has this attribute's type and lies in its domain."""
        if not type_fits(self.type, value):
            raise SchemaError(self.name, f"expected {self.type.value}, got {type_name(value)}")
        if self.type is AttrType.STRING:
            n = utf8_length(value)  # type: ignore[arg-type]
            if n > self.length_limit:
                raise SchemaError(self.name, f"string of {n} bytes is longer than the limit of {self.length_limit}")
        elif not self.low <= value <= self.high:  # type: ignore[operator]
            raise SchemaError(self.name, f"value {value!r} outside [{fmt_number(self.low)}, {fmt_number(self.high)}]")


@dataclass(frozen=True)
class Schema:
    attributes: tuple[Attribute, ...] = ()
    max_attribute_bytes: int | None = None  # None: DEFAULT_MAX_ATTRIBUTE_BYTES

    def __post_init__(self) -> None:
        if self.max_attribute_bytes is not None and not 1 <= self.max_attribute_bytes <= MAX_MAX_ATTRIBUTE_BYTES:
            raise SchemaError("", f"max_attribute_bytes {self.max_attribute_bytes}: 1 to {MAX_MAX_ATTRIBUTE_BYTES}")
        names = [a.name for a in self.attributes]
        for a in self.attributes:
            if not a.name.isidentifier():
                raise SchemaError(a.name, "names must be identifiers (letters, digits, _)")
            if names.count(a.name) > 1:
                raise SchemaError(a.name, "declared twice")
            if a.type is AttrType.STRING and (a.min is not None or a.max is not None):
                raise SchemaError(a.name, "min/max apply to numeric attributes only")
            if a.max_length is not None and a.type is not AttrType.STRING:
                raise SchemaError(a.name, "max_length applies to string attributes only")
            if a.max_length is not None and not 1 <= a.max_length <= MAX_MAX_LENGTH:
                raise SchemaError(a.name, f"max_length {a.max_length}: 1 to {MAX_MAX_LENGTH}")
            for bound in (a.min, a.max):
                if bound is not None and (math.isnan(bound) or (a.type is AttrType.INT and bound != int(bound))):
                    raise SchemaError(a.name, f"bound {bound!r} is not a valid {a.type.value}")
            if a.min is not None and a.max is not None and a.min > a.max:
                raise SchemaError(a.name, f"min {a.min} > max {a.max}")

    @property
    def empty(self) -> bool:
        """A schemaless topic: events are not validated (but for their size)."""
        return not self.attributes

    @property
    def attribute_bytes_limit(self) -> int:
        return self.max_attribute_bytes or DEFAULT_MAX_ATTRIBUTE_BYTES

    def get(self, name: str) -> Attribute:
        for a in self.attributes:
            if a.name == name:
                return a
        raise SchemaError(name, "unknown attribute")

    def validate_event(self, attributes: Mapping[str, object]) -> None:
        """Every attribute known, well typed and inside its domain (absent ones are allowed),
        and all of them within the size limit."""
        if self.empty or not self._fits(attributes):  # _fits: the common case, once per event
            self._check(attributes)

    def _check(self, attributes: Mapping[str, object]) -> None:
        """Raise SchemaError saying what is wrong with the event, if anything."""
        if self.empty:
            for name, value in attributes.items():
                if not isinstance(value, (int, float, str)) or isinstance(value, bool):
                    raise SchemaError(name, f"unsupported value type {type_name(value)}")
        else:
            for name, value in attributes.items():
                self.get(name).check(value)
        size = sum(utf8_length(n) + (utf8_length(v) if isinstance(v, str) else NUMBER_BYTES)
                   for n, v in attributes.items())
        if size > self.attribute_bytes_limit:
            raise SchemaError("", f"the event's attributes take {size} bytes, over the topic's limit of "
                                  f"{self.attribute_bytes_limit}")


    @cached_property
    def _bounds(self) -> dict[str, tuple[AttrType, float, float, int]]:
        return {a.name: (a.type, a.low, a.high, a.length_limit) for a in self.attributes}

    def _fits(self, attributes: Mapping[str, object]) -> bool:
        """`validate_event` would accept the event: one pass over precomputed bounds (the
        schema is cached per topic version), no exception and no message built."""
        bounds = self._bounds
        size = 0
        for name, value in attributes.items():
            b = bounds.get(name)
            if b is None:
                return False
            kind, low, high, limit = b
            t = type(value)
            if t is str:
                n = utf8_length(value)  # type: ignore[arg-type]
                if kind is not AttrType.STRING or n > limit:
                    return False
                size += n
            elif t is float or t is int:  # not bool; NaN fails the comparison
                if kind is AttrType.STRING or (t is float and kind is AttrType.INT) or not low <= value <= high:
                    return False
                size += NUMBER_BYTES
            else:
                return False
            size += utf8_length(name)
        return size <= self.attribute_bytes_limit


def type_fits(t: AttrType, value: object) -> bool:
    if isinstance(value, bool):
        return False
    if t is AttrType.INT:
        return isinstance(value, int)
    if t is AttrType.FLOAT:
        return isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value))
    return isinstance(value, str)


def utf8_length(s: str) -> int:
    """Bytes of `s` in UTF-8 (without encoding it when it is plain ASCII)."""
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


def type_name(value: object) -> str:
    return {int: "int", float: "float", str: "string"}.get(type(value), type(value).__name__)


def fmt_number(x: float) -> str:
    """A bound as a human writes it: 500, not 500.0."""
    return str(int(x)) if isinstance(x, int) or (math.isfinite(x) and x == int(x)) else str(x)


def parse_attribute(spec: str) -> Attribute:
    """`name:type[:min:max]` or `name:string:max_length`, e.g. `High:float:0:500`,
    `Symbol:string` or `Symbol:string:16` (the CLI's form)."""
    parts = spec.split(":")
    if len(parts) not in (2, 3, 4):
        raise SchemaError(parts[0] if parts else spec, f"expected name:type[:min:max], got {spec!r}")
    name, kind = parts[0], parts[1].lower()
    try:
        t = AttrType(kind)
    except ValueError:
        raise SchemaError(name, f"type {kind!r} is not one of int, float, string") from None
    if len(parts) == 3:
        if t is not AttrType.STRING or not parts[2].isdigit():
            raise SchemaError(name, f"expected name:string:max_length or name:type:min:max, got {spec!r}")
        return Attribute(name, t, max_length=int(parts[2]))
    lo = hi = None
    if len(parts) == 4:
        try:
            lo, hi = (float(x) if x else None for x in parts[2:])
        except ValueError:
            raise SchemaError(name, f"bounds {parts[2]!r}, {parts[3]!r} are not numbers") from None
    return Attribute(name, t, lo, hi)
