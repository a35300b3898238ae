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
callback form never runs more than `max_outstanding` callbacks at once. A named
subscription (`name=`) outlives its stream: whatever was not acked when it closed is
redelivered to the next stream with that name (`redelivery_count` + 1).

Batching (issue 12): the agent sends many deliveries per message, and an application
may take them many at a time and settle them in one call:

    async for batch in sub.batches(max_messages=256):   # what has arrived, at least one
        store([m.payload for m in batch])
        await sub.ack(batch)                             # or: await sub.nack(batch, delay=5.0)

Acks are delayed and cumulative (client/acks.py: one write for many, flushed by a
timer, a quarter of the window, a nack, or close()); `ack()` queues and returns.
Received deliveries wait in a plain deque (one wakeup per message received, not per
delivery) and become `Message`s (client/message.py) only when handed out (the inbox,
from received to settled: client/inbox.py). Measured
(loadtest.bench_hotpath --cluster 5 --selectivity 20, main against this tree in one
run): the load generator, whose 50 subscribers take batches, spent 1.70x less CPU per
1,000 events at saturation, 1.42x less at 1,000 events/s.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import TYPE_CHECKING, AsyncIterator, Awaitable, Callable, Iterable

import grpc

from echelon.client.acks import Flusher, Settlements
from echelon.client.callbacks import dispatch
from echelon.client.inbox import Inbox
from echelon.client.errors import (ClientClosed, EchelonError, FailedPrecondition, InvalidArgument,
                                   Timeout, Unavailable, from_rpc_error, from_status)
from echelon.client.message import Message, Sliced, check_delay, subscribe_call
from echelon.client.shared import SharedStream
from echelon.core.filters import Disjunction, Filter
from echelon.runtime.transport import SUBSCRIPTION_KEY
from echelon.runtime.wire import filter_to_pb
from echelon.v1 import pubsub_pb2 as ppb

if TYPE_CHECKING:
    from echelon.client.client import Client

MAX_WHOLE = 64 << 20  # payloads up to this are assembled and handed whole
MAX_BATCH = 256  # messages handed out by one receive() unless asked otherwise

Callback = Callable[["Message"], "Awaitable[None] | None"]

