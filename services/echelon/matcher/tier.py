"""The matcher tier's protocol at one matcher: copies, layouts, handoff and routing
(Meghdoot sections 3-4 over a cluster; docs/papers.md, "Meghdoot"). `Tier` wires its parts and
holds the entry's side of Register; each part has one job:

    store.py     the copies held, with tombstones
    adoption.py  the layouts adopted from the view, and the handoff push
    barrier.py   when a pushed layout is switched to, and when the old one goes
    removal.py   drops sent to every matcher and on to holders they did not know
    zones.py     matching a batch in this matcher's zones
    fanout.py    the entry's side of Match
    empty.py     zones promised empty, which entries skip

A matcher holds subscription *copies*. Which copies it must hold, and which it indexes
for matching, follows from a *layout* (layout.py): a topic's zones with their members.
Every matcher derives the layout from its view, so all agree once their views agree.

- Register: the entry (any matcher an agent calls) validates, then sends each copy to
  its holders, the members of the zone holding its point and of the mirror's zone,
  under every layout it has (active and pending). A holder that receives a copy
  forwards it under its own layouts the sender did not route by, so a registration
  racing a layout change reaches the new holders too.
- Match: the entry routes each event to the zones its affected region meets, in its
  active layout, one holder-mode Match message per matcher per batch, on a long-lived
  stream (fanout.py, peers.py); each zone matches with its CDM index. Subscription ids
  (or agents) are deduplicated.
- Handoff: when the layout of a topic changes (a plan splits, moves or replicates a
  zone; a matcher joins, restarts or dies), each matcher adopts the new layout as
  *pending* and pushes every copy it holds to the new layout's holders that did not
  hold it in the active one. The copies of a lost zone live on at the holders of their
  mirrors (and the mirrors' at their primaries), so the same push rebuilds it at its
  new owner: recovery from the mirrors. A barrier carried by Sync messages keeps
  answers exact during the switch (barrier.py): until every matcher has pushed,
  entries route with the old layout, whose holders keep everything.
- Remove: sent to every matcher; each drops the copy and keeps a tombstone, so an
  older copy still in flight (a push) cannot bring it back, and tells the copy's
  holders the sender did not know of. A re-registration (a new version) drops the
  older copies the same way: another filter may have lived in another zone.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import Callable, Mapping, MutableMapping, Sequence

from echelon.contract.schema import Schema
from echelon.matcher.adoption import CHUNK, Layouts
from echelon.matcher.barrier import Barrier
from echelon.matcher.empty import LEASE, EmptyZones
from echelon.matcher.fanout import TOPIC_WAIT, Fanout
from echelon.matcher.layout import Copy
from echelon.matcher.peers import Agents, Matches, PeerUnavailable, Status, TierView, Transport, ZoneRef, wait
from echelon.matcher.refill import Refill
from echelon.matcher.removal import Drops, Removal
from echelon.matcher.store import CopyStore
from echelon.matcher.zones import Zones
from echelon.contract.errors import NotFound, Unavailable

log = logging.getLogger("echelon.matcher.tier")


class Tier:
    def __init__(self, me: str, transport: Transport, lifetime: Callable[[], int] = lambda: 0,
                 deadline: float = 8.0, lease: float = LEASE, refill: Refill | None = None):
        """`refill`: when this matcher holds every agent's subscriptions (refill.py; None:
        from the start, as when no agent owns any)."""
        self.me = me
        self.transport = transport
        self.deadline = deadline
        # Hook for the service: layout changes (metric labels).
        self.on_change: Callable[[], None] | None = None
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._peer_call = 0.0  # loop time of the last request from another matcher
        self.store = CopyStore(lambda topic: self.layouts.of(topic))
        self.layouts = Layouts(me, lifetime, self.store, transport, self._spawn, lambda: self.barrier.moved())
        self.empty = EmptyZones(me, self.layouts, transport, lease)
        self.refill = refill if refill is not None else Refill()
        self.barrier = Barrier(self.layouts, self.store, transport, self._notify, self.empty, self.refill)
        self.removal = Removal(me, self.layouts, self.store, transport, self._spawn)
        self.zones = Zones(me, self.layouts, self.store)
        self.fanout = Fanout(self.layouts, self.zones, transport, self.wait_change, deadline, self.barrier.routable)

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        self.empty.start()
        self._spawn(self.barrier.run())

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("matcher task failed", exc_info=task.exception())

    def _notify(self) -> None:
        """Wake every request waiting for the layouts to change."""
        event, self._changed = self._changed, asyncio.Event()
        event.set()
        if self.on_change:
            self.on_change()

    async def wait_change(self, deadline: float, what: str, step: float = 0.5) -> None:
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise Unavailable(f"matcher {self.me}: {what}")
        await wait(self._changed, min(remaining, step))

    def _called(self) -> None:
        self._peer_call = asyncio.get_running_loop().time()

    async def quiet(self, period: float, deadline: float) -> None:
        """Until no matcher has called this one for `period` seconds (they all route
        around it), or `deadline` (loop time)."""
        loop = asyncio.get_running_loop()
        while (now := loop.time()) < deadline and now - self._peer_call < period:
            await asyncio.sleep(min(deadline, self._peer_call + period) - now)

    def update_view(self, view: TierView) -> None:
        """Adopt the layouts `view` implies (adoption.py); the barrier takes it from there."""
        before = self.layouts.view.matchers
        self.empty.forget({p for p, life in before.items() if view.matchers.get(p) != life})
        self.layouts.update(view)
        self.barrier.forget_gone()
        self.barrier.moved()
        self._notify()

    # -- registration ----------------------------------------------------------------

    async def accept(self, topic: str, copies: Sequence[Copy], sender: str = "",
                     sender_layouts: Sequence[str] = ()) -> tuple[int, list[str]]:
        """Hold new copies and forward them under this matcher's layouts the sender did not
        route by. Returns (copies installed, ids no holder acknowledged)."""
        if sender:
            self._called()

        def known() -> bool:
            ts = self.layouts.topics.get(topic)
            return ts is not None and all(ts.find(k) is not None for k in sender_layouts)

        known_before = known()
        installed = []
        tell: Drops = defaultdict(list)

        def replacing(held: Copy, newer: Copy) -> None:  # a push of `held` may still be travelling
            for p in self.layouts.holders(held) - {self.me}:
                tell[p].append((held.id, newer.version - 1))

        async with self.empty.fence(topic, copies):  # zones promised empty are revoked first
            for i in range(0, len(copies), CHUNK):
                if i:
                    await asyncio.sleep(0)  # a refill of many copies must not stall the loop
                installed += self.store.install(copies[i:i + CHUNK], replacing)
        layouts = self.layouts.routing(topic)
        sends: dict[str, dict[str, Copy]] = defaultdict(dict)
        for L in layouts:
            if L.key not in sender_layouts:
                # (Copies a layout still being filled has not placed yet, it pushes itself.)
                for c in (c for c in installed if L.placed(c.id)):
                    for p in L.targets(c.id):
                        if p not in (self.me, sender):
                            sends[p][c.id] = c
        peers = list(sends)
        keys = [L.key for L in layouts]
        results = await asyncio.gather(*(self.transport.store(p, topic, keys, list(sends[p].values()))
                                         for p in peers), self.removal.tell(tell, []), return_exceptions=True)
        reached: dict[str, int] = defaultdict(int)
        failed: set[str] = set()
        for p, r in zip(peers, results):
            if isinstance(r, BaseException):
                if not isinstance(r, PeerUnavailable):
                    log.warning("storing on %s failed: %r", p, r)
                failed.update(sends[p])
            else:
                for sid in sends[p]:
                    reached[sid] += 1
        missing = []
        layouts = self.layouts.routing(topic)
        # A copy routed by a layout this matcher has not adopted yet is kept: it will be.
        # (One it held when the copy came, dropped since, is no such: the fence may wait.)
        routed_known = known_before or known()
        for c in installed:
            if self.store.copies.get(c.id) is not c:
                continue  # replaced or removed meanwhile
            held = any(not L.placed(c.id) or L.holds(c.id) for L in layouts)
            if not held and not reached[c.id]:
                missing.append(c.id)
            if layouts and routed_known and not held and c.id not in failed:
                self.store.uninstall(c.id)  # a stray: its holders have it
        # The acknowledgement waits (not the copies: they are placed as ever) for promises
        # of empty zones that may still be believed (empty.py).
        if failed:  # by a holder that could not be reached
            await self.empty.settle_unreached()
        if sender:  # by this matcher's previous life, for a layout routed by
            await self.empty.grace(topic, sender_layouts)
        return len(installed), missing

    async def register(self, copies: Sequence[Copy], refill: str = "") -> int:
        """The entry's side of Register (copies validated by the caller); `refill`: the agent
        whose every subscription these are (refill.py), once they are held."""
        deadline = asyncio.get_running_loop().time() + self.deadline
        groups: dict[str, list[Copy]] = defaultdict(list)
        for c in copies:
            groups[c.topic].append(c)
        for topic, group in groups.items():
            while (ts := self.layouts.topics.get(topic)) is None or ts.latest is None:
                await self.wait_change(deadline, f"no layout for topic {topic!r} yet")
            # Copies of an older version (another filter, so maybe elsewhere) go everywhere.
            superseded = [(c.id, c.version - 1) for c in group if c.version > 1]
            (_, missing), _ = await asyncio.gather(self.accept(topic, group), self.removal.everywhere(superseded))
            if missing:
                raise Unavailable(f"no holder of subscription {missing[0]!r} could be reached; retry")
        if refill:
            self.refill.agent(refill)
            self.barrier.moved()
        return len(copies)

    async def schema(self, topic: str) -> Schema:
        """The topic's schema, waiting briefly for a topic the view does not hold yet."""
        deadline = asyncio.get_running_loop().time() + TOPIC_WAIT
        while topic not in self.layouts.view.topics:
            try:
                await self.wait_change(deadline, "", 0.1)
            except Unavailable:
                raise NotFound(f"topic {topic!r} does not exist") from None
        return self.layouts.view.topics[topic]

    # -- the other requests, each answered by its part -------------------------------

    async def remove(self, ids: Sequence[str], version: int) -> int:
        """The entry's side of Remove: every matcher drops the ids."""
        return len(await self.removal.everywhere([(sid, version) for sid in ids]))

    async def drop(self, items: Sequence[tuple[str, int]], sender: str = "", sent_to: Sequence[str] = ()) -> list[str]:
        self._called()
        return await self.removal.drop(items, sender, sent_to)

    async def match(self, events: Sequence[tuple[str, Mapping[str, object]]] | None, agents_only: bool = False,
                    wire: Sequence | None = None, weights: MutableMapping[str, int] | None = None,
                    topics: Sequence[str] | None = None) -> list[Matches] | list[Agents]:
        """The entry's side of Match (fanout.py): per event, {subscription id: agent}, or
        the set of agents when `agents_only`."""
        return await self.fanout.match(events, agents_only, wire, weights, topics)

    def match_zones(self, topic: str, key: str, events: Sequence[Mapping[str, object]] | None,
                    zones: Mapping[str, Sequence[int]], agents_only: bool = False,
                    wire: Sequence | None = None) -> list[Matches] | list[Agents]:
        self._called()
        return self.zones.match(topic, key, events, zones, agents_only, wire)

    def on_status(self, peer: str, lifetime: int, seq: int, status: dict[str, Status]) -> list[ZoneRef]:
        """A peer's Sync; the answer: the zones promised empty to it (empty.py)."""
        self._called()
        self.barrier.on_status(peer, lifetime, seq, status)
        return self.empty.grant(peer)
