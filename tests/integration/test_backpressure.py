"""Back-pressure end to end (agent/subscriptions.py): a subscription past its bound lags
instead of losing. The frames that fill it are acknowledged only once the client's acks
bring it below the bound, so the publisher's acks wait (and its stream slows) while the
consumer is behind; nothing is lost and nothing is evicted. An ephemeral subscription that
chose eviction is closed instead and never holds the publisher back."""

from __future__ import annotations

import asyncio

import pytest

from echelon.client import AckLevel, Durable, errors
from echelon.core.durability import holders
from tests.harness import Cluster

pytestmark = pytest.mark.asyncio
BOUND = 20
KINDS = ["ephemeral", "named", "durable"]


def open_kind(client, kind: str, agents: list[str], credits: int):
    """A subscription of `kind` held by `agents[1]` (a durable one: its only holder, by its name)."""
    if kind == "durable":
        name = next(f"d{i}" for i in range(500) if holders(f"d{i}", agents, 1) == [agents[1]])
        return client.subscribe("t", "", name=name, max_outstanding=credits,
                                durable=Durable(max_messages=BOUND, replicas=1))
    return client.subscribe("t", "", name="slow" if kind == "named" else "", max_outstanding=credits)


def held_sub(agent, kind: str):
    subs = list(agent.durables.subs.values()) if kind == "durable" else list(agent.subscriptions.subs.values())
    (sub,) = subs
    return sub


@pytest.mark.parametrize("kind", KINDS)
async def test_a_slow_consumer_slows_the_publisher_and_loses_nothing(kind):
    """A durable subscription lags too (its default policy): nothing dropped (core/durability.py)."""
    c = Cluster(agents=2)
    await c.start()
    try:
        agent = c.agent_nodes[1]
        agent.max_backlog = BOUND
        c0, c1 = c.client(0), c.client(1)
        await c0.create_topic("t")
        sub = open_kind(c1, kind, [n.config.id for n in c.agent_nodes], 5)
        await sub.start()
        pub = c0.publisher(ack_level=AckLevel.DELIVERED)
        futures = [pub.publish_nowait("t", {"n": n}) for n in range(200)]
        # Nothing read yet: the subscription fills to its bound and the rest waits upstream.
        await asyncio.sleep(2.0)
        acked = sum(f.done() for f in futures)
        assert acked <= BOUND + 5, acked  # the frames past the bound are not acknowledged
        assert all(f.exception() is None for f in futures if f.done())
        held = held_sub(agent, kind)
        assert held.room is not None and held.depth <= 200
        got = []
        while len(got) < 200:
            msg = await sub.next(timeout=20)
            got.append(msg.attributes["n"])
            await msg.ack()
        results = await asyncio.wait_for(asyncio.gather(*futures), 30)
        assert all(r.destinations == 1 for r in results)
        assert got == list(range(200))  # every one, in order
        assert agent.metrics.overflows._value.get() == 0
        assert agent.durables.dropped._value.get() == 0
        await sub.close()
    finally:
        await c.stop()


async def test_an_ephemeral_subscription_that_chose_eviction_never_holds_the_publisher():
    c = Cluster(agents=2)
    await c.start()
    try:
        agent = c.agent_nodes[1]
        agent.max_backlog = BOUND
        c0, c1 = c.client(0), c.client(1)
        await c0.create_topic("t")
        sub = c1.subscribe("t", "", max_outstanding=5, evict=True)
        await sub.start()
        pub = c0.publisher(ack_level=AckLevel.DELIVERED)
        results = await asyncio.wait_for(asyncio.gather(*(pub.publish_nowait("t", {"n": n}) for n in range(200))), 30)
        assert len(results) == 200
        with pytest.raises(errors.ResourceExhausted):
            for _ in range(300):
                await sub.next(timeout=5)
        assert agent.metrics.overflows._value.get() == 1
    finally:
        await c.stop()


async def test_a_slow_consumer_on_the_publishing_agent_slows_its_publisher_too():
    c = Cluster(agents=1)
    await c.start()
    try:
        agent = c.agent_nodes[0]
        agent.max_backlog = BOUND
        client = c.client(0)
        await client.create_topic("t")
        sub = client.subscribe("t", "", max_outstanding=5)
        await sub.start()
        pub = client.publisher(ack_level=AckLevel.ACCEPTED)
        futures = [pub.publish_nowait("t", {"n": n}) for n in range(200)]
        await asyncio.sleep(2.0)
        assert sum(f.done() for f in futures) <= BOUND + 64  # held past the bound: not all accepted yet
        got = []
        while len(got) < 200:
            msg = await sub.next(timeout=20)
            got.append(msg.attributes["n"])
            await msg.ack()
        await asyncio.wait_for(asyncio.gather(*futures), 30)
        assert got == list(range(200))
        held = next(iter(agent.subscriptions.subs.values()))
        assert held.depth <= BOUND + 64
    finally:
        await c.stop()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_stalled_consumer_stops_holding_publishers_back(kind):
    """One that acknowledges nothing for the stall bound would otherwise stop every
    publisher through its agent (a hostile or dead client): an ephemeral one is closed
    RESOURCE_EXHAUSTED, a named one sheds its oldest; each event is either delivered or
    counted as shed, and a healthy subscriber beside it gets every one."""
    c = Cluster(agents=3)
    await c.start()
    try:
        agent = c.agent_nodes[1]
        agent.max_backlog = BOUND
        agent.subscriptions.stall_seconds = 1.0  # as `--stall-seconds 1`
        c0, c1, c2 = c.client(0), c.client(1), c.client(2)
        await c0.create_topic("t")
        named = kind != "ephemeral"
        stalled = open_kind(c1, kind, [n.config.id for n in c.agent_nodes], 5)
        await stalled.start()
        healthy = c2.subscribe("t", "", max_outstanding=64)
        await healthy.start()
        pub = c0.publisher(ack_level=AckLevel.DELIVERED)
        results = await asyncio.wait_for(asyncio.gather(*(pub.publish_nowait("t", {"n": n}) for n in range(200))), 60)
        assert all(r.destinations == 2 for r in results)
        got = []
        while len(got) < 200:
            msg = await healthy.next(timeout=20)
            got.append(msg.attributes["n"])
            await msg.ack()
        assert got == list(range(200))
        assert agent.metrics.stalls.labels(kind)._value.get() == 1
        if named:
            held = held_sub(agent, kind)
            dropped = (lambda: held.dropped) if kind == "durable" else (lambda: held.shed)
            received = []
            while len(received) + dropped() < 200:
                msg = await stalled.next(timeout=20)
                received.append(msg.attributes["n"])
                await msg.ack()
            counted = agent.durables.dropped if kind == "durable" else agent.metrics.shed
            assert dropped() > 0 and counted._value.get() == dropped()
            assert received == sorted(received) and len(set(received)) == len(received)  # in order, once each
        else:
            with pytest.raises(errors.ResourceExhausted):
                for _ in range(300):
                    await stalled.next(timeout=5)
    finally:
        await c.stop()
