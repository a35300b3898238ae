"""The benchmark's Node publisher (loadtest/node/publish.js through loadtest/bench_events/node.py:
@grpc/grpc-js, protos/ loaded at start, one event per PublishRequest, many in flight, at
DELIVERED) against a real cluster: with one ack per request and with `coalesce_acks`, every
send returns once its events are acked, and each subscriber (on the other agents, the data
plane's path) receives exactly the events its filter matches, once each, against a
brute-force oracle written here (not the matcher), payloads intact.

Needs node and the load generator's pinned packages: `make install` (or the test itself)
runs `npm ci` in loadtest/node when npm is present; skips, saying why, otherwise."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from loadtest.bench_events import node
from loadtest.bench_events.workload import PAYLOAD
from loadtest.checker import drain

SCHEMA = ["Symbol:string:8", "Price:float:0:500", "Volume:int"]
SYMBOLS = ["aapl", "msft", "goog", "ibm", "orcl"]
FILTERS = ['Symbol = "aapl"', "Price >= 40 and Price < 60 and Volume >= 500", 'Symbol in ("ibm", "orcl")']
POOL = 64  # distinct attribute sets, as the benchmark's pool
EVENTS = 800


def oracle(f: str, e: dict) -> bool:
    """Each filter above, by hand."""
    if f == FILTERS[0]:
        return e["Symbol"] == "aapl"
    if f == FILTERS[1]:
        return 40 <= e["Price"] < 60 and e["Volume"] >= 500
    return e["Symbol"] in ("ibm", "orcl")


@pytest.fixture(scope="module")
def node_client():
    why = node.install()  # npm ci of the pinned packages when they are missing and npm is here
    if why:
        pytest.skip(f"the Node load generator cannot run here: {why}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("coalesce", [False, True], ids=["ack-each", "coalesced"])
async def test_the_node_publisher_one_event_a_request_delivers_every_event_once(cluster, node_client, coalesce):
    await cluster.client(0).create_topic("quotes", SCHEMA)
    rng = random.Random(11)
    pool = [{"Symbol": rng.choice(SYMBOLS), "Price": round(rng.uniform(0, 100), 2) + 0.25,
             "Volume": rng.randrange(0, 1000)} for _ in range(POOL)]
    subs = [cluster.client(1 + i % 2).subscribe("quotes", f, max_outstanding=4096) for i, f in enumerate(FILTERS)]
    for s in subs:
        await s.start()
    pub = node.NodePublisher(cluster.agent_nodes[0].address, 2, coalesce, pool, "quotes")
    try:
        # Sends of 100 events, 5 at a time: many requests in flight on the one stream.
        room = asyncio.Semaphore(5)

        async def send(first: int) -> None:
            async with room:
                await pub.send([(i, (i * 7) % POOL) for i in range(first, min(first + 100, EVENTS))])
        t0 = time.perf_counter_ns()
        await asyncio.wait_for(asyncio.gather(*(send(k) for k in range(0, EVENTS, 100))), 60)
    finally:
        await pub.close()
    for f, s in zip(FILTERS, subs):
        got = await drain(s, idle=0.5)
        expected = [i for i in range(EVENTS) if oracle(f, pool[(i * 7) % POOL])]
        assert 20 < len(expected) < EVENTS, f  # the filter selects some, not all
        ids = [PAYLOAD.unpack(m.payload)[0] for m in got]
        assert sorted(ids) == expected, f  # each matching event once, no other
        for m in got:
            i, sent = PAYLOAD.unpack(m.payload)
            assert m.attributes == pool[(i * 7) % POOL] and sent >= t0  # Node's clock is this one's
        await s.close()


async def test_a_refused_event_fails_its_send_with_the_agents_code(cluster, node_client):
    await cluster.client(0).create_topic("quotes", SCHEMA)
    pub = node.NodePublisher(cluster.agent_nodes[0].address, 2, True,
                             [{"Symbol": "aapl", "Price": 10.5, "Volume": 1}, {"Symbol": "aapl", "Price": 900.5}],
                             "quotes")
    try:
        await pub.send([(0, 0), (1, 0)])
        with pytest.raises(RuntimeError, match=r"error 4: 3 "):  # its sequence (the 4th request), INVALID_ARGUMENT
            await pub.send([(2, 0), (3, 1)])
        await pub.send([(4, 0)])  # the stream stays open
    finally:
        await pub.close()
