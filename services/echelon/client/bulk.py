"""Publishing a payload too large to hold: from an iterator of chunks, or a file.

    async with client.publisher(ack_level=AckLevel.DELIVERED) as pub:
        await pub.publish_file("files", {"name": "db.tar"}, "/backups/db.tar")
        await pub.publish_stream("files", {"name": "feed"}, chunks(), size=n)

The payload goes as slices of `SLICE_BYTES` on a Publish stream of its own, read from
the source only as fast as the agent takes them (gRPC flow control; the agent reads
ahead at most its window and forwards slices as they come, dataplane/slices.py), so neither
end holds it whole. Its id is the publisher's next (producer id, sequence), after every
earlier publish of the publisher is acknowledged (so it is ordered after them).

Unlike `publish()`, a broken stream is not retried: the source cannot be read again
from here. The call raises Unavailable and the caller publishes again from its source.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, AsyncIterable, Iterable, Mapping

import grpc

from echelon.client.errors import InvalidArgument, Unavailable, from_status, translating
from echelon.contract.schema import Value
from echelon.contract.wire import attributes_to_pb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc

if TYPE_CHECKING:
    from echelon.client.publisher import Publisher, PublishResult

READ_BYTES = 1 << 20  # a file is read in pieces of this size


async def _pieces(chunks: Iterable[bytes] | AsyncIterable[bytes]):
    if hasattr(chunks, "__aiter__"):
        async for c in chunks:
            yield c
    else:
        for c in chunks:
            yield c


async def _requests(pub: "Publisher", topic: str, attributes: Mapping[str, Value], chunks, size: int,
                    ordering_key: str, sequence: int, slice_bytes: int):
    """The stream's requests: the chunks re-cut into `slice_bytes` slices, checked against `size`."""
    with translating():
        attrs = attributes_to_pb(attributes)
    count = max(1, -(-size // slice_bytes))
    head = ppb.PublishRequest(topic=topic, ordering_key=ordering_key, producer_id=pub.producer_id, sequence=sequence,
                              ack_level=pub.ack_level, attributes=attrs)
    if count > 1:
        head.slice_count, head.payload_size = count, size
    buf = bytearray()
    index = sent = 0

    def request(data: bytes) -> ppb.PublishRequest:
        nonlocal index
        req = head if index == 0 else ppb.PublishRequest(topic=topic, producer_id=pub.producer_id, sequence=sequence,
                                                         ack_level=pub.ack_level, slice_count=count,
                                                         payload_size=size)
        req.payload = data
        req.slice_index = index
        index += 1
        return req

    async for c in _pieces(chunks):
        buf += c
        sent += len(c)
        if sent > size:
            raise InvalidArgument(f"the chunks carry more than size={size} bytes")
        while len(buf) >= slice_bytes and (count > 1 or sent == size):
            yield request(bytes(buf[:slice_bytes]))
            del buf[:slice_bytes]
    if sent != size:
        raise InvalidArgument(f"the chunks carried {sent} bytes, size={size}")
    if buf or index == 0:
        yield request(bytes(buf))


async def publish_stream(pub: "Publisher", topic: str, attributes: Mapping[str, Value] | None, chunks,
                         size: int, ordering_key: str = "") -> "PublishResult":
    from echelon.client.publisher import SLICE_BYTES, PublishResult

    if size < 0:
        raise InvalidArgument(f"size {size}: at least 0")
    await pub.flush()
    sequence = pub._number()
    stub = pgrpc.PubSubStub(pub._conn.channel())
    errors: list[BaseException] = []

    async def requests():
        try:
            async for req in _requests(pub, topic, attributes or {}, chunks, size, ordering_key, sequence,
                                       SLICE_BYTES):
                yield req
        except BaseException as e:  # the source failed or lied about its size: the call is cancelled
            errors.append(e)
            call.cancel()
            raise

    call = stub.Publish(requests())
    try:
        with translating():
            ack = await call.read()
    except asyncio.CancelledError:
        if errors:  # cancelled by `requests` above, not by our caller
            raise errors[0] from None
        raise
    finally:
        call.cancel()
    if errors:
        raise errors[0]
    if ack is grpc.aio.EOF:
        raise Unavailable("the publish stream ended without an ack")
    if ack.code:
        raise from_status(ack.code, ack.error)
    return PublishResult(ack.producer_id, ack.sequence, ack.destinations, ack.duplicate)


def file_chunks(path: str | os.PathLike):
    """A file's bytes, piece by piece, and its size."""
    size = os.path.getsize(path)

    def pieces():
        with open(path, "rb") as f:
            while piece := f.read(READ_BYTES):
                yield piece

    return pieces(), size
