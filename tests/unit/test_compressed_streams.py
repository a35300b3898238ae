"""The agent's side of compressed client streams (agent/compressed.py) and the SDK's
reader (client/compressed.py), without a cluster: who is accepted, the bound, and the
requests refused before anything of them is used."""

from __future__ import annotations

import pytest

from echelon.agent.compressed import CompressedStreams, compressor
from echelon.contract.zstream import decoded
from echelon.client.compressed import reader
from echelon.contract import zstream
from echelon.v1 import pubsub_pb2 as ppb


class Context:
    def __init__(self, metadata):
        self.metadata = metadata

    def invocation_metadata(self):
        return self.metadata


def test_only_a_call_that_offers_is_accepted_and_only_while_the_agent_compresses(monkeypatch):
    streams = CompressedStreams(2)
    assert streams.offered(Context(zstream.OFFER))
    assert not streams.offered(Context((("other", "x"),)))
    assert not streams.offered(None)  # in-process (the dead letters' publish)
    monkeypatch.setenv("ECHELON_COMPRESS", "off")
    assert not streams.offered(Context(zstream.OFFER))


def test_the_bound_is_counted_and_released():
    streams = CompressedStreams(2)
    assert streams.take() and streams.take()
    assert not streams.take() and streams.open == 2
    streams.release()
    assert streams.take() and streams.open == 2


def test_a_request_is_decoded_by_its_stream_or_refused():
    req = ppb.PublishRequest(topic="t", producer_id="p", sequence=7)
    block = zstream.Compressor(zstream.CLIENT_WINDOW_LOG).block
    received = CompressedStreams().decompressor()
    assert decoded(ppb.PublishRequest(zstd=block(req.SerializeToString())), received) == req
    with pytest.raises(zstream.CompressionError, match="not accepted"):
        decoded(ppb.PublishRequest(zstd=b"anything"), None)
    with pytest.raises(zstream.CompressionError, match="more than its zstd block"):
        decoded(ppb.PublishRequest(topic="t", zstd=block(req.SerializeToString())), received)
    nested = ppb.PublishRequest(zstd=b"x").SerializeToString()
    with pytest.raises(zstream.CompressionError, match="another compressed message"):
        decoded(ppb.PublishRequest(zstd=block(nested)), received)
    with pytest.raises(zstream.CompressionError, match="cannot be decoded"):
        decoded(ppb.PublishRequest(zstd=b"\x28\xb5\x2f\xfd not a block"), CompressedStreams().decompressor())


def test_a_request_decodes_to_at_most_the_agents_receive_limit():
    """A block of a few KiB must cost the agent no more than a plain request could: the
    agent's `max_request_bytes`, not the transport's far larger message limit."""
    streams = CompressedStreams(request_bytes=1 << 20)
    big = ppb.PublishRequest(topic="t", payload=bytes((1 << 20) - 16)).SerializeToString()
    block = zstream.Compressor(zstream.CLIENT_WINDOW_LOG).block
    assert len(big) <= 1 << 20 and decoded(ppb.PublishRequest(zstd=block(big)), streams.decompressor()).topic == "t"
    over = ppb.PublishRequest(topic="t", payload=bytes(1 << 20)).SerializeToString()
    with pytest.raises(zstream.CompressionError, match="more than 1048576 bytes"):
        decoded(ppb.PublishRequest(zstd=zstream.Compressor(zstream.CLIENT_WINDOW_LOG).block(over)),
                streams.decompressor())


def test_the_sdk_reads_plain_and_compressed_messages_of_one_stream():
    """The agent's writer (compressor, wrapped as pubsub.py writes a Delivery) against the
    SDK's reader: plain and compressed messages alternating, each read as it was."""
    write, wrap, read = compressor(), zstream.wrap, reader(ppb.DeliveryRead)
    for i in range(1, 6):
        d = ppb.Delivery(delivery_id=i, subscription="~1", redelivery_count=i % 2)
        data = d.SerializeToString()
        got = read(wrap(write(data)) if i % 2 else data)
        assert (got.delivery_id, got.subscription, got.redelivery_count) == (i, "~1", i % 2)
