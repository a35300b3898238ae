"""The `Relay` service, of agents and routers alike: frames from peers go to the node's
`receive` (its data plane: delivers, forwards and says when each may be acknowledged);
acks go back batched."""

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


class RelayServicer(rgrpc.RelayServicer):
    """Receives frames from peers; acknowledges each once `receive(peer, frame, ack)` calls
    `ack` (the data plane says its subtree holds it). Frames wait for `ready` (the data
    plane exists); `received(peer)` is the peer's received-bytes series."""

    def __init__(self, ready: asyncio.Event, received: Callable[[str], Counter],
                 receive: Callable[[str, rpb.RelayFrame, Callable[[], None]], None]):
        self.ready = ready
        self.received = received
        self.receive = receive

    async def Stream(self, request_iterator, context):
        peer = dict(context.invocation_metadata()).get(MEMBER_KEY, "?")
        # Agents and routers relay; the claimed sender must be the certificate's (no-op without TLS).
        require_member(context, peer, ("agent", "router"), "Relay.Stream")
        received = self.received(peer)
        acks: asyncio.Queue[int | None] = asyncio.Queue()
        await self.ready.wait()

        async def read():
            async for frame in request_iterator:
                received.inc(frame.ByteSize())
                self.receive(peer, frame, lambda seq=frame.seq: acks.put_nowait(seq))

        reader = asyncio.create_task(read())
        reader.add_done_callback(lambda _: acks.put_nowait(None))
        try:
            while (seq := await acks.get()) is not None:
                seqs = [seq]
                while not acks.empty() and (seq := acks.get_nowait()) is not None:
                    seqs.append(seq)
                yield rpb.RelayAck(seqs=seqs)
                if seq is None:
                    break
            error = reader.exception() if reader.done() and not reader.cancelled() else None
            if error is not None and not isinstance(error, grpc.aio.AioRpcError):
                log.error("relay stream from %s failed", peer, exc_info=error)
        finally:
            reader.cancel()
