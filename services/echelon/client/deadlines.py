"""Dead messages on the client (docs/cli.md, "Dead messages"): an ack deadline per
subscription, `msg.in_progress()` to extend it, `msg.term()`, and `max_deliveries` with a
dead-letter topic.

The agents enforce all of it (agent/redelivery.py) and say so when a stream opens; the
SDK then sends `in_progress` and `term` and leaves dead letters to them
(`Subscription._enforce`). What runs here:

- With such an agent: `Deadlines` settles what the agent took back. A quarter of a
  deadline after the agent's (between 1.25 and 1.5 deadlines), a message still unsettled
  is nacked: the agent no longer has its id, so the nack only returns the credit (and if
  the agent were late, it is the same redelivery); the message is marked settled and
  counted (`expired`).
- With an older agent (no announcement), the fallback, as before the protocol had it:
  - ack deadline (default 60 s, as Google Pub/Sub's): a message handed out and not
    settled within it is nacked (no delay), so the agent redelivers it
    (`redelivery_count` + 1); settling the first copy later does nothing (it comes back
    between one and one and a quarter deadlines). `in_progress()` restarts it here. A
    payload streamed to `chunks()` has none (reading it may take longer than any deadline).
  - `term()`: acked, and counted (`terminated`).
  - `max_deliveries` (0: no bound): a message already delivered that many times
    (`redelivery_count` >= max_deliveries) is not handed out again: it is published to
    `dead_letter_topic` with its attributes, payload and ordering key, plus
    `dead_letter_deliveries` (how often it was delivered) and `dead_letter_subscription`,
    then acked (a topic with an empty schema takes those attributes). If the dead-letter
    publish fails the message is nacked and tried again later.
  A client that dies or hangs is covered by neither: that is why the agents enforce it.

Counted on the Subscription: `expired`, `terminated`, `dead_lettered`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from echelon.client.errors import EchelonError, InvalidArgument
from echelon.client.message import event_of
from echelon.contract.wire import attributes_from_pb
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
    """The ack deadlines of one subscription's messages handed out, kept without a cost per
    message: messages are handed out in delivery id order (client/inbox.py), so a mark
    (time, highest id handed out by then) taken every quarter deadline says which ids were
    out before a time. A sweep nacks the unsettled ones at or below the newest mark older
    than the deadline: a message comes back between one and one and a quarter deadlines."""

    def __init__(self, sub: "Subscription", seconds: float):
        self.sub = sub
        self.seconds = seconds
        self.late = 0.0  # of a deadline: how much later than the agent this one gives a message back
        self._marks: deque[tuple[float, int]] = deque()

    def clear(self) -> None:
        """The stream was lost: its ids mean nothing to the next one (its messages are Stale)."""
        self._marks.clear()

    async def run(self) -> None:
        tick = max(self.seconds / 4, 0.01)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            handed = self.sub._handed
            self._marks.append((now, handed[-1][-1].delivery_id if handed and handed[-1] else 0))
            bound = 0
            while self._marks and self._marks[0][0] <= now - self.seconds * (1 + self.late):
                bound = self._marks.popleft()[1]
            if bound:
                self._expire(now, bound)

    def _expire(self, now: float, bound: int) -> None:
        sub = self.sub
        if sub._half_closed or sub._ended.is_set():
            return  # the stream's end gives everything back anyway
        due = []
        for batch in list(sub._handed):
            if batch and batch[0].delivery_id > bound:
                break
            for m in batch:
                if m.delivery_id > bound or m.settled or m._chunks is not None or m._subscription is not sub:
                    continue
                extended = sub._extended.get(m.delivery_id)
                if extended is not None and extended > now:
                    continue
                due.append(m)
        if due:
            for m in due:
                sub._extended.pop(m.delivery_id, None)
            sub.expired += len(due)
            log.info("%d messages of subscription %r past their ack deadline: redelivered", len(due),
                     sub.name or sub._open.topic)
            sub._settle(due, 0.0)


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
    """Restart `m`'s ack deadline: here, and at an agent that enforces it (told with the next flush)."""
    sub = m._subscription
    deadlines = getattr(sub, "_deadlines", None)
    if deadlines is not None and not m.settled:
        sub._extended[m.delivery_id] = time.monotonic() + deadlines.seconds
        if sub._enforced and not sub._half_closed and not sub._ended.is_set():
            sub.settlements.in_progress(m.delivery_id)
