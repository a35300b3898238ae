"""Subscribing through real agents: nack with a delay, callbacks under flow control,
and a subscription's drain. Timing is checked by the order of events; the one clock
comparison is a lower bound the agent cannot beat however loaded the machine is."""

from __future__ import annotations

import asyncio
import time

import pytest

from echelon.agent.subscriptions import Pending, Subscription as AgentSubscription
from echelon.client import AckLevel, errors
from echelon.contract.filters import parse
from echelon.contract.errors import InvalidArgument
from echelon.v1 import common_pb2 as pb
from tests.harness import wait_for

DELAY = 1.0


async def published(cluster, topic: str, events: list[dict], agent: int = 0,
                    level: AckLevel = AckLevel.DELIVERED) -> list:
    async with cluster.client(agent).publisher(ack_level=level) as pub:
        return await pub.publish_batch(topic, events)


async def test_a_nacked_message_comes_back_after_its_delay_and_not_before(cluster):
    c = cluster.client(1)
    await c.create_topic("t")
    async with c.subscribe("t", "", max_outstanding=10) as sub:
        await published(cluster, "t", [{"n": 0}, {"n": 1}])
        first, second = await sub.next(timeout=5), await sub.next(timeout=5)
        nacked_at = time.monotonic()
        await first.nack(delay=DELAY)
        await second.nack()  # no delay: back at once
        again = await sub.next(timeout=5)
        assert (again.attributes, again.redelivery_count) == ({"n": 1}, 1)
        await again.ack()
        # A message published after the nack overtakes the delayed one while its delay runs.
        await published(cluster, "t", [{"n": 2}])
        fresh = await sub.next(timeout=5)
        fresh_at = time.monotonic()
        assert fresh.attributes == {"n": 2} or fresh_at - nacked_at >= DELAY
        await fresh.ack()
        late = fresh if fresh.attributes == {"n": 0} else await sub.next(timeout=DELAY + 10)
        back_at = time.monotonic()
        assert (late.attributes, late.redelivery_count) == ({"n": 0}, 1)
        assert back_at - nacked_at >= DELAY  # the agent held it for the whole delay
        await late.ack()
    agent = cluster.agent_nodes[1]
    assert agent.metrics.redeliveries._value.get() == 2


async def test_nack_delay_is_bounded_on_both_sides(cluster):
    c = cluster.client(0)
    await c.create_topic("t")
    async with c.subscribe("t", "") as sub:
        await published(cluster, "t", [{"n": 0}])
        msg = await sub.next(timeout=5)
        with pytest.raises(errors.InvalidArgument):
            await msg.nack(delay=601)
        with pytest.raises(errors.InvalidArgument):
            await msg.nack(delay=-1)
        await msg.ack()
        await msg.nack()  # settled already: nothing happens
    sub = AgentSubscription("a/s", "s", "t", parse(""), max_backlog=10)
    with pytest.raises(InvalidArgument):  # the agent refuses what a client did not check
        sub.nack([1], 600.5, 1)


async def test_the_agent_holds_a_delayed_nack_against_the_backlog_bound():
    sub = AgentSubscription("a/s", "s", "t", parse(""), max_backlog=3, evict=True)
    sub.attach(credits=3)
    for i in range(3):
        assert sub.offer(pb.Event(id=pb.MessageId(producer_id="p", sequence=i)))
    taken = sub.take(3)
    assert sub.nack([taken[0][0], taken[1][0]], 30.0, 2) == 2
    assert (sub.depth, len(sub.unacked), sub.delayed, sub.credits) == (3, 1, 2, 2)
    assert not sub.offer(pb.Event()) and sub.overflowed  # the delayed ones still count
    sub.nack([taken[2][0]], 0.0, 1)
    assert [p.event.id.sequence for p in sub.backlog] == [2] and sub.backlog[0].redeliveries == 1
    assert isinstance(sub.backlog[0], Pending)


