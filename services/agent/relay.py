"""The `Relay` service, of agents and routers alike: frames from peers go to the node's
`receive` (its data plane: delivers, forwards and says when each may be acknowledged);
acks go back coalesced.

Coalesced acks (issue 12). A gRPC message costs ~100 us of CPU at each end, and at a low
rate every frame carries one event: an ack per frame doubles the link's messages. So
while frames stream in (the last two came less than ACK_DELAY apart), an ack that
settles waits up to ACK_DELAY for the next ones and they go back as one RelayAck; a
lone frame (a sequential publisher, a quiet link) is acknowledged at once, and under
load acks coalesce by themselves (ACK_BATCH or more settled while the last ack was
written go at once). Nothing on the delivery path waits for an ack: frames are forwarded
and delivered on arrival. What waits is the root's DELIVERED ack to its publisher (by
at most ACK_DELAY per hop) and the sender's window, bounded in bytes (links.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

import grpc
from prometheus_client import Counter

from echelon.runtime.transport import MEMBER_KEY, require_member
from echelon.v1 import relay_pb2 as rpb
from echelon.v1 import relay_pb2_grpc as rgrpc

log = logging.getLogger("echelon.relay")

ACK_DELAY = 0.002  # seconds a settled ack may wait for the next frames' while frames stream in
ACK_BATCH = 64  # settled acks that go at once, without waiting


class RelayServicer(rgrpc.RelayServicer):
    """Receives frames from peers; acknowledges each once `receive(peer, frame, ack)` calls
    `ack` (the data plane says its subtree holds it). Frames wait for `ready` (the data
    plane exists); `received(peer)` is the peer's received-bytes series."""

    def __init__(self, ready: asyncio.Event, received: Callable[[str], Counter],
                 receive: Callable[[str, rpb.RelayFrame, Callable[[], None]], None], ack_delay: float = ACK_DELAY):
        self.ready = ready
        self.received = received
        self.receive = receive
        self.ack_delay = ack_delay

    async def Stream(self, request_iterator, context):
        peer = dict(context.invocation_metadata()).get(MEMBER_KEY, "?")
        # Agents and routers relay; the claimed sender must be the certificate's (no-op without TLS).
        require_member(context, peer, ("agent", "router"), "Relay.Stream")
        received = self.received(peer)
        loop = asyncio.get_running_loop()
        settled: list[int] = []  # acks not yet written
        wake = asyncio.Event()
        gap = [float("inf"), loop.time()]  # seconds between the last two frames, the last's arrival
        await self.ready.wait()

        def ack(seq: int) -> None:
            settled.append(seq)
            wake.set()

        async def read():
            async for frame in request_iterator:
                now = loop.time()
                gap[:] = now - gap[1], now
                received.inc(frame.ByteSize())
                self.receive(peer, frame, lambda seq=frame.seq: ack(seq))

        reader = asyncio.create_task(read())
        reader.add_done_callback(lambda _: wake.set())
        try:
            while True:
                if not settled:
                    if reader.done():
                        break
                    wake.clear()
                    await wake.wait()
                    continue
                if not reader.done() and len(settled) < ACK_BATCH and gap[0] < self.ack_delay:
                    await asyncio.sleep(self.ack_delay)  # frames are streaming in: theirs may join
                seqs = settled[:]
                settled.clear()
                yield rpb.RelayAck(seqs=seqs)
            error = reader.exception() if not reader.cancelled() else None
            if error is not None and not isinstance(error, grpc.aio.AioRpcError):
                log.error("relay stream from %s failed", peer, exc_info=error)
        finally:
            reader.cancel()
