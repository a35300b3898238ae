"""Settlements on their way to the agent: delayed, cumulative acks.

As TCP's delayed ACK and AMQP's `multiple` ack: settling a message queues its ack and
returns; what is queued goes out in one write (the nacks, then one SubscriberAck: a
cumulative `through` up to the oldest message still handed out, the ids above it, and
the credits) when the first of these comes:

- a nack is queued: the application wants it back now;
- the settlements queued reach a quarter of the window (`max_outstanding`), or the
  agent's credits left (the window less what we hold: received, handed out, or settled
  and queued) fall under a quarter: so the agent never runs dry while we sit on acks (a
  window of 1-4 flushes every settlement at once);
- ACK_DELAY after the first settlement queued;
- `flush()`: the subscription closes (everything queued is written before the
  half-close), or the application asks.

On a shared stream (client/shared.py) one write carries the settlements of all its
subscriptions (`SubscribeRequest.batch`), whichever of them triggered it; while a write
is on its way the next settlements accumulate for the one after it.

Why these numbers: an ack message costs about what the delivery it answers costs
(the CPU of a gRPC message at each end), so one per delivery message doubled the subscriber
side's messages. Deliveries do not wait on acks while credits remain, so the delay
costs no latency; it only widens what a broken stream redelivers (at-least-once: an ack
in flight was never certain). A stream writes at most one timer flush per ACK_DELAY: 20
a second, whatever the rate.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

import grpc

from echelon.v1 import pubsub_pb2 as ppb

ACK_DELAY = 0.05  # seconds a settlement may wait for company
FLUSH_FRACTION = 4  # flush once a 1/FLUSH_FRACTION of the window is settled and unwritten


class Settlements:
    """One subscription's queued acks, nacks and credits (flushed by its stream's Flusher)."""

    def __init__(self, flusher: "Flusher", oldest: Callable[[], int | None], held: Callable[[], int], window: int,
                 sid: int = 0):
        self.flusher = flusher
        self._oldest = oldest  # the oldest delivery id still handed out (None: none)
        self._held = held  # deliveries received and not settled (waiting, or handed out)
        self.window = window
        self.threshold = max(1, window // FLUSH_FRACTION)
        self.sid = sid  # on a shared stream: the subscription's (client/shared.py)
        self.acks: list[int] = []  # handed out in id order: eligible for `through`
        self.loose: list[int] = []  # never handed out (their ids may pass ones not yet handed): by id only
        self.nacks: dict[int, list[int]] = {}  # delay in ms -> ids
        self.terms: list[int] = []  # never to be redelivered (an agent that takes `term`)
        self.progress: list[int] = []  # still being worked on: their ack deadlines start again
        self.credits = 0
        self.queued = 0

    def ack(self, delivery_ids: list[int], credit: int, handed: bool = True) -> None:
        """Queue acks (`credit` each): a batch's at once, judged for a flush once."""
        (self.acks if handed else self.loose).extend(delivery_ids)
        self._queue(credit, len(delivery_ids), urgent=False)

    def nack(self, delivery_id: int, delay_ms: int, credit: int) -> None:
        self.nacks.setdefault(delay_ms, []).append(delivery_id)
        self._queue(credit, 1, urgent=True)

    def term(self, delivery_ids: list[int], credit: int) -> None:
        self.terms.extend(delivery_ids)
        self._queue(credit, len(delivery_ids), urgent=False)

    def in_progress(self, delivery_id: int) -> None:
        """Not a settlement (no credit): written with the next flush, within ACK_DELAY."""
        self.progress.append(delivery_id)
        self.flusher.queued(self, False)

    def _queue(self, credit: int, n: int, urgent: bool) -> None:
        self.credits += credit * n
        self.queued += n
        self.flusher.queued(self, urgent or self.queued >= self.threshold or self._low())

    def _low(self) -> bool:
        """Has the agent under a quarter of the window left? (At most the window less what we hold.)"""
        return self.window - self._held() - self.queued < self.threshold

    def received(self) -> None:
        """Deliveries came: what they used of the agent's credits may make ours urgent."""
        if self.queued and self._low():
            self.flusher.queued(self, True)

    def cancel(self) -> None:
        """The subscription ended: what is queued is dropped (the agent redelivers it)."""
        self.acks, self.loose, self.nacks, self.credits, self.queued = [], [], {}, 0, 0
        self.terms, self.progress = [], []

    def take(self) -> list[ppb.SubscribeRequest]:
        """The requests for everything queued (nacks and terms first, so a cumulative ack
        cannot cover their ids), and the queue emptied."""
        acks, loose, nacks, credits, sid = self.acks, self.loose, self.nacks, self.credits, self.sid
        terms, progress = self.terms, self.progress
        self.cancel()
        requests = [ppb.SubscribeRequest(nack=ppb.SubscriberNack(delivery_ids=ids, delay_ms=delay, sid=sid))
                    for delay, ids in nacks.items()]
        if progress:
            requests.append(ppb.SubscribeRequest(in_progress=ppb.SubscriberProgress(delivery_ids=progress, sid=sid)))
        if terms:  # their credits go with the ack below (or alone)
            requests.append(ppb.SubscribeRequest(term=ppb.SubscriberTerm(delivery_ids=terms, sid=sid)))
        if acks or loose or credits:
            # Every id below the oldest message still handed out is settled (handed in id order).
            oldest = self._oldest()
            if oldest is None:  # none handed out is unsettled: the highest covers them all
                through, above = max(acks, default=0), loose
            else:
                through = max((i for i in acks if i < oldest), default=0)
                above = [i for i in acks if i > through] + loose
            requests.append(ppb.SubscribeRequest(ack=ppb.SubscriberAck(
                delivery_ids=above, credits=credits, through=through, sid=sid)))
        return requests


class Flusher:
    """When a stream's queued settlements are written: one write for every subscription
    of the stream with something queued."""

    def __init__(self, write: Callable[[list[ppb.SubscribeRequest]], Awaitable[None]], delay: float = ACK_DELAY):
        self._write = write  # writes the requests in order; raises if the stream has ended
        self.delay = delay
        self.writes = 0  # writes made: what the tests and benchmarks count
        self._pending: dict[Settlements, None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # (get_running_loop() costs a syscall per call)

    def queued(self, settlements: Settlements, now: bool) -> None:
        self._pending[settlements] = None
        if now:
            self._start()
        elif self._timer is None and self._flushing is None:
            self._timer = self._running().call_later(self.delay, self._start)

    def _start(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flushing is None and self._pending:
            self._flushing = self._running().create_task(self._flush())

    def _running(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    async def flush(self) -> None:
        """Write everything queued now (and wait for it)."""
        self._start()
        while self._flushing is not None:
            await asyncio.gather(self._flushing, return_exceptions=True)

    def cancel(self) -> None:
        """The stream ended: what is queued is dropped (the agent redelivers it)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for s in self._pending:
            s.cancel()
        self._pending.clear()

    async def _flush(self) -> None:
        """Write what is queued until nothing is: the settlements given while a write was
        on its way go in the next. A write that fails means the stream ended: next() and
        wait_closed() report how, and the agent redelivers what was not acked."""
        try:
            while self._pending:
                pending, self._pending = self._pending, {}
                requests = [r for s in pending for r in s.take()]
                if requests:
                    self.writes += 1
                    await self._write(requests)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            self.cancel()
        finally:
            self._flushing = None
