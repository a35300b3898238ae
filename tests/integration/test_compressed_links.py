"""Compressed relay links (contract/zstream.py, docs/compression.md): a link offers zstd, the
agents' Relay service accepts, and from then on frames travel as blocks of the stream's one
context: the receiver reads exactly the frames sent, in fewer bytes. A peer that sends
what it was not granted, or a block that decodes past its bounds, is refused with
INVALID_ARGUMENT and nothing of it is received. (Links to a receiver that never accepts,
as an earlier release: tests/integration/test_dataplane_links.py.)"""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from echelon.contract import zstream
from echelon.contract.transport import MEMBER_KEY
from echelon.dataplane.frames import OutFrame, whole_tail
from echelon.dataplane.links import STREAM_METHOD, Link
from echelon.dataplane.relay import RelayServicer, add_RelayServicer_to_server
from echelon.runtime.server import Server
from echelon.v1 import common_pb2 as pb
from echelon.v1 import relay_pb2 as rpb
from tests.harness import free_port, wait_for


class Count:
    def __init__(self):
        self.value = 0

    def inc(self, n):
        self.value += n


async def serve():
    got: list[rpb.RelayFrame] = []
    received: dict[str, Count] = {}

    def receive(peer, frame, ack):
        got.append(frame)
        ack()

    ready = asyncio.Event()
    ready.set()
    servicer = RelayServicer(ready, lambda peer: received.setdefault(peer, Count()), receive)
    server = Server()
    server.add(add_RelayServicer_to_server, servicer, "echelon.v1.Relay")
    address = f"127.0.0.1:{free_port()}"
    await server.start(address)
    return server, address, got, received


def event(rng: random.Random, i: int) -> bytes:
    e = pb.Event(id=pb.MessageId(producer_id="bench-1", sequence=i), topic="quotes", payload=rng.randbytes(16))
    e.attributes["Symbol"].string_value = f"s{rng.randrange(50):02d}"
    e.attributes["Price"].float_value = rng.random() * 100
    return e.SerializeToString()


async def test_frames_arrive_exactly_as_sent_in_far_fewer_bytes():
    server, address, got, received = await serve()
    link = Link("a", "b", address)
    rng = random.Random(7)
    sent: list[list[bytes]] = []
    try:
        for round in range(40):  # rounds of frames, so most go after the receiver accepted
            futures = []
            for _ in range(rng.randrange(1, 6)):
                frame, events = OutFrame("a", "a:1"), [event(rng, len(sent) * 100 + k) for k in range(rng.randrange(1, 60))]
                for data in events:
                    frame.add_whole(whole_tail(["b"]), data)
                sent.append(events)
                futures.append(link.send(frame))
            assert await asyncio.wait_for(asyncio.gather(*futures), 10) == [True] * len(futures)
        # Frames queued together may go as one message: compare the events in order.
        assert [m.encoded_event for f in got for m in f.messages] == [e for events in sent for e in events]
        assert all(list(m.destinations) == ["b"] for f in got for m in f.messages)
        plain = sum(len(e) + 12 for events in sent for e in events)  # a lower bound of the plain frames
        assert link.sent_bytes == received["a"].value  # both ends count the wire's bytes
        assert link.sent_bytes < plain / 2, (link.sent_bytes, plain)
    finally:
        await link.close()
        await server.stop(0)


async def _raw_stream(address: str, messages: list[bytes], offer: bool):
    channel = grpc.aio.insecure_channel(address)
    try:
        metadata = ((MEMBER_KEY, "x"), *(zstream.OFFER if offer else ()))
        call = channel.stream_stream(STREAM_METHOD, response_deserializer=rpb.RelayAck.FromString)(
            iter(messages), metadata=metadata)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            async for _ in call:
                pass
        return failed.value
    finally:
        await channel.close()


