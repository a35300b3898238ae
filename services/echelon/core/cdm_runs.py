"""CDM's runs (CBDLO section 4; cdm.py has the index and its levels): one immutable run
over some subscriptions, their access predicates' covering lists as CSR arrays along a
segment tree per access dimension (`_Tree`), their other predicates checked in one
vectorised pass per batch (`Run.match`).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from echelon.core.cdm_keys import BOTTOM, NAN, NO_EXCL, TOP, Codec, Column, Dim, Row


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


class Run:
    """An immutable index over some subscriptions: codecs, access trees, checks.

    Positions follow (access dimension, access range), and the ids are copied into fresh
    string objects in that order: one event's matches (one symbol, one volume band) then
    sit side by side in memory, which more than halves the cost of building the answer
    lists for a million subscriptions (each id touched is otherwise a cache miss).
    """

    def __init__(self, entries: list[tuple[str, tuple[Row, ...], int]]):
        """`entries`: (id, predicate rows, agent code) per subscription."""
        constants: dict[Dim, set] = {}
        for _, rows, _ in entries:
            for r in rows:
                s = constants.setdefault(r.dim, set())
                s.update(x for x in (r.lo, r.hi, r.value) if x is not None)
        self.dims = sorted(constants)
        self.codecs = [Codec(d[1], constants[d]) for d in self.dims]
        index = {d: i for i, d in enumerate(self.dims)}
        plan = []  # (sort key, id, access row or None, other rows, agent code)
        for sid, rows, agent in entries:
            keyed = [self._key_row(index[r.dim], r) for r in rows]
            ranged = [k for k in keyed if k[1] >= BOTTOM]
            if not ranged:
                plan.append(((1, 0, 0, 0), sid, None, keyed, agent))
                continue
            best = min(ranged, key=self._width)
            keyed.remove(best)
            plan.append(((0, best[0], best[1], best[2]), sid, best, keyed, agent))
        plan.sort(key=lambda p: p[0])
        n = len(plan)
        self.ids = np.empty(n, dtype=object)
        self.ids[:] = [_fresh(p[1]) for p in plan]
        self.agents = np.fromiter((p[4] for p in plan), np.int64, n)
        self.pos = {p[1]: j for j, p in enumerate(plan)}
        self.alive = np.ones(n, dtype=bool)
        self.dead = 0
        self.views: tuple | None = None  # `_views`, made at the first small match
        self.agent_codes: memoryview | None = None  # `agents` for `match_small`'s callers
        access: dict[int, list[tuple[int, int, int]]] = {}
        always, first, extra = [], [], []  # first: (sub, dim, lo, hi, excl); extra: the rest
        for j, (_, _, best, others, _) in enumerate(plan):
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
        # Columns of their own (not views of x): match_small reads them through memoryviews.
        self.xdim, self.xlo, self.xhi, self.xexcl = (np.ascontiguousarray(x[:, i]) for i in range(1, 5))

    def _width(self, k: tuple[int, int, int, int]) -> float:
        """The share of the dimension's virtual nodes an access range covers."""
        top = self.codecs[k[0]].top
        return (min(k[2], top) - k[1]) / (top + 2)

    def _key_row(self, d: int, r: Row) -> tuple[int, int, int, int]:
        c = self.codecs[d]
        if r.ne:
            return d, NAN, TOP, NO_EXCL if r.value is None else c.key(r.value)
        lo = BOTTOM if r.lo is None else c.key(r.lo) + r.lo_strict
        hi = TOP if r.hi is None else c.key(r.hi) - r.hi_strict
        return d, lo, hi, NO_EXCL

    def _views(self) -> tuple:
        """The arrays `match_small` reads, as memoryviews (no copy; `alive` stays live):
        an element read from one is a Python int, where numpy would box a scalar."""
        trees = tuple((d, tree.size, memoryview(tree.ptr), memoryview(tree.items)) for d, tree in self.trees)
        arrays = (self.check_dim, self.check_lo, self.check_hi, self.check_excl, self.xcount, self.xptr,
                  self.xdim, self.xlo, self.xhi, self.xexcl)
        self.views = (trees, self.always.tolist(), *map(memoryview, arrays), memoryview(self.alive))
        self.agent_codes = memoryview(self.agents)
        return self.views

    def match_small(self, events: list[Mapping[str, object]], budget: int) -> list[list[int]] | None:
        """`match` for a batch of a few events, in Python: per event, the positions of the
        live subscriptions matching it. Each numpy call costs microseconds whatever its
        size, which is most of a lone event's match; per candidate, Python costs more, so
        past `budget` candidates in all this gives up (None) and `match` is the way."""
        trees, always, cdim, clo, chi, cexcl, xcount, xptr, xdim, xlo, xhi, xexcl, alive = self.views or self._views()
        if not self.dims:  # only empty filters: they match everything
            return [[s for s in always if alive[s]] for _ in events] if len(always) * len(events) <= budget else None
        codecs = [(d[0], c) for d, c in zip(self.dims, self.codecs)]
        found: list[tuple[list[int], list[int]]] = []
        for event in events:
            keys = [c.key_one(event.get(attr)) for attr, c in codecs]
            spans = []  # (a tree's items, start, end): counted before any is copied
            budget -= len(always)
            for d, size, ptr, items in trees:
                if keys[d] < BOTTOM:  # absent or NaN: no access range holds it
                    continue
                node = keys[d] + 1 + size  # the leaf, then its ancestors: the covering lists
                while node:
                    a, b = ptr[node], ptr[node + 1]
                    if a != b:
                        spans.append((items, a, b))
                        budget -= b - a
                    node >>= 1
            if budget < 0:
                return None
            cands = list(always)
            for items, a, b in spans:
                cands += items[a:b]
            found.append((keys, cands))
        out = []
        for keys, cands in found:
            hits = []
            for s in cands:
                k = keys[cdim[s]]
                if k < clo[s] or k > chi[s] or k == cexcl[s] or not alive[s]:
                    continue
                p = xptr[s]
                for r in range(p, p + xcount[s]):
                    k = keys[xdim[r]]
                    if k < xlo[r] or k > xhi[r] or k == xexcl[r]:
                        break
                else:
                    hits.append(s)
            out.append(hits)
        return out

    def kill(self, sid: str) -> None:
        j = self.pos.get(sid)
        if j is not None and self.alive[j]:
            self.alive[j] = False
            self.dead += 1

    def match(self, columns: Mapping[Dim, Column], n: int) -> tuple[np.ndarray, np.ndarray]:
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
