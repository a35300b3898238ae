"""Publishing results and the client's lifecycle through real agents: PublishResult,
publish_batch, a Publisher that flushes on exit, and drain/close with publishes in flight
(none lost, none after the drain)."""

from __future__ import annotations

import asyncio

import pytest

from echelon.client import DELIVERED, AckLevel, PublishResult, errors
from tests.harness import wait_for

SCHEMA = ["Symbol:string", "High:float:0:500"]


async def read_until(sub, marker: dict, limit: int = 100_000) -> list:
    """Every message before `marker` (acked), in arrival order."""
    got = []
    for _ in range(limit):
        m = await sub.next(timeout=15)
        await m.ack()
        if m.attributes == marker:
            return got
        got.append(m)
    raise AssertionError(f"no marker in {limit} messages")


async def test_publish_returns_a_result_and_a_batch_keeps_order(cluster):
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("quotes", SCHEMA)
    async with c1.subscribe("quotes", 'Symbol = "aapl"') as sub:
        async with c0.publisher(producer_id="p1", ack_level=AckLevel.DELIVERED) as pub:
            assert await pub.publish("quotes", {"Symbol": "aapl"}) == PublishResult("p1", 1, 1)
            assert await pub.publish("quotes", {"Symbol": "msft"}) == PublishResult("p1", 2, 0)  # nobody wants it
            results = await pub.publish_batch("quotes", [{"Symbol": "aapl", "High": float(i)} for i in range(50)]
                                              + [({"Symbol": "aapl"}, b"x" * 1000)])
        assert results == [PublishResult("p1", seq, 1) for seq in range(3, 54)]
        got = [await sub.next(timeout=5) for _ in range(52)]
    assert [m.sequence for m in got] == [1, *range(3, 54)] and got[-1].payload == b"x" * 1000


async def test_a_batch_reports_each_rejection_in_its_place(cluster):
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("quotes", SCHEMA)
    events = [{"Symbol": "a"}, {"High": 999.0}, {"Symbol": "b"}, {"Nope": 1}]
    async with c1.subscribe("quotes", "") as sub, c0.publisher(ack_level=AckLevel.DELIVERED) as pub:
        results = await pub.publish_batch("quotes", events, return_exceptions=True)
        assert [type(r) for r in results] == [PublishResult, errors.InvalidArgument, PublishResult,
                                              errors.InvalidArgument]
        assert "'High'" in results[1].message and "'Nope'" in results[3].message
        with pytest.raises(errors.InvalidArgument):  # without return_exceptions: the first rejection
            await pub.publish_batch("quotes", events)
        with pytest.raises(errors.InvalidArgument):  # a value no attribute can hold: nothing is sent
            await pub.publish_batch("quotes", [{"Symbol": "c"}, {"Symbol": [1]}])
        await pub.publish("quotes", {"Symbol": "end"})
        got = await read_until(sub, {"Symbol": "end"})
    assert [m.attributes for m in got] == [{"Symbol": "a"}, {"Symbol": "b"}] * 2


async def test_a_publisher_flushes_when_its_block_ends(cluster):
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("t")
    async with c1.subscribe("t", "", max_outstanding=500) as sub:
        async with c0.publisher() as pub:
            futures = [pub.publish_nowait("t", {"n": i}) for i in range(300)]
        assert all(f.done() and not f.exception() for f in futures)
        assert [f.result().sequence for f in futures] == list(range(1, 301))
        with pytest.raises(errors.ClientClosed):
            await pub.publish("t", {"n": -1})
        got = [await sub.next(timeout=5) for _ in range(300)]
    assert [m.attributes["n"] for m in got] == list(range(300))


async def test_close_flushes_publishers_too(cluster):
    c0 = cluster.client(0)
    await c0.create_topic("t")
    pub = c0.publisher()
    futures = [pub.publish_nowait("t", {"n": i}) for i in range(200)]
    await c0.close()
    assert all(f.done() and not f.exception() for f in futures)
    with pytest.raises(errors.ClientClosed):
        c0.publisher()
    with pytest.raises(errors.ClientClosed):
        await c0.get_topic("t")


