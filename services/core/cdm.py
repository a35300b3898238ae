"""CDM: the counting index a matcher keeps for its zone (CBDLO section 4; ALGORITHMS.md 3).

Per dimension (an attribute and a value kind, number or string) the distinct predicate
constants c_0 < ... < c_{m-1} cut the value line into "virtual nodes": the constants
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

Counting (section 4): a subscription matches when the counter of its satisfied
predicates equals its number of predicates. Counting every predicate of every
subscription costs a touch per satisfied predicate (about half of all subscriptions per
stock event), so each subscription is listed under one access predicate, its narrowest
range in key space (an `=` beats a range): only subscriptions whose access predicate
holds get counters, and their other predicates are counted in one vectorised pass.
Each access dimension keeps the virtual nodes' covering lists as CSR arrays, factored
along a balanced tree (a segment tree): a subscription is listed at the O(log m) tree
nodes that cover its range, and a value's covering list is the union of the lists on
its leaf-to-root path. That keeps memory at O(k log m) where long ranges (`Low <= P2`)
would make plain per-interval lists O(k^2).

Inserts and deletes never rebuild the whole index (Bentley-Saxe's logarithmic method):
subscriptions live in levels of capacity 64 * 8^i, each level one immutable run (keys,
trees, CSR). An insert goes to level 0, rebuilt lazily at the next match; a level past
its capacity merges into the next, so a subscription is rebuilt O(log_8 k) times in
all. A delete sets a tombstone in its run; a level more than half tombstones is
compacted.

One module past 400 lines on purpose: the run layout (keys, trees, CSR) and the batch
matcher that walks it are one data structure; split, each would reach into the other.
"""

from __future__ import annotations

import gc
from bisect import bisect_left
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from echelon.core.filters import Filter, Op

ABSENT, NAN, BOTTOM, NO_EXCL = -4, -3, -1, -5
TOP = 2**62
_EXACT_INT = 2.0**53
BATCH = 4096  # events matched per numpy pass; < 2**16 keeps the event sort a radix sort

Dim = tuple[str, str]  # (attribute, "num" | "str")


@contextmanager
def _bulk():
    """Pause the cyclic GC while building: the tuples of a million subscriptions would
    trigger it again and again (half the build time) though none of them forms a cycle."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass(frozen=True)
class Subscription:
    id: str
    agent: str
    filter: Filter


class _Row(NamedTuple):
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


def _rows(f: Filter) -> tuple[_Row, ...] | None:
    """The predicates of `f` as rows; None when some predicate can never hold."""
    f.check_shape()  # malformed predicates (between with one bound, ...) are refused
    rows = []
    for p in f.predicates:
        v = p.value
        kind = "str" if isinstance(v, str) else "num"
        dim = (p.attribute, kind)
        if p.op is Op.NE:
            rows.append(_Row(dim, ne=True, value=None if v != v else v))
            continue
        if v != v or (p.upper is not None and p.upper != p.upper):
            return None  # NaN satisfies no comparison
        if p.op is Op.EQ:
            rows.append(_Row(dim, v, False, v, False))
        elif p.op in (Op.LT, Op.LE):
            rows.append(_Row(dim, hi=v, hi_strict=p.op is Op.LT))
        elif p.op in (Op.GT, Op.GE):
            rows.append(_Row(dim, lo=v, lo_strict=p.op is Op.GT))
        elif p.op is Op.BETWEEN:
            rows.append(_Row(dim, v, False, p.upper, False))
        else:  # PREFIX (validate() ensured a string)
            rows.append(_Row(dim, v, False, successor(v), True))  # type: ignore[arg-type]
    return tuple(rows)


def _float_exact(c: object) -> bool:
    try:
        return float(c) == c  # type: ignore[arg-type]
    except OverflowError:
        return False


class _Column:
    """One dimension's values for a batch of events, extracted once and shared by runs."""

    def __init__(self, events: Sequence[Mapping[str, object]], dim: Dim):
        attr, self.kind = dim
        self.raw = [e.get(attr) for e in events]
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

    def fits(self, v: object) -> bool:
        """Is `v` of this dimension's kind? (A bool is neither kind.)"""
        if self.kind == "str":
            return isinstance(v, str)
        return isinstance(v, (int, float)) and not isinstance(v, bool)


