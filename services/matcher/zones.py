"""Zone matching at a holder (Meghdoot 3.4): a batch of events against this matcher's
CDM indexes of some zones of one layout, the `MatchZones` side of `Match` (fanout.py is
the entry's side)."""

from __future__ import annotations

import time
from typing import Callable, Mapping, Sequence

from echelon.matcher.adoption import Layouts
from echelon.matcher.layout import Layout
from echelon.matcher.peers import Matches, StaleLayout
from echelon.matcher.store import CopyStore

# (topic, zone, events, matches, seconds) of one zone's batch, for the service's metrics
Observer = Callable[[str, str, int, int, float], None]


class Zones:
    def __init__(self, me: str, layouts: Layouts, store: CopyStore):
        self.me = me
        self.layouts = layouts
        self.store = store
        self.observe: Observer | None = None

    def match(self, topic: str, key: str, events: Sequence[Mapping[str, object]],
              zones: Mapping[str, Sequence[int]]) -> list[Matches]:
        """Per event, {subscription id: agent} over the zones named (event positions each)."""
        ts = self.layouts.topics.get(topic)
        layout = ts.find(key) if ts else None
        if layout is None or not layout.ready or any(z not in layout.index for z in zones):
            raise StaleLayout(f"matcher {self.me} holds no layout {key} of topic {topic!r} with those zones")
        out: list[Matches] = [{} for _ in events]
        agent = self.store.agents.__getitem__
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
