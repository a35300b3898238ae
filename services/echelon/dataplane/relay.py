"""The `Relay` service, of agents and routers alike: frames from peers go to the node's
`receive` (its data plane: delivers, forwards and says when each may be acknowledged);
acks go back coalesced.

Coalesced acks. A gRPC message costs ~100 us of CPU at each end, and at a low
rate every frame carries one event: an ack per frame doubles the link's messages. So an
ack that settles while frames stream in (the last two came less than ACK_DELAY apart)
waits up to ACK_DELAY for the next ones', and they go back as one RelayAck; under load
acks coalesce by themselves (all those settled while the last was written go at once,
and ACK_BATCH of them go without waiting). Only frames that say so wait
(`ack_may_wait`): the root leaves it unset when a publisher waits on the frame alone (a
DELIVERED publish with nothing else in flight on its stream, as `await publish()` in a
loop does), so a sequential publisher never waits for an ack delay; anything unset
(an older sender, a re-route) is acknowledged at once, as are the acks settled with it.
Nothing on the delivery path waits for an ack: frames are forwarded and delivered on
arrival. What waits is the root's DELIVERED ack to its publisher (by at most ACK_DELAY
per hop, when that publisher has more in flight) and the sender's window, bounded in
bytes (links.py).

A sender that offers zstd is accepted at once, and its frames may then come compressed
(contract/zstream.py, docs/compression.md); a block that cannot be decoded within its
bounds ends the stream with INVALID_ARGUMENT (the sender sends its frames again on a
new one).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

import grpc
from prometheus_client import Counter

from echelon.contract import zstream
from echelon.contract.transport import MAX_MESSAGE_BYTES, MEMBER_KEY, require_member
from echelon.v1 import relay_pb2 as rpb
from echelon.v1 import relay_pb2_grpc as rgrpc

log = logging.getLogger("echelon.relay")

ACK_DELAY = 0.005  # seconds a settled ack may wait for the next frames' while frames stream in
# (longer than the gap between frames at a low rate, or every ack goes alone; the DELIVERED
# acks then reach the root, and its publisher, in fewer messages too: docs/performance.md)
ACK_BATCH = 64  # settled acks that go at once, without waiting
SERVICE = rpb.DESCRIPTOR.services_by_name["Relay"].full_name


def add_RelayServicer_to_server(servicer: "RelayServicer", server) -> None:
    """relay_pb2_grpc's, with each frame handed to `Stream` as its bytes, parsed there: its
    size is then known without walking the parsed frame (`ByteSize` walks every field)."""
    handlers = {"Stream": grpc.stream_stream_rpc_method_handler(
        servicer.Stream, request_deserializer=None, response_serializer=rpb.RelayAck.SerializeToString)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


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
        metadata = context.invocation_metadata()
        peer = dict(metadata).get(MEMBER_KEY, "?")
        # Agents and routers relay; the claimed sender must be the certificate's (no-op without TLS).
        require_member(context, peer, ("agent", "router"), "Relay.Stream")
        received = self.received(peer)
        decompressor = None
        if zstream.enabled() and zstream.offered(metadata):
            decompressor = zstream.Decompressor(MAX_MESSAGE_BYTES)
            await context.send_initial_metadata(zstream.ACCEPT)
        loop = asyncio.get_running_loop()
        settled: list[int] = []  # acks not yet written
        state = _Acks()
        wake = asyncio.Event()
        await self.ready.wait()

        def ack(seq: int, may_wait: bool) -> None:
            settled.append(seq)
            state.hurry = state.hurry or not may_wait
            wake.set()

        def due() -> None:
            state.due = True
            wake.set()

        async def read():
            async for frame in request_iterator:
                now = loop.time()
                state.gap, state.last = now - state.last, now
                if frame.__class__ is bytes:  # registered by `add_RelayServicer_to_server` (an agent)
                    received.inc(len(frame))
                    if (block := zstream.unwrap(frame)) is not None:
                        frame = zstream.decode(decompressor, block)
                    frame = rpb.RelayFrame.FromString(frame)
                else:  # parsed by gRPC (a router's registration)
                    received.inc(frame.ByteSize())
                    if frame.zstd:
                        frame = zstream.decoded(frame, decompressor)
                self.receive(peer, frame, lambda seq=frame.seq, w=frame.ack_may_wait: ack(seq, w))

        reader = asyncio.create_task(read())
        reader.add_done_callback(lambda _: wake.set())
        try:
            while True:
                if settled and not (state.hurry or state.due or reader.done() or len(settled) >= ACK_BATCH
                                    or state.gap >= self.ack_delay):
                    if state.timer is None:  # frames are streaming in: the next ones' acks may join
                        state.timer = loop.call_later(self.ack_delay, due)
                elif settled:
                    if state.timer is not None:
                        state.timer.cancel()
                    state.timer, state.due, state.hurry = None, False, False
                    seqs = settled[:]
                    settled.clear()
                    yield rpb.RelayAck(seqs=seqs)
                    continue
                elif reader.done():
                    break
                wake.clear()
                await wake.wait()
            error = reader.exception() if not reader.cancelled() else None
            if isinstance(error, zstream.CompressionError):
                log.warning("relay stream from %s: %s", peer, error)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
            if error is not None and not isinstance(error, grpc.aio.AioRpcError):
                log.error("relay stream from %s failed", peer, exc_info=error)
        finally:
            reader.cancel()
            if state.timer is not None:
                state.timer.cancel()


class _Acks:
    """One stream's ack state: the gap between its last two frames, whether an ack must go
    now (`hurry`: a frame without `ack_may_wait`; `due`: the delay ran out), the timer."""

    __slots__ = ("gap", "last", "hurry", "due", "timer")

    def __init__(self):
        self.gap = float("inf")
        self.last = float("-inf")  # the first frame's gap is infinite: nothing streams in yet
        self.hurry = False
        self.due = False
        self.timer: asyncio.TimerHandle | None = None