class _Codec:
    """The virtual nodes of one dimension: its sorted constants and the exact keying."""

    def __init__(self, kind: str, constants: set):
        self.kind = kind
        self.sorted = sorted(constants)
        self.rank = {c: i for i, c in enumerate(self.sorted)}
        self.top = 2 * len(self.sorted) - 1
        self.array = None
        if kind == "num" and all(_float_exact(c) for c in self.sorted):
            self.array = np.array(self.sorted, dtype=np.float64)

    def key(self, c: object) -> int:
        return 2 * self.rank[c]

    def encode(self, col: _Column) -> np.ndarray:
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
            try:  # each distinct value is keyed once, with Python's exact comparisons
                table = {v: self._key_of(col, v) for v in set(col.raw)}
                return np.fromiter(map(table.__getitem__, col.raw), np.int64, len(col.raw))
            except TypeError:  # an unhashable value
                pass
        return np.fromiter((self._key_of(col, v) for v in col.raw), np.int64, len(col.raw))

    def _key_of(self, col: _Column, v: object) -> int:
        if not col.fits(v):
            return ABSENT
        if v != v:
            return NAN
        i = bisect_left(self.sorted, v)
        return 2 * i if i < len(self.sorted) and self.sorted[i] == v else 2 * i - 1


def _gather(items: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenate items[starts[j] : starts[j] + counts[j]] over j, vectorised."""
    total = int(counts.sum())
    offsets = np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(total)
    return items[offsets]


class _Tree:
    """Covering lists of one access dimension, as CSR arrays over a segment tree."""

    def __init__(self, leaves: int, lo: np.ndarray, hi: np.ndarray, subs: np.ndarray):
        self.size = 1 << max(0, (leaves - 1).bit_length())
        self.shifts = np.arange(self.size.bit_length(), dtype=np.int64)
        l, r = lo + self.size, hi + self.size + 1
        nodes, owners = [], []
        while True:  # the canonical cover of [lo, hi], all ranges level by level
            active = l < r
            if not active.any():
                break
            left = active & (l & 1 == 1)
            nodes.append(l[left])
            owners.append(subs[left])
            l = l + left
            right = active & (r & 1 == 1)
            r = r - right
            nodes.append(r[right])
            owners.append(subs[right])
            l, r = l >> 1, r >> 1
        node = np.concatenate(nodes)
        order = np.argsort(node, kind="stable")
        self.items = np.concatenate(owners)[order].astype(np.int32)
        self.ptr = np.zeros(2 * self.size + 1, dtype=np.int64)
        np.cumsum(np.bincount(node, minlength=2 * self.size), out=self.ptr[1:])

    def candidates(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(event, subscription) pairs whose access range holds each event's key."""
        events = np.flatnonzero(keys >= BOTTOM)
        nodes = (keys[events] + 1 + self.size)[:, None] >> self.shifts
        starts = self.ptr[nodes]
        counts = self.ptr[nodes + 1] - starts
        per_event = counts.sum(axis=1)
        nz = counts.ravel() > 0
        subs = _gather(self.items, starts.ravel()[nz], counts.ravel()[nz])
        return np.repeat(events, per_event), subs


def _fresh(s: str) -> str:
    """An equal string in a new object (see `_Run`)."""
    return s.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


class _Run:
    """An immutable index over some subscriptions: codecs, access trees, checks.

    Positions follow (access dimension, access range), and the ids are copied into fresh
    string objects in that order: one event's matches (one symbol, one volume band) then
    sit side by side in memory, which more than halves the cost of building the answer
    lists for a million subscriptions (each id touched is otherwise a cache miss).
    """

    def __init__(self, entries: list[tuple[str, tuple[_Row, ...]]]):
        constants: dict[Dim, set] = {}
        for _, rows in entries:
            for r in rows:
                s = constants.setdefault(r.dim, set())
                s.update(x for x in (r.lo, r.hi, r.value) if x is not None)
        self.dims = sorted(constants)
        self.codecs = [_Codec(d[1], constants[d]) for d in self.dims]
        index = {d: i for i, d in enumerate(self.dims)}
        plan = []  # (sort key, id, access row or None, other rows)
        for sid, rows in entries:
            keyed = [self._key_row(index[r.dim], r) for r in rows]
            ranged = [k for k in keyed if k[1] >= BOTTOM]
            if not ranged:
                plan.append(((1, 0, 0, 0), sid, None, keyed))
                continue
            best = min(ranged, key=self._width)
            keyed.remove(best)
            plan.append(((0, best[0], best[1], best[2]), sid, best, keyed))
        plan.sort(key=lambda p: p[0])
        n = len(plan)
        self.ids = np.empty(n, dtype=object)
        self.ids[:] = [_fresh(p[1]) for p in plan]
        self.pos = {p[1]: j for j, p in enumerate(plan)}
        self.alive = np.ones(n, dtype=bool)
        self.dead = 0
        access: dict[int, list[tuple[int, int, int]]] = {}
        always, first, extra = [], [], []  # first: (sub, dim, lo, hi, excl); extra: the rest
        for j, (_, _, best, others) in enumerate(plan):
            if best is None:
                always.append(j)
            else:
                access.setdefault(best[0], []).append((j, best[1], best[2]))
            if others:
                first.append((j, *others[0]))
                extra += [(j, *k) for k in others[1:]]
        self.trees = []
        for d, subs in sorted(access.items()):
            a = np.array(subs, dtype=np.int64)
            top = self.codecs[d].top
            self.trees.append((d, _Tree(top + 2, a[:, 1] + 1, np.minimum(a[:, 2], top) + 1, a[:, 0])))
        self.always = np.array(always, dtype=np.int64)
        # Every subscription's first non-access predicate, in flat arrays (a no-op row for
        # those without one): the stock templates have at most one, checked without CSR.
        f = np.array(first, dtype=np.int64).reshape(-1, 5)
        self.check_dim = np.zeros(n, np.int64)
        self.check_lo = np.full(n, -TOP, np.int64)
        self.check_hi = np.full(n, TOP, np.int64)
        self.check_excl = np.full(n, NO_EXCL, np.int64)
        for arr, col in ((self.check_dim, 1), (self.check_lo, 2), (self.check_hi, 3), (self.check_excl, 4)):
            arr[f[:, 0]] = f[:, col]
        x = np.array(extra, dtype=np.int64).reshape(-1, 5)
        self.xcount = np.bincount(x[:, 0], minlength=n)
        self.xptr = np.concatenate(([0], np.cumsum(self.xcount)[:-1]))
        self.xdim, self.xlo, self.xhi, self.xexcl = x[:, 1], x[:, 2], x[:, 3], x[:, 4]

    def _width(self, k: tuple[int, int, int, int]) -> float:
        """The share of the dimension's virtual nodes an access range covers."""
        top = self.codecs[k[0]].top
        return (min(k[2], top) - k[1]) / (top + 2)

    def _key_row(self, d: int, r: _Row) -> tuple[int, int, int, int]:
        c = self.codecs[d]
        if r.ne:
            return d, NAN, TOP, NO_EXCL if r.value is None else c.key(r.value)
        lo = BOTTOM if r.lo is None else c.key(r.lo) + r.lo_strict
        hi = TOP if r.hi is None else c.key(r.hi) - r.hi_strict
        return d, lo, hi, NO_EXCL

    def kill(self, sid: str) -> None:
        j = self.pos.get(sid)
        if j is not None and self.alive[j]:
            self.alive[j] = False
            self.dead += 1

    def match(self, columns: Mapping[Dim, _Column], n: int) -> tuple[np.ndarray, np.ndarray]:
        """(event, position) of every live subscription of this run matching each event."""
        if not self.dims:  # only empty filters: they match everything
            e, s = np.repeat(np.arange(n), self.always.size), np.tile(self.always, n)
            return (e, s) if not self.dead else (e[self.alive[s]], s[self.alive[s]])
        keys = np.stack([c.encode(columns[d]) for d, c in zip(self.dims, self.codecs)])
        ev, sub = [], []
        for d, tree in self.trees:
            e, s = tree.candidates(keys[d])
            ev.append(e)
            sub.append(s)
        if self.always.size:
            ev.append(np.repeat(np.arange(n), self.always.size))
            sub.append(np.tile(self.always, n))
        e, s = np.concatenate(ev), np.concatenate(sub)
        # Count the other predicates of each candidate: it matches when none fails.
        k = keys[self.check_dim[s], e]
        ok = (k >= self.check_lo[s]) & (k <= self.check_hi[s]) & (k != self.check_excl[s])
        if self.dead:
            ok &= self.alive[s]
        cnt = self.xcount[s]
        if cnt.any():
            pair = np.repeat(np.arange(len(s)), cnt)
            row = np.repeat(self.xptr[s] - (np.cumsum(cnt) - cnt), cnt) + np.arange(int(cnt.sum()))
            k = keys[self.xdim[row], e[pair]]
            fail = (k < self.xlo[row]) | (k > self.xhi[row]) | (k == self.xexcl[row])
            ok &= np.bincount(pair[fail], minlength=len(s)) == 0
        return e[ok], s[ok]


class CountingIndex:
    """Subscriptions of one zone (or one matcher), matched by counting; see the module doc."""

    def __init__(self, subscriptions: Iterable[Subscription] = (), *, base: int = 64, growth: int = 8):
        self._base, self._growth = base, growth
        self._subs: dict[str, Subscription] = {}
        self._rows: dict[str, tuple[_Row, ...] | None] = {}
        self._level: dict[str, int] = {}
        self._levels: list[list[str]] = [[]]
        self._dead: list[int] = [0]
        self._runs: list[_Run | None] = [None]
        self.insert_many(subscriptions)

    def __len__(self) -> int:
        return len(self._subs)

    def __contains__(self, sid: object) -> bool:
        return sid in self._subs

    def get(self, sid: str) -> Subscription | None:
        return self._subs.get(sid)

    def subscriptions(self) -> list[Subscription]:
        return list(self._subs.values())

    def insert(self, sub: Subscription) -> None:
        """Add or replace (same id) one subscription; SchemaError for a malformed filter."""
        self.insert_many([sub])

    def insert_many(self, subs: Iterable[Subscription]) -> None:
        """Add or replace many at once, placed in the first level that holds them all."""
        with _bulk():
            parsed = [(s, _rows(s.filter)) for s in subs]  # raises before any state changes
        if not parsed:
            return
        level = 0
        while self._cap(level) < len(parsed):
            level += 1
        self._ensure(level)
        for s, rows in parsed:
            self.delete(s.id)
            self._subs[s.id], self._rows[s.id], self._level[s.id] = s, rows, level
            self._levels[level].append(s.id)
        self._runs[level] = None
        self._cascade(level)

    def delete(self, sid: str) -> bool:
        """Remove one subscription (a tombstone in its run); False if unknown."""
        level = self._level.pop(sid, None)
        if level is None:
            return False
        del self._subs[sid], self._rows[sid]
        run = self._runs[level]
        if run is not None:
            run.kill(sid)
        self._dead[level] += 1
        if 2 * self._dead[level] > len(self._levels[level]):
            self._levels[level] = self._live(level)
            self._dead[level], self._runs[level] = 0, None
        return True

    def match(self, event: Mapping[str, object]) -> list[str]:
        return self.match_batch([event])[0]

    def match_batch(self, events: Sequence[Mapping[str, object]]) -> list[list[str]]:
        """Ids of the subscriptions matching each event, exactly as `Filter.matches`."""
        runs = [self._run(i) for i in range(len(self._levels)) if self._levels[i]]
        out: list[list[str]] = []
        for start in range(0, len(events), BATCH):
            chunk = events[start : start + BATCH]
            n = len(chunk)
            columns: dict[Dim, _Column] = {}
            parts = []
            for run in runs:
                for d in run.dims:
                    if d not in columns:
                        columns[d] = _Column(chunk, d)
                e, s = run.match(columns, n)
                if e.size:
                    parts.append((e, s, run))
            if not parts:
                out += [[] for _ in range(n)]
                continue
            # Order by event on the integer arrays, then touch each id object once: with
            # a million subscriptions those scattered increfs are the main cost.
            e = np.concatenate([p[0] for p in parts])
            order = np.argsort(e.astype(np.uint16), kind="stable") if np.any(e[1:] < e[:-1]) else None
            if len(parts) == 1:
                _, s, run = parts[0]
                idv = run.ids[s if order is None else s[order]]
            else:
                idv = np.concatenate([run.ids[s] for _, s, run in parts])
                idv = idv if order is None else idv[order]
            e = e if order is None else e[order]
            bounds = np.searchsorted(e, np.arange(n + 1)).tolist()
            ids = idv.tolist()  # once: a numpy slice and tolist per event cost 10x a list slice
            out += [ids[a:b] for a, b in zip(bounds, bounds[1:])]
        return out

    def match_agents(self, events: Sequence[Mapping[str, object]]) -> list[set[str]]:
        """The agents holding a matching subscription, per event (the matcher's answer)."""
        return [{self._subs[i].agent for i in ids} for ids in self.match_batch(events)]

    # -- levels ------------------------------------------------------------------------

    def _cap(self, level: int) -> int:
        return self._base * self._growth**level

    def _ensure(self, level: int) -> None:
        while len(self._levels) <= level:
            self._levels.append([])
            self._dead.append(0)
            self._runs.append(None)

    def _live(self, level: int) -> list[str]:
        """The level's subscriptions, once each (a replaced id can be listed twice)."""
        return list(dict.fromkeys(i for i in self._levels[level] if self._level.get(i) == level))

    def _cascade(self, level: int) -> None:
        while len(self._levels[level]) - self._dead[level] > self._cap(level):
            self._ensure(level + 1)
            moved = self._live(level)
            for sid in moved:
                self._level[sid] = level + 1
            self._levels[level + 1].extend(moved)
            self._levels[level], self._dead[level] = [], 0
            self._runs[level] = self._runs[level + 1] = None
            level += 1

    def _run(self, level: int) -> _Run:
        run = self._runs[level]
        if run is None:
            live = self._live(level)
            self._levels[level], self._dead[level] = live, 0
            with _bulk():
                run = _Run([(i, self._rows[i]) for i in live if self._rows[i] is not None])  # type: ignore[misc]
            self._runs[level] = run
        return run
