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


async def test_acks_of_frames_streaming_in_are_coalesced():
    """While frames stream in, a settled ack waits (up to the delay) for the next ones and
    they go back together: a burst of 20 frames each acknowledged at once on arrival is
    answered in a few RelayAcks, every frame exactly once. (A long delay here, so the
    burst surely streams in within it on a loaded machine.)"""
    from echelon.agent.relay import RelayServicer

    ready = asyncio.Event()
    ready.set()
    servicer = RelayServicer(ready, lambda peer: _Bytes(), lambda peer, frame, ack: ack(), ack_delay=0.5)
    server = Server()
    server.add(rgrpc.add_RelayServicer_to_server, servicer, "echelon.v1.Relay")
    address = f"127.0.0.1:{free_port()}"
    await server.start(address)
    try:
        async with grpc.aio.insecure_channel(address) as ch:
            frames = [rpb.RelayFrame(seq=i, messages=frame(i).messages) for i in range(1, 21)]
            call = rgrpc.RelayStub(ch).Stream(iter(frames))
            messages = [list(ack.seqs) async for ack in call]
        assert sorted(s for m in messages for s in m) == list(range(1, 21))
        assert len(messages) < 20
    finally:
        await server.stop(0)
