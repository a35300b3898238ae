"""Compressed client streams (docs/compression.md): a Publish or Subscribe stream whose
client offered zstd, accepted while the agent holds fewer than its bound of them.

Why a bound: each such stream holds a zstd context per direction (the window of
contract/zstream.py's CLIENT_WINDOW_LOG and the coder's tables: docs/cli.md says what it
costs), for as long as the stream lives; a client's streams are many and cheap to open,
so past the bound a stream that offers stays plain (never refused: plain is always
correct, and the client sees no ACCEPT).

Publish: ACCEPT goes out at once, as the call's initial metadata; from then on the
client's requests may come compressed, and every ack goes compressed. Subscribe: the
stream sends its initial metadata itself (the subscription's id, once registered: the
client's `start()` waits for it), so ACCEPT goes with it (`Accepting`), and the
deliveries written after it go compressed.
"""

from __future__ import annotations

from echelon.contract import zstream
from echelon.runtime.limits import Limits

MAX_STREAMS = 256  # compressed client streams per agent (the `--max-compressed-streams` flag)


class CompressedStreams:
    """The agent's compressed client streams: how many are open, and the bound; what one of
    their requests may decode to (`request_bytes`: the agent's receive limit for a plain
    request, so a block of a few KiB costs no more than a plain request the client sent)."""

    def __init__(self, limit: int = MAX_STREAMS, request_bytes: int = Limits().max_request_bytes):
        self.limit = limit
        self.request_bytes = request_bytes
        self.open = 0

    def offered(self, context) -> bool:
        """Whether a call offers zstd and this agent compresses at all (ECHELON_COMPRESS);
        a call made in-process (no context: the dead letters' publish) never does."""
        return context is not None and zstream.enabled() and zstream.offered(context.invocation_metadata())

    def take(self) -> bool:
        """One more stream accepted, if under the bound; `release()` it when it ends."""
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open -= 1

    def decompressor(self) -> zstream.Decompressor:
        """A compressing stream's reader, bounded as a plain request is."""
        return zstream.Decompressor(self.request_bytes, zstream.CLIENT_WINDOW_LOG)


def compressor():
    """A compressing stream's writer: serialized message (bytes) -> its block."""
    return zstream.Compressor(zstream.CLIENT_WINDOW_LOG).block


class Accepting:
    """A Subscribe call's context whose initial metadata carries ACCEPT: the stream's own
    (its subscription id, its policies), sent when the stream sends it (`sent` from then)."""

    __slots__ = ("_context", "sent")

    def __init__(self, context):
        self._context = context
        self.sent = False

    async def send_initial_metadata(self, metadata) -> None:
        await self._context.send_initial_metadata((*metadata, *zstream.ACCEPT))
        self.sent = True

    def __getattr__(self, name):
        return getattr(self._context, name)
