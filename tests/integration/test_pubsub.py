"""End to end through real servers: publish on one agent, filtered subscribers on others."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from echelon.client import ACCEPTED, DELIVERED, errors
from echelon.contract.filters import parse
from tests.harness import wait_for
from loadtest.checker import drain

SCHEMA = ["Symbol:string", "High:float:0:500", "Low:float:0:500", "Volume:int:0:310000000"]


async def publish_in_turn_and_check(clients, topic: str, events: list[dict], subs: dict, filters: dict) -> None:
    """Publish `events` at DELIVERED from each client in turn; then each subscription of
    `subs` holds exactly the events its filter of `filters` (name -> (client, text)) matches,
    by brute force. Events carry their tag in attribute `r`."""
    pubs = [c.publisher(ack_level=DELIVERED) for c in clients]
    for k, e in enumerate(events):
        await pubs[k % len(pubs)].publish(topic, e)
    for name, (_, f) in filters.items():
        got = sorted(m.attributes["r"] for m in await drain(subs[name]))
        expected = sorted(e["r"] for e in events if parse(f).matches(e))
        assert got == expected, name


async def test_matching_subscribers_on_other_agents_receive_once(cluster):
    c0, c1, c2 = (cluster.client(i) for i in range(3))
    await c0.create_topic("quotes", SCHEMA)
    filters = {
        "aapl-high": (c1, 'Symbol = "aapl" and High >= 45'),
        "volume": (c2, "Volume >= 1000"),
        "never": (c2, 'Symbol = "zzzz"'),
        "local": (c0, "Low < 10"),
    }
    subs = {name: c.subscribe("quotes", f) for name, (c, f) in filters.items()}
    for s in subs.values():
        await s.start()
    events = [
        {"Symbol": "aapl", "High": 50.0, "Low": 5.0, "Volume": 2000},
        {"Symbol": "aapl", "High": 40.0, "Low": 30.0, "Volume": 10},
        {"Symbol": "msft", "High": 99.5, "Low": 1.0, "Volume": 1000},
        {"Symbol": "aapl", "High": 45},  # ints are accepted for float attributes
    ]
    pub = c0.publisher(ack_level=DELIVERED)
    payloads = [bytes([i]) * (1000 * i) for i in range(len(events))]
    for e, p in zip(events, payloads):
        await pub.publish("quotes", e, payload=p)
    for name, (_, f) in filters.items():
        got = await drain(subs[name])
        expected = [(e, p) for e, p in zip(events, payloads) if parse(f).matches(e)]
        assert [(m.attributes, m.payload) for m in got] == expected, name
        assert all(m.producer_id == pub.producer_id and m.redelivery_count == 0 for m in got)
    assert cluster.agent_nodes[2].metrics.duplicates._value.get() == 0


async def test_schema_violations_are_rejected_naming_the_attribute(cluster):
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("quotes", SCHEMA)
    async with c1.subscribe("quotes", "") as everything:
        pub = c0.publisher()
        cases = [
            ({"Sym": "aapl"}, "Sym", "unknown attribute"),
            ({"Symbol": 3}, "Symbol", "expected string"),
            ({"High": "high"}, "High", "expected float"),
            ({"High": 500.5}, "High", "outside [0, 500]"),
            ({"Volume": 1.5}, "Volume", "expected int"),
        ]
        for attrs, name, reason in cases:
            with pytest.raises(errors.InvalidArgument) as err:
                await pub.publish("quotes", attrs)
            assert f"'{name}'" in err.value.message and reason in err.value.message
        # The stream survives a rejected message, and nothing was published.
        assert (await pub.publish("quotes", {"Symbol": "ok"})).destinations == 1
        got = await drain(everything)
        assert [m.attributes for m in got] == [{"Symbol": "ok"}]
    with pytest.raises(errors.NotFound):
        await pub.publish("nope", {"x": 1})


@pytest.mark.parametrize("text, code, needle", [
    ("High >=", grpc.StatusCode.INVALID_ARGUMENT, "position 7"),
    ('Symbol = "aapl" xor High > 3', grpc.StatusCode.INVALID_ARGUMENT, "position 16"),
    ("Price > 3", grpc.StatusCode.INVALID_ARGUMENT, "'Price'"),
    ('High = "x"', grpc.StatusCode.INVALID_ARGUMENT, "expected float"),
    ("High > 600", grpc.StatusCode.INVALID_ARGUMENT, "no value in [0, 500]"),
    ("High between 9 and 3", grpc.StatusCode.INVALID_ARGUMENT, "empty range"),
])
async def test_invalid_subscriptions_change_nothing(cluster, text, code, needle):
    c = cluster.client(1)
    await c.create_topic("quotes", SCHEMA)
    with pytest.raises(errors.EchelonError) as err:
        await c.subscribe("quotes", text, name="bad").start()
    assert err.value.code == code and needle in err.value.message
    agent, matcher = cluster.agent_nodes[1], cluster.matcher_nodes[0]
    assert agent.subs == {} and len(matcher.tier.store) == 0


async def test_unknown_topic_is_not_found(cluster):
    with pytest.raises(errors.NotFound):
        await cluster.client(0).subscribe("missing", "").start()


async def test_credits_bound_deliveries_in_flight(cluster):
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("t")
    sub = c1.subscribe("t", "", max_outstanding=3)
    await sub.start()
    pub = c0.publisher(ack_level=DELIVERED)
    for i in range(10):
        await pub.publish("t", {"i": i})
    first = [await sub.next(timeout=5) for _ in range(3)]
    with pytest.raises(asyncio.TimeoutError):
        await sub.next(timeout=0.5)  # no credit left: nothing more is sent
    (state,) = cluster.agent_nodes[1].subs.values()
    assert len(state.unacked) == 3 and len(state.backlog) == 7
    await first[0].ack()  # one ack gives one credit back
    fourth = await sub.next(timeout=5)
    assert [m.attributes["i"] for m in first + [fourth]] == [0, 1, 2, 3]
    with pytest.raises(asyncio.TimeoutError):
        await sub.next(timeout=0.3)
    await sub.close()


async def test_named_subscription_redelivers_unacked_after_reconnect(cluster):
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("t")
    sub = c1.subscribe("t", "", name="durable", max_outstanding=10)
    await sub.start()
    # ACCEPTED: a DELIVERED publish to a named subscription with its client attached waits
    # for that client's ack (docs/guarantees.md), and this client reads only afterwards.
    pub = c0.publisher(ack_level=ACCEPTED)
    for i in range(4):
        await pub.publish("t", {"i": i})
    got = [await sub.next(timeout=5) for _ in range(4)]
    await got[0].ack()
    await got[1].ack()
    await asyncio.sleep(0.2)  # the acks reach the agent before the stream closes
    await sub.close()
    await wait_for(lambda: not cluster.agent_nodes[1].subs["durable"].attached, what="detach")
    again = c1.subscribe("t", "", name="durable", max_outstanding=10)
    await again.start()
    redelivered = [await again.next(timeout=5) for _ in range(2)]
    assert [(m.attributes["i"], m.redelivery_count) for m in redelivered] == [(2, 1), (3, 1)]
    await again.close()
    await c1.unsubscribe("durable")
    assert "durable" not in cluster.agent_nodes[1].subs


async def test_backlog_overflow_ends_the_stream_with_resource_exhausted(cluster):
    """Eviction, for an ephemeral subscription that chose it (lagging: test_backpressure.py)."""
    agent = cluster.agent_nodes[1]
    agent.max_backlog = 5
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("t")
    sub = c1.subscribe("t", "", max_outstanding=1, evict=True)
    await sub.start()
    pub = c0.publisher(ack_level=DELIVERED)
    for i in range(8):
        await pub.publish("t", {"i": i})
    await sub.next(timeout=5)
    with pytest.raises(errors.ResourceExhausted):
        for _ in range(10):
            await sub.next(timeout=5)
    assert agent.metrics.overflows._value.get() == 1


async def test_retry_through_another_agent_is_delivered_once(cluster):
    c0, c1, c2 = (cluster.client(i) for i in range(3))
    await c0.create_topic("t")
    async with c2.subscribe("t", "") as sub:
        a = c0.publisher(producer_id="retrying", ack_level=DELIVERED)
        b = c1.publisher(producer_id="retrying", ack_level=DELIVERED)
        await a.publish("t", {"n": 1})
        await b.publish("t", {"n": 1})  # same (producer, sequence 1): a retry after a lost ack
        got = await drain(sub)
    assert [m.attributes for m in got] == [{"n": 1}]
    assert cluster.agent_nodes[2].metrics.duplicates._value.get() == 1


async def test_fifo_per_producer_under_a_burst(cluster):
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("t")
    async with c1.subscribe("t", "n >= 0", max_outstanding=1000) as sub:
        pub = c0.publisher()
        futures = [pub.publish_nowait("t", {"n": i}) for i in range(2000)]
        await asyncio.gather(*futures)
        got = []
        while len(got) < 2000:
            m = await sub.next(timeout=10)
            got.append(m.attributes["n"])
            await m.ack()
    assert got == list(range(2000))


async def test_large_payload_is_sliced_and_reassembled(cluster):
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("bulk")
    payload = bytes(range(256)) * (9 * 4096 + 7)  # ~9.4 MB: three 4 MiB slices from the client
    async with c1.subscribe("bulk", "") as sub:
        await c0.publisher(ack_level=DELIVERED).publish("bulk", {"name": "blob"}, payload=payload)
        m = await sub.next(timeout=20)
    assert m.payload == payload and m.attributes == {"name": "blob"}