async def test_drain_with_publishes_in_flight_loses_none_and_lets_none_after(cluster):
    producer, reader = cluster.client(0), cluster.client(1)
    await producer.create_topic("t")
    accepted: dict[str, list] = {}  # producer id -> futures of publishes the client took
    refused: list[str] = []
    in_flight_at_drain = []

    async with reader.subscribe("t", "", name="all", max_outstanding=1000) as sub:
        pubs = [producer.publisher(f"p{i}", AckLevel.DELIVERED) for i in range(3)]

        async def produce(pub) -> None:
            futures = accepted.setdefault(pub.producer_id, [])
            for k in range(100_000):
                try:
                    futures.append(pub.publish_nowait("t", {"k": k}))
                except errors.ClientClosed:
                    refused.append(pub.producer_id)
                    return
                if len(futures) > 50:  # a window of 50 in flight: wait for the oldest
                    await asyncio.wait([futures[-50]])

        # Read while they publish: a DELIVERED publish to a named subscription with its
        # client attached waits for that client's ack (docs/guarantees.md).
        reading = asyncio.create_task(read_until(sub, {"k": -1}))
        tasks = [asyncio.create_task(produce(p)) for p in pubs]
        await wait_for(lambda: sum(f.done() for fs in accepted.values() for f in fs) >= 300, what="a flow of acks")
        in_flight_at_drain.append(sum(not f.done() for fs in accepted.values() for f in fs))
        await producer.drain(timeout=60)
        await asyncio.gather(*tasks)
        with pytest.raises(errors.ClientClosed):
            await pubs[0].publish("t", {"k": -1})

        async with cluster.client(2).publisher(ack_level=AckLevel.DELIVERED) as last:
            await last.publish("t", {"k": -1})
        got = await reading

    assert in_flight_at_drain[0] > 0  # the drain had publishes to wait for
    assert sorted(refused) == ["p0", "p1", "p2"]  # every producer was refused after the drain began
    acked = {(r.producer_id, r.sequence) for fs in accepted.values() for r in (f.result() for f in fs)}
    assert len(acked) == sum(map(len, accepted.values()))  # every accepted publish was acked: none lost
    received = [(m.producer_id, m.sequence) for m in got]
    assert len(received) == len(set(received)) and set(received) == acked  # exactly those, once each


async def test_a_retry_of_an_accepted_publish_is_marked_duplicate(cluster):
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("t")
    async with c1.subscribe("t", "") as sub:
        # Three publishers with one producer id: each numbers from 1, as a restarted producer would.
        first, again, other = (c0.publisher("retrying", DELIVERED) for _ in range(3))
        assert await first.publish("t", {"n": 1}) == PublishResult("retrying", 1, 1, duplicate=False)
        # The same (producer, sequence) and event: a retry after a lost ack.
        assert await again.publish("t", {"n": 1}) == PublishResult("retrying", 1, 1, duplicate=True)
        with pytest.raises(errors.AlreadyExists):  # the same id for another event
            await other.publish("t", {"n": 2})
        assert (await sub.next(timeout=5)).attributes == {"n": 1}
        with pytest.raises(errors.Timeout):
            await sub.next(timeout=0.3)  # delivered once


async def test_a_broken_stream_is_resent_to_the_next_agent_each_event_once_in_order(cluster):
    """The publisher's agent dies with a publish_batch (two `batch` requests built in place)
    and lone publishes unacknowledged behind it: the publisher reconnects to its next
    address and resends every one under its id; each is acked once with its own sequence
    and delivered once, in order. A batch with a value no attribute can hold is refused
    before anything is numbered or sent."""
    from echelon.client import Client

    c0 = cluster.client(0)
    await c0.create_topic("t")
    first, second = cluster.agent_nodes[0], cluster.agent_nodes[1]
    matched = []

    async def held(encoded):  # agent-0 never sends its batch to a matcher: its publishes stay unacknowledged
        matched.append(len(encoded))
        await asyncio.Event().wait()

    first.matching.send = held
    client = Client([first.address, second.address], tls=cluster.tls_dir("client-test", "client") or None)
    cluster.clients.append(client)
    async with cluster.client(2).subscribe("t", "", max_outstanding=1000) as sub:
        pub = client.publisher("resent", ack_level=DELIVERED)
        with pytest.raises(errors.InvalidArgument):
            await pub.publish_batch("t", [{"n": -1}, {"n": object()}])
        batch = asyncio.ensure_future(pub.publish_batch("t", [{"n": i} for i in range(600)]))
        await asyncio.sleep(0)  # the batch's task numbers and queues its events in its first step
        singles = [pub.publish_nowait("t", {"n": 600 + i}) for i in range(5)]
        await wait_for(lambda: matched, 10, what="agent-0 dispatching the first batch")
        await cluster.crash(first)
        results = await asyncio.wait_for(batch, 30) + list(await asyncio.gather(*singles))
        assert [(r.producer_id, r.sequence, r.destinations) for r in results] == [
            ("resent", seq, 1) for seq in range(1, 606)]
        got = await read_until(sub, {"n": 604})
    assert [m.attributes["n"] for m in got] == list(range(604)) and [m.sequence for m in got] == list(range(1, 605))
