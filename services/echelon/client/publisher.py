"""Publishing: one stream per `Publisher`, numbered messages, acks as `PublishResult`s.

    async with client.publisher(ack_level=AckLevel.DELIVERED) as pub:
        result = await pub.publish("quotes", {"Symbol": "aapl", "High": 50.0})
        print(result.sequence, result.destinations)
        results = await pub.publish_batch("quotes", [{"Symbol": "msft"}, ({"Symbol": "ibm"}, b"payload")])
    # leaving the block flushed every publish and closed the stream

A `Publisher` keeps one stream open and numbers its messages (producer id, sequence).
On a broken stream it reconnects (to the next address, if several) and resends every
unacknowledged message with the same (producer id, sequence), so receivers drop the
second copy (docs/guarantees.md). Payloads above `SLICE_BYTES` go as slices.

Batching, as NATS's client does it: each event is encoded once, as wire
bytes, into the stream's outbox (outbox.py, encoding.py), and the stream takes
everything queued whenever it is ready to write, in `batch` requests of up to
MAX_BATCH_EVENTS events / MAX_BATCH_BYTES. So batching adds no delay: a lone publish goes
at once (no timer), and under load events coalesce while the previous write is on its
way. `publish_batch()` waits on one future for the whole batch. Acks come coalesced
(`coalesce_acks`): the agent answers the requests that settled together in one message,
and each ack finds its event by its offset in its publish call's run (client/results.py).
"""

from __future__ import annotations

import asyncio
import enum
import os
from typing import TYPE_CHECKING, AsyncIterable, Iterable, Mapping

import grpc

from echelon.client import bulk
from echelon.client.compressed import OFFER, Requests, reader
from echelon.client.connection import ConnectionEvent, Outage
from echelon.client.errors import ClientClosed, EchelonError, Timeout, from_rpc_error, from_status
from echelon.client.outbox import MAX_BATCH_BYTES, MAX_BATCH_EVENTS, SLICE_BYTES, Outbox  # noqa: F401 - public
from echelon.client.results import Pending
from echelon.client.results import PublishResult  # noqa: F401 - public
from echelon.contract.schema import Value
from echelon.v1 import pubsub_pb2 as ppb

if TYPE_CHECKING:
    from echelon.client.connection import Connection

# Stream failures worth a reconnect and a resend; anything else fails the pending publishes.
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED,
           grpc.StatusCode.INTERNAL)

Event = Mapping[str, Value] | tuple[Mapping[str, Value], bytes]


class InBand(Exception):
    """The agent ended the stream with this status in its last ack (`stream_status`)."""

    def __init__(self, error: EchelonError):
        super().__init__(str(error))
        self.error = error


PUBLISH = f"/{ppb.DESCRIPTOR.services_by_name['PubSub'].full_name}/Publish"


def publish_call(channel: grpc.aio.Channel, requests, compress: bool = False) -> grpc.aio.StreamStreamCall:
    """A Publish call whose requests are written as they come: serialized (the outbox's).
    `compress`: offering zstd, the requests compressed once accepted (client/compressed.py)."""
    if not compress:
        return channel.stream_stream(PUBLISH, request_serializer=None,
                                     response_deserializer=ppb.PublishAck.FromString)(requests)
    writer = Requests()
    call = channel.stream_stream(PUBLISH, request_serializer=None, response_deserializer=reader(ppb.PublishAck))(
        writer.of(requests), metadata=OFFER)
    writer.watch(call)
    return call


class AckLevel(enum.IntEnum):
    """When a publish is acknowledged."""

    ACCEPTED = ppb.ACK_LEVEL_ACCEPTED  # validated and held by the agent
    DELIVERED = ppb.ACK_LEVEL_DELIVERED  # every destination agent holds it


