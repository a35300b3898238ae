"""Outgoing relay links: one long-lived `Relay.Stream` per peer.

A frame stays in the link until the peer acknowledges it. Frames are queued without
waiting (so the order in which the dispatcher queues them is the order on the wire);
the sender keeps at most `window_bytes` unacknowledged, which is the backpressure. A
broken stream is reopened and every unacknowledged frame sent again; the receiver drops
duplicate messages by id. Closing a link (the peer left the view) settles every
pending frame as not delivered, so the caller can re-route or count it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Callable

import grpc

from echelon.runtime.server import channel
from echelon.v1 import relay_pb2 as rpb
from echelon.v1 import relay_pb2_grpc as rgrpc

log = logging.getLogger("echelon.links")


class Link:
    def __init__(self, self_id: str, peer_id: str, address: str, window_bytes: int = 8 << 20,
                 on_break: Callable[[str], None] | None = None):
        self.self_id = self_id
        self.peer = peer_id
        self.address = address
        self.window_bytes = window_bytes
        self.on_break = on_break
        self.outbox: deque[tuple[int, rpb.RelayFrame, int]] = deque()  # not yet sent on this stream
        self.unacked: dict[int, tuple[rpb.RelayFrame, int, asyncio.Future]] = {}
        self.in_flight = 0
        self.enqueued = 0  # frames, for the congestion element
        self.dequeued = 0
        self.sent_bytes = 0
        self._seq = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._channel: grpc.aio.Channel | None = None

    @property
    def queue_length(self) -> int:
        return len(self.unacked)

    def send(self, frame: rpb.RelayFrame) -> asyncio.Future:
        """Queue a frame; the future resolves True when acknowledged, False if the link closed first."""
        self._seq += 1
        frame.seq = self._seq
        size = frame.ByteSize()
        future = asyncio.get_running_loop().create_future()
        self.unacked[frame.seq] = (frame, size, future)
        self.outbox.append((frame.seq, frame, size))
        self.enqueued += 1
        self._wake.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"link-{self.peer}")
        return future

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._channel:
            await self._channel.close()
        for _, _, future in self.unacked.values():
            if not future.done():
                future.set_result(False)
        self.unacked.clear()
        self.outbox.clear()

    async def _run(self) -> None:
        self._channel = channel(self.address)
        stub = rgrpc.RelayStub(self._channel)
        backoff = 0.05
        while True:
            # (Re)open: everything unacknowledged goes out again, in sequence order.
            self.outbox = deque((seq, f, size) for seq, (f, size, _) in sorted(self.unacked.items()))
            self.in_flight = 0
            call = stub.Stream(self._frames(), metadata=(("x-echelon-member", self.self_id),))
            try:
                async for ack in call:
                    for seq in ack.seqs:
                        entry = self.unacked.pop(seq, None)
                        if entry is None:
                            continue
                        _, size, future = entry
                        self.in_flight -= size
                        self.dequeued += 1
                        if not future.done():
                            future.set_result(True)
                    self._wake.set()
                    backoff = 0.05
            except asyncio.CancelledError:
                call.cancel()
                raise
            except grpc.aio.AioRpcError as e:
                log.info("link to %s broke: %s", self.peer, e.code().name)
                if self.on_break:
                    self.on_break(self.peer)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    async def _frames(self):
        while True:
            while self.outbox and (self.in_flight < self.window_bytes or self.in_flight == 0):
                seq, frame, size = self.outbox.popleft()
                if seq not in self.unacked:
                    continue
                self.in_flight += size
                self.sent_bytes += size
                yield frame
            self._wake.clear()
            await self._wake.wait()
