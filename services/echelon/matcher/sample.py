"""What the routing job samples at a matcher: subscription points per zone and recent event
points per topic (Meghdoot section 3.3 / 4.1: splits need the points, replicas the events).

Why an RPC (`Matcher.Sample`) and not a metric family: a point has 2n coordinates, so a
metric could only carry per-dimension histograms, and splitting needs the joint
distribution (a cut on one axis moves points by their other coordinates too); labels per
point would be unbounded cardinality. The per-zone totals are also metrics
(`echelon_matcher_zone_subscriptions`, `echelon_matcher_zone_events_total`); the sample
says where inside a zone the load lies.

Bounds: at most `max_points` subscription points per topic (split over the zones this
matcher owns in proportion to their size, so every owner's sample has one rate) and the
last EVENTS_KEPT event points per topic of one event in SAMPLE_EVERY (every event counted
in `total`), for at most MAX_TOPICS topics. Subscriptions are picked by the smallest crc32
of their id, so two calls on an unchanged matcher return the same sample (a replan with
nothing changed sees the same input).
"""

from __future__ import annotations

import math
import zlib
from collections import Counter, OrderedDict, deque
from typing import Callable, Mapping, Sequence

from echelon.matcher.tier import Tier
from echelon.contract.errors import InvalidArgument
from echelon.v1 import matcher_pb2 as xpb

DEFAULT_POINTS = 4096
MAX_POINTS = 65536
EVENTS_KEPT = 4096
SAMPLE_EVERY = 8  # one event in this many kept for the routing job (a copy of every event costs too much)
MAX_TOPICS = 1024


class EventSampler:
    """Recent events per topic answered as the entry (attributes only): one in `every`, taken
    at a fixed stride across batches (a systematic sample: the points keep the events'
    distribution, and a ring covers `every` times as many events), and every event counted."""

    def __init__(self, kept: int = EVENTS_KEPT, topics: int = MAX_TOPICS, every: int = SAMPLE_EVERY):
        self.kept, self.max_topics, self.every = kept, topics, every
        self.recent: OrderedDict[str, deque] = OrderedDict()
        self.seen: dict[str, int] = {}
        self._skip = 0  # events to pass over before the next one kept

    def add(self, topics: Sequence[str], events: Sequence, read: Callable[[object], Mapping] | None = None) -> None:
        """Each event's topic in `topics`; `read` makes the attributes of one event of
        `events` (as received) kept, called only on the one in `every` kept."""
        for topic, n in Counter(topics).items():  # counted in C: no Python step per event
            if topic not in self.recent:
                if len(self.recent) >= self.max_topics:  # the least recently seen topic goes
                    old, _ = self.recent.popitem(last=False)
                    self.seen.pop(old, None)
                self.recent[topic] = deque(maxlen=self.kept)
            else:
                self.recent.move_to_end(topic)
            self.seen[topic] = self.seen.get(topic, 0) + n
        picked = range(self._skip, len(events), self.every)
        self._skip = (self._skip - len(events)) % self.every
        for i in picked:
            ring = self.recent.get(topics[i])
            if ring is not None:  # None: a topic of this batch already pushed out by more than max_topics
                ring.append(events[i] if read is None else read(events[i]))


def sample(tier: Tier, events: EventSampler, request: xpb.SampleRequest) -> xpb.SampleResponse:
    """The Sample RPC's answer (see the module doc)."""
    if request.max_points > MAX_POINTS:
        raise InvalidArgument(f"max_points {request.max_points} is above {MAX_POINTS}")
    cap = request.max_points or DEFAULT_POINTS
    out = xpb.SampleResponse(member=tier.me)
    for topic, ts in sorted(tier.layouts.topics.items()):
        if (request.topic and topic != request.topic) or ts.active is None:
            continue
        layout = ts.active
        t = out.topics.add(topic=topic, dims=layout.space.dims, layout=layout.key, source=layout.source)
        owned = {z.id: [] for z in layout.zones if z.owner == tier.me}
        for sid, zone in layout.primary.items():
            if zone in owned:
                owned[zone].append(sid)
        total = sum(map(len, owned.values()))
        rate = min(1.0, cap / total) if total else 1.0
        for zone, sids in sorted(owned.items()):
            keep = sorted(sids, key=lambda s: (zlib.crc32(s.encode()), s))[:math.ceil(len(sids) * rate)]
            points = tier.store.points([tier.store.copies[s] for s in keep], layout.space)
            coords = [x for s in keep for x in points[s]]
            t.subscriptions.add(zone=zone, total=len(sids), coordinates=coords)
        recent = list(events.recent.get(topic, ()))[-cap:]
        t.events.total = events.seen.get(topic, 0)
        t.events.coordinates.extend(x for e in recent for x in layout.space.event_point(e))
    return out
