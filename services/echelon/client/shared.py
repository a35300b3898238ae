"""A client's shared subscription stream: its (non-durable) subscriptions on one
Subscribe stream, each under a sid (agent/shared_stream.py says why and how).

A Client keeps one shared stream at a time, opened by its first subscription on it and
half-closed when its last one closes (the next opens a new one). A Subscription on it
is what it is on a stream of its own (credits, acks, drain, close); the stream routes
its deliveries by sid, and one Flusher (client/acks.py) writes the settlements of all
its subscriptions in one request. Refused opens end only their subscription; the
stream's end ends them all with its error.

The stream is read by one task: a payload streamed to the application (above
`max_whole`, read with `chunks()`) holds the other subscriptions' deliveries while its
reader is CHUNKS_AHEAD behind. A subscription that reads such payloads slowly is better
off on a stream of its own (`subscribe(..., shared=False)`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import grpc

from echelon.client.acks import Flusher
from echelon.client.errors import Unavailable, from_rpc_error, from_status
from echelon.client.message import subscribe_call
from echelon.contract.transport import REDELIVERY_KEY
from echelon.v1 import pubsub_pb2 as ppb

if TYPE_CHECKING:
    from echelon.client.connection import Connection
    from echelon.client.subscription import Subscription

CLOSE_WAIT = 5.0  # seconds a closing subscription waits for the agent's answer


class SharedStream:
    def __init__(self, conn: "Connection"):
        self.conn = conn
        self.index = conn.current  # the agent it runs through, in the client's list
        self.call = subscribe_call(conn.channel(self.index), conn.compress)
        self.subs: dict[int, "Subscription"] = {}  # open, or opening (deliveries may follow their answer at once)
        self.opening: dict[int, asyncio.Future] = {}
        self.flusher = Flusher(self._write)
        self._lock = asyncio.Lock()  # one write at a time
        self._next_sid = 1
        self._closing = False  # half-closed (or about to be): no more opens
        self._left: asyncio.Future | None = None  # the half-close, once begun
        self.messages = 0  # Delivery messages read: what the benchmarks count
        self.enforced = False  # the agent enforces redelivery policies (its initial metadata, once read)
        self._reader = asyncio.create_task(self._read(), name="shared subscription stream")

    @staticmethod
    def of(conn: "Connection") -> "SharedStream":
        """The client's shared stream, a new one if it has none open."""
        stream = conn.shared_stream
        if stream is None or stream._closing:
            stream = conn.shared_stream = SharedStream(conn)
        return stream

    def sid(self) -> int:
        """A new subscription's id on this stream."""
        self._next_sid += 1
        return self._next_sid - 1

    async def open(self, sub: "Subscription", open_: ppb.SubscriptionOpen, sid: int) -> str:
        """Open `sub` under `sid`: its cluster-wide id once the agent registered it; raises its refusal."""
        shared = ppb.SubscriptionOpen()
        shared.CopyFrom(open_)
        shared.sid = sid
        answer = self.opening[sid] = asyncio.get_running_loop().create_future()
        self.subs[sid] = sub
        try:
            try:
                await self._write([ppb.SubscribeRequest(open=shared)])
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                pass  # the stream failed: the reader answers with its status
            opened = await answer
            self.enforced = REDELIVERY_KEY in dict(await self.call.initial_metadata() or ())
            return opened
        except BaseException:
            self.subs.pop(sid, None)
            self.opening.pop(sid, None)
            await self._leave()
            raise

    async def close(self, sid: int) -> None:
        """End one subscription (after its queued settlements): the agent answers once it
        has put its unacked deliveries back; a closing stream ends it anyway."""
        sub = self.subs.get(sid)
        if sub is None:
            return
        await self.flusher.flush()
        try:
            await self._write([ppb.SubscribeRequest(close=ppb.SubscriptionClose(sid=sid))])
            await asyncio.wait_for(sub._ended.wait(), CLOSE_WAIT)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, asyncio.TimeoutError):
            pass  # the stream is gone or stuck: the agent detaches everything when it ends
        if self.subs.pop(sid, None) is not None:
            sub._finish(None)
        await self._leave()

    async def _leave(self) -> None:
        """No subscription left: half-close (the next subscribe opens a new stream). Every
        caller waits for the same half-close, so a closing client closes its channel after it."""
        if self.subs:
            return
        self._closing = True
        if self._left is None:
            self._left = asyncio.ensure_future(self._half_close())
        await asyncio.shield(self._left)

    async def _half_close(self) -> None:
        if not self._reader.done():
            async with self._lock:
                try:
                    await self.call.done_writing()
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    pass  # already ended
        # The agent ends the stream once it has read the half-close.
        _, late = await asyncio.wait({self._reader}, timeout=CLOSE_WAIT)
        if late:
            self.call.cancel()

    async def _write(self, requests: list[ppb.SubscribeRequest]) -> None:
        req = requests[0] if len(requests) == 1 else ppb.SubscribeRequest(batch=requests)
        async with self._lock:
            await self.call.write(req)

    async def _read(self) -> None:
        error = final = None
        try:
            subs = self.subs
            async for delivery in self.call:
                self.messages += 1
                by_sub: dict[int, list] = {}
                last = None  # the sid of the delivery before (a message holds each one's in a row)
                for d in delivery.batch or (delivery,):
                    if not d.delivery_id and not d.sid and d.code:  # the stream's own status, in-band
                        final = from_status(d.code, d.error)
                        continue
                    if not d.delivery_id:
                        self._status(d)
                        last = None  # (it may have ended one)
                        continue
                    sid = d.sid
                    if sid != last:
                        last, sub = sid, subs.get(sid)
                        ds = None if sub is None else by_sub.setdefault(sid, [])
                        incoming = None if sub is None else sub._sliced.incoming
                    if ds is None:
                        continue  # closed here meanwhile: the agent takes it back with the close
                    if d.chunked or (incoming and d.delivery_id in incoming):  # never in a batch
                        await sub._sliced.receive(d)
                        last = None
                    else:
                        ds.append(d)
                for sid, ds in by_sub.items():
                    sub = subs.get(sid)
                    if sub is not None and ds:  # not closed while a chunk above was awaited
                        sub._receive(ds)
        except grpc.aio.AioRpcError as e:
            error = final or from_rpc_error(e)  # the call's status may have become INTERNAL (grpc/grpc#36066)
        finally:
            self._closing = True
            if self.conn.shared_stream is self:
                self.conn.shared_stream = None
            self.flusher.cancel()
            for answer in self.opening.values():
                if not answer.done():
                    answer.set_exception(error or Unavailable("the subscription stream ended"))
            subs, self.subs = list(self.subs.values()), {}
            for sub in subs:
                sub._finish(error)

    def _status(self, d: ppb.DeliveryRead) -> None:
        """An open's answer, or a subscription's end."""
        answer = self.opening.pop(d.sid, None)
        error = from_status(d.code, d.error) if d.code else None
        if answer is not None:
            if d.opened:
                answer.set_result(d.opened)
            else:
                answer.set_exception(error or Unavailable("the subscription was not opened"))
            return
        sub = self.subs.pop(d.sid, None)
        if sub is not None:
            sub._finish(error)
            if not self.subs:
                self._closing = True
                self._left = self._left or asyncio.ensure_future(self._half_close())
