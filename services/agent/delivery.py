"""Local delivery: an event is offered once per message id (the dedup window) to every
local subscription of its topic whose filter it matches and that is owed it; a
subscription past its backlog bound is closed (counted). A sliced payload is offered as
a `slices.ChunkStream` per subscription, and only to subscriptions with a stream
attached: nothing here holds it for one that comes back later (slices.py)."""

from __future__ import annotations

import logging
import time
from typing import Callable, Mapping

from echelon.agent.metrics import AgentMetrics
from echelon.agent.slices import ChunkStream
from echelon.agent.subscriptions import Subscription
from echelon.core.dedup import DedupWindow
from echelon.runtime.wire import attributes_from_pb
from echelon.v1 import common_pb2 as pb

log = logging.getLogger("echelon.agent.delivery")


class LocalDelivery:
    def __init__(self, subs: Callable[[], Mapping[str, Subscription]], metrics: AgentMetrics,
                 close: Callable[[Subscription], object]):
        self.subs = subs
        self.metrics = metrics
        self.close = close
        self.dedup = DedupWindow()  # message ids delivered here

    def deliver(self, event: pb.Event) -> int:
        """Offer an event to every matching local subscription, once per message id."""
        if not self.dedup.first_time((event.id.producer_id, event.id.sequence), time.monotonic()):
            self.metrics.duplicates.inc()
            return 0
        attrs = None
        offered = 0
        for sub in list(self.subs().values()):
            if sub.topic != event.topic:
                continue
            attrs = attrs if attrs is not None else attributes_from_pb(event.attributes)
            if sub.filter.matches(attrs) and sub.owes(event):
                if sub.offer(event):
                    offered += 1
                else:
                    self._overflow(sub)
        if offered:
            self.metrics.latency.observe(max(0.0, time.time() - event.publish_time_unix_nanos / 1e9))
        return offered

    def open_stream(self, head: pb.Event, size: int) -> list[ChunkStream]:
        """Offer a sliced payload (its head: no payload, `size` bytes to come); the chunk
        streams of the subscriptions that take it. A matching subscription with no stream
        attached does not get it (counted as aborted)."""
        if not self.dedup.first_time((head.id.producer_id, head.id.sequence), time.monotonic()):
            self.metrics.duplicates.inc()
            return []
        attrs = attributes_from_pb(head.attributes)
        streams = []
        for sub in list(self.subs().values()):
            if sub.topic != head.topic or not sub.filter.matches(attrs) or not sub.owes(head):
                continue
            if not sub.attached:
                self.metrics.bulk_aborted.inc()
                log.warning("subscription %s has no stream attached: it misses the %d-byte payload %s:%d",
                            sub.id, size, head.id.producer_id, head.id.sequence)
                continue
            stream = ChunkStream(size, lambda reason, sid=sub.id: self._aborted(sid, head, reason))
            if sub.offer(head, stream):
                streams.append(stream)
            else:
                self._overflow(sub)
        if streams:
            self.metrics.latency.observe(max(0.0, time.time() - head.publish_time_unix_nanos / 1e9))
        return streams

    def _aborted(self, sid: str, head: pb.Event, reason: str) -> None:
        self.metrics.bulk_aborted.inc()
        log.warning("subscription %s lost the payload %s:%d mid-way: %s", sid, head.id.producer_id,
                    head.id.sequence, reason)

    def _overflow(self, sub: Subscription) -> None:
        if sub.closed:
            return
        self.metrics.overflows.inc()
        log.warning("subscription %s overflowed its backlog of %d", sub.id, sub.max_backlog)
        self.close(sub)
