"""Subscriptions held by an agent: backlog, client credits, unacknowledged deliveries.

A subscription never has more deliveries in flight than the client granted credits.
Named subscriptions outlive their stream: on detach the unacknowledged deliveries go
back to the head of the backlog (redelivery count + 1) for the next stream. Past
`max_backlog` messages the subscription overflows: its stream ends with
RESOURCE_EXHAUSTED and the agent counts it. A nacked delivery comes back to the head of
the backlog after the client's delay (redelivery count + 1), counting against the bound
while it waits.

A subscription is owed the events published from its creation on (DESIGN.md: "every
subscription that matched at publish time"). `owes` refuses older ones, allowing
`CLOCK_SKEW` between the publishing agent's clock and ours: so a process restarted after
a crash does not hand its new subscriptions what the dead process may already have
delivered (messages parked for it, or resent by a peer's link, while it was down).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

from echelon.agent.slices import ChunkStream
from echelon.core.filters import Filter
from echelon.runtime.errors import InvalidArgument
from echelon.v1 import common_pb2 as pb

CLOCK_SKEW_NS = 500_000_000
MAX_NACK_DELAY = 600.0  # seconds, as Google Pub/Sub's longest retry backoff


@dataclass
class Pending:
    event: pb.Event
    redeliveries: int = 0
    stream: ChunkStream | None = None  # a sliced payload, handed out as it arrives (slices.py)


class Subscription:
    def __init__(self, sid: str, name: str, topic: str, flt: Filter, max_backlog: int):
        self.id = sid  # cluster-wide: "<agent>/<name>"
        self.name = name
        self.topic = topic
        self.filter = flt
        self.max_backlog = max_backlog
        self.named = not name.startswith("~")
        self.backlog: deque[Pending] = deque()
        self.unacked: dict[int, Pending] = {}
        self.credits = 0
        self.delayed = 0  # nacked, waiting for their delay
        self.attached = False
        self.overflowed = False
        self.closed = False
        self.changed = asyncio.Event()
        self.created_ns = time.time_ns()
        self._next_id = 1

    def owes(self, event: pb.Event) -> bool:
        """Was `event` published after this subscription existed (give or take the skew)?"""
        t = event.publish_time_unix_nanos
        return not t or t >= self.created_ns - CLOCK_SKEW_NS

    def offer(self, event: pb.Event, stream: ChunkStream | None = None) -> bool:
        """Queue an event for delivery (a sliced payload: its head and chunk stream);
        False (and overflowed) past the backlog bound."""
        if self.closed:
            return False
        if self.depth >= self.max_backlog:
            self.overflowed = True
            self.changed.set()
            return False
        self.backlog.append(Pending(event, stream=stream))
        self.changed.set()
        return True

    def take(self) -> tuple[int, Pending] | None:
        """The next delivery if the client has credit for it."""
        if self.credits <= 0 or not self.backlog:
            return None
        pending = self.backlog.popleft()
        delivery_id = self._next_id
        self._next_id += 1
        self.unacked[delivery_id] = pending
        self.credits -= 1
        return delivery_id, pending

    def ack(self, delivery_ids, credits: int) -> int:
        acked = sum(self.unacked.pop(i, None) is not None for i in delivery_ids)
        self.credits += credits
        self.changed.set()
        return acked

    def nack(self, delivery_ids, delay: float, credits: int) -> int:
        """Give deliveries back unprocessed: redelivered after `delay` seconds."""
        if not 0 <= delay <= MAX_NACK_DELAY:
            raise InvalidArgument(f"nack delay {delay:g}s: 0 to {MAX_NACK_DELAY:g}s")
        nacked = self._unstreamed([self.unacked.pop(i) for i in delivery_ids if i in self.unacked],
                                  "nacked: a sliced payload is not redelivered")
        for pending in nacked:
            pending.redeliveries += 1
        if delay and nacked:
            self.delayed += len(nacked)
            asyncio.get_running_loop().call_later(delay, self._requeue, nacked, True)
        else:
            self._requeue(nacked, False)
        self.credits += credits
        self.changed.set()
        return len(nacked)

    def _requeue(self, nacked: list[Pending], delayed: bool) -> None:
        if delayed:
            self.delayed -= len(nacked)
        if not self.closed:  # a removed subscription drops them with the rest of its backlog
            self.backlog.extendleft(reversed(nacked))
            self.changed.set()

    def attach(self, credits: int) -> None:
        self.attached = True
        self.credits = credits

    def detach(self) -> None:
        """The stream ended: unacknowledged deliveries go back to the head of the backlog;
        sliced payloads are lost to this subscription (nothing holds them to redeliver)."""
        for delivery_id in sorted(self.unacked, reverse=True):
            pending = self.unacked.pop(delivery_id)
            pending.redeliveries += 1
            self.backlog.appendleft(pending)
        self.backlog = deque(self._unstreamed(self.backlog, "the subscription stream ended"))
        self.attached = False
        self.credits = 0

    @staticmethod
    def _unstreamed(pendings, reason: str) -> list[Pending]:
        """`pendings` without the sliced payloads, whose streams are aborted."""
        kept = []
        for pending in pendings:
            if pending.stream is None:
                kept.append(pending)
            else:
                pending.stream.abort(reason)
        return kept

    @property
    def depth(self) -> int:
        return len(self.backlog) + len(self.unacked) + self.delayed