class Subscription(Inbox):
    """A subscription stream, made by `Client.subscribe()`; `async with` opens and closes it."""

    def __init__(self, client: "Client", topic: str, flt: str | Filter, name: str, max_outstanding: int,
                 callback: Callback | None, durable: ppb.DurableOptions | None = None, max_whole: int = MAX_WHOLE,
                 shared: bool = False):
        if max_outstanding < 1:
            raise InvalidArgument(f"max_outstanding {max_outstanding}: at least 1")
        if max_whole < 0:
            raise InvalidArgument(f"max_whole {max_whole}: at least 0")
        self.max_whole = max_whole
        self._sliced = Sliced(max_whole, self._put, self._lost)  # sliced payloads being received
        self.client = client
        self.name = name
        self.max_outstanding = max_outstanding
        self.callback_errors = 0  # callbacks that raised (their messages were nacked)
        open_ = ppb.SubscriptionOpen(topic=topic, subscription=name, credits=max_outstanding, durable=durable,
                                     encoded_events=True)
        # Durable: message ids acked through this client under this name, so a redelivery after
        # a failover is acked again, not handed out (client/durable.py).
        self._acked: OrderedDict[tuple[str, int], None] | None = \
            client._acked.setdefault(name, OrderedDict()) if durable is not None else None
        self.acked_redeliveries = 0
        if isinstance(flt, (Filter, Disjunction)):  # a parsed filter: its structured form
            open_.filter.CopyFrom(filter_to_pb(flt))
        else:
            open_.filter_text = flt
        self._open = open_
        self.id = ""  # cluster-wide ("<agent>/<name>"), once open
        self._callback = callback
        self._state = "new"  # new -> open -> draining -> closed
        self._write = asyncio.Lock()  # one write at a time on a stream
        self._shared: SharedStream | None = None  # set once open on the client's shared stream
        self._share = shared and durable is None
        self._init_inbox()
        self.settlements = Settlements(Flusher(self._write_requests), self._oldest, self._held, max_outstanding)
        self._callbacks: set[asyncio.Task] = set()
        self._call = None
        self._half_closed = False
        self._tasks: list[asyncio.Task] = []
        self._ended = asyncio.Event()
        self._error: EchelonError | None = None

    async def __aenter__(self) -> "Subscription":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def start(self) -> None:
        """Open the stream; raises InvalidArgument (bad filter), NotFound (no such topic), ..."""
        if self._state != "new":
            raise FailedPrecondition(f"subscription is {self._state}")
        self.client._check_open()
        self.client._track(self)
        self._state = "open"
        try:
            await self._open_stream()
        except BaseException:
            self._state = "closed"
            self._ended.set()
            self.client._forget(self)
            raise
        # Reads run in their own task: cancelling a pending read would cancel the RPC,
        # so `next(timeout=...)` waits on the inbox instead.
        if self._shared is None:
            self._tasks.append(asyncio.create_task(self._read(), name="subscription reader"))
        if self._callback is not None:
            self._tasks.append(asyncio.create_task(dispatch(self, self._callback), name="subscription callbacks"))

    async def _open_stream(self) -> None:
        """Open on the client's first agent; a durable subscription fails over to the next
        ones while they are unreachable (any agent serves it)."""
        if self._share:
            stream = self._shared = SharedStream.of(self.client)
            sid = stream.sid()
            s = self.settlements
            self.settlements = Settlements(stream.flusher, s._oldest, s._held, self.max_outstanding, sid)
            self.id = await stream.open(self, self._open, sid)
            return
        tries = len(self.client.addresses) if self._acked is not None else 1
        for i in range(tries):
            try:
                return await self._open_on(i)
            except Unavailable:
                if i == tries - 1:
                    raise

    async def _open_on(self, i: int) -> None:
        call = self._call = subscribe_call(self.client._channel(i))
        try:
            await call.write(ppb.SubscribeRequest(open=self._open))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # refused before our write went out: the call's status says why
        # The agent sends headers once the subscription is registered; a refusal
        # (bad filter, unknown topic) ends the call without them.
        metadata = dict(await call.initial_metadata() or ())
        if SUBSCRIPTION_KEY in metadata:
            self.id = metadata[SUBSCRIPTION_KEY]
            if self._acked is not None:  # a seek moved what is owed: acked messages may come again
                self.client._seen_seeks(self.name, metadata.get("x-echelon-seeks", ""))
            return
        code = await call.code()
        if code == grpc.StatusCode.OK:
            raise Unavailable("subscription stream ended before it was opened")
        raise from_status(code, await call.details() or "", {k: v for k, v in await call.trailing_metadata() or ()})

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
        if self._state == "closed":
            return
        self._state = "closed"
        self.client._forget(self)
        self._wake()
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

    # -- internals ---------------------------------------------------------------------

    async def _read(self) -> None:
        """A stream of its own: what comes, into the inbox."""
        error = None
        try:
            async for delivery in self._call:
                if delivery.chunked or delivery.delivery_id in self._sliced:  # never in a batch
                    await self._sliced.receive(delivery)
                else:
                    self._receive(delivery.batch or (delivery,))
        except grpc.aio.AioRpcError as e:
            error = from_rpc_error(e)
        finally:
            self._finish(error)

    def _finish(self, error: EchelonError | None) -> None:
        """The stream ended (a shared one: this subscription's part of it), with `error` or not."""
        if error is not None and self._state != "closed":
            self._error = error
        self._ended.set()
        self.settlements.cancel()
        if self._shared is None:
            self.settlements.flusher.cancel()
        self._no_more = True
        self._wake()

    async def _write_requests(self, requests: list[ppb.SubscribeRequest]) -> None:
        async with self._write:
            if self._half_closed:
                raise asyncio.InvalidStateError("the stream is half-closed")
            for req in requests:
                await self._call.write(req)
