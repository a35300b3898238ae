"""Relay links across a broken stream: every frame queued before, during and after the
break is sent on the new stream and acknowledged (none is lost to the dead stream)."""

from __future__ import annotations

import asyncio

import grpc

from echelon.agent.links import Link
from echelon.runtime.server import Server
from echelon.v1 import common_pb2 as pb
from echelon.v1 import relay_pb2 as rpb
from echelon.v1 import relay_pb2_grpc as rgrpc
from tests.harness import free_port, wait_for


class Acker(rgrpc.RelayServicer):
    def __init__(self):
        self.seqs: list[int] = []

    async def Stream(self, request_iterator, context):
        async for frame in request_iterator:
            self.seqs.append(frame.seq)
            yield rpb.RelayAck(seqs=[frame.seq])


async def serve(address: str) -> tuple[Server, Acker]:
    acker = Acker()
    server = Server()
    server.add(rgrpc.add_RelayServicer_to_server, acker, "echelon.v1.Relay")
    await server.start(address)
    return server, acker


def frame(i: int) -> rpb.RelayFrame:
    return rpb.RelayFrame(messages=[rpb.RelayMessage(event=pb.Event(payload=bytes([i % 256]) * 1000))])


async def test_frames_survive_a_broken_stream():
    address = f"127.0.0.1:{free_port()}"
    server, first = await serve(address)
    breaks = []
    link = Link("a", "b", address, on_break=breaks.append)
    try:
        assert await asyncio.wait_for(link.send(frame(0)), 5)
        await server.grpc.stop(0)  # the stream breaks while the link's generator waits for frames
        await wait_for(lambda: breaks, what="the break")
        server, second = await serve(address)
        await asyncio.sleep(0.5)  # the link reconnects, idle
        after = [link.send(frame(i)) for i in range(1, 20)]
        assert await asyncio.wait_for(asyncio.gather(*after), 5) == [True] * 19
        more = [link.send(frame(i)) for i in range(20, 40)]
        await server.grpc.stop(0)  # and breaks again with frames queued
        server, third = await serve(address)
        assert await asyncio.wait_for(asyncio.gather(*more), 10) == [True] * 20
        assert set(breaks) == {"b"}
        assert set(second.seqs) | set(third.seqs) == set(range(2, 41)) and link.pending_bytes == 0
        assert link.enqueued == link.dequeued == 40
    finally:
        await link.close()
        await server.stop(0)


class _Bytes:
    def inc(self, n: int) -> None:
        pass


async def test_a_relay_holds_acks_only_for_frames_that_may_wait_and_while_they_stream_in():
    """A lone frame is acked at once (nothing streams in); a frame with `ack_may_wait`
    that comes right after another has its ack held (here for 30 s); a frame without it
    is acked at once and takes the held ack along: one RelayAck for both."""
    from echelon.agent.relay import RelayServicer

    ready = asyncio.Event()
    ready.set()
    servicer = RelayServicer(ready, lambda peer: _Bytes(), lambda peer, frame, ack: ack(), ack_delay=30.0)
    server = Server()
    server.add(rgrpc.add_RelayServicer_to_server, servicer, "echelon.v1.Relay")
    address = f"127.0.0.1:{free_port()}"
    await server.start(address)
    outbox: asyncio.Queue = asyncio.Queue()

    async def frames():
        while (f := await outbox.get()) is not None:
            yield f

    try:
        async with grpc.aio.insecure_channel(address) as ch:
            call = rgrpc.RelayStub(ch).Stream(frames())
            outbox.put_nowait(rpb.RelayFrame(seq=1, ack_may_wait=True, messages=frame(1).messages))
            assert list((await asyncio.wait_for(call.read(), 10)).seqs) == [1]  # alone: at once
            outbox.put_nowait(rpb.RelayFrame(seq=2, ack_may_wait=True, messages=frame(2).messages))
            read = asyncio.ensure_future(call.read())
            done, _ = await asyncio.wait({read}, timeout=0.5)
            assert not done  # held: it came right after another and may wait
            outbox.put_nowait(rpb.RelayFrame(seq=3, messages=frame(3).messages))
            assert list((await asyncio.wait_for(read, 10)).seqs) == [2, 3]
            outbox.put_nowait(None)
            assert await asyncio.wait_for(call.read(), 10) is grpc.aio.EOF  # nothing more
    finally:
        await server.stop(0)
