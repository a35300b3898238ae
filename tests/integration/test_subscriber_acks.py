"""The subscriber's delayed, cumulative acks and batch API (client/acks.py)
through a real agent (the in-process harness: the agent and the client share one event
loop, so "not written yet" right after a synchronous ack is exact, not a race).

What each test pins: many acks go out as one write; each flush trigger (the timer, a
quarter of the window, a nack, close) works alone with the others held off (a delay of
an hour); a small window never stalls; the batch API hands out in order and refuses a
message of another subscription. The triggers are checked on a stream of the
subscription's own too (`shared=False`: the durable subscriptions' kind)."""

from __future__ import annotations

import pytest

from echelon.client import AckLevel, errors
from tests.harness import wait_for

HOUR = 3600.0  # an ack delay no test waits out: only the trigger under test can flush


async def publish(cluster, n: int, start: int = 0) -> None:
    # ACCEPTED: a DELIVERED publish to a named subscription with its client attached waits
    # for that client's ack (docs/guarantees.md), and these tests read only afterwards.
    async with cluster.client(0).publisher(ack_level=AckLevel.ACCEPTED) as pub:
        await pub.publish_batch("t", [{"n": i} for i in range(start, start + n)])


async def receive(sub, n: int) -> list:
    got = []
    while len(got) < n:
        got += await sub.receive(n - len(got), timeout=10)
    return got


def agent_sub(cluster, name: str):
    return cluster.agent_nodes[1].subs[name]


async def test_many_acks_go_out_in_one_write_when_the_timer_fires(cluster):
    c = cluster.client(1)
    await c.create_topic("t")
    async with c.subscribe("t", "", name="s", max_outstanding=1000) as sub:
        await publish(cluster, 20)
        msgs = await receive(sub, 20)
        for m in msgs:
            await m.ack()
        held = agent_sub(cluster, "s")
        assert len(held.unacked) == 20 and sub.settlements.flusher.writes == 0  # queued, not written
        await wait_for(lambda: not held.unacked, 10, what="the timer's flush")
        assert sub.settlements.flusher.writes == 1  # one SubscriberAck (cumulative) for the twenty


@pytest.mark.parametrize("shared", [True, False])
async def test_a_quarter_of_the_window_flushes_without_the_timer(cluster, shared):
    c = cluster.client(1)
    await c.create_topic("t")
    async with c.subscribe("t", "", name="s", max_outstanding=8, shared=shared) as sub:
        sub.settlements.flusher.delay = HOUR
        await publish(cluster, 3)
        first, *rest = await receive(sub, 3)
        await first.ack()  # 1 of the 2 that flush a window of 8
        held = agent_sub(cluster, "s")
        await sub.ack(rest)
        await wait_for(lambda: not held.unacked, 10, what="the window's flush")
        assert held.credits == 8


@pytest.mark.parametrize("shared", [True, False])
async def test_acks_go_before_the_agent_runs_out_of_credits(cluster, shared):
    """Held messages use the window too: once what we hold leaves the agent under a
    quarter of it, a queued ack goes at once (here the agent would have none left)."""
    c = cluster.client(1)
    await c.create_topic("t")
    async with c.subscribe("t", "", max_outstanding=8, shared=shared) as sub:
        sub.settlements.flusher.delay = HOUR
        await publish(cluster, 4)
        first, *_ = await receive(sub, 4)
        await first.ack()  # 4 of 8 credits left: no hurry
        await publish(cluster, 5, start=4)  # 4 come at once (the agent's last credits), the 5th waits
        held = await receive(sub, 4)
        assert [m.attributes["n"] for m in held] == [4, 5, 6, 7]
        (last,) = await receive(sub, 1)  # the ack went when the 4 came: one credit back
        assert last.attributes == {"n": 8}


async def test_a_window_of_one_never_waits_for_the_timer(cluster):
    """Were the acks held back, the agent would have no credit for the second message."""
    c = cluster.client(1)
    await c.create_topic("t")
    async with c.subscribe("t", "", max_outstanding=1) as sub:
        sub.settlements.flusher.delay = HOUR
        await publish(cluster, 10)
        for i in range(10):
            msg = await sub.next(timeout=10)
            assert msg.attributes == {"n": i}
            await msg.ack()


@pytest.mark.parametrize("shared", [True, False])
async def test_a_nack_goes_at_once_with_the_acks_before_it(cluster, shared):
    c = cluster.client(1)
    await c.create_topic("t")
    async with c.subscribe("t", "", name="s", max_outstanding=1000, shared=shared) as sub:
        sub.settlements.flusher.delay = HOUR
        await publish(cluster, 3)
        a, b, c_ = await receive(sub, 3)
        await a.ack()
        await c_.ack()
        await b.nack()
        again = await sub.next(timeout=10)
        assert (again.attributes, again.redelivery_count) == ({"n": 1}, 1)
        held = agent_sub(cluster, "s")
        assert sorted(held.unacked) == [again.delivery_id]  # a and c acked, the cumulative ack passed b's nack
        await again.ack()


@pytest.mark.parametrize("shared", [True, False])
async def test_close_writes_the_queued_acks_before_it_half_closes(cluster, shared):
    c = cluster.client(1)
    await c.create_topic("t")
    sub = c.subscribe("t", "", name="s", max_outstanding=1000, shared=shared)
    await sub.start()
    sub.settlements.flusher.delay = HOUR
    await publish(cluster, 5)
    msgs = await receive(sub, 5)
    await sub.ack(msgs[:4])
    await sub.close()
    held = agent_sub(cluster, "s")
    assert len(held.backlog) == 1 and held.backlog[0].event.attributes["n"].int_value == 4
    async with c.subscribe("t", "", name="s") as again:
        last = await again.next(timeout=10)
        assert (last.attributes, last.redelivery_count) == ({"n": 4}, 1)
        await last.ack()


async def test_batches_come_in_order_and_are_settled_in_one_call(cluster):
    c = cluster.client(1)
    await c.create_topic("t")
    async with c.subscribe("t", "", name="s", max_outstanding=1000) as sub, \
            c.subscribe("t", "", max_outstanding=10) as other:
        await publish(cluster, 30)
        seen = []
        async for batch in sub.batches(max_messages=8):
            assert 1 <= len(batch) <= 8
            seen += [m.attributes["n"] for m in batch]
            await sub.ack(batch)
            await sub.ack(batch)  # settled already: nothing more
            if len(seen) == 30:
                break
        assert seen == list(range(30))
        stranger = await other.next(timeout=10)
        with pytest.raises(errors.InvalidArgument):
            await sub.ack([stranger])
        with pytest.raises(errors.InvalidArgument):
            await sub.receive(0)
        await sub.flush()
        held = agent_sub(cluster, "s")
        await wait_for(lambda: not held.unacked and not held.backlog, 10, what="the acks applied")
