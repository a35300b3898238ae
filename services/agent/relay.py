"""The `Relay` service: frames from peers go to the data plane, which delivers, forwards
and says when each may be acknowledged; acks go back batched."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import grpc

from echelon.v1 import relay_pb2 as rpb
from echelon.v1 import relay_pb2_grpc as rgrpc

if TYPE_CHECKING:
    from echelon.agent.server import AgentNode

log = logging.getLogger("echelon.agent")


class RelayServicer(rgrpc.RelayServicer):
    """Receives frames from peers; acknowledges each once the data plane says its subtree holds it."""

    def __init__(self, node: AgentNode):
        self.node = node

    async def Stream(self, request_iterator, context):
        peer = dict(context.invocation_metadata()).get("x-echelon-member", "?")
        node = self.node
        received = node.links.received(peer, peer in node.membership.members)
        acks: asyncio.Queue[int | None] = asyncio.Queue()
        await node.ready.wait()

        async def read():
            async for frame in request_iterator:
                received.inc(frame.ByteSize())
                node.plane.receive(frame, lambda seq=frame.seq: acks.put_nowait(seq))

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
