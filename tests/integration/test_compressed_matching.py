"""Compressed match streams (contract/zstream.py, docs/compression.md): the publishing agent
offers zstd on its `Match` stream and the matcher accepts; every event still reaches
exactly the subscriptions whose filters it satisfies (brute force over the same filters is
the oracle). A stream that sends a compressed request it was not granted, or one that
decodes past its bounds, ends with INVALID_ARGUMENT and the matcher serves on."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from echelon.contract import zstream
from echelon.contract.wire import attributes_to_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import matcher_pb2 as xpb
from tests.harness import Cluster, wait_for

MATCH_METHOD = "/echelon.v1.Matcher/Match"
FILTERS = {"low": (lambda n, k: n < 40, "n < 40"), "band": (lambda n, k: 30 <= n < 70 and k == "a", 'n >= 30 and n < 70 and k = "a"'),
           "high": (lambda n, k: n >= 90, "n >= 90")}


@pytest.mark.timeout(90)
async def test_events_reach_exactly_the_matching_subscriptions_over_compressed_match_streams():
    c = Cluster(agents=3, matchers=2)
    try:
        await c.start()
        await c.client(0).create_topic("t", ["n:int:0:99", "k:string", "i:int"])
        subs = {name: c.client(1 + i % 2).subscribe("t", text, name=name, max_outstanding=1000)
                for i, (name, (_, text)) in enumerate(FILTERS.items())}
        for s in subs.values():
            await s.start()
        rng = random.Random(3)
        events = [(rng.randrange(100), rng.choice("ab")) for _ in range(300)]
        publisher = c.client(0).publisher()
        for lo in range(0, len(events), 30):  # in bursts: batches of several events, and single ones
            await asyncio.gather(*(publisher.publish_nowait("t", {"n": n, "k": k, "i": lo + j})
                                   for j, (n, k) in enumerate(events[lo:lo + 30])))
        for name, (match, _) in FILTERS.items():
            want = [i for i, (n, k) in enumerate(events) if match(n, k)]
            got = []
            while len(got) < len(want):
                m = await subs[name].next(timeout=10)
                got.append(m.attributes["i"])
                await m.ack()
            assert sorted(got) == want, name
        assert c.agent_nodes[0].matching._compressor is not None  # the matcher accepted: requests went compressed
        for s in subs.values():
            await s.close()
    finally:
        await c.stop()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["not offered", "bomb", "garbage"])
async def test_a_compressed_request_not_granted_or_past_its_bounds_ends_the_stream(case):
    c = Cluster(agents=1, matchers=1)
    try:
        await c.start()
        await c.client(0).create_topic("t", ["n:int:0:99"])
        address = c.matcher_nodes[0].address
        event = pb.Event(id=pb.MessageId(producer_id="p", sequence=1), topic="t", attributes=attributes_to_pb({"n": 5}))
        good = xpb.MatchRequest(batch_id=1, events=[event], agents_only=True).SerializeToString()
        bad = {"not offered": zstream.wrap(zstream.Compressor().block(good)),
               "bomb": zstream.wrap(zstream.Compressor().block(bytes(80 << 20))),
               "garbage": zstream.wrap(b"\x28\xb5\x2f\xfd not a block")}[case]
        async with grpc.aio.insecure_channel(address) as ch:
            call = ch.stream_stream(MATCH_METHOD, response_deserializer=xpb.MatchResponse.FromString)(
                iter([bad]), metadata=() if case == "not offered" else zstream.OFFER)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                async for _ in call:
                    pass
            assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT, failed.value
            # The matcher serves on: a granted, compressed request is answered, compressed.
            compressor, decompressor = zstream.Compressor(), zstream.Decompressor(1 << 20)
            call = ch.stream_stream(MATCH_METHOD, response_deserializer=xpb.MatchResponse.FromString)(
                metadata=zstream.OFFER)
            assert zstream.accepted(await call.initial_metadata())
            await call.write(zstream.wrap(compressor.block(good)))
            answer = await asyncio.wait_for(call.read(), 10)
            assert answer.zstd and xpb.MatchResponse.FromString(decompressor.message(answer.zstd)).batch_id == 1
            call.cancel()
    finally:
        await c.stop()
