"""Dead messages, as the client enforces them (docs/cli.md, "Dead messages"): an ack
deadline per subscription, `msg.in_progress()` to extend it, `msg.term()`, and
`max_deliveries` with a dead-letter topic.

- Ack deadline (default 60 s, as Google Pub/Sub's): a message handed out and not
  settled within it is nacked (no delay), so the agent redelivers it (`redelivery_count`
  + 1) instead of it waiting behind a stuck callback until the stream ends; settling
  the first copy later does nothing. `in_progress()` restarts its deadline. A payload
  streamed to `chunks()` has none (reading it may take longer than any deadline).
- `term()`: processed never, redelivered never: acked, and counted (`terminated`).
- `max_deliveries` (0: no bound): a message already delivered that many times
  (`redelivery_count` >= max_deliveries) is not handed out again: it is published to
  `dead_letter_topic` with its attributes, payload and ordering key, plus
  `dead_letter_deliveries` (how often it was delivered) and `dead_letter_subscription`,
  then acked (a topic with an empty schema takes those attributes). If the dead-letter
  publish fails the message is nacked and tried again later.

Counted on the Subscription: `expired`, `terminated`, `dead_lettered`.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from typing import TYPE_CHECKING

from echelon.client.errors import EchelonError, InvalidArgument
from echelon.client.message import event_of
from echelon.runtime.wire import attributes_from_pb
from echelon.v1 import pubsub_pb2 as ppb

if TYPE_CHECKING:
    from echelon.client.message import Message
    from echelon.client.subscription import Subscription

log = logging.getLogger("echelon.client")

ACK_DEADLINE = 60.0  # seconds, as Google Pub/Sub's default
RETRY_DEAD_LETTER_MS = 5000  # a failed dead-letter publish: the message comes back after this


def check(ack_deadline: float, max_deliveries: int, dead_letter_topic: str) -> None:
    if ack_deadline < 0:
        raise InvalidArgument(f"ack_deadline {ack_deadline}: 0 (none) or more seconds")
    if max_deliveries < 0:
        raise InvalidArgument(f"max_deliveries {max_deliveries}: 0 (no bound) or more")
    if max_deliveries and not dead_letter_topic:
        raise InvalidArgument("max_deliveries needs a dead_letter_topic for the messages past it")


class Deadlines:
    """The ack deadlines of one subscription's messages handed out: a heap of (when, batch),
    swept by a task that sleeps until the earliest."""

    def __init__(self, sub: "Subscription", seconds: float):
        self.sub = sub
        self.seconds = seconds
        self._heap: list = []
        self._order = itertools.count()  # ties: batches are never compared
        self._changed: asyncio.Event | None = None

    def handed(self, batch: tuple) -> None:
        heapq.heappush(self._heap, (time.monotonic() + self.seconds, next(self._order), batch))
        if len(self._heap) == 1 and self._changed is not None:
            self._changed.set()

    def clear(self) -> None:
        """The stream was lost: its messages are the Stale ones now (client/inbox.py)."""
        self._heap.clear()

    async def run(self) -> None:
        self._changed = asyncio.Event()
        while True:
            if not self._heap:
                self._changed.clear()
                await self._changed.wait()
                continue
            wait = self._heap[0][0] - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            self._expire(time.monotonic())

    def _expire(self, now: float) -> None:
        if self.sub._half_closed or self.sub._ended.is_set():
            self._heap.clear()  # the stream's end gives everything back anyway
            return
        due = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, batch = heapq.heappop(heap)
            for m in batch:
                if m.settled or m._chunks is not None:
                    continue
                if m._subscription is not self.sub:  # (a stale one: its stream is gone)
                    continue
                extended = self.sub._extended.get(m.delivery_id)
                if extended is not None and extended > now:
                    heapq.heappush(heap, (extended, next(self._order), (m,)))
                    continue
                due.append(m)
        if due:
            for m in due:
                self.sub._extended.pop(m.delivery_id, None)
            self.sub.expired += len(due)
            log.info("%d messages of subscription %r past their ack deadline: redelivered", len(due),
                     self.sub.name or self.sub._open.topic)
            self.sub._settle(due, 0.0)


class DeadLetters:
    """Messages delivered `max_deliveries` times, on their way to the dead-letter topic."""

    def __init__(self, sub: "Subscription", max_deliveries: int, topic: str):
        self.sub = sub
        self.max_deliveries = max_deliveries
        self.topic = topic
        self._publisher = None
        self._tasks: set[asyncio.Task] = set()

    def dead(self, d: ppb.DeliveryRead) -> bool:
        """Is `d` past the bound? Then it goes to the dead-letter topic, not the application."""
        if d.redelivery_count < self.max_deliveries:
            return False
        task = asyncio.ensure_future(self._send(d, self.sub.settlements))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _send(self, d: ppb.DeliveryRead, settlements) -> None:
        sub = self.sub
        event = event_of(d)
        attributes = dict(attributes_from_pb(event.attributes))
        attributes["dead_letter_deliveries"] = d.redelivery_count
        attributes["dead_letter_subscription"] = sub.name or sub._open.topic
        try:
            if self._publisher is None:
                from echelon.client.publisher import AckLevel, Publisher

                self._publisher = Publisher(sub._conn, f"dead-letters-{id(self):x}", AckLevel.DELIVERED)
            await self._publisher.publish(self.topic, attributes, event.payload, event.ordering_key)
        except EchelonError as e:
            log.error("dead-letter publish to %r failed (%s): the message comes back later", self.topic, e)
            if settlements is sub.settlements:  # the same stream: its ids still mean this message
                settlements.nack(d.delivery_id, RETRY_DEAD_LETTER_MS, sub._credit())
            return
        if settlements is sub.settlements:
            sub.dead_lettered += 1
            settlements.ack([d.delivery_id], sub._credit(), handed=False)

    async def close(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._publisher is not None:
            await self._publisher.close(5.0)


def in_progress(m: "Message") -> None:
    """Restart `m`'s ack deadline (no message to the agent: the deadline is the client's)."""
    sub = m._subscription
    deadlines = getattr(sub, "_deadlines", None)
    if deadlines is not None and not m.settled:
        sub._extended[m.delivery_id] = time.monotonic() + deadlines.seconds
