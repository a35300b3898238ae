"""The matcher tier's protocol at one matcher: copies, layouts, handoff and routing
(Meghdoot sections 3-4 over a cluster; ALGORITHMS.md 2).

A matcher holds subscription *copies*. Which copies it must hold, and which it indexes
for matching, follows from a *layout* (layout.py): a topic's zones with their members.
Every matcher derives the layout from its view, so all agree once their views agree.

- Register: the entry (any matcher an agent calls) validates, then sends each copy to
  its holders, the members of the zone holding its point and of the mirror's zone,
  under every layout it has (active and pending). A holder that receives a copy
  forwards it under its own layouts the sender did not route by, so a registration
  racing a layout change reaches the new holders too.
- Match: the entry routes each event to the zones its affected region meets, in its
  active layout, one MatchZones call per matcher per batch (fanout.py); each zone
  matches with match_batch on its CDM index. Subscription ids are deduplicated.
- Handoff: when the layout of a topic changes (a plan splits, moves or replicates a
  zone; a matcher joins, restarts or dies), each matcher adopts the new layout as
  *pending* and pushes every copy it holds to the new layout's holders that did not
  hold it in the active one. The copies of a lost zone live on at the holders of their
  mirrors (and the mirrors' at their primaries), so the same push rebuilds it at its
  new owner: recovery from the mirrors. A barrier carried by Sync messages keeps
  answers exact during the switch:
    pushed: this matcher has pushed everything it held when it adopted the layout;
    filled: every alive matcher reports pushed (so every holder holds its copies);
    switch: every alive matcher reports filled -> route with it (active);
    settle: every alive matcher routes with it -> drop the old layout's indexes and
            the copies this matcher no longer holds.
  Until the switch, entries route with the old layout, whose holders keep everything.
- Remove: sent to every matcher; each drops the copy and keeps a tombstone, so an
  older copy still in flight (a push) cannot bring it back, and tells the copy's
  holders the sender did not know of. A re-registration (a new version) drops the
  older copies the same way: another filter may have lived in another zone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from echelon.core.can import TilingError, Zone
from echelon.core.schema import Schema
from echelon.core.space import Space
from echelon.matcher.fanout import TOPIC_WAIT, Fanout
from echelon.matcher.layout import Copy, Layout, default_zones, effective_zones, layout_key
from echelon.matcher.peers import Matches, PeerUnavailable, StaleLayout, Status, TierView, Transport, wait
from echelon.runtime.errors import NotFound, Unavailable

log = logging.getLogger("echelon.matcher.tier")

CHUNK = 2000  # copies per Store message of a handoff push, and per slice of work between yields
TOMBSTONE_TTL = 300.0
RETRY = 0.2


@dataclass
class TopicState:
    active: Layout | None = None
    pending: Layout | None = None
    retired: Layout | None = None  # the previous active, answered until every matcher switched
    pushed: str = ""  # key of the layout this matcher finished pushing for
    filled: str = ""
    settled: bool = True
    push: asyncio.Task | None = None

    @property
    def latest(self) -> Layout | None:
        return self.pending or self.active

    def find(self, key: str) -> Layout | None:
        return next((L for L in (self.active, self.pending, self.retired) if L is not None and L.key == key), None)

    def layouts(self) -> list[Layout]:
        return [L for L in (self.active, self.pending, self.retired) if L is not None]


class MatcherCore:
    def __init__(self, me: str, transport: Transport, incarnation: Callable[[], int] = lambda: 0,
                 deadline: float = 8.0):
        self.me = me
        self.transport = transport
        self.incarnation = incarnation
        self.deadline = deadline
        self.copies: dict[str, Copy] = {}
        self.points: dict[str, tuple[Space, tuple]] = {}
        self.agents: dict[str, str] = {}  # subscription id -> agent, for answers
        self.by_topic: dict[str, set[str]] = defaultdict(set)
        self.tombs: dict[str, tuple[int, float]] = {}
        self.topics: dict[str, TopicState] = {}
        self.view = TierView({me: incarnation()}, {})
        self.peers: dict[str, tuple[int, int, dict[str, Status]]] = {}  # id -> (incarnation, seq, status)
        # Hooks for the service: per-zone match stats, and layout changes (metric labels).
        self.observe: Callable[[str, str, int, int, float], None] | None = None
        self.on_change: Callable[[], None] | None = None
        self.on_handoff: Callable[[int], None] | None = None  # a layout pushed: copies sent
        self._changed = asyncio.Event()
        self._dirty = asyncio.Event()
        self._seq = 0
        self.fanout = Fanout(self)
        self._tasks: set[asyncio.Task] = set()

    def __len__(self) -> int:
        return len(self.copies)

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        self._spawn(self._sync_loop())

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

    # -- the view: layouts to adopt ----------------------------------------------------

    def update_view(self, view: TierView) -> None:
        """Adopt the layouts `view` implies; a changed one becomes pending and is pushed."""
        matchers = {**view.matchers, self.me: view.matchers.get(self.me, self.incarnation())}
        self.view = TierView(matchers, dict(view.topics), dict(view.plan_zones), view.plan_version)
        order = sorted(matchers)
        for topic, schema in view.topics.items():
            ts = self.topics.setdefault(topic, TopicState())
            latest = ts.latest
            space = latest.space if latest is not None and latest.schema == schema else Space.of(schema)
            zones, source = self._zones(topic, space, view, order)
            key = layout_key(topic, schema, zones, matchers)
            if ts.latest is not None and ts.latest.key == key:
                continue
            self._cancel_push(ts)
            if ts.active is not None and ts.active.key == key:
                # Back to the active layout before the switch: copies pushed for the
                # abandoned one are dropped once every matcher is back too.
                ts.pending, ts.settled = None, False
                continue
            try:
                layout = Layout(topic, schema, zones, self.me, matchers, source, space)
            except (TilingError, ValueError) as e:  # membership checked the plan: not expected
                log.error("topic %s: zones of %s do not tile the space (%s)", topic, source, e)
                continue
            ts.pending = layout
            ts.push = self._spawn(self._push(topic, ts, layout))
            log.info("topic %s: adopted layout %s (%s, %d zones)", topic, layout.key, layout.source,
                     len(layout.members))
        for topic in [t for t in self.topics if t not in view.topics]:
            self._cancel_push(self.topics.pop(topic))
        for peer in [p for p in self.peers if p not in matchers]:
            del self.peers[peer]
        self._dirty.set()
        self._advance()
        self._notify()

    def _zones(self, topic: str, space: Space, view: TierView, order: list[str]) -> tuple[list[Zone], str]:
        plan = view.plan_zones.get(topic)
        if plan and all(len(z.low) == space.dims for z in plan):
            return effective_zones(topic, space, plan, order), f"plan {view.plan_version}"
        if plan:  # a plan made for an earlier schema of the topic
            log.warning("topic %s: plan %d does not fit its schema: default zones", topic, view.plan_version)
        return default_zones(topic, space, order)

    def _cancel_push(self, ts: TopicState) -> None:
        if ts.push is not None:
            ts.push.cancel()
            ts.push = None

    async def _push(self, topic: str, ts: TopicState, layout: Layout) -> None:
        """Place the copies held in a new layout, in slices (copies installed meanwhile are
        placed by `_install`); then the handoff: send each copy to the layout's holders that
        did not hold it before."""
        held = list(self.by_topic.get(topic, ()))
        for i in range(0, len(held), CHUNK):
            todo = [self.copies[s] for s in held[i:i + CHUNK] if s in self.copies and not layout.placed(s)]
            layout.add(todo, self._points(todo, layout.space))
            await asyncio.sleep(0)
        for index in layout.index.values():  # build the CDM runs now, not in the first match
            index.match_batch([])
            await asyncio.sleep(0)
        layout.ready = True
        old = ts.active
        sends: dict[str, list[Copy]] = defaultdict(list)
        for sid in list(self.by_topic.get(topic, ())):
            new = set(layout.targets(sid)) - {self.me}
            if old is not None:
                new -= {p for p in old.targets(sid) if old.incarnations.get(p) == layout.incarnations.get(p)}
            for p in new:
                sends[p].append(self.copies[sid])
        keys = [L.key for L in (ts.active, layout) if L is not None]
        await asyncio.gather(*(self._send(topic, p, keys, copies, ts, layout) for p, copies in sends.items()))
        if ts.pending is layout:
            ts.pushed = layout.key
            sent = sum(map(len, sends.values()))
            log.info("topic %s: pushed %d copies for layout %s", topic, sent, layout.key)
            if self.on_handoff:
                self.on_handoff(sent)
            self._dirty.set()
            self._advance()

    async def _send(self, topic: str, peer: str, keys: list[str], copies: list[Copy], ts: TopicState,
                    layout: Layout) -> None:
        for i in range(0, len(copies), CHUNK):
            while True:
                # Copies removed or replaced meanwhile stay behind (a replacement was forwarded).
                chunk = [c for c in copies[i:i + CHUNK] if self.copies.get(c.id) is c]
                try:
                    await self.transport.store(peer, topic, keys, chunk)
                    break
                except Exception as e:  # noqa: BLE001 - retried until superseded
                    if not isinstance(e, PeerUnavailable):
                        log.warning("handoff to %s failed: %r", peer, e)
                    if ts.pending is not layout or peer not in self.view.matchers:
                        return  # a newer layout (or the peer's death) supersedes this push
                    await asyncio.sleep(RETRY)

    # -- the barrier -----------------------------------------------------------------

    def status(self) -> dict[str, Status]:
        out = {}
        for topic, ts in self.topics.items():
            L = ts.latest
            if L is not None:
                done = L is ts.active
                out[topic] = Status(L.key, done or ts.pushed == L.key, done or ts.filled == L.key,
                                    ts.active.key if ts.active else "")
        return out

    def on_status(self, peer: str, incarnation: int, seq: int, status: dict[str, Status]) -> None:
        current = self.peers.get(peer)
        if current is not None and (current[0], current[1]) >= (incarnation, seq):
            return
        self.peers[peer] = (incarnation, seq, status)
        self._advance()

    def _peer(self, peer: str, topic: str) -> Status | None:
        entry = self.peers.get(peer)
        if entry is None or entry[0] != self.view.matchers.get(peer):
            return None
        return entry[2].get(topic)

    def _advance(self) -> None:
        peers = [p for p in self.view.matchers if p != self.me]
        changed = False
        for topic, ts in self.topics.items():
            L = ts.pending
            if L is not None:
                others = [self._peer(p, topic) for p in peers]
                if ts.pushed == L.key and ts.filled != L.key and \
                        all(s is not None and s.adopted == L.key and s.pushed for s in others):
                    ts.filled, changed = L.key, True
                if ts.filled == L.key and all(s is not None and s.adopted == L.key and s.filled for s in others):
                    ts.retired, ts.active, ts.pending, ts.settled = ts.active, L, None, False
                    changed = True
                    log.info("topic %s: switched to layout %s", topic, L.key)
            if ts.pending is None and ts.active is not None and not ts.settled and \
                    all((s := self._peer(p, topic)) is not None and s.active == ts.active.key for p in peers):
                self._settle(topic, ts)
                changed = True
        if changed:
            self._dirty.set()
            self._notify()

    def _settle(self, topic: str, ts: TopicState) -> None:
        """Every matcher routes with the active layout: the old one and stray copies go."""
        ts.retired, ts.settled = None, True
        strays = [s for s in self.by_topic.get(topic, ()) if not ts.active.holds(s)]
        for sid in strays:
            self._uninstall(sid)
        log.info("topic %s: settled on layout %s, dropped %d copies", topic, ts.active.key, len(strays))

    async def _sync_loop(self) -> None:
        """Send this matcher's status to every peer on a change, and every second anyway."""
        while True:
            await wait(self._dirty, 1.0)
            self._dirty.clear()
            self._seq += 1
            status = self.status()
            peers = [p for p in self.view.matchers if p != self.me]
            await asyncio.gather(*(self.transport.sync(p, self._seq, status) for p in peers),
                                 return_exceptions=True)

    # -- copies ----------------------------------------------------------------------

    def _install(self, copies: Sequence[Copy], tell: dict[str, list[tuple[str, int]]]) -> list[Copy]:
        """Hold the copies newer than what is held (and than any tombstone); place them in
        every layout of their topic. Returns those installed; `tell` gets the holders of
        the versions they replace (pushed there by this matcher, maybe still travelling)."""
        installed: dict[str, Copy] = {}
        for c in copies:
            tomb = self.tombs.get(c.id)
            current = self.copies.get(c.id)
            if (tomb is not None and tomb[0] >= c.version) or (current is not None and current.version >= c.version):
                continue
            if current is not None:
                for p in self._holders(c.id) - {self.me}:
                    tell[p].append((c.id, c.version - 1))
                self._uninstall(c.id)
                installed.pop(c.id, None)
            self.copies[c.id] = installed[c.id] = c
            self.agents[c.id] = c.agent
            self.by_topic[c.topic].add(c.id)
        by_topic: dict[str, list[Copy]] = defaultdict(list)
        for c in installed.values():
            by_topic[c.topic].append(c)
        for topic, group in by_topic.items():
            ts = self.topics.get(topic)
            for L in ts.layouts() if ts else ():
                L.add(group, self._points(group, L.space))
        return list(installed.values())

    def _points(self, copies: Sequence[Copy], space: Space) -> dict[str, tuple]:
        """Subscription points in `space`, computed once per copy (layouts share the space)."""
        out = {}
        for c in copies:
            cached = self.points.get(c.id)
            if cached is None or cached[0] is not space:
                cached = self.points[c.id] = (space, space.subscription_point(c.filter))
            out[c.id] = cached[1]
        return out

    def _uninstall(self, sid: str) -> None:
        c = self.copies.pop(sid)
        self.points.pop(sid, None)
        del self.agents[sid]
        self.by_topic[c.topic].discard(sid)
        ts = self.topics.get(c.topic)
        for L in ts.layouts() if ts else ():
            L.remove(sid)

    async def accept(self, topic: str, copies: Sequence[Copy], sender: str = "",
                     sender_layouts: Sequence[str] = ()) -> tuple[int, list[str]]:
        """Hold new copies and forward them under this matcher's layouts the sender did not
        route by. Returns (copies installed, ids no holder acknowledged)."""
        installed = []
        tell: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for i in range(0, len(copies), CHUNK):
            if i:
                await asyncio.sleep(0)  # a refill of many copies must not stall the loop
            installed += self._install(copies[i:i + CHUNK], tell)
        ts = self.topics.get(topic)
        layouts = [L for L in (ts.active, ts.pending) if L is not None] if ts else []
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
                                         for p in peers), self._tell(tell, []), return_exceptions=True)
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
        ts = self.topics.get(topic)
        layouts = [L for L in (ts.active, ts.pending) if L is not None] if ts else []
        # A copy routed by a layout this matcher has not adopted yet is kept: it will be.
        known = ts is not None and all(ts.find(k) is not None for k in sender_layouts)
        for c in installed:
            if self.copies.get(c.id) is not c:
                continue  # replaced or removed meanwhile
            held = any(not L.placed(c.id) or L.holds(c.id) for L in layouts)
            if not held and not reached[c.id]:
                missing.append(c.id)
            if layouts and known and not held and c.id not in failed:
                self._uninstall(c.id)  # a stray: its holders have it
        return len(installed), missing

    async def register(self, copies: Sequence[Copy]) -> int:
        """The entry's side of Register (copies validated by the caller)."""
        deadline = asyncio.get_running_loop().time() + self.deadline
        groups: dict[str, list[Copy]] = defaultdict(list)
        for c in copies:
            groups[c.topic].append(c)
        for topic, group in groups.items():
            while (ts := self.topics.get(topic)) is None or ts.latest is None:
                await self.wait_change(deadline, f"no layout for topic {topic!r} yet")
            # Copies of an older version (another filter, so maybe elsewhere) go everywhere.
            superseded = [(c.id, c.version - 1) for c in group if c.version > 1]
            (_, missing), _ = await asyncio.gather(self.accept(topic, group), self._drop_everywhere(superseded))
            if missing:
                raise Unavailable(f"no holder of subscription {missing[0]!r} could be reached; retry")
        return len(copies)

    async def schema(self, topic: str) -> Schema:
        """The topic's schema, waiting briefly for a topic the view does not hold yet."""
        deadline = asyncio.get_running_loop().time() + TOPIC_WAIT
        while topic not in self.view.topics:
            try:
                await self.wait_change(deadline, "", 0.1)
            except Unavailable:
                raise NotFound(f"topic {topic!r} does not exist") from None
        return self.view.topics[topic]

    # -- removal ---------------------------------------------------------------------

    async def remove(self, ids: Sequence[str], version: int) -> int:
        """The entry's side of Remove: every matcher drops the ids."""
        return len(await self._drop_everywhere([(sid, version) for sid in ids]))

    async def _drop_everywhere(self, items: list[tuple[str, int]]) -> set[str]:
        peers = [p for p in self.view.matchers if p != self.me]
        removed = set(await self.drop(items, self.me, [self.me, *peers]))
        results = await asyncio.gather(*(self.transport.drop(p, items, [self.me, *peers]) for p in peers),
                                       return_exceptions=True)
        for p, r in zip(peers, results):
            if isinstance(r, BaseException):
                self._spawn(self._drop_later(p, items))
            else:
                removed.update(r)
        return removed

    async def _drop_later(self, peer: str, items: list[tuple[str, int]]) -> None:
        while peer in self.view.matchers:
            await asyncio.sleep(RETRY * 5)
            try:
                await self.transport.drop(peer, items, [self.me])
                return
            except PeerUnavailable:
                continue

    async def drop(self, items: Sequence[tuple[str, int]], sender: str = "", sent_to: Sequence[str] = ()) -> list[str]:
        """Drop each (id, version): its copy if not newer, keeping the version as a tombstone.
        A dropped copy's holders under this matcher's layouts that the sender did not reach
        (a matcher it did not know yet, pushed to by this one) are told too."""
        now = time.monotonic()
        while self.tombs:
            oldest = next(iter(self.tombs))
            if self.tombs[oldest][1] > now:
                break
            del self.tombs[oldest]
        out = []
        tell: dict[str, list[tuple[str, int]]] = defaultdict(list)
        skip = {self.me, sender, *sent_to}
        for sid, version in items:
            v = self.tombs.pop(sid, (0, 0.0))[0]
            self.tombs[sid] = (max(v, version), now + TOMBSTONE_TTL)
            c = self.copies.get(sid)
            if c is not None and c.version <= version:
                for p in self._holders(sid) - skip:
                    tell[p].append((sid, version))
                self._uninstall(sid)
                out.append(sid)
        await self._tell(tell, list(skip))
        return out

    def _holders(self, sid: str) -> set[str]:
        """The holders of a copy under this matcher's layouts (those it pushes to). A layout
        still being filled has not placed (or pushed) the copy yet."""
        ts = self.topics.get(self.copies[sid].topic)
        layouts = [L for L in (ts.active, ts.pending) if L is not None and L.placed(sid)] if ts else []
        return {p for L in layouts for p in L.targets(sid)}

    async def _tell(self, tell: dict[str, list[tuple[str, int]]], told: list[str]) -> None:
        """Drops for holders the sender did not reach; best effort (their push may be gone)."""
        peers = list(tell)
        told = [*told, *peers]
        await asyncio.gather(*(self.transport.drop(p, tell[p], told) for p in peers), return_exceptions=True)

    # -- matching --------------------------------------------------------------------

    async def match(self, events: Sequence[tuple[str, Mapping[str, object]]]) -> list[Matches]:
        """The entry's side of Match (fanout.py): per event, {subscription id: agent}."""
        return await self.fanout.match(events)

    def match_zones(self, topic: str, key: str, events: Sequence[Mapping[str, object]],
                    zones: Mapping[str, Sequence[int]]) -> list[Matches]:
        """Match events against this matcher's indexes of some zones of one layout."""
        ts = self.topics.get(topic)
        layout = ts.find(key) if ts else None
        if layout is None or not layout.ready or any(z not in layout.index for z in zones):
            raise StaleLayout(f"matcher {self.me} holds no layout {key} of topic {topic!r} with those zones")
        out: list[Matches] = [{} for _ in events]
        agent = self.agents.__getitem__
        for zone, idxs in zones.items():
            start = time.perf_counter()
            found = layout.index[zone].match_batch([events[i] for i in idxs])
            n = 0
            for i, sids in zip(idxs, found):
                out[i].update(zip(sids, map(agent, sids)))
                n += len(sids)
            if self.observe:
                self.observe(topic, zone, len(idxs), n, time.perf_counter() - start)
        return out

    # -- introspection ---------------------------------------------------------------

    def held(self, topic: str, layout: Layout) -> dict[str, tuple[int, int]]:
        """Per zone of `layout`: (primary copies, other copies) this matcher holds there."""
        counts = {z: [0, 0] for z in layout.members}
        for sid in self.by_topic.get(topic, ()):
            primary, mirror = layout.zones_of(sid)
            if self.me in layout.members[primary]:
                counts[primary][0] += 1
            else:
                counts[mirror][1] += 1  # the mirror copy (or the extra one, see layout.py)
        return {z: (a, b) for z, (a, b) in counts.items()}
