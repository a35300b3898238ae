"""CDM: the counting index a matcher keeps for its zone (CBDLO section 4; docs/papers.md,
"CBDLO: CDM and CRAWL"),
over the exact integer keys of cdm_keys.py (a predicate is a key range, a value a key).

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
subscriptions live in levels of capacity 64 * 8^i, each level one immutable run (cdm_runs.py: keys,
trees, CSR). An insert goes to level 0, rebuilt lazily at the next match; a level past
its capacity merges into the next, so a subscription is rebuilt O(log_8 k) times in
all. A delete sets a tombstone in its run; a level more than half tombstones is
compacted.

A matcher's answer to a publishing agent is the set of agents per event, not the
subscriptions: each run keeps its subscriptions' agents as small integer codes, and
`match_agents` dedups (event, agent) pairs in numpy, touching no id string.

A batch of a few events (SMALL) is matched in Python instead (`Run.match_small`): the same
runs, keys, covering lists and checks, read through memoryviews. numpy's cost per call is
fixed and a batch makes many calls, which is most of the work for a lone event, as events
reach a matcher at low rates (docs/performance.md, "Messages per event at low rates").
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from echelon.core.cdm_keys import Column, Dim, Row, rows_of
from echelon.core.cdm_runs import Run
from echelon.contract.filters import Filter

BATCH = 4096  # events matched per numpy pass; < 2**16 keeps the event sort a radix sort
SEEN_CELLS = 1 << 20  # (event, agent) pairs deduplicated in a table up to this size, else sorted
AGENT_SETS = 4096  # distinct agent sets kept by match_agents (past it, forgotten and made again)
# A batch of up to SMALL events is matched in Python (see the module doc) while each run meets
# at most SMALL_CANDIDATES candidates for it: past that, Python's cost per candidate passes
# numpy's per call (loadtest/bench_cdm_small.py).
SMALL = 8
SMALL_CANDIDATES = 256
_NONE: frozenset[str] = frozenset()


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
class Entry:
    """A subscription as the index holds it: its id, the agent that holds it, its filter."""

    id: str
    agent: str
    filter: Filter


class CountingIndex:
    """Subscriptions of one zone (or one matcher), matched by counting; see the module doc."""

    def __init__(self, subscriptions: Iterable[Entry] = (), *, base: int = 64, growth: int = 8):
        self._base, self._growth = base, growth
        self._subs: dict[str, Entry] = {}
        self._rows: dict[str, tuple[Row, ...] | None] = {}
        self._level: dict[str, int] = {}
        self._levels: list[list[str]] = [[]]
        self._dead: list[int] = [0]
        self._runs: list[Run | None] = [None]
        self._codes: dict[str, int] = {}  # agent -> its code in the runs (never reused)
        self._names: list[str] = []  # code -> agent
        self._attributes: dict[str, int] = {}  # attribute -> live subscriptions naming it
        self._sets: dict[bytes, frozenset[str]] = {}  # agent sets by their row of codes (match_agents)
        self.insert_many(subscriptions)

    def __len__(self) -> int:
        return len(self._subs)

    def __contains__(self, sid: object) -> bool:
        return sid in self._subs

    def get(self, sid: str) -> Entry | None:
        return self._subs.get(sid)

    def subscriptions(self) -> list[Entry]:
        return list(self._subs.values())

    def attributes(self) -> Iterable[str]:
        """The attributes some subscription here names: the only ones matching reads."""
        return self._attributes.keys()

    def insert(self, sub: Entry) -> None:
        """Add or replace (same id) one subscription; SchemaError for a malformed filter."""
        self.insert_many([sub])

    def insert_many(self, subs: Iterable[Entry]) -> None:
        """Add or replace many at once, placed in the first level that holds them all."""
        with _bulk():
            parsed = [(s, rows_of(s.filter)) for s in subs]  # raises before any state changes
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
            for name in {p.attribute for p in s.filter.predicates}:
                self._attributes[name] = self._attributes.get(name, 0) + 1
        self._runs[level] = None
        self._cascade(level)

    def delete(self, sid: str) -> bool:
        """Remove one subscription (a tombstone in its run); False if unknown."""
        level = self._level.pop(sid, None)
        if level is None:
            return False
        for name in {p.attribute for p in self._subs.pop(sid).filter.predicates}:
            if self._attributes[name] == 1:
                del self._attributes[name]
            else:
                self._attributes[name] -= 1
        del self._rows[sid]
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

    def _chunks(self, events: Sequence[Mapping[str, object]]):
        """(its size, its matches as `_parts`) for each chunk of BATCH events, in order."""
        for start in range(0, len(events), BATCH):
            chunk = events[start : start + BATCH]
            yield len(chunk), self._parts(chunk)

    def _parts(self, chunk: Sequence[Mapping[str, object]]) -> list[tuple[np.ndarray, np.ndarray, Run]]:
        """(event, position, run) of every match of a chunk, run by run (non-empty ones)."""
        runs = [self._run(i) for i in range(len(self._levels)) if self._levels[i]]
        columns: dict[Dim, Column] = {}
        parts = []
        for run in runs:
            for d in run.dims:
                if d not in columns:
                    columns[d] = Column(chunk, d)
            e, s = run.match(columns, len(chunk))
            if e.size:
                parts.append((e, s, run))
        return parts

    def _small(self, events: Sequence[Mapping[str, object]]) -> list[tuple[Run, list[list[int]]]] | None:
        """Per non-empty run, its matches' positions per event, without numpy; None when
        the batch is not small (see SMALL)."""
        if len(events) > SMALL:
            return None
        parts = []
        for i in range(len(self._levels)):
            if self._levels[i]:
                run = self._run(i)
                found = run.match_small(events, SMALL_CANDIDATES)
                if found is None:
                    return None
                parts.append((run, found))
        return parts

    def match_batch(self, events: Sequence[Mapping[str, object]]) -> list[list[str]]:
        """Ids of the subscriptions matching each event, exactly as `Filter.matches`."""
        small = self._small(events)
        if small is not None:
            out = [[] for _ in events]
            for run, found in small:
                ids = run.ids
                for hits, positions in zip(out, found):
                    hits += [ids[s] for s in positions]
            return out
        out: list[list[str]] = []
        for n, parts in self._chunks(events):
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
            ids = idv.tolist()  # once: a numpy slice and tolist per event cost far more than a list slice
            out += [ids[a:b] for a, b in zip(bounds, bounds[1:])]
        return out

    def match_agents(self, events: Sequence[Mapping[str, object]]) -> tuple[list[frozenset[str]], int]:
        """The agents holding a matching subscription, per event (what a matcher answers a
        publishing agent), and the number of (event, subscription) matches. (Event, agent
        code) pairs are deduplicated as integers: no id is touched; each event's set is
        made in C (no Python step per event)."""
        small = self._small(events)
        if small is not None:
            return self._agents_small(small, len(events))
        out: list[frozenset[str]] = []
        total = 0
        for n, parts in self._chunks(events):
            if not parts:
                out += [_NONE] * n
                continue
            e = np.concatenate([p[0] for p in parts])
            codes = np.concatenate([run.agents[s] for _, s, run in parts])
            total += e.size
            width = len(self._names)
            if n * width <= SEEN_CELLS:  # a table of (event, agent) cells: no sort
                seen = np.zeros((n, width), dtype=bool)
                seen[e, codes] = True
                out += self._agent_sets(seen)
                continue
            pairs = np.unique(e * width + codes)
            ev = pairs // width
            agents = list(map(self._names.__getitem__, (pairs - ev * width).tolist()))
            bounds = np.searchsorted(ev, np.arange(n + 1)).tolist()
            out += map(frozenset, map(agents.__getitem__, map(slice, bounds, bounds[1:])))
        return out, total

    def _agents_small(self, small: list[tuple[Run, list[list[int]]]], n: int) -> tuple[list[frozenset[str]], int]:
        """`match_agents` from `_small`'s positions."""
        codes: list[set[int]] = [set() for _ in range(n)]
        total = 0
        for run, found in small:
            agent = run.agent_codes.__getitem__
            for mine, positions in zip(codes, found):
                mine.update(map(agent, positions))
                total += len(positions)
        names = self._names.__getitem__
        return [frozenset(map(names, c)) if c else _NONE for c in codes], total

    def _agent_sets(self, seen: np.ndarray) -> list[frozenset[str]]:
        """Each row's agents (a row of `seen` per event, a column per agent code), as one
        frozenset per distinct row, kept: a row packed into bytes is its key, looked up
        in C (a topic's events meet few agent sets: a new frozenset per event would cost more)."""
        packed = np.packbits(seen, axis=1)
        keys = packed.view(f"V{packed.shape[1]}").ravel().tolist()  # a bytes object per row
        kept = self._sets
        found = list(map(kept.get, keys))
        if None in found:
            if len(kept) > AGENT_SETS:
                kept.clear()
            names = self._names
            for i, agents in enumerate(found):
                if agents is None:
                    agents = kept.get(keys[i])
                    if agents is None:
                        agents = kept[keys[i]] = frozenset(map(names.__getitem__, np.flatnonzero(seen[i]).tolist()))
                    found[i] = agents
        return found

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

    def _code(self, agent: str) -> int:
        code = self._codes.get(agent)
        if code is None:
            code = self._codes[agent] = len(self._names)
            self._names.append(agent)
        return code

    def _run(self, level: int) -> Run:
        run = self._runs[level]
        if run is None:
            live = self._live(level)
            self._levels[level], self._dead[level] = live, 0
            with _bulk():
                run = Run([(i, self._rows[i], self._code(self._subs[i].agent))  # type: ignore[misc]
                            for i in live if self._rows[i] is not None])
            self._runs[level] = run
        return run
