"""The 2n-dimensional Meghdoot space of a schema (Gupta et al., sections 3.2-3.4).

Attribute A_i (0-based i) owns dimensions 2i and 2i+1 (the paper's 2i-1 and 2i): a
subscription's range [l_i, h_i] on A_i becomes the coordinates (l_i, h_i), so a
subscription is the point (l1, h1, ..., ln, hn) (section 3.3), and an event
{A_i = c_i} is the point (c1, c1, ..., cn, cn) with an unset attribute at (L_i, H_i)
(section 3.4). S is affected by e iff l_i <= c_i1 and c_i2 <= h_i for every i.

Coordinates are floats, produced by one monotone (order-preserving, not necessarily
injective) key per attribute, so every predicate keeps its meaning as a range and the
placement below only ever over-approximates; the exact `Filter.matches` decides.

- Strings: the first 6 bytes of the UTF-8 encoding, padded with zero bytes, read as a
  48-bit big-endian integer and divided by 2**48, giving a float in [0, 1) exactly (48
  bits fit the 53-bit mantissa). UTF-8 byte order equals code-point order, so the map is
  monotone; strings sharing their first 6 bytes (or differing only by trailing NULs) map
  to one value. The string domain is [0, 1]. `prefix p` is the range from p padded with
  0x00 to p padded with 0xFF (p itself once it has 6 bytes or more).
- Numbers: clamped into the attribute's domain [L, H] (comparisons on the exact Python
  values, so huge ints never overflow), then to float, then into [-1e300, 1e300]:
  unbounded float domains become [-1e300, 1e300], int64 domains stay finite as floats.
  Clamping and rounding are monotone, so out-of-domain or huge values merge with their
  neighbours and never leave their range.
- Every predicate is one continuous range; several predicates on one attribute
  intersect. `!=` cannot be one range, so it takes the whole domain; `<` and `>` use the
  same bound as `<=` and `>=`. A value of the wrong kind for the attribute, a bool or a
  NaN (in an event or a predicate) takes the whole domain too: it can only be decided
  by the exact check. Attributes unknown to the schema have no dimension.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from echelon.contract.filters import Filter, Op, Predicate
from echelon.contract.schema import Attribute, AttrType, Schema

STRING_BYTES = 6
FINITE = 1e300  # coordinates are clamped into [-FINITE, FINITE]
_SCALE = float(2 ** (8 * STRING_BYTES))

Point = tuple[float, ...]


def string_key(s: str) -> float:
    """Order-preserving map of a string into [0, 1) from its first 6 UTF-8 bytes."""
    b = s.encode("utf-8", "surrogatepass")[:STRING_BYTES]
    return int.from_bytes(b.ljust(STRING_BYTES, b"\0"), "big") / _SCALE


def prefix_range(p: str) -> tuple[float, float]:
    """The key range holding every string that starts with `p`."""
    b = p.encode("utf-8", "surrogatepass")[:STRING_BYTES]
    lo = int.from_bytes(b.ljust(STRING_BYTES, b"\0"), "big")
    hi = int.from_bytes(b.ljust(STRING_BYTES, b"\xff"), "big")
    return lo / _SCALE, hi / _SCALE


def _clamp(x: float) -> float:
    return min(max(x, -FINITE), FINITE)


def attribute_domain(attr: Attribute) -> tuple[float, float]:
    """(L_i, H_i) as finite floats."""
    if attr.type is AttrType.STRING:
        return 0.0, 1.0
    return _clamp(float(attr.low)), _clamp(float(attr.high))


def _kind_fits(attr: Attribute, value: object) -> bool:
    if isinstance(value, bool):
        return False
    if attr.type is AttrType.STRING:
        return isinstance(value, str)
    return isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value))


def value_key(attr: Attribute, value: object) -> float | None:
    """The monotone key of one value; None for a value of the wrong kind, a bool or NaN."""
    if not _kind_fits(attr, value):
        return None
    if attr.type is AttrType.STRING:
        return string_key(value)  # type: ignore[arg-type]
    lo, hi = attribute_domain(attr)
    if value <= attr.low:  # type: ignore[operator]
        return lo
    if value >= attr.high:  # type: ignore[operator]
        return hi
    return _clamp(float(value))  # type: ignore[arg-type]


def predicate_range(attr: Attribute, p: Predicate) -> tuple[float, float]:
    """One continuous key range containing every value that satisfies `p`."""
    lo, hi = attribute_domain(attr)
    if p.op is Op.NE or not _kind_fits(attr, p.value):
        return lo, hi
    if p.op is Op.PREFIX:
        return prefix_range(p.value) if isinstance(p.value, str) else (lo, hi)
    v = value_key(attr, p.value)
    assert v is not None
    if p.op is Op.EQ:
        return v, v
    if p.op in (Op.LT, Op.LE):
        return lo, v
    if p.op in (Op.GT, Op.GE):
        return v, hi
    u = value_key(attr, p.upper)  # BETWEEN
    return (v, u) if u is not None else (v, hi)


@dataclass(frozen=True)
class Space:
    """The 2n-dim box [L1, H1] x [L1, H1] x ... x [Ln, Hn] x [Ln, Hn] of a schema."""

    attributes: tuple[Attribute, ...]
    low: Point
    high: Point

    @classmethod
    def of(cls, schema: Schema) -> "Space":
        lows: list[float] = []
        highs: list[float] = []
        for a in schema.attributes:
            lo, hi = attribute_domain(a)
            lows += [lo, lo]
            highs += [hi, hi]
        return cls(schema.attributes, tuple(lows), tuple(highs))

    @property
    def dims(self) -> int:
        return len(self.low)

    def subscription_point(self, f: Filter) -> Point:
        """Section 3.3: (l1, h1, ..., ln, hn); an unconstrained attribute gives (L_i, H_i).

        Several predicates on one attribute intersect; an empty intersection gives a point
        with l_i > h_i, which no event affects (such a filter never matches).
        """
        point = list(zip(self.low[0::2], self.high[1::2]))
        index = {a.name: i for i, a in enumerate(self.attributes)}
        for p in f.predicates:
            i = index.get(p.attribute)
            if i is None:
                continue
            lo, hi = predicate_range(self.attributes[i], p)
            point[i] = (max(point[i][0], lo), min(point[i][1], hi))
        return tuple(x for pair in point for x in pair)

    def event_point(self, attrs: Mapping[str, object]) -> Point:
        """Section 3.4: (c1, c1, ..., cn, cn); an unset (or unusable) attribute gives (L_i, H_i)."""
        out: list[float] = []
        for i, a in enumerate(self.attributes):
            k = value_key(a, attrs[a.name]) if a.name in attrs else None
            out += [k, k] if k is not None else [self.low[2 * i], self.high[2 * i + 1]]
        return tuple(out)

    def affected_region(self, event_point: Sequence[float]) -> tuple[Point, Point]:
        """Section 3.4: the box from (L1, c11, ..., Ln, cn1) to (c12, H1, ..., cn2, Hn).

        It holds exactly the affected points when every attribute is set; for an unset
        one, (c_i1, c_i2) = (L_i, H_i) spans the attribute's whole plane, where only
        (L_i, H_i) is affected: zones found through it are a superset, as in the paper.
        """
        low = tuple(self.low[j] if j % 2 == 0 else event_point[j - 1] for j in range(self.dims))
        high = tuple(event_point[j + 1] if j % 2 == 0 else self.high[j] for j in range(self.dims))
        return low, high


def subscription_point(f: Filter, schema: Schema) -> Point:
    """Section 3.3: the subscription point of `f` in the space of `schema`."""
    return Space.of(schema).subscription_point(f)


def event_point(attrs: Mapping[str, object], schema: Schema) -> Point:
    """Section 3.4: the event point of `attrs` in the space of `schema`."""
    return Space.of(schema).event_point(attrs)


def affected_region(event_point: Sequence[float], space: Space) -> tuple[Point, Point]:
    """Section 3.4: (low corner, high corner) of the subscription points `event_point` affects."""
    return space.affected_region(event_point)


def is_affected(sub_point: Sequence[float], event_point: Sequence[float]) -> bool:
    """Section 3.4: l_i <= c_i1 and c_i2 <= h_i for every attribute i."""
    return all(
        sub_point[j] <= event_point[j] and event_point[j + 1] <= sub_point[j + 1] for j in range(0, len(sub_point), 2)
    )


def affected_mask(points: np.ndarray, event_point: Sequence[float]) -> np.ndarray:
    """`is_affected` for every row of a (k, 2n) array of subscription points at once."""
    ep = np.asarray(event_point, dtype=np.float64)
    return np.all(points[:, 0::2] <= ep[0::2], axis=1) & np.all(points[:, 1::2] >= ep[1::2], axis=1)


def reflect(point: Sequence[float]) -> Point:
    """Section 4.3: the mirror image (h1, l1, ..., hn, ln) in the diagonal hyperplane."""
    out: list[float] = []
    for j in range(0, len(point), 2):
        out += [point[j + 1], point[j]]
    return tuple(out)