class Publisher:
    """Publishes on one stream; an async context manager that flushes and closes on exit.

    Made by `Client.publisher()`. Many publishes may be in flight at once
    (`publish_nowait`); acks come back in order."""

    def __init__(self, conn: "Connection", producer_id: str, ack_level: AckLevel, max_retries: int = 20):
        self._conn = conn
        self.producer_id = producer_id
        self.ack_level = AckLevel(ack_level)
        self.max_retries = max_retries
        self._seq = 1  # the next event's sequence
        self._pending = Pending(producer_id)  # unacknowledged events (client/results.py)
        self._outbox = Outbox(producer_id, self.ack_level)
        self._task: asyncio.Task | None = None
        self._closed = False

    async def __aenter__(self) -> "Publisher":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def publish(self, topic: str, attributes: Mapping[str, Value] | None = None, payload: bytes = b"",
                      ordering_key: str = "") -> PublishResult:
        """Publish one event and wait for its ack.

            result = await pub.publish("quotes", {"Symbol": "aapl", "High": 50.0}, payload=b"...")

        Raises InvalidArgument (unknown attribute, wrong type, out of range: the message
        names the attribute), NotFound (no such topic), ClientClosed, or Unavailable."""
        return await self.publish_nowait(topic, attributes, payload, ordering_key)

    def publish_nowait(self, topic: str, attributes: Mapping[str, Value] | None = None, payload: bytes = b"",
                       ordering_key: str = "") -> asyncio.Future:
        """Queue one event; returns the future of its PublishResult, so many may be in flight.

            futures = [pub.publish_nowait("quotes", q) for q in quotes]
            results = await asyncio.gather(*futures)"""
        if self._closed:
            raise ClientClosed(f"publisher {self.producer_id} is closed")
        seq = self._seq
        requests = self._outbox.add(topic, attributes or {}, payload, ordering_key, seq)
        self._seq = seq + 1
        future = self._pending.one(seq, requests)
        self._started()
        return future

    async def publish_batch(self, topic: str, events: Iterable[Event], ordering_key: str = "",
                            return_exceptions: bool = False) -> list:
        """Publish many events in one go; their PublishResults in order.

            await pub.publish_batch("files", [({"name": "a"}, data_a), ({"name": "b"}, data_b)])

        Each event is its attributes, or (attributes, payload). Every event is checked
        before any is sent. Like asyncio.gather: the first rejection is raised once all
        are settled, or with `return_exceptions=True` each rejection takes its event's place."""
        if self._closed:
            raise ClientClosed(f"publisher {self.producer_id} is closed")
        outbox, first = self._outbox, self._seq
        mark = outbox.mark()
        try:
            queued = outbox.extend(topic, events, ordering_key, first)
        except BaseException:
            outbox.rollback(mark)  # nothing numbered, nothing sent
            raise
        if not queued:
            return []
        self._seq = first + len(queued)
        future = self._pending.batch(first, queued)
        self._started()
        results = await future
        if not return_exceptions:
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        return results

    async def publish_stream(self, topic: str, attributes: Mapping[str, Value] | None,
                             chunks: Iterable[bytes] | AsyncIterable[bytes], size: int,
                             ordering_key: str = "") -> PublishResult:
        """Publish a payload of `size` bytes read from `chunks` as it is sent, never held
        whole (client/bulk.py: ordering, and why a broken stream is not retried).

            await pub.publish_stream("files", {"name": "feed"}, feed_chunks(), size=n)"""
        return await bulk.publish_stream(self, topic, attributes, chunks, size, ordering_key)

    async def publish_file(self, topic: str, attributes: Mapping[str, Value] | None, path: str | os.PathLike,
                           ordering_key: str = "") -> PublishResult:
        """Publish a file's bytes as the payload, read as it is sent (`publish_stream`)."""
        chunks, size = bulk.file_chunks(path)
        return await bulk.publish_stream(self, topic, attributes, chunks, size, ordering_key)

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued publish is acknowledged or failed; Timeout after `timeout` s."""
        futures = self._pending.futures()
        if not futures:
            return
        _, late = await asyncio.wait(futures, timeout=timeout)
        if late:
            raise Timeout(f"{len(late)} publishes unacknowledged after {timeout}s")

    async def close(self, timeout: float | None = None) -> None:
        """No more publishes; flush, then end the stream. Publishes still unacknowledged
        after `timeout` seconds fail with Timeout, and so does this call."""
        self._closed = True
        self._conn.forget(self)
        try:
            await self.flush(timeout)
        except Timeout as e:
            self._fail_pending(e)
            raise
        finally:
            await self._end_stream()

    # -- internals ---------------------------------------------------------------------

    def _number(self) -> int:
        """The next sequence, for a publish that does not go through the outbox (bulk.py)."""
        seq = self._seq
        self._seq = seq + 1
        return seq

    def _started(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"publisher {self.producer_id}")

    def _fail_pending(self, error: EchelonError) -> None:
        self._pending.fail(error)

    async def _end_stream(self) -> None:
        """Half-close the stream (the agent ends it once every ack is sent), then wait for it."""
        if self._task is None:
            return
        self._outbox.end()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 5.0)
        except asyncio.TimeoutError:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        conn = self._conn
        attempt, agent = 0, conn.current
        outage: Outage | None = None  # since the stream was lost, until an ack comes on a new one
        outbox: Outbox | None = self._outbox
        while self._pending or not self._closed:
            if outbox is None:  # a fresh stream: resend whatever is unacknowledged, in order, then the rest
                outbox = self._outbox = Outbox(self.producer_id, self.ack_level)
                for requests in self._pending.unacked():
                    outbox.again(requests)
                if self._closed:
                    outbox.end()
            call = publish_call(conn.channel(agent), outbox.requests(), conn.compress)
            outbox = None
            try:
                async for reply in call:
                    if reply.stream_status:  # the stream's own status, in-band: the call's may be INTERNAL
                        raise InBand(from_status(reply.code, reply.error))
                    attempt = 0
                    if outage is not None:
                        conn.notify(ConnectionEvent("reconnected", self, conn.address(agent),
                                                    attempts=outage.attempts, down_seconds=outage.seconds))
                        outage = None
                    self._pending.acked(reply.acks or (reply,))
                if self._closed and not self._pending:
                    return  # our half-close ended the stream
            except (grpc.aio.AioRpcError, InBand) as e:
                call.cancel()
                error = e.error if isinstance(e, InBand) else from_rpc_error(e)
                attempt += 1
                retried = error.code in RETRIED
                if retried and outage is None:
                    outage = Outage(conn)
                    conn.notify(ConnectionEvent("disconnected", self, conn.address(agent), error))
                if outage is not None:
                    outage.attempts += 1
                if attempt > self.max_retries or not retried:
                    self._fail_pending(error)
                    attempt = 0
                conn.failed(agent)  # the next stream goes to the next agent
                agent = conn.current
                await asyncio.sleep(min(0.05 * 2 ** attempt, 2.0))
