"""The handoff barrier: when every matcher may route with a newly adopted layout, and when
the old one may go (tier.py has the whole protocol).

Each matcher tells its peers, per topic, where it stands (Sync messages, on a change and
every second anyway):
    pushed: this matcher has pushed everything it held when it adopted the layout;
    filled: every alive matcher reports pushed (so every holder holds its copies);
    switch: every alive matcher reports filled -> route with it (active);
    settle: every alive matcher routes with it -> drop the old layout's indexes and
            the copies this matcher no longer holds.
Until the switch, entries route with the old layout, whose holders keep everything.
Each status also says whether the matcher holds every subscription its layouts give it
(refill.py): an entry routes by a layout only once each of its members says so.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from echelon.matcher.adoption import Layouts, TopicState
from echelon.matcher.empty import EmptyZones
from echelon.matcher.layout import Layout
from echelon.matcher.peers import Status, Transport, wait
from echelon.matcher.refill import Refill
from echelon.matcher.store import CopyStore

log = logging.getLogger("echelon.matcher.tier")


class Barrier:
    def __init__(self, layouts: Layouts, store: CopyStore, transport: Transport, changed: Callable[[], None],
                 empty: EmptyZones, refill: Refill):
        """`changed()`: a layout switched or settled (requests waiting on layouts look again);
        `empty`: takes the zones each Sync answer promises empty; `refill`: this matcher's
        completeness."""
        self.refill = refill
        self._routable: set[str] = set()  # keys of layouts every member is complete for (monotone)
        self.layouts = layouts
        self.store = store
        self.transport = transport
        self.changed = changed
        self.empty = empty
        self.peers: dict[str, tuple[int, int, dict[str, Status]]] = {}  # id -> (lifetime, seq, status)
        self._dirty = asyncio.Event()
        self._seq = 0

    def status(self) -> dict[str, Status]:
        out = {}
        for topic, ts in self.layouts.topics.items():
            L = ts.latest
            if L is not None:
                done = L is ts.active
                out[topic] = Status(L.key, done or ts.pushed == L.key, done or ts.filled == L.key,
                                    ts.active.key if ts.active else "", self.refill.complete(topic))
        return out

    def on_status(self, peer: str, lifetime: int, seq: int, status: dict[str, Status]) -> None:
        current = self.peers.get(peer)
        if current is not None and (current[0], current[1]) >= (lifetime, seq):
            return
        self.peers[peer] = (lifetime, seq, status)
        self.advance()

    def moved(self) -> None:
        """This matcher's own state moved (a layout adopted or pushed): tell the peers, look again."""
        self._dirty.set()
        self.advance()

    def forget_gone(self) -> None:
        """The view changed: statuses of matchers no longer in it go."""
        for peer in [p for p in self.peers if p not in self.layouts.view.matchers]:
            del self.peers[peer]

    def _peer(self, peer: str, topic: str) -> Status | None:
        entry = self.peers.get(peer)
        if entry is None or entry[0] != self.layouts.view.matchers.get(peer):
            return None
        return entry[2].get(topic)

    def routable(self, topic: str, layout: Layout) -> bool:
        """May an entry route `topic`'s events by `layout`: is this matcher complete for it,
        and every other member of its zones (by its last Sync, refill.py)?"""
        if layout.key in self._routable:
            return True
        if not self.refill.complete(topic):
            return False
        for p in layout.others:
            s = self._peer(p, topic)
            if s is None or not s.complete:
                return False
        self._routable.add(layout.key)
        return True

    def advance(self) -> None:
        peers = self.layouts.peers()
        changed = False
        for topic, ts in self.layouts.topics.items():
            L = ts.pending
            if L is not None:
                others = [self._peer(p, topic) for p in peers]
                if ts.pushed == L.key and ts.filled != L.key and \
                        all(s is not None and s.adopted == L.key and s.pushed for s in others):
                    ts.filled, changed = L.key, True
                if ts.filled == L.key and all(s is not None and s.adopted == L.key and s.filled for s in others):
                    if others and all(s.complete for s in others):  # their handoff filled this matcher
                        self.refill.handoff(topic)
                    ts.retired, ts.active, ts.pending, ts.settled = ts.active, L, None, False
                    changed = True
                    log.info("topic %s: switched to layout %s", topic, L.key)
            if ts.pending is None and ts.active is not None and not ts.settled and \
                    all((s := self._peer(p, topic)) is not None and s.active == ts.active.key for p in peers):
                self._settle(topic, ts)
                changed = True
        if changed:
            self._dirty.set()
            self.changed()

    def _settle(self, topic: str, ts: TopicState) -> None:
        """Every matcher routes with the active layout: the old one and stray copies go."""
        ts.retired, ts.settled = None, True
        self._routable &= {L.key for t in self.layouts.topics.values() for L in t.layouts()}
        strays = [s for s in self.store.by_topic.get(topic, ()) if not ts.active.holds(s)]
        for sid in strays:
            self.store.uninstall(sid)
        log.info("topic %s: settled on layout %s, dropped %d copies", topic, ts.active.key, len(strays))

    async def run(self) -> None:
        """Send this matcher's status to every peer on a change, and every second anyway
        (which renews the peers' promises of empty zones, empty.py)."""
        while True:
            await wait(self._dirty, 1.0)
            self._dirty.clear()
            self._seq += 1
            status = self.status()
            peers = self.layouts.peers()
            asked = self.empty.asking()
            answers = await asyncio.gather(*(self.transport.sync(p, self._seq, status) for p in peers),
                                           return_exceptions=True)
            for p, a in zip(peers, answers):
                if a and not isinstance(a, BaseException):
                    self.empty.granted(p, asked, *a)
