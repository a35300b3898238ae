"""Outgoing relay links: one long-lived `Relay.Stream` per peer.

A frame stays in the link until the peer acknowledges it, which the peer does once its
whole subtree holds the frame's messages. Frames are queued without waiting, so the
order in which they are queued is the order on the wire.

Backpressure: a root waits for `room()` before it queues more, so at most
`window_bytes` of its frames are unacknowledged per link. Because acks aggregate up
the tree, that also bounds every copy of those frames anywhere below; so a relay
forwards at once and never waits. (If relays also stopped at a full window, striped
trees could deadlock: A's window to B full of stripe-1 frames waiting on B's subtree,
which waits on a stripe-2 frame queued behind a full window back to A.)

Frames queued while the stream is busy writing go as one gRPC message (each
message costs ~100 us of CPU at either end and its own wakeups): consecutive frames of
one source with the same `ack_may_wait`, up to MERGE_BYTES. Two serialized RelayFrames
side by side parse as one, its messages all of theirs and its seq the last one's; the
receiver acknowledges that seq once its subtree holds them all, which settles every
frame of the group (`_groups`).

A broken stream is reopened and every unacknowledged frame sent again; the receiver
drops duplicates by message id. Closing a link (the peer left the view) settles every
pending frame as not delivered (False), so the caller re-routes it.

Compressed: each stream offers zstd (contract/zstream.py), and once the receiver has
accepted, every message after is a block of the stream's one compression context
(docs/compression.md). A receiver of an earlier release never accepts, and gets plain frames.

The link counts what the congestion element needs (OctopiA: CE = enqueued / dequeued,
and the queue length q) and the bytes it puts on the wire (compressed).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Callable

import grpc

from echelon.contract import zstream
from echelon.dataplane.frames import OutFrame
from echelon.contract.transport import MEMBER_KEY, PLAIN, RECONNECT_OPTIONS, Transport
from echelon.v1 import relay_pb2 as rpb

log = logging.getLogger("echelon.links")

MERGE_BYTES = 1 << 20  # frames merged into one message up to this size
STREAM_METHOD = "/echelon.v1.Relay/Stream"  # written as bytes (merged frames), not through the stub


class LinkMetrics:
    """The per-peer series one link feeds (children of the agent's labelled metrics)."""

    def __init__(self, enqueued=None, dequeued=None, sent_bytes=None):
        self.enqueued = enqueued
        self.dequeued = dequeued
        self.sent_bytes = sent_bytes


class Link:
    def __init__(self, self_id: str, peer_id: str, address: str, window_bytes: int = 8 << 20,
                 on_break: Callable[[str], None] | None = None, metrics: LinkMetrics | None = None,
                 transport: Transport = PLAIN):
        self.self_id = self_id
        self.peer = peer_id
        self.address = address
        self.window_bytes = window_bytes
        self.on_break = on_break
        self.metrics = metrics or LinkMetrics()
        self.transport = transport
        self.outbox: deque[tuple[int, OutFrame, int]] = deque()  # not yet sent on this stream
        self.unacked: dict[int, tuple[OutFrame, int, asyncio.Future]] = {}
        self.in_flight = 0  # bytes on the wire, unacknowledged
        self.pending_bytes = 0  # bytes queued or on the wire, unacknowledged
        self.enqueued = 0  # frames, for the congestion element
        self.dequeued = 0
        self.sent_bytes = 0
        self.closed = False
        self._stream = 0  # which stream `_frames` feeds: an old stream's generator must stop
        self._compressor: zstream.Compressor | None = None  # the current stream's, once accepted
        self._plain = False  # the peer refused a compressed stream: offer it no more
        self._seq = 0
        self._groups: dict[int, list[int]] = {}  # on this stream: a merged message's seq -> the others'
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._channel: grpc.aio.Channel | None = None

    @property
    def queue_length(self) -> int:
        return len(self.unacked)

    def send(self, frame: OutFrame) -> asyncio.Future:
        """Queue a frame; the future resolves True when acknowledged, False if the link closed first."""
        future = asyncio.get_running_loop().create_future()
        if self.closed:
            future.set_result(False)
            return future
        self._seq += 1
        seq, size = self._seq, frame.size
        self.unacked[seq] = (frame, size, future)
        self.outbox.append((seq, frame, size))
        self.pending_bytes += size
        self.enqueued += 1
        if self.metrics.enqueued:
            self.metrics.enqueued.inc()
        self._wake.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"link-{self.peer}")
        return future

    async def room(self) -> None:
        """Wait until less than a window is queued (or the link closed)."""
        while not self.closed and self.pending_bytes >= self.window_bytes:
            self._room.clear()
            await self._room.wait()

    def abandon(self) -> list[asyncio.Future]:
        """Close now, without waiting for the stream: every unacknowledged frame's future
        resolves False at once. Returns those futures in sequence order, so the caller can
        re-route them before anything else is sent on the new view (`close()` finishes)."""
        self.closed = True
        self._room.set()
        unacked, self.unacked = self.unacked, {}
        self.outbox.clear()
        self.pending_bytes = self.in_flight = 0
        futures = [future for _, _, future in unacked.values() if not future.done()]
        for future in futures:
            future.set_result(False)
        return futures

    async def close(self) -> None:
        self.abandon()
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._channel:
            await self._channel.close()

    def _acked(self, seqs) -> None:
        groups = self._groups
        for seq in [s for last in seqs for s in (*groups.pop(last, ()), last)] if groups else seqs:
            entry = self.unacked.pop(seq, None)
            if entry is None:
                continue
            _, size, future = entry
            self.in_flight -= size
            self.pending_bytes -= size
            self.dequeued += 1
            if self.metrics.dequeued:
                self.metrics.dequeued.inc()
            if not future.done():
                future.set_result(True)
        self._wake.set()
        if self.pending_bytes < self.window_bytes:
            self._room.set()

    async def _run(self) -> None:
        backoff = 0.05
        failures = 0  # consecutive streams that broke without a single ack
        made = -1
        while True:
            if self._channel is None or self.transport.stale(made):  # first, or new certificates
                old = self._channel
                self._channel = self.transport.dial(self.address, RECONNECT_OPTIONS)
                made = self.transport.generation
                stream = self._channel.stream_stream(STREAM_METHOD, response_deserializer=rpb.RelayAck.FromString)
                if old is not None:
                    await old.close()
            # (Re)open: everything unacknowledged goes out again, in sequence order.
            self.outbox = deque((seq, f, size) for seq, (f, size, _) in sorted(self.unacked.items()))
            self.in_flight = 0
            self._groups = {}
            self._compressor = None
            offer = () if self._plain else zstream.offer()
            call = stream(self._frames(self._stream), metadata=((MEMBER_KEY, self.self_id), *offer))
            try:
                # An earlier release sends its initial metadata with its first ack: frames go
                # plain meanwhile (the generator runs on its own).
                if zstream.accepted(await call.initial_metadata()):
                    self._compressor = zstream.Compressor()
                async for ack in call:
                    self._acked(ack.seqs)
                    backoff = 0.05
                    failures = 0
            except asyncio.CancelledError:
                call.cancel()
                raise
            except grpc.aio.AioRpcError as e:
                log.info("link to %s broke: %s %s (%d frames to resend)", self.peer, e.code().name, e.details(),
                         len(self.unacked))
                if e.code() == grpc.StatusCode.INVALID_ARGUMENT and self._compressor is not None:
                    # It could not decode our blocks: a fault of one end, not evidence against the
                    # path. The frames go again, plain, rather than break every stream.
                    log.warning("link to %s: compressed frames refused, sending plain from now on", self.peer)
                    self._plain = True
                else:
                    failures += 1
                # A stream can break on a congested path; only a peer we cannot reach again is
                # evidence against it (a false suspicion may get a live agent declared dead).
                if failures >= 2 and self.on_break:
                    self.on_break(self.peer)
            finally:
                # Retire this stream's generator and wake it to end: a broken call no longer
                # cancels grpc's task that polls it, which a closed link would leave pending.
                self._stream += 1
                self._wake.set()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    async def _frames(self, stream: int):
        # grpc keeps polling a failed call's request iterator: a generator whose stream is
        # gone must not take frames meant for the next one (they would never be sent).
        sent_bytes = self.metrics.sent_bytes
        while stream == self._stream:
            while self.outbox and stream == self._stream:
                seq, frame, size = self.outbox.popleft()
                if seq not in self.unacked:
                    continue
                parts, total, merged = frame.data(seq), size, []
                while self.outbox and total + (nxt := self.outbox[0])[2] <= MERGE_BYTES and \
                        (f := nxt[1]).source == frame.source and f.source_key == frame.source_key and \
                        f.ack_may_wait == frame.ack_may_wait:
                    self.outbox.popleft()
                    if nxt[0] in self.unacked:
                        merged.append(seq)
                        seq = nxt[0]
                        parts += f.data(seq)
                        total += nxt[2]
                if merged:
                    self._groups[seq] = merged
                self.in_flight += total
                data = b"".join(parts)
                if self._compressor is not None:
                    data = zstream.wrap(self._compressor.block(data))
                self.sent_bytes += len(data)
                if sent_bytes:
                    sent_bytes.inc(len(data))
                yield data
            self._wake.clear()
            await self._wake.wait()
