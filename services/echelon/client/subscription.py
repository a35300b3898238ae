"""Subscribing: an async iterator of `Message`s, or a callback with flow control.

    async with client.subscribe("quotes", 'Symbol = "aapl" and High >= 45') as sub:
        async for msg in sub:
            print(msg.attributes)
            await msg.ack()                 # or: await msg.nack(delay=5.0)

    async def handle(msg):                  # returns: acked; raises: nacked
        await store(msg.payload)

    async with client.subscribe("quotes", "", name="store", callback=handle, max_outstanding=16) as sub:
        await sub.wait_closed()             # until client.drain() or an error

A payload above `max_whole` bytes is handed out as soon as it starts, to be read as it
arrives (never held whole, here or on any agent):

    async for msg in sub:
        with open(path, "wb") as f:
            async for chunk in msg.chunks():   # raises DataLoss if it was lost mid-way
                f.write(chunk)
        await msg.ack()

Smaller payloads are assembled here and handed whole (`msg.payload`; `chunks()` gives
it in one piece). Reading is flow-controlled: `CHUNKS_AHEAD` chunks wait here, then the
stream stops and the agents' windows hold the publisher back. So read a message's
chunks (or settle it: the rest is then read and dropped) before waiting for the next.

Flow control (as Google Pub/Sub's): the agent never has more than `max_outstanding`
deliveries unsettled (the stream's credits: one comes back per ack or nack), and the
callback form never runs more than `max_outstanding` callbacks at once. Beside that
message bound, `max_outstanding_bytes` bounds the bytes of the deliveries received and not
settled: while they hold more, settling one returns no credit (it is withheld, and goes
back with the settlement that brings them under the bound), so the agent stops sending and
the subscription lags there (docs/guarantees.md, "Flow control"). What the agent's credits
left let through can still come: the bytes held stay under the bound plus `max_outstanding`
messages. A named
subscription (`name=`) outlives its stream: whatever was not acked when it closed is
redelivered to the next stream with that name (`redelivery_count` + 1).

Batching: the agent sends many deliveries per message, and an application
may take them many at a time and settle them in one call:

    async for batch in sub.batches(max_messages=256):   # what has arrived, at least one
        store([m.payload for m in batch])
        await sub.ack(batch)                             # or: await sub.nack(batch, delay=5.0)

Acks are delayed and cumulative (client/acks.py: one write for many, flushed by a
timer, a quarter of the window, a nack, or close()); `ack()` queues and returns.
Received deliveries wait in a plain deque (one wakeup per message received, not per
delivery) and become `Message`s (client/message.py) only when handed out (the inbox,
from received to settled: client/inbox.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator, Awaitable, Callable, Iterable

import grpc

from echelon.client.acks import Flusher, Settlements
from echelon.client.callbacks import dispatch
from echelon.client.connection import Connection, ConnectionEvent, Outage
from echelon.client.deadlines import ACK_DEADLINE, DeadLetters, Deadlines
from echelon.client.deadlines import check as check_dead_messages
from echelon.client.inbox import Inbox, Stale
from echelon.client.errors import (ClientClosed, EchelonError, FailedPrecondition, InvalidArgument,
                                   Timeout, Unavailable, from_rpc_error, from_status)
from echelon.client.message import Message, Sliced, check_delay, subscribe_call
from echelon.client.shared import SharedStream
from echelon.contract.filters import Disjunction, Filter
from echelon.contract.transport import REDELIVERY_KEY, SUBSCRIPTION_KEY
from echelon.contract.wire import filter_to_pb
from echelon.v1 import pubsub_pb2 as ppb

log = logging.getLogger("echelon.client")

MAX_WHOLE = 64 << 20  # payloads up to this are assembled and handed whole
MAX_OUTSTANDING_BYTES = 64 << 20  # received and unsettled, past which credits are withheld (the agent's default bound)
MAX_BATCH = 256  # messages handed out by one receive() unless asked otherwise
OPEN_WAIT = 10.0  # seconds one reopen attempt may take before the next agent is tried

# A stream that ended with one of these is opened again (when the subscription reconnects):
# its agent died or is going away. A durable subscription also reopens after a seek
# (ABORTED), and while the agents still see it attached to the stream that was lost
# (ALREADY_EXISTS, on an open).
LOST = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNKNOWN}
LOST_DURABLE = LOST | {grpc.StatusCode.ABORTED}
REFUSED_DURABLE = LOST_DURABLE | {grpc.StatusCode.ALREADY_EXISTS}

Callback = Callable[["Message"], "Awaitable[None] | None"]


class Subscription(Inbox):
    """A subscription stream, made by `Client.subscribe()`; `async with` opens and closes it."""

    def __init__(self, conn: Connection, topic: str, flt: str | Filter, name: str, max_outstanding: int,
                 callback: Callback | None, durable: ppb.DurableOptions | None = None, max_whole: int = MAX_WHOLE,
                 shared: bool = False, reconnect: bool = False, ack_deadline: float = ACK_DEADLINE,
                 max_deliveries: int = 0, dead_letter_topic: str = "", evict: bool = False,
                 max_outstanding_bytes: int = MAX_OUTSTANDING_BYTES):
        if max_outstanding < 1:
            raise InvalidArgument(f"max_outstanding {max_outstanding}: at least 1")
        if max_outstanding_bytes < 0:
            raise InvalidArgument(f"max_outstanding_bytes {max_outstanding_bytes}: at least 0 (0: no byte bound)")
        self._bytes = _HeldBytes(max_outstanding_bytes) if max_outstanding_bytes else None
        if max_whole < 0:
            raise InvalidArgument(f"max_whole {max_whole}: at least 0")
        check_dead_messages(ack_deadline, max_deliveries, dead_letter_topic)
        self.max_whole = max_whole
        self._conn = conn
        self.name = name
        self.max_outstanding = max_outstanding
        self.callback_errors = 0  # callbacks that raised (their messages were nacked)
        self.reconnect = reconnect  # open the stream again when its agent is lost (client/connection.py)
        self.reconnects = 0  # streams opened again after one was lost
        self.gaps: list[tuple[float, float]] = []  # (lost, reopened), Unix seconds: events may be missing there
        open_ = ppb.SubscriptionOpen(topic=topic, subscription=name, credits=max_outstanding, durable=durable,
                                     encoded_events=True, batched_deliveries=True, evict=evict,
                                     redelivery=ppb.RedeliveryPolicy(
                                         ack_deadline_ms=round(ack_deadline * 1000), no_ack_deadline=not ack_deadline,
                                         max_deliveries=max_deliveries, dead_letter_topic=dead_letter_topic))
        if isinstance(flt, (Filter, Disjunction)):  # a parsed filter: its structured form
            open_.filter.CopyFrom(filter_to_pb(flt))
        else:
            open_.filter_text = flt
        self._open = open_
        self.id = ""  # cluster-wide ("<agent>/<name>"), once open
        self._callback = callback
        self._write = asyncio.Lock()  # one write at a time on a stream
        self._shared: SharedStream | None = None  # set once open on the client's shared stream
        self._share = shared and durable is None
        self._agent = 0  # the index, in the client's list, of the agent the stream runs through
        super().__init__(self._new_settlements(Flusher(self._write_requests)),
                         conn.acked(name) if durable is not None else None,
                         Deadlines(self, ack_deadline) if ack_deadline else None,
                         DeadLetters(self, max_deliveries, dead_letter_topic) if max_deliveries else None)
        self._fallback = self._dead_letters  # client-side dead letters, for an agent that does not enforce them
        self._sliced = Sliced(max_whole, self._put, self._lost)  # sliced payloads being received
        self._callbacks: set[asyncio.Task] = set()
        self._call = None
        self._tasks: list[asyncio.Task] = []
        self._reopening: asyncio.Task | None = None
        self._lost_while_opening: EchelonError | None = None  # a stream that `_reopen` opened, lost at once
        self._starting: asyncio.Task | None = None  # a callback subscription opening by itself
        self._start_awaited = False

    def _new_settlements(self, flusher: Flusher, sid: int = 0) -> Settlements:
        """A new stream's: its credits start at `max_outstanding`, and nothing is held on it yet."""
        if self._bytes is None:
            return Settlements(flusher, self._oldest, self._held, self.max_outstanding, sid)
        self._bytes.clear()
        return _ByteSettlements(self._bytes, flusher, self._oldest, self._held, self.max_outstanding, sid)

    def _receive(self, batch) -> None:
        held = self._bytes
        if held is not None:
            held.received(batch)
        super()._receive(batch)

    @property
    def held_bytes(self) -> int:
        """Bytes of the deliveries received on this stream and not settled (0 without a byte bound)."""
        return self._bytes.held if self._bytes is not None else 0

    async def __aenter__(self) -> "Subscription":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def start(self) -> None:
        """Open the stream; raises InvalidArgument (bad filter), NotFound (no such topic), ...
        A callback subscription made inside a running loop is already opening: this waits
        for it (and raises how it failed)."""
        if self._starting is not None:
            self._start_awaited = True
            await asyncio.shield(self._starting)
            return
        await self._start()

    def _start_soon(self) -> None:
        """Open in the background (a callback subscription delivers without a second call);
        a failure nobody awaits is logged and ends the subscription with it (wait_closed)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: `async with` or start() opens it
        self._starting = loop.create_task(self._start(), name="subscription start")
        self._starting.add_done_callback(self._started)

    def _started(self, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is None:
            return
        e = task.exception()
        if isinstance(e, EchelonError) and self._error is None:
            self._error = e
        if not self._start_awaited and not isinstance(e, ClientClosed):
            log.error("subscription to %r could not open: %s", self._open.topic, e)

    async def _start(self) -> None:
        if self._state != "new":
            raise FailedPrecondition(f"subscription is {self._state}")
        self._conn.check_open()
        self._conn.track(self)
        self._state = "open"
        try:
            # A durable subscription fails over to the next agents while they are
            # unreachable (any agent serves it).
            await self._open_stream(self._conn.current, len(self._conn.addresses) if self._acked is not None else 1)
        except BaseException:
            self._state = "closed"
            self._ended.set()
            self._conn.forget(self)
            raise
        self._read_stream()
        if self._deadlines is not None:
            self._tasks.append(asyncio.create_task(self._deadlines.run(), name="subscription ack deadlines"))
        if self._callback is not None:
            self._tasks.append(asyncio.create_task(dispatch(self, self._callback), name="subscription callbacks"))

    def _read_stream(self) -> None:
        """Reads run in their own task: cancelling a pending read would cancel the RPC,
        so `next(timeout=...)` waits on the inbox instead. (A shared stream has its reader.)"""
        if self._shared is None:
            self._tasks.append(asyncio.create_task(self._read(self._call), name="subscription reader"))

    async def _open_stream(self, first: int, tries: int) -> None:
        """Open on agent `first` of the client's list (a shared subscription: on the
        client's shared stream), then the next ones while they are unreachable."""
        for k in range(tries):
            try:
                if self._share:
                    return await self._open_shared()
                return await self._open_on(first + k)
            except Unavailable:
                self._conn.failed(self._agent)
                if k == tries - 1:
                    raise

    async def _open_shared(self) -> None:
        stream = self._shared = SharedStream.of(self._conn)
        self._agent = stream.index
        sid = stream.sid()
        self.settlements = self._new_settlements(stream.flusher, sid)
        try:
            self.id = await stream.open(self, self._open, sid)
        except BaseException:
            self._shared = None
            raise
        self._enforce(stream.enforced)

    async def _open_on(self, i: int) -> None:
        self._agent = i % len(self._conn.addresses)
        call = self._call = subscribe_call(self._conn.channel(i), self._conn.compress)
        self._half_closed = False
        self.settlements = self._new_settlements(Flusher(self._write_requests))
        try:
            await call.write(ppb.SubscribeRequest(open=self._open))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # refused before our write went out: the call's status says why
        # The agent sends headers once the subscription is registered; a refusal
        # (bad filter, unknown topic) ends the call without them.
        metadata = dict(await call.initial_metadata() or ())
        if SUBSCRIPTION_KEY in metadata:
            self.id = metadata[SUBSCRIPTION_KEY]
            self._enforce(REDELIVERY_KEY in metadata)
            if self._acked is not None:  # a seek moved what is owed: acked messages may come again
                self._conn.seen_seeks(self.name, metadata.get("x-echelon-seeks", ""))
            return
        code = await call.code()
        if code == grpc.StatusCode.OK:
            raise Unavailable("subscription stream ended before it was opened")
        raise from_status(code, await call.details() or "", {k: v for k, v in await call.trailing_metadata() or ()})

    def _enforce(self, announced: bool) -> None:
        """This stream's agent enforces the redelivery policy (it said so when the stream
        opened): dead letters are its job, and this client's deadlines only settle, a
        quarter of a deadline after the agent's, what the agent took back (a nack of an id
        it no longer has just returns the credit). Else client/deadlines.py enforces both."""
        self._enforced = announced
        self._dead_letters = None if announced else self._fallback
        if self._deadlines is not None:
            self._deadlines.late = 0.25 if announced else 0.0

    async def next(self, timeout: float | None = None) -> Message:
        """The next message; Timeout after `timeout` seconds (the stream stays open).
        Raises ClientClosed once the subscription is draining or closed, or the error
        the stream ended with (e.g. ResourceExhausted past the agent's backlog bound)."""
        return (await self.receive(1, timeout))[0]

    async def receive(self, max_messages: int = MAX_BATCH, timeout: float | None = None) -> list[Message]:
        """The messages received by now, up to `max_messages`; waits for the first (Timeout
        after `timeout` seconds). Raises as next() does."""
        if self._callback is not None:
            raise FailedPrecondition("this subscription hands its messages to its callback")
        if max_messages < 1:
            raise InvalidArgument(f"max_messages {max_messages}: at least 1")
        await self._wait(timeout)
        return self._hand(max_messages)

    async def batches(self, max_messages: int = MAX_BATCH) -> AsyncIterator[list[Message]]:
        """receive() until the subscription is draining or closed (then it ends; an error
        the stream ended with is raised)."""
        if self._callback is not None:
            raise FailedPrecondition("this subscription hands its messages to its callback")
        if max_messages < 1:
            raise InvalidArgument(f"max_messages {max_messages}: at least 1")
        while True:
            if not self._inbox:
                await self._wait(None)
            try:
                batch = self._hand(max_messages)
            except ClientClosed:
                return
            yield batch

    async def ack(self, messages: Iterable[Message]) -> None:
        """Settle many messages of this subscription in one call, as each one's `ack()`."""
        self._settle(messages, None)

    async def nack(self, messages: Iterable[Message], delay: float = 0.0) -> None:
        """As each one's `nack(delay)`."""
        self._settle(messages, check_delay(delay))

    async def flush(self) -> None:
        """Write the settlements queued by now (acks are delayed: client/acks.py) and wait
        for the write: the agent applies them before anything written later on the stream."""
        if not self._ended.is_set():
            await self.settlements.flusher.flush()

    def __aiter__(self):
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.next()
        except ClientClosed:
            raise StopAsyncIteration from None

    async def wait_closed(self) -> None:
        """Until the stream ends; raises the error it ended with, if any."""
        if self._starting is not None:
            await asyncio.gather(self._starting, return_exceptions=True)
        await self._ended.wait()
        if self._error is not None:
            raise self._error

    async def drain(self, timeout: float | None = None) -> None:
        """Hand out nothing more, wait until every message handed out is settled (and every
        callback returned), then close. What was received but not handed out goes back to
        the agent (a named subscription redelivers it). Timeout if `timeout` runs out first."""
        if self._state != "open":
            await self.close()
            return
        self._state = "draining"  # from here on acks give no credit back
        self._wake()  # waiting readers see it
        waits = [self._settled() if self._unsettled else None, *self._callbacks]
        waits = [w for w in waits if w is not None]
        late = set()
        if waits:
            _, late = await asyncio.wait(waits, timeout=timeout)
            for w in late:
                w.cancel()
        await self.close()
        if late:
            raise Timeout(f"subscription {self.name or self._open.topic!r}: {self._unsettled} messages "
                          f"unsettled after {timeout}s (they will be redelivered to a named subscription)")

    async def close(self) -> None:
        """End the stream now: callbacks are cancelled, acks already given are applied, and
        every unacked message goes back to the agent."""
        if self._starting is not None and not self._starting.done():
            self._start_awaited = True
            await asyncio.gather(self._starting, return_exceptions=True)  # (an open is not cut half-way)
        if self._state == "closed":
            return
        self._state = "closed"
        self._conn.forget(self)
        self._wake()
        if self._reopening is not None:
            self._reopening.cancel()
            await asyncio.gather(self._reopening, return_exceptions=True)
        for task in list(self._callbacks):
            task.cancel()
        await asyncio.gather(*self._callbacks, return_exceptions=True)
        if self._shared is not None and not self._ended.is_set():
            await self.flush()  # acks already given are written before the close
            self._half_closed = True
            await self._shared.close(self.settlements.sid)
        elif self._call is not None and not self._ended.is_set():
            await self.flush()  # acks already given are written before the half-close
            async with self._write:
                self._half_closed = True
                try:
                    await self._call.done_writing()
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    pass  # already ended
            try:  # the agent ends the stream once it has read the half-close
                await asyncio.wait_for(self._ended.wait(), 5.0)
            except asyncio.TimeoutError:
                self._call.cancel()
        self.settlements.cancel()
        if self._shared is None:
            self.settlements.flusher.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._fallback is not None:
            await self._fallback.close()
        if not self._ended.is_set():  # closed while no stream was open (reconnecting)
            self._finish(None)

    # -- internals ---------------------------------------------------------------------

    async def _read(self, call) -> None:
        """A stream of its own: what comes, into the inbox."""
        error = None
        try:
            async for delivery in call:
                if delivery.code and not delivery.delivery_id:  # the stream's status, in-band
                    error = from_status(delivery.code, delivery.error)
                    break
                if delivery.chunked or delivery.delivery_id in self._sliced:  # never in a batch
                    await self._sliced.receive(delivery)
                else:
                    self._receive(delivery.batch or (delivery,))
        except grpc.aio.AioRpcError as e:
            error = from_rpc_error(e)
        finally:
            if call is self._call:  # (a stream lost and replaced meanwhile says nothing more)
                self._finish(error)

    def _finish(self, error: EchelonError | None, final: bool = False) -> None:
        """The stream ended (a shared one: this subscription's part of it), with `error` or
        not: the subscription ends, or opens a new stream when its agent was lost."""
        if not final and self._reopening is not None and not self._reopening.done():
            # A stream being opened by `_reopen` ended: the open raises, or `_reopen` sees this.
            self._lost_while_opening = error or Unavailable("the agent ended the subscription stream")
            return
        if not final and self._state == "open" and self.reconnect and self._conn.state == "open" and not self._half_closed \
                and (error is None or error.code in (LOST if self._acked is None else LOST_DURABLE)):
            self._stream_lost(error or Unavailable("the agent ended the subscription stream"))
            return
        if error is not None and self._state != "closed":
            self._error = error
        self._ended.set()
        self.settlements.cancel()
        if self._shared is None:
            self.settlements.flusher.cancel()
        self._no_more = True
        self._wake()

    def _stream_lost(self, error: EchelonError) -> None:
        """Forget the lost stream (its delivery ids mean nothing to another) and open a new
        one. Messages handed out and not settled stay the application's: settling them
        sends nothing (the agent redelivers them; a durable subscription remembers the
        acks, so what was acked is not handed out again). What was received and not
        handed out is dropped: redelivered to a durable subscription, part of the gap of
        another."""
        self._forget_stream(error)
        self._reopening = asyncio.ensure_future(self._reopen(error))

    def _forget_stream(self, error: EchelonError) -> None:
        self.settlements.cancel()
        if self._shared is None:
            self.settlements.flusher.cancel()
        self._call, self._shared = None, None
        self._extended.clear()
        if self._deadlines is not None:
            self._deadlines.clear()
        stale = Stale(self, self._acked)
        for batch in self._handed:
            for m in batch:
                if not m.settled:
                    m._subscription = stale
        self._handed.clear()
        self._unsettled = 0
        self._inbox.clear()
        self._sliced.abandon(error)
        if self._all_settled is not None and not self._all_settled.done():
            self._all_settled.set_result(None)

    async def _reopen(self, error: EchelonError) -> None:
        """Open the stream again, on the agents of the client's list in turn, waiting more
        between attempts (the client's Reconnect); the subscription ends with the last
        error when the policy gives up or an agent refuses it for good."""
        conn, gap = self._conn, self._acked is None
        lost_at, lost = self._agent, time.time()
        conn.failed(lost_at)
        conn.notify(ConnectionEvent("disconnected", self, conn.address(lost_at), error, gap=gap))
        outage = Outage(conn)
        refusals = LOST if gap else REFUSED_DURABLE
        while await outage.next_attempt():
            if self._state != "open" or conn.state != "open":
                return
            self._lost_while_opening = None
            try:
                await asyncio.wait_for(self._open_stream(conn.current, 1), OPEN_WAIT)
            except asyncio.TimeoutError:
                error = Unavailable(f"{conn.address(self._agent)} did not open the subscription in {OPEN_WAIT:g}s")
                if self._call is not None:
                    self._call.cancel()
                self._call = None
                conn.failed(self._agent)
                continue
            except EchelonError as e:
                error = e
                if e.code in refusals:
                    continue
                break
            if self._lost_while_opening is not None:  # opened, and lost before this task went on
                error = self._lost_while_opening
                self._forget_stream(error)
                conn.failed(self._agent)
                continue
            self.reconnects += 1
            if gap:
                self.gaps.append((lost, time.time()))
            self._read_stream()
            self._wake()
            conn.notify(ConnectionEvent("reconnected", self, conn.address(self._agent), attempts=outage.attempts,
                                        down_seconds=outage.seconds, gap=gap))
            return
        self._reopening = None
        self._finish(final=True, error=error if error.code not in LOST_DURABLE else
                     Unavailable(f"subscription {self.name!r} lost its agent and was not reopened after "
                                 f"{outage.attempts - 1} attempts: {error.message}"))

    async def _write_requests(self, requests: list[ppb.SubscribeRequest]) -> None:
        async with self._write:
            if self._half_closed:
                raise asyncio.InvalidStateError("the stream is half-closed")
            for req in requests:
                await self._call.write(req)


