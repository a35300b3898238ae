"""Layout adoption at one matcher: the layouts each topic is held under, derived from the
view (layout.py), and the handoff push of a newly adopted layout (Meghdoot 4.3 over a
cluster; tier.py has the whole protocol).

A layout that differs from the latest one of its topic is adopted as *pending*: the
copies held are placed in it in slices, then each is pushed to the new layout's holders
that did not hold it in the active one. The copies of a lost zone live on at the holders
of their mirrors, so the same push rebuilds it at its new owner: recovery from the
mirrors. When the push is done the layout is *pushed*; the barrier (barrier.py) takes it
from there.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

from echelon.core.can import TilingError, Zone
from echelon.core.space import Space
from echelon.matcher.layout import Copy, Layout, default_zones, effective_zones, layout_key
from echelon.matcher.peers import PeerUnavailable, TierView, Transport
from echelon.matcher.store import CopyStore

log = logging.getLogger("echelon.matcher.tier")

CHUNK = 2000  # copies per Store message of a handoff push, and per slice of work between yields
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

    def routing(self) -> list[Layout]:
        """The layouts copies are sent by: the active one and the one being adopted."""
        return [L for L in (self.active, self.pending) if L is not None]


class Layouts:
    """The topics' layouts at matcher `me`, and the view they come from."""

    def __init__(self, me: str, lifetime: Callable[[], int], store: CopyStore, transport: Transport,
                 spawn: Callable[..., asyncio.Task], pushed: Callable[[], None]):
        """`pushed()`: a push finished (the barrier looks again)."""
        self.me = me
        self.lifetime = lifetime
        self.store = store
        self.transport = transport
        self.spawn = spawn
        self.pushed = pushed
        self.on_handoff: Callable[[int], None] | None = None  # the service's metric: copies sent
        self.topics: dict[str, TopicState] = {}
        self.view = TierView({me: lifetime()}, {})

    def of(self, topic: str) -> list[Layout]:
        """Every layout of the topic (active, pending, retired)."""
        ts = self.topics.get(topic)
        return ts.layouts() if ts else []

    def routing(self, topic: str) -> list[Layout]:
        ts = self.topics.get(topic)
        return ts.routing() if ts else []

    def holders(self, c: Copy) -> set[str]:
        """The holders of a copy under this matcher's layouts (those it pushes to). A layout
        still being filled has not placed (or pushed) the copy yet."""
        return {p for L in self.routing(c.topic) if L.placed(c.id) for p in L.targets(c.id)}

    def peers(self) -> list[str]:
        return [p for p in self.view.matchers if p != self.me]

    def update(self, view: TierView) -> None:
        """Adopt the layouts `view` implies; a changed one becomes pending and is pushed."""
        matchers = {**view.matchers, self.me: view.matchers.get(self.me, self.lifetime())}
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
            ts.push = self.spawn(self._push(topic, ts, layout))
            log.info("topic %s: adopted layout %s (%s, %d zones)", topic, layout.key, layout.source,
                     len(layout.members))
        for topic in [t for t in self.topics if t not in view.topics]:
            self._cancel_push(self.topics.pop(topic))

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
        placed by the store); then the handoff: send each copy to the layout's holders that
        did not hold it before."""
        store = self.store
        held = list(store.by_topic.get(topic, ()))
        for i in range(0, len(held), CHUNK):
            todo = [store.copies[s] for s in held[i:i + CHUNK] if s in store.copies and not layout.placed(s)]
            layout.add(todo, store.points(todo, layout.space))
            await asyncio.sleep(0)
        for index in layout.index.values():  # build the CDM runs now, not in the first match
            index.match_batch([])
            await asyncio.sleep(0)
        layout.ready = True
        old = ts.active
        sends: dict[str, list[Copy]] = defaultdict(list)
        for sid in list(store.by_topic.get(topic, ())):
            new = set(layout.targets(sid)) - {self.me}
            if old is not None:
                new -= {p for p in old.targets(sid) if old.lifetimes.get(p) == layout.lifetimes.get(p)}
            for p in new:
                sends[p].append(store.copies[sid])
        keys = [L.key for L in (ts.active, layout) if L is not None]
        await asyncio.gather(*(self._send(topic, p, keys, copies, ts, layout) for p, copies in sends.items()))
        if ts.pending is layout:
            ts.pushed = layout.key
            sent = sum(map(len, sends.values()))
            log.info("topic %s: pushed %d copies for layout %s", topic, sent, layout.key)
            if self.on_handoff:
                self.on_handoff(sent)
            self.pushed()

    async def _send(self, topic: str, peer: str, keys: list[str], copies: list[Copy], ts: TopicState,
                    layout: Layout) -> None:
        for i in range(0, len(copies), CHUNK):
            while True:
                # Copies removed or replaced meanwhile stay behind (a replacement was forwarded).
                chunk = [c for c in copies[i:i + CHUNK] if self.store.copies.get(c.id) is c]
                try:
                    await self.transport.store(peer, topic, keys, chunk)
                    break
                except Exception as e:  # noqa: BLE001 - retried until superseded
                    if not isinstance(e, PeerUnavailable):
                        log.warning("handoff to %s failed: %r", peer, e)
                    if ts.pending is not layout or peer not in self.view.matchers:
                        return  # a newer layout (or the peer's death) supersedes this push
                    await asyncio.sleep(RETRY)
