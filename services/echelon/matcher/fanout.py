"""The entry's side of Match (Meghdoot 3.4 over the tier): each event goes only to the
zones its affected region meets, in the active layout; one holder-mode Match message per
matcher per batch, on a long-lived stream (peers.py; the entry's own zones locally, a
zone's replicas round-robin); answers merged per event (by subscription id, or as a set
of agents when only the agents are asked for). A zone whose members cannot be reached,
or a layout a holder has retired, makes the batch wait for the layouts to change (a dead
matcher's zones recovered, a switch completed), up to the matcher's deadline, then
UNAVAILABLE.

The entry also scores, per batch, how many of its events each matcher holds zones for
(`weights`): the matcher with the most is the best entry for such batches, since it
answers them with the fewest peer messages (none when it holds every zone they meet).
The service suggests it to the agent (MatchResponse.entry, server.py). That pays where
one matcher holds every zone an event meets: a schemaless topic (one zone, owner and
replica), a plan that replicates the low zones every event meets onto the owners of the
higher ones.

Zones known to be empty are skipped (empty.py): the entry's own by its index, another
matcher's by that holder's promise. They need no message, so they count for no matcher:
on loadtest.bench_events' default zones every event meets d0 (empty: the symbols start
with "s") and d1 (all 50 subscriptions), and d1's holder answers them alone.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from operator import attrgetter, itemgetter
from typing import Awaitable, Callable, Mapping, MutableMapping, Sequence

from echelon.matcher.adoption import Layouts
from echelon.matcher.layout import Layout
from echelon.matcher.peers import Agents, Matches, PeerUnavailable, StaleLayout, Transport
from echelon.matcher.zones import Zones
from echelon.contract.wire import attributes_read

TOPIC_WAIT = 3.0  # how long a batch waits for a topic this matcher has not seen yet

# wait_change(deadline, what, step): until the layouts change, or Unavailable(what) past the deadline
WaitChange = Callable[..., Awaitable[None]]


class Fanout:
    def __init__(self, layouts: Layouts, zones: Zones, transport: Transport, wait_change: WaitChange,
                 deadline: float, routable: Callable[[str, Layout], bool] = lambda topic, layout: True):
        """`routable(topic, layout)`: do the layout's members hold every subscription (refill.py)?"""
        self.me = layouts.me
        self.layouts = layouts
        self.zones = zones
        self.transport = transport
        self.wait_change = wait_change
        self.deadline = deadline
        self.routable = routable
        self._rr = 0

    async def match(self, events: Sequence[tuple[str, Mapping[str, object]]] | None, agents_only: bool = False,
                    wire: Sequence | None = None,
                    weights: MutableMapping[str, int] | None = None,
                    topics: Sequence[str] | None = None) -> list[Matches] | list[Agents]:
        """The entry's side of Match: per event, {subscription id: agent} (or its agents).
        `wire`: the events as received, forwarded to holders as they are; `events` None:
        read from `wire` (their `topics` given or read), only the attributes the topic's
        layout reads (Layout.reads: its routing's and this matcher's indexes'), when its
        events are matched. `weights` (filled if given): matcher -> events of the batch it
        holds a zone of."""
        deadline = asyncio.get_running_loop().time() + self.deadline
        if topics is None:
            topics = list(map(itemgetter(0), events) if events is not None else map(attrgetter("topic"), wire))
        distinct = set(topics)
        if len(distinct) == 1:  # a batch is mostly one topic: no regrouping, no task of its own
            return await self._match_topic(distinct.pop(), None if events is None else list(map(itemgetter(1), events)),
                                           wire, deadline, agents_only, weights)
        groups: dict[str, list[int]] = defaultdict(list)
        for i, topic in enumerate(topics):
            groups[topic].append(i)
        found = await asyncio.gather(*(self._match_topic(t, None if events is None else [events[i][1] for i in idxs],
                                                         None if wire is None else [wire[i] for i in idxs],
                                                         deadline, agents_only, weights)
                                       for t, idxs in groups.items()))
        out: list = [None] * len(topics)
        for idxs, part in zip(groups.values(), found):
            for i, matches in zip(idxs, part):
                out[i] = matches
        return out

    async def _match_topic(self, topic: str, events: list[Mapping[str, object]] | None, wire: Sequence | None,
                           deadline: float, agents_only: bool,
                           weights: MutableMapping[str, int] | None) -> list[Matches] | list[Agents]:
        loop = asyncio.get_running_loop()
        unknown_until = loop.time() + TOPIC_WAIT
        failed: set[str] = set()
        while True:
            ts = self.layouts.topics.get(topic)
            layout = ts.active if ts else None
            if layout is None:
                if topic not in self.layouts.view.topics and loop.time() > unknown_until:
                    # a topic no matcher has seen holds no subscription
                    return _merge([], len(events if events is not None else wire), agents_only)
                await self.wait_change(deadline, f"no active layout for topic {topic!r}", 0.1)
                continue
            if not self.routable(topic, layout):  # an answer now could miss subscriptions: no ack on it
                await self.wait_change(deadline, f"topic {topic!r}: a matcher is not refilled yet (restarted)", 0.1)
                continue
            # Read here, with no await before the local zones are matched: what a subscription
            # added meanwhile names is read too.
            evs = events if events is not None else attributes_read(wire, layout.reads())
            routed = self._needed(layout, layout.route(evs))
            plan = self._assign(layout, routed, failed)
            if plan is None:  # a zone with no reachable member: wait for the layout to change
                await self.wait_change(deadline, f"no member of some zone of topic {topic!r} is reachable")
                failed.clear()
                continue
            results = await self._ask(topic, layout.key, evs, wire, plan, agents_only)
            errors = [r for r in results if isinstance(r, BaseException)]
            if not errors:
                if weights is not None:
                    for zone, idxs in routed.items():
                        for m in layout.members[zone]:
                            weights[m] = weights.get(m, 0) + len(idxs)
                return _merge(results, len(evs), agents_only)
            for e in errors:
                if not isinstance(e, (PeerUnavailable, StaleLayout)):
                    raise e
            failed.update(e.peer for e in errors if isinstance(e, PeerUnavailable))
            if any(isinstance(e, StaleLayout) for e in errors):  # a holder moved on: so will we, soon
                await self.wait_change(deadline, f"layouts of topic {topic!r} do not settle", 0.05)

    def _needed(self, layout: Layout, routed: dict[str, list[int]]) -> dict[str, list[int]]:
        """The zones met that may hold a match: not those known to be empty (empty.py)."""
        out = {}
        now = 0.0
        for zone, idxs in routed.items():
            local = layout.index.get(zone)
            if local is not None:
                if not len(local):
                    continue
            elif layout.promised:
                now = now or asyncio.get_running_loop().time()
                if layout.promised.get(zone, 0.0) > now:
                    continue
            out[zone] = idxs
        return out

    def _assign(self, layout: Layout, zones: dict[str, list[int]],
                failed: set[str]) -> dict[str, dict[str, list[int]]] | None:
        """A member for each zone: this matcher if it is one, else round-robin (replicas)."""
        plan: dict[str, dict[str, list[int]]] = defaultdict(dict)
        for zone, idxs in zones.items():
            members = [p for p in layout.members[zone] if p not in failed]
            if not members:
                return None
            self._rr += 1
            plan[self.me if self.me in members else members[self._rr % len(members)]][zone] = idxs
        return plan

    async def _ask(self, topic: str, key: str, events: list[Mapping[str, object]], wire: list | None,
                   plan: dict[str, dict[str, list[int]]], agents_only: bool) -> list:
        """Each member's part of the plan, or the exception it raised: the entry's own at
        once, then one peer's awaited here, several peers' together (a task each)."""
        calls = [self._zones_at(p, topic, key, events, wire, z, agents_only)
                 for p, z in sorted(plan.items(), key=lambda pz: pz[0] != self.me)]
        results: list = []
        if len(calls) > 1 + (self.me in plan):
            if self.me in plan:
                results += await self._ask_one(calls.pop(0))
            return results + await asyncio.gather(*calls, return_exceptions=True)
        for call in calls:
            results += await self._ask_one(call)
        return results

    @staticmethod
    async def _ask_one(call) -> list:
        try:
            return [await call]
        except Exception as e:  # noqa: BLE001 - as gather(return_exceptions=True) would
            return [e]

    async def _zones_at(self, peer: str, topic: str, key: str, events: list[Mapping[str, object]],
                        wire: list | None, zones: dict[str, list[int]], agents_only: bool) -> list:
        """Per event, its matches in `zones` at `peer` (None, or empty, where it met none of them)."""
        if peer == self.me:
            return self.zones.match(topic, key, events, zones, agents_only)
        needed = sorted({i for idxs in zones.values() for i in idxs})
        at = {i: j for j, i in enumerate(needed)}
        results = await self.transport.match_zones(peer, topic, key, [events[i] for i in needed],
                                                   {z: [at[i] for i in idxs] for z, idxs in zones.items()},
                                                   agents_only, None if wire is None else [wire[i] for i in needed])
        out: list = [None] * len(events)
        for i, found in zip(needed, results):
            out[i] = found
        return out


def _merge(parts: list[list], n: int, agents_only: bool) -> list[Matches] | list[Agents]:
    """Per event, the union of its matches over the members' parts (each per event: its own
    new set or map, or None where that member had none of its zones). One local part, the
    usual case, is the answer as it is."""
    if len(parts) == 1 and None not in parts[0]:
        return parts[0]
    merged: list = [None] * n
    for part in parts:
        for i, found in enumerate(part):
            if found:
                if merged[i] is None:
                    merged[i] = found
                else:
                    merged[i] |= found
    return [m if m is not None else set() if agents_only else {} for m in merged]
