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

Batching (issue 12): the agent sends many deliveries per message; acks and nacks are
group-committed: `ack()` queues the ack and returns (it does not wait for the write),
and one flush task writes everything queued by then in one request (nacks first, then
one ack that is cumulative, `through`, up to the oldest message still handed out, plus
the ids above it). A lone ack goes out on the next turn of the event loop; under load
acks coalesce while the previous write is on its way. `close()` writes what is queued
before it half-closes the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Awaitable, Callable

import grpc

from echelon.client.errors import (ClientClosed, DataLoss, EchelonError, FailedPrecondition, InvalidArgument,
                                   Timeout, Unavailable, from_rpc_error, from_status)
from echelon.core.filters import Filter
from echelon.core.schema import Value
from echelon.runtime.transport import SUBSCRIPTION_KEY
from echelon.runtime.wire import attributes_from_pb, filter_to_pb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc

if TYPE_CHECKING:
    from echelon.client.client import Client

log = logging.getLogger("echelon.client")

MAX_NACK_DELAY = 600.0  # seconds; the agent refuses more
ACKED_MEMORY = 200_000  # message ids a durable subscription remembers having acked
MAX_WHOLE = 64 << 20  # payloads up to this are assembled and handed whole
CHUNKS_AHEAD = 64  # chunks of a streamed payload received ahead of the application (64 KiB each by default)
_END = object()  # in the inbox: nothing more will be handed out

Callback = Callable[["Message"], "Awaitable[None] | None"]


@dataclass
class Message:
    """One delivery. Settle it with `ack()` or `nack(delay=...)`; the first settles, later calls do nothing."""

    topic: str
    attributes: dict[str, Value]
    payload: bytes
    producer_id: str
    sequence: int
    ordering_key: str
    redelivery_count: int
    delivery_id: int
    publish_time_ns: int
    _subscription: "Subscription" = field(repr=False, default=None)  # type: ignore[assignment]
    settled: bool = field(default=False, init=False)
    payload_size: int = 0  # of a streamed payload (`payload` is then empty: read `chunks()`)
    _chunks: "_Incoming | None" = field(repr=False, default=None)

    @property
    def streamed(self) -> bool:
        """Is the payload to be read with `chunks()` (it was above `max_whole`)?"""
        return self._chunks is not None

    async def chunks(self):
        """The payload as it arrives, chunk by chunk (once); DataLoss if it was lost on
        the way (its publishing agent died, or this subscription fell behind)."""
        if self._chunks is None:
            if self.payload:
                yield self.payload
            return
        incoming = self._chunks
        if incoming.read:
            raise FailedPrecondition("a streamed payload's chunks can be read once")
        incoming.read = True
        while (item := await incoming.queue.get()) is not None:
            if isinstance(item, EchelonError):
                raise item
            yield item

    async def ack(self) -> None:
        """Processed: the agent forgets it and may send one more (queued for the stream at
        once, written with the next flush; raises ClientClosed if the stream has ended). A
        streamed payload's unread chunks are dropped."""
        if self._chunks is not None:
            self._chunks.drop()
        await self._subscription._settle(self, None)

    async def nack(self, delay: float = 0.0) -> None:
        """Not processed: the agent redelivers it after `delay` seconds (0 to 600)."""
        if not 0 <= delay <= MAX_NACK_DELAY:
            raise InvalidArgument(f"nack delay {delay}s: 0 to {MAX_NACK_DELAY:g}s")
        if self._chunks is not None:
            self._chunks.drop()  # and the agent does not redeliver it: nothing holds a copy
        await self._subscription._settle(self, delay)


class _Incoming:
    """A sliced payload being received: assembled (`whole`), or queued for `chunks()`."""

    __slots__ = ("head", "whole", "parts", "queue", "read", "dropped")

    def __init__(self, head: ppb.Delivery, whole: bool):
        self.head = head
        self.whole = whole
        self.parts: list[bytes] = []
        self.queue: asyncio.Queue = asyncio.Queue(CHUNKS_AHEAD)
        self.read = False
        self.dropped = False

    async def put(self, item) -> None:
        if not self.dropped:
            await self.queue.put(item)

    def drop(self) -> None:
        """Unread chunks are dropped, and so is what comes after (the reader is not held up)."""
        self.dropped = True
        while not self.queue.empty():
            self.queue.get_nowait()


