"""CDM's keys: a predicate's range and an event's value as integers on one dimension's
"virtual nodes" (CBDLO section 4; docs/papers.md, "CBDLO: CDM and CRAWL"). The counting index
(cdm.py) is built
and matched on these keys only.

Per dimension (an attribute and a value kind, number or string) the distinct predicate
constants c_0 < ... < c_{m-1} cut the value line into virtual nodes: the constants
themselves and the open gaps between them. A value is keyed exactly (not approximately)
by where it falls: 2r when it equals c_r, 2r - 1 when it lies between c_{r-1} and c_r.
Every predicate becomes an inclusive key range, exactly:

    =v [2r, 2r]   <=v [-1, 2r]   <v [-1, 2r-1]   >=v [2r, top]   >v [2r+1, top]
    between a and b [2r_a, 2r_b]   prefix p [2r_p, 2r_succ(p) - 1] (p <= s < succ(p))
    !=v  any present value except key 2r (NaN included, as in Python)

An absent attribute, a value of the other kind or a bool gets a key no predicate accepts
(ABSENT); a numeric NaN gets one that only `!=` accepts. The keys are computed with numpy
(searchsorted) when constants and values are exact as float64; otherwise with Python's
own comparisons, so results equal `Filter.matches` exactly: no approximate step is left
for a second, exact pass to correct.
"""

from __future__ import annotations

from bisect import bisect_left
from operator import methodcaller
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from echelon.contract.filters import Filter, Op

ABSENT, NAN, BOTTOM, NO_EXCL = -4, -3, -1, -5
TOP = 2**62
_EXACT_INT = 2.0**53
KNOWN = 65536  # values whose keys a codec keeps (past it, forgotten and keyed again)

Dim = tuple[str, str]  # (attribute, "num" | "str")


class Row(NamedTuple):
    """One predicate in value space; bounds None are open, `ne` rows exclude `value`."""

    dim: Dim
    lo: object = None
    lo_strict: bool = False
    hi: object = None
    hi_strict: bool = False
    ne: bool = False
    value: object = None  # for `!=`: the excluded value (None for NaN: excludes nothing)


def successor(p: str) -> str | None:
    """The least string above every string starting with `p` (None: no such string)."""
    while p:
        c = ord(p[-1])
        if c < 0x10FFFF:
            return p[:-1] + chr(c + 1)
        p = p[:-1]
    return None


def rows_of(f: Filter) -> tuple[Row, ...] | None:
    """The predicates of `f` as rows; None when some predicate can never hold."""
    f.check_shape()  # malformed predicates (between with one bound, ...) are refused
    rows = []
    for p in f.predicates:
        v = p.value
        kind = "str" if isinstance(v, str) else "num"
        dim = (p.attribute, kind)
        if p.op is Op.NE:
            rows.append(Row(dim, ne=True, value=None if v != v else v))
            continue
        if v != v or (p.upper is not None and p.upper != p.upper):
            return None  # NaN satisfies no comparison
        if p.op is Op.EQ:
            rows.append(Row(dim, v, False, v, False))
        elif p.op in (Op.LT, Op.LE):
            rows.append(Row(dim, hi=v, hi_strict=p.op is Op.LT))
        elif p.op in (Op.GT, Op.GE):
            rows.append(Row(dim, lo=v, lo_strict=p.op is Op.GT))
        elif p.op is Op.BETWEEN:
            rows.append(Row(dim, v, False, p.upper, False))
        else:  # PREFIX (validate() ensured a string)
            rows.append(Row(dim, v, False, successor(v), True))  # type: ignore[arg-type]
    return tuple(rows)


def _float_exact(c: object) -> bool:
    try:
        return float(c) == c  # type: ignore[arg-type]
    except OverflowError:
        return False


class Column:
    """One dimension's values for a batch of events, extracted once and shared by runs."""

    def __init__(self, events: Sequence[Mapping[str, object]], dim: Dim):
        attr, self.kind = dim
        self.raw = list(map(methodcaller("get", attr), events))  # in C: no Python step per event
        self.floats: np.ndarray | None = None
        self.absent: np.ndarray | None = None
        types = set(map(type, self.raw))
        self.has_bool = bool in types  # True == 1 would merge them in a dict
        if self.kind == "str":
            return
        if types <= {int, float, type(None)}:
            try:
                self.floats = np.array(self.raw, dtype=np.float64)  # None becomes NaN
            except OverflowError:
                return
            if int in types and np.any(np.abs(self.floats) >= _EXACT_INT):
                self.floats = None  # an int that float64 cannot hold exactly
            elif type(None) in types:
                self.absent = np.fromiter((v is None for v in self.raw), bool, len(self.raw))


class Codec:
    """The virtual nodes of one dimension: its sorted constants and the exact keying."""

    def __init__(self, kind: str, constants: set):
        self.kind = kind
        self.sorted = sorted(constants)
        self.rank = {c: i for i, c in enumerate(self.sorted)}
        self.top = 2 * len(self.sorted) - 1
        self.array = None
        self._known: dict = {}  # value -> key, for values keyed in Python (`encode`)
        if kind == "num" and all(_float_exact(c) for c in self.sorted):
            self.array = np.array(self.sorted, dtype=np.float64)

    def key(self, c: object) -> int:
        return 2 * self.rank[c]

    def encode(self, col: Column) -> np.ndarray:
        if self.array is not None and col.floats is not None:
            f, c, m = col.floats, self.array, len(self.array)
            i = np.searchsorted(c, f, "left")
            eq = (c[np.minimum(i, m - 1)] == f) & (i < m) if m else np.zeros(len(f), bool)
            keys = 2 * i - 1 + eq
            keys[np.isnan(f)] = NAN
            if col.absent is not None:
                keys[col.absent] = ABSENT
            return keys
        if not col.has_bool:
            # Each value keyed once with Python's exact comparisons, and kept: a run's
            # constants never change, and a topic's strings repeat (looked up in C).
            known = self._known
            try:
                keys = list(map(known.get, col.raw))
            except TypeError:  # an unhashable value
                keys = None
            if keys is not None:
                if None in keys:
                    if len(known) > KNOWN:
                        known.clear()
                    for n, k in enumerate(keys):
                        if k is None:
                            v = col.raw[n]
                            k = keys[n] = known[v] = self._key_of(v)
                return np.fromiter(keys, np.int64, len(keys))
        return np.fromiter((self._key_of(v) for v in col.raw), np.int64, len(col.raw))

    def fits(self, v: object) -> bool:
        """Is `v` of this dimension's kind? (A bool is neither kind.)"""
        if self.kind == "str":
            return isinstance(v, str)
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def key_one(self, v: object) -> int:
        """One value's key, as `encode` gives it, without numpy (cdm_runs.Run.match_small):
        Python's exact comparisons, through the same kept keys."""
        if type(v) is bool:  # neither kind; and True == 1 would find 1's key
            return ABSENT
        known = self._known
        try:
            k = known.get(v)
        except TypeError:  # an unhashable value
            return self._key_of(v)
        if k is None:
            if len(known) > KNOWN:
                known.clear()
            k = known[v] = self._key_of(v)
        return k

    def _key_of(self, v: object) -> int:
        if not self.fits(v):
            return ABSENT
        if v != v:
            return NAN
        i = bisect_left(self.sorted, v)
        return 2 * i if i < len(self.sorted) and self.sorted[i] == v else 2 * i - 1
