"""What a subscription has received and handed out (client/subscription.py's other half):
the inbox of deliveries not yet handed out, the readers waiting on it, the messages
handed out and not yet settled, and their settlements queued (client/acks.py).

Per delivery, only what the application needs is made: received deliveries
wait in a plain deque (one wakeup per message received, not per delivery) and become
`Message`s only when handed out; handed-out messages are kept in the order they went
(batch by batch, in delivery id order: the oldest unsettled one bounds the cumulative
ack) and settling one only marks it; a reader waits on a future of its own, woken by a
callback.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from itertools import repeat
from typing import Iterable

from echelon.client.acks import Settlements
from echelon.client.errors import ClientClosed, EchelonError, InvalidArgument, Timeout
from echelon.client.message import Message, event_of
from echelon.v1 import pubsub_pb2 as ppb

ACKED_MEMORY = 200_000  # message ids a durable subscription remembers having acked


class Stale:
    """What the messages handed out on a stream lost since are settled with: nothing goes
    to any agent (the new stream's ids are not theirs; the agent redelivers them), but a
    durable subscription remembers an ack, so the redelivery is not handed out again."""

    __slots__ = ("owner", "acked")

    def __init__(self, owner: "Inbox", acked: OrderedDict | None):
        self.owner = owner
        self.acked = acked

    def _settle(self, messages, nack_delay: float | None, term: bool = False) -> None:
        for m in messages:
            if not m.settled:
                m.settled = True
                if m._chunks is not None:
                    m._chunks.drop()
                if nack_delay is None and self.acked is not None:
                    self.acked[(m.producer_id, m.sequence)] = None


class Inbox:
    """The application's side of a subscription: its state as the application sees it
    (new, open, draining, closed; the error it ended with), the deliveries from received to
    settled, and the settlements queued for the stream. The stream's side (opening,
    reading, writing, reopening) is the Subscription's (client/subscription.py), which
    gives it a new `settlements` with each stream."""

    def __init__(self, settlements: Settlements, acked: OrderedDict[tuple[str, int], None] | None,
                 deadlines=None, dead_letters=None):
        self.settlements = settlements
        self._deadlines = deadlines  # ack deadlines of the messages handed out (client/deadlines.py), or None
        self._extended: dict[int, float] = {}  # delivery id -> its deadline, once `in_progress()` moved it
        self._dead_letters = dead_letters  # past max_deliveries: to the dead-letter topic (client/deadlines.py)
        # The stream's agent enforces the redelivery policy (agent/redelivery.py): term and
        # in_progress go to it, dead letters are its own; else client/deadlines.py stands in.
        self._enforced = False
        self._max_deliveries = dead_letters.max_deliveries if dead_letters is not None else 0
        self.expired = self.terminated = self.dead_lettered = 0
        # Durable: message ids acked through this client under this name, so a redelivery
        # after a failover is acked again, not handed out (client/durable.py).
        self._acked = acked
        self.acked_redeliveries = 0  # such redeliveries
        self._state = "new"  # new -> open -> draining -> closed
        self._error: EchelonError | None = None  # what the subscription ended with
        self._ended = asyncio.Event()  # no stream will come any more
        self._half_closed = False  # the stream's end is on its way: no more settlements
        self._loop: asyncio.AbstractEventLoop | None = None  # (asyncio.get_running_loop() costs a syscall per call)
        self._inbox: deque = deque()  # Deliveries (and _Incoming) received, not yet handed out
        self._waiters: list[asyncio.Future] = []  # readers waiting for the inbox (`_wake`)
        self._no_more = False  # nothing more comes into the inbox
        self._handed: deque[tuple[Message, ...]] = deque()  # the batches handed out, in id order (`_oldest`)
        self._unsettled = 0  # of those, not settled yet
        self._all_settled: asyncio.Future | None = None  # drain() waiting for `_unsettled` to reach 0

    def _receive(self, batch) -> None:
        """Deliveries (not chunks) received: into the inbox."""
        if self._acked is not None:
            batch = [d for d in batch if not self._acked_before(d)]
        if self._dead_letters is not None:
            batch = [d for d in batch if not self._dead_letters.dead(d)]
        self._inbox.extend(batch)
        self._wake()
        self.settlements.received()

    def _put(self, item) -> None:
        self._inbox.append(item)
        self._wake()
        self.settlements.received()

    def _lost(self, delivery_id: int) -> None:
        self.settlements.ack([delivery_id], self._credit(), handed=False)  # never handed out: its credit comes back

    def _acked_before(self, d: ppb.DeliveryRead) -> bool:
        """Acked by us before (durable): acked again, not handed out."""
        event = event_of(d)
        if (event.id.producer_id, event.id.sequence) not in self._acked:
            return False
        self.acked_redeliveries += 1
        self.settlements.ack([d.delivery_id], self._credit(), handed=False)
        return True

    def _credit(self) -> int:
        return 1 if self._state == "open" else 0  # draining: let nothing new in

    def _held(self) -> int:
        """Deliveries received and not settled (waiting, or handed out)."""
        return len(self._inbox) + self._unsettled

    def _oldest(self) -> int | None:
        """The delivery id of the oldest message handed out and not settled (None: none is)."""
        handed = self._handed
        while handed:
            for m in handed[0]:
                if not m.settled:
                    return m.delivery_id
            handed.popleft()  # settled, all of it
        return None

    async def _wait(self, timeout: float | None) -> None:
        """Until the inbox has something, or nothing more will come; Timeout after `timeout`.
        (A future of its own per reader, awaited as it is: an asyncio.Event's wait() and a
        wait_for() cost two coroutines per wakeup, and a wakeup comes per message received.)"""
        while not self._inbox and not self._no_more and self._state == "open":
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                if timeout is None:
                    await waiter
                else:
                    await asyncio.wait_for(waiter, timeout)
            except asyncio.TimeoutError:
                raise Timeout(f"no message within {timeout}s") from None
            finally:
                if waiter in self._waiters:  # not woken: timed out or cancelled
                    self._waiters.remove(waiter)

    def _wake(self) -> None:
        """The readers waiting in `_wait` look again."""
        waiters = self._waiters
        if waiters:
            self._waiters = []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _hand(self, most: int) -> list[Message]:
        """Up to `most` messages from the inbox, recorded as handed out; raises once the
        subscription is draining or closed, or the stream ended and the inbox is empty."""
        inbox = self._inbox
        if self._state != "open" or not inbox:
            if self._error is not None:
                raise self._error
            raise ClientClosed(f"subscription is {'closed' if self._state != 'open' else 'ended'}")
        if len(inbox) <= most:  # (the common case: all of it, each made in C's loop)
            batch = tuple(map(Message, inbox, repeat(self, len(inbox))))
            inbox.clear()
        else:
            pop = inbox.popleft
            batch = tuple([Message(pop(), self) for _ in range(most)])
        handed = self._handed
        if len(handed) > 2 * self._unsettled + 64:  # settled batches not yet dropped by `_oldest`
            self._oldest()
            handed = self._handed
            if len(handed) > 2 * self._unsettled + 64:  # held behind an old unsettled one
                handed = self._handed = deque(b for b in handed if not all(m.settled for m in b))
        handed.append(batch)  # kept as a tuple: the application may change its list
        self._unsettled += len(batch)
        return list(batch)

    def _settle(self, messages: Iterable[Message], nack_delay: float | None, term: bool = False) -> None:
        """Queue the settlement of each message not settled yet (client/acks.py writes them)."""
        messages = [m for m in messages if not m.settled]
        if not messages:
            return
        for m in messages:
            if m._subscription is not self:
                return self._settle_stale(messages, nack_delay, term)
        if self._half_closed or self._ended.is_set():
            raise ClientClosed("subscription is closed: the agent redelivers this message to a named subscription")
        ids = []
        for m in messages:
            if not m.settled:  # (a message given twice is settled once: one credit back)
                m.settled = True
                ids.append(m.delivery_id)
                if m._chunks is not None:
                    m._chunks.drop()  # and a nacked one is not redelivered: nothing holds a copy
        unsettled = self._unsettled = self._unsettled - len(ids)
        if not unsettled:  # every batch handed out is settled: let them go now
            self._handed.clear()
        credit, settlements = self._credit(), self.settlements
        if nack_delay is not None:
            for i in ids:
                settlements.nack(i, round(nack_delay * 1000), credit)
            if self._enforced and self._max_deliveries:  # the agent sends these to the dead-letter topic
                self.dead_lettered += sum(1 for m in messages if m.redelivery_count + 1 >= self._max_deliveries)
        else:
            acked = self._acked
            if acked is not None:
                for m in messages:
                    acked[(m.producer_id, m.sequence)] = None
                while len(acked) > ACKED_MEMORY:
                    acked.popitem(last=False)
            if term and self._enforced:
                settlements.term(ids, credit)
            else:
                settlements.ack(ids, credit)  # after the loop: the flush judged once, on what is no longer handed
        if not unsettled and self._all_settled is not None and not self._all_settled.done():
            self._all_settled.set_result(None)

    def _settle_stale(self, messages: list[Message], nack_delay: float | None, term: bool = False) -> None:
        """Some of `messages` came on a stream lost since (Stale): settled apart, the rest as usual."""
        rest = []
        for m in messages:
            owner = m._subscription
            if owner is self:
                rest.append(m)
            elif type(owner) is Stale and owner.owner is self:
                owner._settle((m,), nack_delay)
            else:
                raise InvalidArgument("a message of another subscription: settle it with its own")
        if rest:
            self._settle(rest, nack_delay, term)

    def _settled(self) -> asyncio.Future:
        """Done once no message handed out is unsettled."""
        if self._all_settled is None or self._all_settled.done():
            self._all_settled = asyncio.get_running_loop().create_future()
            if not self._unsettled:
                self._all_settled.set_result(None)
        return self._all_settled
