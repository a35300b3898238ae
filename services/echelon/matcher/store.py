"""The subscription copies one matcher holds, and the tombstones of those it dropped
(docs/papers.md, "Meghdoot"; tier.py has the protocol that moves them).

A copy is held only if it is newer than the copy held and than any tombstone of its id,
so a registration or a handoff push still travelling cannot bring back a removed or
replaced version. Every copy held is placed in every layout of its topic (active,
pending, retired): the store is the one place that adds copies to a layout's indexes
and takes them out.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterable, Sequence

from echelon.core.space import Space
from echelon.matcher.layout import Copy, Layout

TOMBSTONE_TTL = 300.0


class CopyStore:
    def __init__(self, layouts: Callable[[str], Iterable[Layout]]):
        """`layouts(topic)`: every layout of the topic the copies are placed in."""
        self.copies: dict[str, Copy] = {}
        self.agents: dict[str, str] = {}  # subscription id -> agent, for answers
        self.by_topic: dict[str, set[str]] = defaultdict(set)
        self.tombs: dict[str, tuple[int, float]] = {}  # id -> (version, expiry), oldest expiry first
        self._layouts = layouts
        self._points: dict[str, tuple[Space, tuple]] = {}

    def __len__(self) -> int:
        return len(self.copies)

    def install(self, copies: Sequence[Copy], replacing: Callable[[Copy, Copy], None]) -> list[Copy]:
        """Hold the copies newer than what is held (and than any tombstone), placed in every
        layout of their topic; returns those installed. `replacing(held, newer)` is called
        just before a newer copy replaces a held one (still placed)."""
        installed: dict[str, Copy] = {}
        for c in copies:
            tomb = self.tombs.get(c.id)
            current = self.copies.get(c.id)
            if (tomb is not None and tomb[0] >= c.version) or (current is not None and current.version >= c.version):
                continue
            if current is not None:
                replacing(current, c)
                self.uninstall(c.id)
                installed.pop(c.id, None)
            self.copies[c.id] = installed[c.id] = c
            self.agents[c.id] = c.agent
            self.by_topic[c.topic].add(c.id)
        by_topic: dict[str, list[Copy]] = defaultdict(list)
        for c in installed.values():
            by_topic[c.topic].append(c)
        for topic, group in by_topic.items():
            for L in self._layouts(topic):
                L.add(group, self.points(group, L.space))
        return list(installed.values())

    def points(self, copies: Sequence[Copy], space: Space) -> dict[str, tuple]:
        """Subscription points in `space`, computed once per copy (layouts share the space)."""
        out = {}
        for c in copies:
            cached = self._points.get(c.id)
            if cached is None or cached[0] is not space:
                cached = self._points[c.id] = (space, space.subscription_point(c.filter))
            out[c.id] = cached[1]
        return out

    def uninstall(self, sid: str) -> Copy:
        c = self.copies.pop(sid)
        self._points.pop(sid, None)
        del self.agents[sid]
        self.by_topic[c.topic].discard(sid)
        for L in self._layouts(c.topic):
            L.remove(sid)
        return c

    def bury(self, sid: str, version: int, now: float) -> None:
        """Keep a tombstone: no copy of `sid` at or below `version` is held for a while."""
        v = self.tombs.pop(sid, (0, 0.0))[0]
        self.tombs[sid] = (max(v, version), now + TOMBSTONE_TTL)

    def expire(self, now: float) -> None:
        """Forget the tombstones past their time."""
        while self.tombs:
            oldest = next(iter(self.tombs))
            if self.tombs[oldest][1] > now:
                break
            del self.tombs[oldest]
