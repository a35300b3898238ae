"""Compressed streams: one zstd context per gRPC stream and direction (docs/compression.md).

A stream's messages are small and alike (events of one schema), so each compressed on its
own gains little; compressed in one context that lives as long as the stream, each message
is coded against the ones before it, and a single event shrinks as much as a large batch.
Each message is one zstd block, flushed at once: the receiver decodes it on arrival, and
a message never waits for the next.

Negotiated, so that a peer of an earlier release (or a client that did not ask) sees the
plain messages it knows. The caller offers `zstd` in its metadata (`OFFER`); a receiver
that takes it answers with `ACCEPT` in its initial metadata, and only from then on does
the caller send compressed messages; the receiver then compresses its replies too. A
compressed message is the message type's `zstd` field alone (the other fields unset),
holding the block; plain and compressed messages may alternate on one stream. The
services always take it; a client needs the `zstd` extra (Python before 3.14).

The receiver bounds what a block may cost it: the window (the memory a context holds)
and the bytes one message may decompress to, so a hostile block is refused
(`CompressionError`) before it grows past a plain message's limit.
"""

from __future__ import annotations

import os

try:
    from compression import zstd  # Python 3.14
except ImportError:
    try:
        from backports import zstd  # the same module for earlier Pythons: the `zstd` extra
    except ImportError:  # a client installed without it cannot offer compression
        zstd = None

from echelon.contract.errors import InvalidArgument
from echelon.contract.wire import varint
from echelon.v1.tags import RelayFrame

KEY = "echelon-compress"
ZSTD = "zstd"
OFFER = ((KEY, ZSTD),)
ACCEPT = ((KEY, ZSTD),)
# The first of zstd's fast levels: here the CPU is dearer than the bytes (the trade, level
# by level: docs/compression.md).
LEVEL = -1
LINK_WINDOW_LOG = 17  # between nodes: a larger window finds no more in a stream of events
CLIENT_WINDOW_LOG = 16  # a client's stream: many per agent, each holding its context
TAG = varint(RelayFrame.zstd)  # every compressed message type has its block in field 190: one tag for all


class CompressionError(InvalidArgument):
    """A block that cannot be decoded within its bounds: the stream must end."""


def available() -> bool:
    """Whether this process can compress (the services always can: the `zstd` extra)."""
    return zstd is not None


def enabled() -> bool:
    """Whether this service offers and accepts compressed streams: unless
    ECHELON_COMPRESS=off (docs/compression.md). A client offers only when asked."""
    return zstd is not None and os.environ.get("ECHELON_COMPRESS", ZSTD) != "off"


def offer() -> tuple:
    """A service's call metadata: OFFER when `enabled()`."""
    return OFFER if enabled() else ()


def offered(metadata) -> bool:
    """Whether a call's invocation metadata offers zstd."""
    return any(k == KEY and ZSTD in v.split(",") for k, v in metadata or ())


def accepted(metadata) -> bool:
    """Whether a call's initial metadata accepted zstd."""
    return any(k == KEY and v == ZSTD for k, v in metadata or ())


def wrap(block: bytes) -> bytes:
    """A compressed message's bytes: the `zstd` field alone, holding `block`."""
    return TAG + varint(len(block)) + block


def unwrap(data: bytes) -> bytes | None:
    """The block of a compressed message's bytes (`wrap`), None for a plain message; a
    message with a `zstd` field and anything else raises CompressionError."""
    if data[:2] != TAG:
        return None
    n, shift, i = 0, 0, 2
    while i < len(data) and i < 12:
        b = data[i]
        n |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            if i + n == len(data):
                return data[i:]
            break
        shift += 7
    raise CompressionError("a compressed message holds more than its zstd block")


NOT_GRANTED = "a compressed message on a stream whose zstd offer was not accepted"


def decode(decompressor: "Decompressor | None", block: bytes) -> bytes:
    """A block read off a stream: decoded by the stream's `decompressor`, None where the
    receiver did not accept (then the block is refused)."""
    if decompressor is None:
        raise CompressionError(NOT_GRANTED)
    return decompressor.message(block)


def decoded(message, decompressor: "Decompressor | None"):
    """The message a parsed message with a `zstd` field stands for (one of the same type);
    CompressionError for one on a stream not accepted, one holding more than its block or
    another compressed message, or a block that cannot be decoded within its bounds."""
    if len(message.ListFields()) != 1:
        raise CompressionError("a compressed message holds more than its zstd block")
    inner = type(message).FromString(decode(decompressor, message.zstd))
    if inner.zstd:
        raise CompressionError("a compressed message holds another compressed message")
    return inner


class Compressor:
    """One direction of a stream: `block(data)` is `data` coded against what this context
    coded before, flushed, so the receiver can decode it alone."""

    __slots__ = ("_compress",)

    def __init__(self, window_log: int = LINK_WINDOW_LOG):
        options = {zstd.CompressionParameter.compression_level: LEVEL, zstd.CompressionParameter.window_log: window_log}
        self._compress = zstd.ZstdCompressor(options=options).compress

    def block(self, data: bytes) -> bytes:
        return self._compress(data, zstd.ZstdCompressor.FLUSH_BLOCK)


class Decompressor:
    """The other end of a `Compressor`: `message(block)` is the bytes the peer coded, the
    blocks taken in the order coded (a gRPC stream's). A block that is not zstd, wants a
    larger window than `window_log`, or decodes to more than `limit` bytes raises
    CompressionError, having decoded at most `limit` + 1 bytes; the context is then
    unusable (the stream must end)."""

    __slots__ = ("_decompress", "limit")

    def __init__(self, limit: int, window_log: int = LINK_WINDOW_LOG):
        options = {zstd.DecompressionParameter.window_log_max: window_log}
        self._decompress = zstd.ZstdDecompressor(options=options).decompress
        self.limit = limit

    def message(self, block: bytes) -> bytes:
        try:
            data = self._decompress(block, self.limit + 1)
        except zstd.ZstdError as e:
            raise CompressionError(f"a compressed message cannot be decoded: {e}") from None
        if len(data) > self.limit:
            del data  # not kept alive by the error's traceback while the stream's end is handled
            raise CompressionError(f"a compressed message decodes to more than {self.limit} bytes")
        return data
