"""A refused call keeps nothing of its request alive (runtime/server.py): gRPC holds the
abort's exception, with the handler's error as its context, in the call's state; with the
error's traceback, every frame's locals would live on with it (a compressed bomb's decoded
bytes did, one copy per refused stream: docs/compression.md). Here a decoder that refuses
after building a large buffer stands in for any handler that finds its request bad late."""

from __future__ import annotations

import gc

import grpc

from echelon.contract import zstream
from echelon.v1 import pubsub_pb2 as ppb
from tests.harness import Cluster



class Built:
    """What a handler had built (a decoded buffer, a parsed request): a tracked object, so
    that the collector can say whether anything still holds it."""

    def __init__(self):
        self.data = bytearray(1 << 20)


async def test_a_refused_streams_locals_do_not_outlive_it(monkeypatch):
    def refuse_late(self, block):
        built = Built()  # what it had built when it found the block bad
        raise zstream.CompressionError(f"refused after building {len(built.data)} bytes")

    monkeypatch.setattr(zstream.Decompressor, "message", refuse_late)
    c = Cluster(agents=1, matchers=1)
    try:
        await c.start()
        block = zstream.wrap(zstream.Compressor(zstream.CLIENT_WINDOW_LOG).block(b"any request"))
        async with grpc.aio.insecure_channel(c.agent_nodes[0].address) as ch:
            publish = ch.stream_stream("/echelon.v1.PubSub/Publish", response_deserializer=ppb.PublishAck.FromString)
            for _ in range(3):
                codes = []
                try:
                    async for ack in publish(iter([block]), metadata=zstream.OFFER, timeout=30):
                        codes += [a.code for a in ack.acks or [ack] if a.stream_status]
                except grpc.aio.AioRpcError as e:
                    codes.append(e.code().value[0])
                assert codes and codes[0] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        gc.collect()
        assert [o for o in gc.get_objects() if isinstance(o, Built)] == []
    finally:
        await c.stop()