@pytest.mark.parametrize("case", ["not offered", "bomb", "garbage", "block and fields"])
async def test_a_block_not_granted_or_past_its_bounds_is_refused_and_nothing_is_received(case):
    server, address, got, _ = await serve()
    try:
        good = rpb.RelayFrame(seq=1, source="x").SerializeToString()
        c = zstream.Compressor()
        bad = {
            "not offered": zstream.wrap(zstream.Compressor().block(good)),
            "bomb": zstream.wrap(c.block(bytes(80 << 20))),  # past the 64 MiB of a plain message
            "garbage": zstream.wrap(b"\x28\xb5\x2f\xfd not a block"),
            "block and fields": zstream.wrap(zstream.Compressor().block(good)) + good,
        }[case]
        error = await _raw_stream(address, [bad], offer=case != "not offered")
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert got == []
        # The service goes on: a well-behaved stream afterwards is served.
        c = zstream.Compressor()
        ok = grpc.aio.insecure_channel(address)
        call = ok.stream_stream(STREAM_METHOD, response_deserializer=rpb.RelayAck.FromString)(
            iter([zstream.wrap(c.block(good))]), metadata=((MEMBER_KEY, "y"), *zstream.OFFER))
        assert zstream.accepted(await call.initial_metadata())
        assert (await call.read()).seqs == [1]
        call.cancel()
        await ok.close()
        await wait_for(lambda: len(got) == 1, what="the good frame")
    finally:
        await server.stop(0)


async def test_echelon_compress_off_keeps_links_plain_and_refuses_offers(monkeypatch):
    monkeypatch.setenv("ECHELON_COMPRESS", "off")
    server, address, got, received = await serve()
    link = Link("a", "b", address)
    rng = random.Random(1)
    try:
        events = []
        for round in range(10):
            frame = OutFrame("a", "a:1")
            for data in [event(rng, round * 100 + k) for k in range(30)]:
                frame.add_whole(whole_tail(["b"]), data)
                events.append(data)
            assert await asyncio.wait_for(link.send(frame), 10)
        assert [m.encoded_event for f in got for m in f.messages] == events
        assert link._compressor is None and link.sent_bytes > sum(map(len, events))  # the sender offered nothing
        async with grpc.aio.insecure_channel(address) as ch:  # and the receiver takes no offer
            call = ch.stream_stream(STREAM_METHOD, response_deserializer=rpb.RelayAck.FromString)(
                iter([rpb.RelayFrame(seq=1, source="x").SerializeToString()]), metadata=((MEMBER_KEY, "y"), *zstream.OFFER))
            assert (await call.read()).seqs == [1]
            assert not zstream.accepted(await call.initial_metadata())
            call.cancel()
    finally:
        await link.close()
        await server.stop(0)


async def test_a_peer_that_refuses_the_blocks_it_accepted_gets_every_frame_plain_and_is_not_suspected():
    """A receiver that accepts zstd but cannot decode it (a fault of one end): the link
    sends its frames again on a plain stream, and does not count it against the peer."""
    got: list[int] = []

    async def stream(request_iterator, context):
        await context.send_initial_metadata(zstream.ACCEPT)
        async for data in request_iterator:
            if zstream.unwrap(data) is not None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "this receiver cannot decode zstd")
            frame = rpb.RelayFrame.FromString(data)
            got.extend(m.encoded_event[0] for m in frame.messages)
            yield rpb.RelayAck(seqs=[frame.seq])

    handler = grpc.stream_stream_rpc_method_handler(stream, request_deserializer=None,
                                                    response_serializer=rpb.RelayAck.SerializeToString)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("echelon.v1.Relay", {"Stream": handler}),))
    address = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(address)
    await server.start()
    breaks: list[str] = []
    link = Link("a", "b", address, on_break=breaks.append)
    try:
        for i in range(30):
            frame = OutFrame("a", "a:1")
            frame.add_whole(whole_tail(["b"]), bytes([i]) * 50)
            assert await asyncio.wait_for(link.send(frame), 10)
        assert sorted(set(got)) == list(range(30)) and link._plain and breaks == []
    finally:
        await link.close()
        await server.stop(0)
