"""Local delivery: an event is offered once per message id (the dedup window) to every
local subscription of its topic whose filter it matches and that is owed it; a
subscription past its backlog bound is closed (counted)."""

from __future__ import annotations

import logging
import time
from typing import Callable, Mapping

from echelon.agent.metrics import AgentMetrics
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

    def _overflow(self, sub: Subscription) -> None:
        if sub.closed:
            return
        self.metrics.overflows.inc()
        log.warning("subscription %s overflowed its backlog of %d", sub.id, sub.max_backlog)
        self.close(sub)