class Subscription:
    """A subscription stream, made by `Client.subscribe()`; `async with` opens and closes it."""

    def __init__(self, client: "Client", topic: str, flt: str | Filter, name: str, max_outstanding: int,
                 callback: Callback | None, durable: ppb.DurableOptions | None = None, max_whole: int = MAX_WHOLE):
        if max_outstanding < 1:
            raise InvalidArgument(f"max_outstanding {max_outstanding}: at least 1")
        if max_whole < 0:
            raise InvalidArgument(f"max_whole {max_whole}: at least 0")
        self.max_whole = max_whole
        self._incoming: dict[int, _Incoming] = {}  # sliced payloads being received, by delivery id
        self.client = client
        self.name = name
        self.max_outstanding = max_outstanding
        self.callback_errors = 0  # callbacks that raised (their messages were nacked)
        open_ = ppb.SubscriptionOpen(topic=topic, subscription=name, credits=max_outstanding, durable=durable)
        # Durable: message ids acked through this client under this name, so a redelivery after
        # a failover is acked again, not handed out (client/durable.py).
        self._acked: OrderedDict[tuple[str, int], None] | None = \
            client._acked.setdefault(name, OrderedDict()) if durable is not None else None
        self.acked_redeliveries = 0
        if isinstance(flt, Filter):
            open_.filter.CopyFrom(filter_to_pb(flt))
        else:
            open_.filter_text = flt
        self._open = open_
        self._callback = callback
        self._state = "new"  # new -> open -> draining -> closed
        self._write = asyncio.Lock()  # one write at a time on a stream
        self._acks: list[int] = []  # settled, not yet written
        self._nacks: dict[int, list[int]] = {}  # delay in ms -> ids
        self._credits = 0
        self._flushing: asyncio.Task | None = None
        self._inbox: asyncio.Queue = asyncio.Queue()
        self._handed: dict[int, Message] = {}  # given to the application, not yet settled
        self._settled = asyncio.Event()
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
        self._tasks.append(asyncio.create_task(self._read(), name="subscription reader"))
        if self._callback is not None:
            self._tasks.append(asyncio.create_task(self._dispatch(), name="subscription callbacks"))

    async def _open_stream(self) -> None:
        """Open on the client's first agent; a durable subscription fails over to the next
        ones while they are unreachable (any agent serves it)."""
        tries = len(self.client.addresses) if self._acked is not None else 1
        for i in range(tries):
            try:
                return await self._open_on(i)
            except Unavailable:
                if i == tries - 1:
                    raise

    async def _open_on(self, i: int) -> None:
        call = self._call = pgrpc.PubSubStub(self.client._channel(i)).Subscribe()
        try:
            await call.write(ppb.SubscribeRequest(open=self._open))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # refused before our write went out: the call's status says why
        # The agent sends headers once the subscription is registered; a refusal
        # (bad filter, unknown topic) ends the call without them.
        metadata = dict(await call.initial_metadata() or ())
        if SUBSCRIPTION_KEY in metadata:
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
        if self._callback is not None:
            raise FailedPrecondition("this subscription hands its messages to its callback")
        try:
            item = await asyncio.wait_for(self._inbox.get(), timeout)
        except asyncio.TimeoutError:
            raise Timeout(f"no message within {timeout}s") from None
        return self._hand(item)

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
        self._inbox.put_nowait(_END)
        waits = [asyncio.ensure_future(self._settled.wait()) if self._handed else None, *self._callbacks]
        waits = [w for w in waits if w is not None]
        late = set()
        if waits:
            _, late = await asyncio.wait(waits, timeout=timeout)
            for w in late:
                w.cancel()
        await self.close()
        if late:
            raise Timeout(f"subscription {self.name or self._open.topic!r}: {len(self._handed)} messages "
                          f"unsettled after {timeout}s (they will be redelivered to a named subscription)")

    async def close(self) -> None:
        """End the stream now: callbacks are cancelled, acks already sent are applied, and
        every unacked message goes back to the agent."""
        if self._state == "closed":
            return
        self._state = "closed"
        self.client._forget(self)
        self._inbox.put_nowait(_END)
        for task in list(self._callbacks):
            task.cancel()
        await asyncio.gather(*self._callbacks, return_exceptions=True)
        if self._flushing is not None:  # acks already given are written before the half-close
            await asyncio.gather(self._flushing, return_exceptions=True)
        if self._call is not None and not self._ended.is_set():
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
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- internals ---------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            async for delivery in self._call:
                if delivery.chunked or delivery.delivery_id in self._incoming:  # never in a batch
                    await self._chunk(delivery)
                    continue
                for d in delivery.batch or (delivery,):
                    if self._acked is not None and (d.event.id.producer_id, d.event.id.sequence) in self._acked:
                        self.acked_redeliveries += 1  # acked by us before: acked again, not handed out
                        asyncio.create_task(self._write_quietly(ppb.SubscribeRequest(
                            ack=ppb.SubscriberAck(delivery_ids=[d.delivery_id], credits=1))))
                        continue
                    self._inbox.put_nowait(d)
        except grpc.aio.AioRpcError as e:
            if self._state != "closed":
                self._error = from_rpc_error(e)
        finally:
            self._ended.set()
            self._inbox.put_nowait(_END)

    async def _chunk(self, d: ppb.Delivery) -> None:
        """A sliced payload's head or one of its pieces (protos: Delivery)."""
        if d.chunked:
            incoming = self._incoming[d.delivery_id] = _Incoming(d, d.payload_size <= self.max_whole)
            if not incoming.whole:
                self._inbox.put_nowait(incoming)
            return
        incoming = self._incoming[d.delivery_id]
        if d.chunk:
            if incoming.whole:
                incoming.parts.append(d.chunk)
            else:
                await incoming.put(d.chunk)  # waits while the application is CHUNKS_AHEAD behind
        if not (d.last or d.aborted):
            return
        del self._incoming[d.delivery_id]
        if not incoming.whole:
            await incoming.put(DataLoss(f"the payload was lost on its way: {d.aborted}") if d.aborted else None)
        elif d.aborted:  # never handed out: settled here, so its credit comes back
            log.warning("a %d-byte payload was lost on its way: %s", incoming.head.payload_size, d.aborted)
            ack = ppb.SubscriberAck(delivery_ids=[d.delivery_id], credits=int(self._state == "open"))
            async with self._write:
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    await self._call.write(ppb.SubscribeRequest(ack=ack))
        else:
            incoming.head.event.payload = b"".join(incoming.parts)
            self._inbox.put_nowait(incoming.head)

    def _hand(self, item) -> Message:
        if item is _END or self._state != "open":
            self._inbox.put_nowait(_END)  # every later call ends too
            if self._error is not None:
                raise self._error
            raise ClientClosed(f"subscription is {'closed' if self._state != 'open' else 'ended'}")
        incoming = item if isinstance(item, _Incoming) else None
        item = incoming.head if incoming else item
        e = item.event
        msg = Message(e.topic, attributes_from_pb(e.attributes), e.payload, e.id.producer_id, e.id.sequence,
                      e.ordering_key, item.redelivery_count, item.delivery_id, e.publish_time_unix_nanos, self,
                      payload_size=item.payload_size or len(e.payload), _chunks=incoming)
        self._handed[msg.delivery_id] = msg
        self._settled.clear()
        return msg

    async def _settle(self, msg: Message, nack_delay: float | None) -> None:
        if msg.settled:
            return
        if self._half_closed or self._ended.is_set():
            raise ClientClosed("subscription is closed: the agent redelivers this message to a named subscription")
        msg.settled = True
        self._credits += 1 if self._state == "open" else 0  # draining: let nothing new in
        if nack_delay is None and self._acked is not None:
            self._acked[(msg.producer_id, msg.sequence)] = None
            if len(self._acked) > ACKED_MEMORY:
                self._acked.popitem(last=False)
        if nack_delay is None:
            self._acks.append(msg.delivery_id)
        else:
            self._nacks.setdefault(round(nack_delay * 1000), []).append(msg.delivery_id)
        self._handed.pop(msg.delivery_id, None)
        if not self._handed:
            self._settled.set()
        if self._flushing is None:
            self._flushing = asyncio.create_task(self._flush_settled())

    async def _flush_settled(self) -> None:
        """Write every settlement queued until the queue is empty: one flush for all the
        acks given while the previous write was on its way. A write that fails means the
        stream ended: next() and wait_closed() report how, and the agent redelivers the
        unacknowledged messages to a named subscription."""
        try:
            while self._acks or self._nacks:
                acks, self._acks = self._acks, []
                nacks, self._nacks = self._nacks, {}
                credits, self._credits = self._credits, 0
                requests = [ppb.SubscribeRequest(nack=ppb.SubscriberNack(delivery_ids=ids, delay_ms=delay))
                            for delay, ids in nacks.items()]
                # Every id below the oldest message still handed out is settled (handed in id order).
                oldest = next(iter(self._handed), None)
                through = max((i for i in acks if oldest is None or i < oldest), default=0)
                if acks or credits:
                    requests.append(ppb.SubscribeRequest(ack=ppb.SubscriberAck(
                        delivery_ids=[i for i in acks if i > through], credits=credits, through=through)))
                async with self._write:
                    for req in requests:
                        await self._call.write(req)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            self._acks, self._nacks = [], {}
        finally:
            self._flushing = None

    async def _write_quietly(self, req: ppb.SubscribeRequest) -> None:
        try:
            async with self._write:
                if not self._half_closed:
                    await self._call.write(req)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the stream ended: the agent redelivers it, and it is acked again then

    async def _dispatch(self) -> None:
        """Hand each message to the callback in its own task, at most max_outstanding at once."""
        slots = asyncio.Semaphore(self.max_outstanding)
        while True:
            await slots.acquire()
            try:
                msg = self._hand(await self._inbox.get())
            except EchelonError:
                return
            task = asyncio.create_task(self._run_callback(msg))
            self._callbacks.add(task)
            task.add_done_callback(lambda t: (self._callbacks.discard(t), slots.release()))

    async def _run_callback(self, msg: Message) -> None:
        try:
            result = self._callback(msg)
            if inspect.isawaitable(result):
                await result
            settle = msg.ack()
        except Exception:  # noqa: BLE001 - the message is redelivered; the error is logged and counted
            self.callback_errors += 1
            log.exception("subscription callback failed on %s:%d; nacked", msg.producer_id, msg.sequence)
            settle = msg.nack()
        try:
            await settle
        except ClientClosed:
            pass  # the stream ended meanwhile: the agent redelivers it (named subscriptions)
