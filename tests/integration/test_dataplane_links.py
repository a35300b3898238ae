"""Relay links across a broken stream: every frame queued before, during and after the
break is sent on the new stream and acknowledged (none is lost to the dead stream).
Frames queued together go as one message when they may (same source, same
`ack_may_wait`), and its one ack settles each of them."""

from __future__ import annotations

import asyncio

import grpc

from echelon.dataplane.frames import OutFrame
from echelon.dataplane.links import Link
from echelon.runtime.server import Server
from echelon.v1 import common_pb2 as pb
from echelon.v1 import relay_pb2 as rpb
from echelon.v1 import relay_pb2_grpc as rgrpc
from tests.harness import free_port, wait_for


class Acker(rgrpc.RelayServicer):
    def __init__(self):
        self.seqs: list[int] = []
        self.frames: list[tuple[str, list[int]]] = []  # per message read: source, its events' marks

    async def Stream(self, request_iterator, context):
        async for frame in request_iterator:
            self.seqs.append(frame.seq)
            self.frames.append((frame.source, [m.event.payload[0] for m in frame.messages]))
            yield rpb.RelayAck(seqs=[frame.seq])

    def marks(self) -> set[int]:
        return {k for _, ks in self.frames for k in ks}


async def serve(address: str) -> tuple[Server, Acker]:
    acker = Acker()
    server = Server()
    server.add(rgrpc.add_RelayServicer_to_server, acker, "echelon.v1.Relay")
    await server.start(address)
    return server, acker


def frame(i: int, source: str = "") -> OutFrame:
    out = OutFrame(source, "")
    out.add_message(b"", rpb.RelayMessage(event=pb.Event(payload=bytes([i % 256]) * 1000)).SerializeToString())
    return out


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
        assert second.marks() | third.marks() == set(range(1, 40)) and link.pending_bytes == 0
        assert link.enqueued == link.dequeued == 40
    finally:
        await link.close()
        await server.stop(0)


async def test_frames_queued_together_go_as_one_message_per_source_and_each_is_settled():
    address = f"127.0.0.1:{free_port()}"
    server, acker = await serve(address)
    link = Link("a", "b", address)
    try:
        # Queued before the link's stream writes anything: all waiting at once.
        sources = ["r1"] * 30 + ["r2"] + ["r1"] * 2
        futures = [link.send(frame(i, s)) for i, s in enumerate(sources)]
        assert await asyncio.wait_for(asyncio.gather(*futures), 5) == [True] * len(sources)
        assert acker.frames == [("r1", list(range(30))), ("r2", [30]), ("r1", [31, 32])]
        assert acker.seqs == [30, 31, 33]  # each message's seq is its last frame's
        assert link.pending_bytes == link.in_flight == 0 and not link.unacked
        assert link.enqueued == link.dequeued == len(sources)
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
    from echelon.dataplane.relay import RelayServicer

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


def request_pollers() -> list[asyncio.Task]:
    """grpc.aio's tasks that feed a stream call from its request iterator, still pending."""
    return [t for t in asyncio.all_tasks() if not t.done() and "_consume_request_iterator" in repr(t.get_coro())]


async def test_a_broken_streams_generator_ends_and_leaves_no_task_behind():
    # A call that ended with an error no longer cancels grpc's poller of its request
    # iterator; a generator left waiting for frames then outlives the link, and the GC
    # destroys its task pending ("Task was destroyed but it is pending!").
    address = f"127.0.0.1:{free_port()}"
    server, _ = await serve(address)
    breaks = []
    link = Link("a", "b", address, on_break=breaks.append)
    before = set(request_pollers())
    try:
        assert await asyncio.wait_for(link.send(frame(0)), 5)
        assert len(set(request_pollers()) - before) == 1  # the live stream's
        await server.grpc.stop(0)
        await wait_for(lambda: breaks, what="two broken streams")
        await wait_for(lambda: not set(request_pollers()) - before, what="the broken streams' pollers to end")
    finally:
        await link.close()
        await server.stop(0)
    await asyncio.sleep(0.1)
    assert not set(request_pollers()) - before