class _HeldBytes:
    """A stream's deliveries received and not settled, by size, and the credits withheld."""

    __slots__ = ("max", "held", "sizes", "withheld")

    def __init__(self, max_bytes: int):
        self.max = max_bytes
        self.clear()

    def clear(self) -> None:
        self.held, self.sizes, self.withheld = 0, {}, 0

    def received(self, batch) -> None:
        sizes = self.sizes
        for d in batch:
            n = sizes[d.delivery_id] = d.ByteSize()
            self.held += n

    def grant(self, delivery_ids, credit: int) -> int:
        """Settled: the credits that go back now (none while still past the bound; those withheld too once under)."""
        pop = self.sizes.pop
        self.held -= sum(pop(i, 0) for i in delivery_ids)
        n = credit * len(delivery_ids)
        if not credit:
            return 0  # draining: nothing new comes in
        if self.held > self.max:
            self.withheld += n
            return 0
        n, self.withheld = n + self.withheld, 0
        return n


class _ByteSettlements(Settlements):
    """Settlements whose credits the byte bound may withhold (`_HeldBytes.grant`)."""

    def __init__(self, held: _HeldBytes, *args):
        super().__init__(*args)
        self.held_bytes = held

    def ack(self, delivery_ids: list[int], credit: int, handed: bool = True) -> None:
        granted = self.held_bytes.grant(delivery_ids, credit)
        super().ack(delivery_ids, 0, handed)
        self.credits += granted

    def nack(self, delivery_id: int, delay_ms: int, credit: int) -> None:
        granted = self.held_bytes.grant((delivery_id,), credit)
        super().nack(delivery_id, delay_ms, 0)
        self.credits += granted
