"""Compressed streams (contract/zstream.py): what goes in comes out, message by message, and
a hostile block is refused within its bounds."""

import os
import random

import pytest

from echelon.contract.zstream import (ACCEPT, CLIENT_WINDOW_LOG, OFFER, CompressionError, Compressor, Decompressor,
                                      accepted, offered, unwrap, wrap, zstd)


def _messages(rng: random.Random, n: int) -> list[bytes]:
    """Alike messages (a schema's events) mixed with random and empty ones, some larger
    than the window."""
    out = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.7:
            out.append(b"\x0a\x10producer-%d\x12\x05bench\x1a%b" % (i, os.urandom(rng.randrange(0, 40))) * rng.randrange(1, 30))
        elif kind < 0.9:
            out.append(os.urandom(rng.randrange(0, 3000)))
        elif kind < 0.97:
            out.append(b"")
        else:
            out.append(os.urandom(1 << 16) + bytes(rng.randrange(1 << 17)))
    return out


@pytest.mark.parametrize("window_log", [CLIENT_WINDOW_LOG, 20])
def test_each_block_decodes_alone_to_its_message_in_order(window_log):
    rng = random.Random(window_log)
    c, d = Compressor(window_log), Decompressor(1 << 20, window_log)
    messages = _messages(rng, 1500)
    blocks = [c.block(m) for m in messages]
    assert [d.message(b) for b in blocks] == messages
    alike = [m for m in messages if m.startswith(b"\x0a")]
    coded = sum(len(b) for m, b in zip(messages, blocks) if m.startswith(b"\x0a"))
    assert coded * 3 < sum(map(len, alike))  # coded against the stream's history: far smaller


def test_a_bomb_is_refused_at_the_limit_not_after_decoding_it():
    bomb = Compressor().block(bytes(64 << 20))  # a window the receiver allows: only the size is wrong
    assert len(bomb) < 1 << 14
    d = Decompressor(1 << 20)
    with pytest.raises(CompressionError, match="more than 1048576 bytes"):
        d.message(bomb)


def test_a_window_larger_than_allowed_and_garbage_are_refused():
    big = zstd.ZstdCompressor(options={zstd.CompressionParameter.window_log: 24})
    block = big.compress(os.urandom(100), zstd.ZstdCompressor.FLUSH_BLOCK)
    with pytest.raises(CompressionError):
        Decompressor(1 << 20, window_log=20).message(block)
    with pytest.raises(CompressionError):
        Decompressor(1 << 20).message(b"not zstd at all")


def test_a_message_one_byte_over_the_limit_is_refused_and_one_at_it_is_not():
    c = Compressor()
    assert Decompressor(1000).message(c.block(bytes(1000))) == bytes(1000)
    with pytest.raises(CompressionError):
        Decompressor(1000).message(Compressor().block(bytes(1001)))


def test_negotiation_reads_only_its_own_key_and_value():
    assert offered(OFFER) and offered((("x", "y"), ("echelon-compress", "gzip,zstd")))
    assert not offered((("echelon-compress", "gzip"),)) and not offered(None) and not offered((("zstd", "zstd"),))
    assert accepted(ACCEPT) and not accepted((("echelon-compress", "gzip"),)) and not accepted(())


def test_wrap_is_the_zstd_field_alone_of_every_message_type_and_unwrap_reads_it_back():
    from echelon.v1 import matcher_pb2, pubsub_pb2, relay_pb2
    for block in (b"", b"x", os.urandom(300), os.urandom(70000)):
        data = wrap(block)
        for kind in (relay_pb2.RelayFrame, matcher_pb2.MatchRequest, matcher_pb2.MatchResponse,
                     pubsub_pb2.PublishRequest, pubsub_pb2.PublishAck, pubsub_pb2.Delivery):
            assert kind.FromString(data) == kind(zstd=block)  # protobuf is the oracle
            assert kind(zstd=block).SerializeToString() == data or not block  # (proto3 leaves b"" out)
        assert unwrap(data) == block
    plain = relay_pb2.RelayFrame(seq=3, source="a").SerializeToString()
    assert unwrap(plain) is None and unwrap(b"") is None
    with pytest.raises(CompressionError):
        unwrap(wrap(b"block") + plain)  # the block and other fields: not what a sender writes
    with pytest.raises(CompressionError):
        unwrap(wrap(b"block")[:-1])  # cut short


def test_a_refused_bomb_leaves_nothing_it_decoded_alive_in_the_errors_traceback():
    """The stream that got the error may keep it (its status, a log record): what was decoded
    up to the limit must not live on with it, or each refused bomb would hold the limit."""
    limit = 1 << 20
    with pytest.raises(CompressionError) as refused:
        Decompressor(limit).message(Compressor().block(bytes(8 << 20)))
    tb, held = refused.value.__traceback__, []
    while tb is not None:
        held += [v for v in tb.tb_frame.f_locals.values() if isinstance(v, bytes) and len(v) > limit]
        tb = tb.tb_next
    assert held == []