@pytest.mark.parametrize("ack_first", [False, True], ids=["ack-on-return", "ack-then-work"])
async def test_callbacks_never_exceed_max_outstanding(cluster, ack_first):
    """Credits bound what the agent sends; a callback that acks and keeps working is
    bounded by the client alone (its acks gave the credits back)."""
    c = cluster.client(2)
    await c.create_topic("t")
    inside, most, seen = 0, 0, []
    gate = asyncio.Event()

    async def handle(msg) -> None:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        try:
            if ack_first:
                await msg.ack()
            await gate.wait()
            seen.append(msg.attributes["n"])
        finally:
            inside -= 1

    n, limit = 40, 4
    async with c.subscribe("t", "", name="work", callback=handle, max_outstanding=limit) as sub:
        # ACCEPTED: a DELIVERED publish to a named subscription with its client attached
        # waits for that client's acks (docs/guarantees.md), which the gate holds back.
        await published(cluster, "t", [{"n": i} for i in range(n)], level=AckLevel.ACCEPTED)
        state = cluster.agent_nodes[2].subs["work"]
        await wait_for(lambda: inside == limit, what="the callbacks fill up")
        # The agent holds the rest back: no credit left. Acked early, a second round
        # was sent and waits in the client for a callback slot.
        sent = 2 * limit if ack_first else limit
        await wait_for(lambda: len(state.backlog) == n - sent, what="the rest waits on the agent")
        await wait_for(lambda: len(state.unacked) == limit and state.credits == 0, what="credits spent")
        assert inside == limit
        gate.set()
        await wait_for(lambda: len(seen) == n, what="every message handled")
    assert most == limit and sorted(seen) == list(range(n))
    assert sub.callback_errors == 0 and state.depth == 0  # returning acked each one


async def test_a_callback_that_raises_gets_its_message_redelivered(cluster, caplog):
    c = cluster.client(1)
    await c.create_topic("t")
    calls: list[tuple[int, int]] = []
    done = asyncio.Event()

    def handle(msg) -> None:  # a plain function works too
        calls.append((msg.attributes["n"], msg.redelivery_count))
        if msg.redelivery_count == 0 and msg.attributes["n"] == 1:
            raise RuntimeError("transient")
        if len(calls) == 4:
            done.set()

    async with c.subscribe("t", "", callback=handle, max_outstanding=1) as sub:
        await published(cluster, "t", [{"n": 0}, {"n": 1}, {"n": 2}])
        await asyncio.wait_for(done.wait(), 10)
        assert sub.callback_errors == 1
    assert calls == [(0, 0), (1, 0), (1, 1), (2, 0)]  # nacked at once: back at the head
    assert "transient" in caplog.text
    with pytest.raises(errors.FailedPrecondition):
        await sub.next()


async def test_drain_waits_for_running_callbacks_and_leaves_the_rest_on_the_agent(cluster):
    c = cluster.client(0)
    await c.create_topic("t")
    gate, started = asyncio.Event(), []

    async def handle(msg) -> None:
        started.append(msg.attributes["n"])
        await gate.wait()

    sub = c.subscribe("t", "", name="jobs", callback=handle, max_outstanding=3)
    await sub.start()
    await published(cluster, "t", [{"n": i} for i in range(10)])
    await wait_for(lambda: len(started) == 3, what="three callbacks running")
    draining = asyncio.create_task(c.drain(timeout=30))
    await wait_for(lambda: c.state == "draining", what="drain started")
    with pytest.raises(errors.ClientClosed):
        c.subscribe("t", "")
    assert not draining.done()  # the callbacks hold it
    gate.set()
    await draining
    state = cluster.agent_nodes[0].subs["jobs"]
    await wait_for(lambda: not state.attached, what="the stream ended")
    # The three handled were acked; nothing else was handed out or lost.
    assert sorted(started) == [0, 1, 2] and len(state.unacked) == 0
    assert [p.event.attributes["n"].int_value for p in state.backlog] == list(range(3, 10))
    assert all(p.redeliveries == 0 for p in state.backlog)
    await sub.wait_closed()  # ended cleanly


async def test_a_callback_subscription_delivers_without_a_second_call(cluster, caplog):
    """subscribe(..., callback=...) opens by itself inside a running loop; start() and
    `async with` on it wait for that open; a refused open ends it with its error (logged)."""
    c = cluster.client(1)
    await c.create_topic("t")
    got = []
    sub = c.subscribe("t", "", callback=lambda m: got.append(m.attributes["n"]))
    await wait_for(lambda: sub.id, what="the subscription opened by itself")
    await asyncio.sleep(0.3)  # the registration reaches the matcher
    await published(cluster, "t", [{"n": i} for i in range(5)])
    await wait_for(lambda: sorted(got) == list(range(5)), what="every event to the callback")
    await sub.start()  # waits for the open already made: no error, no second stream
    await sub.close()
    bad = c.subscribe("missing-topic", "", callback=lambda m: None)
    with pytest.raises(errors.NotFound):
        await bad.wait_closed()
    assert "could not open" in caplog.text and "missing-topic" in caplog.text
