"""Compressed streams for `Client(..., compress=True)` (docs/compression.md).

A Publish or Subscribe stream of such a client offers zstd in its metadata. An agent
that accepts answers ACCEPT in the call's initial metadata and from then on compresses
what it writes on that stream; the publisher compresses its requests only once it has
seen ACCEPT (an agent of an earlier release never accepts, nor one past its bound of
compressed streams: the stream stays plain, which is always correct). Each direction of
a stream is one zstd context (contract/zstream.py). A client made without `compress`
takes none of this: its calls are what they were.

zstd is the `zstd` extra (`pip install 'echelon-pubsub[zstd]'`; built in from Python
3.14).
"""

from __future__ import annotations

import asyncio

from echelon.client.errors import FailedPrecondition
from echelon.contract import zstream
from echelon.contract.transport import MAX_MESSAGE_BYTES

OFFER = zstream.OFFER


def check() -> None:
    """Raise FailedPrecondition, naming the extra, where this Python cannot compress."""
    if not zstream.available():
        raise FailedPrecondition("compress=True needs zstd: pip install 'echelon-pubsub[zstd]' "
                                 "(the backports.zstd package; built in from Python 3.14)")


def reader(message_type):
    """A call's response deserializer: a compressed message (the `zstd` field alone) is
    decoded by the stream's context, bounded as a plain message is; a plain one parsed as
    it is. A block that cannot be decoded fails the call (gRPC reports it as INTERNAL)."""
    parse, unwrap = message_type.FromString, zstream.unwrap
    decompress = None

    def read(data: bytes):
        nonlocal decompress
        block = unwrap(data)
        if block is None:
            return parse(data)
        if decompress is None:
            decompress = zstream.Decompressor(MAX_MESSAGE_BYTES, zstream.CLIENT_WINDOW_LOG).message
        return parse(decompress(block))

    return read


class Requests:
    """A stream's serialized requests, compressed once the agent's initial metadata says
    ACCEPT (`watch`); the ones written before go plain. `compressed`: how many went so."""

    def __init__(self):
        self._block = None
        self._watching: asyncio.Task | None = None
        self.compressed = 0

    def watch(self, call) -> None:
        """Read `call`'s initial metadata when it comes (an old agent sends it only with its
        first answer: nothing waits for it)."""
        self._watching = asyncio.ensure_future(call.initial_metadata())
        self._watching.add_done_callback(self._accepted)

    def _accepted(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is None and zstream.accepted(task.result()):
            self._block = zstream.Compressor(zstream.CLIENT_WINDOW_LOG).block

    async def of(self, requests):
        """`requests` (bytes), each compressed once accepted."""
        wrap = zstream.wrap
        try:
            async for data in requests:
                block = self._block
                if block is not None:
                    data = wrap(block(data))
                    self.compressed += 1
                yield data
        finally:
            if self._watching is not None:
                self._watching.cancel()
