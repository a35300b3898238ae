"""Zone matching at a holder (Meghdoot 3.4): a batch of events against this matcher's
CDM indexes of some zones of one layout, the holder's side of `Match` (fanout.py is the
entry's side). An answer of agents only (what a publishing agent routes by) comes from
the index's agent codes, never building a {subscription: agent} map per event: per event
a frozenset the index made, merged only where two zones meet one event."""

from __future__ import annotations

import time
from typing import Callable, Mapping, Sequence

from echelon.matcher.adoption import Layouts
from echelon.matcher.layout import Layout
from echelon.matcher.peers import Agents, Matches, StaleLayout
from echelon.matcher.store import CopyStore
from echelon.contract.wire import attributes_read

NONE: Agents = frozenset()  # an event no zone here matched

# (topic, zone, events, matches, seconds) of one zone's batch, for the service's metrics
Observer = Callable[[str, str, int, int, float], None]


class Zones:
    def __init__(self, me: str, layouts: Layouts, store: CopyStore):
        self.me = me
        self.layouts = layouts
        self.store = store
        self.observe: Observer | None = None

    def match(self, topic: str, key: str, events: Sequence[Mapping[str, object]] | None,
              zones: Mapping[str, Sequence[int]], agents_only: bool = False,
              wire: Sequence | None = None) -> list[Matches] | list[Agents]:
        """Per event, {subscription id: agent} over the zones named (event positions each),
        or the set of agents when `agents_only`. `events` None: read from `wire` (the
        Events as received), only the attributes the layout reads (Layout.reads)."""
        ts = self.layouts.topics.get(topic)
        layout = ts.find(key) if ts else None
        if layout is None or not layout.ready or any(z not in layout.index for z in zones):
            raise StaleLayout(f"matcher {self.me} holds no layout {key} of topic {topic!r} with those zones")
        if events is None:
            events = attributes_read(wire, layout.reads())
        out: list = [NONE] * len(events) if agents_only else [{} for _ in events]
        agent = self.store.agents.__getitem__
        first = True
        for zone, idxs in zones.items():
            start = time.perf_counter()
            whole = len(idxs) == len(events)  # positions are distinct: every event, in order
            batch = events if whole else list(map(events.__getitem__, idxs))
            index = layout.index[zone]
            if agents_only:
                found, n = index.match_agents(batch)
                if first and whole:  # the usual batch: one zone met by all its events
                    out = found
                else:
                    for i, agents in zip(idxs, found):
                        if agents:
                            out[i] = out[i] | agents
            else:
                n = 0
                for i, sids in zip(idxs, index.match_batch(batch)):
                    out[i].update(zip(sids, map(agent, sids)))
                    n += len(sids)
            if self.observe:
                self.observe(topic, zone, len(idxs), n, time.perf_counter() - start)
            first = False
        return out

    def held(self, topic: str, layout: Layout) -> dict[str, tuple[int, int]]:
        """Per zone of `layout`: (primary copies, other copies) this matcher holds there."""
        counts = {z: [0, 0] for z in layout.members}
        for sid in self.store.by_topic.get(topic, ()):
            primary, mirror = layout.zones_of(sid)
            if self.me in layout.members[primary]:
                counts[primary][0] += 1
            else:
                counts[mirror][1] += 1  # the mirror copy (or the extra one, see layout.py)
        return {z: (a, b) for z, (a, b) in counts.items()}
