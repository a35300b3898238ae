"""Zones known to be empty: an entry skips them (Meghdoot 3.4's routing, less the zones
that can answer nothing), so an event whose other zones are all local needs no
matcher-to-matcher message. On loadtest.bench_events' default zones every event meets
d0, which holds no subscription, and d1, which holds them all: the entry at d1's holder
now answers alone.

The decision, and why it is exact. A zone's holder *promises* an entry that the zone is
empty: skipping it then answers exactly what asking that holder would have.

- Granting (holder): every Sync answer (the caller's status, every second and on a
  change, barrier.py) carries the zones of the holder's active, ready layouts whose CDM
  index is empty and not being filled, each promised to the caller for a lease
  (`LEASE`), recorded per (topic, layout key, zone) and caller with the holder's expiry:
  answer time + lease.
- Holding (entry): the promise lives on the entry's layout object that was active when
  it asked, and only while that object is still its active layout; it expires at ask
  time + lease, so it ends before the holder's record (no clocks compared, only
  durations). A promise from a matcher that leaves the entry's view goes at once.
- Revoking (holder): before a holder installs copies (tier.accept, the one place copies
  enter a layout that may be promised) it computes the zones they land in under every
  layout key with live promises (all zones of a key whose layout it no longer holds),
  stops granting those zones, sends `Revoke` to every entry holding one and waits for
  the answer, or for the promise's lease to end. An entry drops the promise and ignores
  any grant it asked for before the revocation reached it (a Sync answer overtaken on
  the wire). So no copy enters a promised zone while an entry still skips it.
- A registration is acknowledged only after every holder it reached installed the copy
  (tier.accept), so a subscription in force has revoked every promise of its zone at
  the holders it reached. A holder it could not reach (crashed) answers nothing either;
  an entry asking it would wait for the layout without it, while one holding its
  promise would skip. So a registration that met an unreachable holder is acknowledged
  one lease later: every promise that holder gave has ended. A restarted matcher (a new
  lifetime, so new layout keys) knows nothing of its previous life's promises: for one
  lease after its start it acknowledges no copy routed by a layout it does not hold.
- Layout changes: promises are per layout key and the entry uses only those of its
  active layout; a holder grants only on its active layout, whose object it keeps (as
  retired) until every matcher routes with a newer one (barrier.py), and copies keep
  being placed in it, so they keep being fenced. Mirrors: a mirror copy is never
  indexed (only primaries answer events), so a zone holding only mirrors is empty.
  Removals: a zone emptied again is promised again at the next Sync.

The entry's own zones need no promise: it reads its index directly (an empty one is
skipped too, and neither kind counts toward the suggested entry, fanout.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, defaultdict
from contextlib import asynccontextmanager
from typing import Callable, Sequence

from echelon.matcher.adoption import Layouts
from echelon.matcher.layout import Copy, Layout
from echelon.matcher.peers import Transport, ZoneRef

log = logging.getLogger("echelon.matcher.empty")

LEASE = 3.0  # seconds a promise lasts from the entry's ask; Sync renews it every second
MAX_LEASE = 60.0  # a longer lease in an answer is refused (bad input)


class EmptyZones:
    """Both sides of the promises at one matcher: the holder's grants and fences, the
    entry's promises (kept on its layouts: `Layout.promised`, `Layout.revoked`)."""

    def __init__(self, me: str, layouts: Layouts, transport: Transport, lease: float = LEASE,
                 clock: Callable[[], float] | None = None):
        self.me = me
        self.layouts = layouts
        self.transport = transport
        self.lease = lease
        self.clock = clock or (lambda: asyncio.get_running_loop().time())
        # holder: topic -> (layout key, zone) -> entry -> expiry (this matcher's clock)
        self.grants: dict[str, dict[tuple[str, str], dict[str, float]]] = defaultdict(dict)
        self.fencing: Counter[str] = Counter()  # topic -> copies being installed: no grant meanwhile
        self.revocations = 0  # Revoke messages sent (tests, metrics)
        self.born = float("-inf")

    def start(self) -> None:
        self.born = self.clock()

    # -- holder ------------------------------------------------------------------------

    def grant(self, entry: str) -> list[ZoneRef]:
        """The zones promised empty to `entry` now (a Sync answer)."""
        now = self.clock()
        self._expire(now)
        out = []
        for topic, ts in self.layouts.topics.items():
            L = ts.active
            if L is None or not L.ready or topic in self.fencing:
                continue
            for zone, index in L.index.items():
                if not len(index):
                    self.grants[topic].setdefault((L.key, zone), {})[entry] = now + self.lease
                    out.append((topic, L.key, zone))
        return out

    def _expire(self, now: float, topics=None) -> None:
        for topic in list(self.grants if topics is None else topics):
            zones = self.grants.get(topic, {})
            for k in [k for k, g in zones.items() if max(g.values(), default=0.0) <= now]:
                del zones[k]
            if not zones:
                self.grants.pop(topic, None)

    @asynccontextmanager
    async def fence(self, topic: str, copies: Sequence[Copy]):
        """Held while `copies` are installed: the zones they land in are promised to no
        entry (revoked first), and no zone of the topic is granted until the block ends."""
        self.fencing[topic] += 1
        try:
            refs = self._landing(topic, copies)
            if refs:
                await self._revoke(topic, refs)
            yield
        finally:
            self.fencing[topic] -= 1
            if not self.fencing[topic]:
                del self.fencing[topic]

    def _landing(self, topic: str, copies: Sequence[Copy]) -> list[ZoneRef]:
        """The promised zones the copies' primaries land in, under every layout key
        promised (all of a key whose layout is gone: its geometry is not at hand)."""
        zones = self.grants.get(topic)
        if not zones or not copies:
            return []
        self._expire(self.clock(), [topic])
        ts = self.layouts.topics.get(topic)
        out: list[ZoneRef] = []
        hit: dict[str, set[str]] = {}
        points: dict[int, list] = {}  # by space: the layouts of one schema share theirs
        for key, zone in list(self.grants.get(topic, ())):
            L = ts.find(key) if ts else None
            if L is None:
                out.append((topic, key, zone))
                continue
            if key not in hit:
                if id(L.space) not in points:
                    points[id(L.space)] = [L.space.subscription_point(c.filter) for c in copies]
                hit[key] = L.primaries(points[id(L.space)])
            if zone in hit[key]:
                out.append((topic, key, zone))
        return out

    async def _revoke(self, topic: str, refs: list[ZoneRef]) -> None:
        now = self.clock()
        zones = self.grants.get(topic, {})
        by_entry: dict[str, list[ZoneRef]] = defaultdict(list)
        until: dict[str, float] = {}
        for r in refs:
            for entry, expiry in zones.get((r[1], r[2]), {}).items():
                if expiry > now:
                    by_entry[entry].append(r)
                    until[entry] = max(until.get(entry, 0.0), expiry)
        await asyncio.gather(*(self._revoke_at(e, rs, until[e]) for e, rs in by_entry.items()))
        for r in refs:  # no grant was made meanwhile (fenced): these are the ones revoked
            zones.pop((r[1], r[2]), None)

    async def _revoke_at(self, entry: str, refs: list[ZoneRef], until: float) -> None:
        self.revocations += 1
        try:
            async with asyncio.timeout(max(0.0, until - self.clock())):
                await self.transport.revoke(entry, refs)
            return
        except Exception as e:  # noqa: BLE001 - unreachable or late: the lease ends it
            log.info("revoking %d empty zones at %s: %r; waiting for the lease", len(refs), entry, e)
        await asyncio.sleep(max(0.0, until - self.clock()))

    async def settle_unreached(self) -> None:
        """A store reached not every holder: acknowledge only once their promises ended."""
        await asyncio.sleep(self.lease)

    async def grace(self, topic: str, sender_layouts: Sequence[str]) -> None:
        """Before acknowledging a copy routed by a layout this matcher does not hold,
        within a lease of its start: its previous life may have promised that layout's
        zones empty."""
        wait = self.born + self.lease - self.clock()
        if wait > 0:
            ts = self.layouts.topics.get(topic)
            if any(ts is None or ts.find(k) is None for k in sender_layouts):
                await asyncio.sleep(wait)

    # -- entry -------------------------------------------------------------------------

    def asking(self) -> tuple[float, dict[str, Layout]]:
        """Just before a Sync: the ask time and the layouts its answer's promises may go on."""
        return self.clock(), {t: ts.active for t, ts in self.layouts.topics.items() if ts.active is not None}

    def granted(self, peer: str, asked: tuple[float, dict[str, Layout]], lease: float,
                refs: Sequence[ZoneRef]) -> None:
        """A Sync answer's promises from `peer`."""
        at, active = asked
        if not refs or not 0.0 < lease <= MAX_LEASE or peer not in self.layouts.view.matchers:
            return
        for topic, key, zone in refs:
            L = active.get(topic)
            ts = self.layouts.topics.get(topic)
            if L is None or L.key != key or ts is None or ts.active is not L:
                continue  # asked under another layout
            if peer not in L.members.get(zone, ()) or L.revoked.get(zone, -1.0) >= at:
                continue  # not its zone, or revoked since the ask
            L.promised[zone] = max(L.promised.get(zone, 0.0), at + lease)

    def revoked(self, refs: Sequence[ZoneRef]) -> None:
        """A holder revokes promises (the Revoke message)."""
        now = self.clock()
        for topic, key, zone in refs:
            ts = self.layouts.topics.get(topic)
            for L in ts.layouts() if ts else ():
                if L.key == key:
                    L.promised.pop(zone, None)
                    L.revoked[zone] = now

    def forget(self, gone: set[str]) -> None:
        """Matchers left the view: every promise goes (which holder gave each is not kept)."""
        if gone:
            for ts in self.layouts.topics.values():
                for L in ts.layouts():
                    L.promised.clear()
