"""Subscriptions outlive their agent (client/connection.py, docs/guarantees.md): real
processes from the launcher (as `echelon up`), the subscriber's agent killed with
SIGKILL mid-stream. The SDK reopens both subscriptions on another agent of its list by
itself; the durable one loses nothing and hands out nothing again that the application
had acked (every delivery is counted against the publisher's acked sequence); the named,
non-durable one reports its gap and goes on receiving."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter

import pytest

from echelon.client import DELIVERED, Client, Durable, errors
from echelon.client.connection import Reconnect
from echelon.core.durability import holders as holders_of
from echelon.launch import Cluster, Loopback

pytestmark = pytest.mark.asyncio

TOPIC = "resilient"
EVENTS = 300
KILL_AFTER = 80  # durable deliveries acked before the kill


class Consumer:
    """Reads a subscription, acks each message, counts what came again after its ack."""

    def __init__(self, sub):
        self.sub = sub
        self.seen: Counter = Counter()
        self.acked: set[int] = set()
        self.again_after_ack = 0
        self.task = asyncio.create_task(self.run())

    async def run(self) -> None:
        async for msg in self.sub:
            n = msg.attributes["n"]
            self.seen[n] += 1
            if n in self.acked:
                self.again_after_ack += 1
            await msg.ack()
            self.acked.add(n)


async def until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.1)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("holders", [("agent-1", "agent-2"), ("agent-0", "agent-1")],
                         ids=["relayed-to-a-holder", "the-victim-holds-it"])
async def test_kill_9_of_the_subscribers_agent_mid_stream(tmp_path, holders):
    cluster = Cluster(agents=3, matchers=1, memberships=1, placement=Loopback(0), log_dir=tmp_path)
    await cluster.start()
    events = []
    try:
        agents = {p.id: p.address for p in cluster.by_role("agent")}
        # The durable subscription's stream runs through agent-0 until agent-0 dies: relayed
        # to a holder on another agent, or served by agent-0 itself, one of its two holders
        # (the other one's copy takes over).
        name = next(f"keep-{i}" for i in range(500) if set(holders_of(f"keep-{i}", agents, 2)) == set(holders))
        order = [agents["agent-0"], agents["agent-1"], agents["agent-2"]]
        sub_client = Client(order, reconnect=Reconnect(max_attempts=-1, max_wait=1.0),
                            on_disconnect=events.append, on_reconnect=events.append)
        pub_client = Client(agents["agent-2"])
        try:
            await pub_client.create_topic(TOPIC, ["n:int"])
            durable = sub_client.subscribe(TOPIC, "", name=name, durable=Durable(replicas=2), max_outstanding=20)
            named = sub_client.subscribe(TOPIC, "", name="watch", max_outstanding=20)
            await durable.start()
            await named.start()
            assert durable.id and named.id.startswith("agent-0/")
            await asyncio.sleep(0.5)  # the registrations reach the matcher
            d, e = Consumer(durable), Consumer(named)
            acked_publishes: list[int] = []

            async def publish() -> None:
                async with pub_client.publisher(ack_level=DELIVERED) as pub:
                    for n in range(EVENTS):
                        await pub.publish(TOPIC, {"n": n})
                        acked_publishes.append(n)
                        await asyncio.sleep(0.02)

            publishing = asyncio.create_task(publish())
            await until(lambda: len(d.acked) >= KILL_AFTER, 60, "deliveries before the kill")
            cluster.signal("agent-0", signal.SIGKILL)
            killed_at = time.time()
            await asyncio.wait_for(publishing, 150)
            assert acked_publishes == list(range(EVENTS))
            await until(lambda: len(d.seen) == EVENTS, 60, "the durable subscription to receive every event")
            await until(lambda: e.seen[EVENTS - 1], 30, "the named subscription to receive the last event")

            print(f"durable: {sum(d.seen.values())} deliveries of {EVENTS} events, {durable.reconnects} reopen(s), "
                  f"{durable.acked_redeliveries} acked redeliveries dropped by the SDK, "
                  f"{d.again_after_ack} handed out again after their ack")
            print(f"named: {len(e.seen)} of {EVENTS} events, gaps {[(round(a - killed_at, 2), round(b - killed_at, 2)) for a, b in named.gaps]}")
            print("events:", [(x.kind, type(x.member).__name__, x.address, x.attempts, x.gap) for x in events])

            # The durable one: nothing lost, nothing acked handed out again.
            assert set(d.seen) == set(range(EVENTS))
            assert d.again_after_ack == 0
            assert durable.reconnects >= 1 and not durable.gaps
            # The named one: reopened on another agent, its gap reported, receiving again.
            assert named.reconnects >= 1 and named.gaps and named.id.split("/")[0] != "agent-0"
            assert all(killed_at - 1 <= lost <= back for lost, back in named.gaps)
            assert e.again_after_ack == 0
            # The hooks: each subscription disconnected from agent-0, then reconnected elsewhere.
            for sub in (durable, named):
                mine = [x for x in events if x.member is sub]
                assert [x.kind for x in mine][:1] == ["disconnected"] and mine[0].address == agents["agent-0"]
                assert mine[-1].kind == "reconnected" and mine[-1].address != agents["agent-0"]
                assert mine[-1].gap == (sub is named)
            assert isinstance(mine[0].error, errors.Unavailable)
            await durable.close()
            await named.close()
            for c in (d, e):
                await asyncio.wait_for(c.task, 10)
        finally:
            await sub_client.close()
            await pub_client.close()
    finally:
        cluster.stop()


async def test_connect_fails_fast_naming_the_cause_and_picks_a_serving_agent():
    """`await client.connect()`: the agents that serve, in the list's order, new streams on the
    first of them; none serving: Unavailable naming each address's cause."""
    from echelon.launch import free_port
    from tests.harness import Cluster as InProcess

    c = await InProcess(agents=2).start()
    try:
        nothing = f"127.0.0.1:{free_port()}"
        a0, a1 = (n.address for n in c.agent_nodes)
        async with Client([nothing, c.replicas[0], a1, a0]) as client:
            assert await client.connect(timeout=5) == [a1, a0]
            assert client.addresses[client._conn.current] == a1  # new streams go to a serving one
            await client.create_topic("t")
        async with Client([nothing, c.replicas[0]]) as client:
            with pytest.raises(errors.Unavailable) as e:
                await client.connect(timeout=5)
            assert f"no agent at {nothing}" in e.value.message
            assert f"{c.replicas[0]} is a membership replica, not an agent" in e.value.message
    finally:
        await c.stop()


async def test_a_publisher_whose_agent_dies_reports_it_and_resends_elsewhere():
    """The hooks see a publisher's stream lost and opened again on the next agent; every
    publish is acked once, none lost (resent with its sequence)."""
    from tests.harness import Cluster as InProcess

    c = await InProcess(agents=2).start()
    events = []
    try:
        a0, a1 = (n.address for n in c.agent_nodes)
        async with Client([a0, a1], on_disconnect=events.append, on_reconnect=events.append) as client:
            await client.create_topic("t")
            async with client.publisher() as pub:
                assert (await pub.publish("t", {"n": 0})).sequence == 1
                await c.crash(c.agent_nodes[0])
                results = [await pub.publish("t", {"n": n}) for n in range(1, 6)]
                assert [r.sequence for r in results] == [2, 3, 4, 5, 6]
        assert [(e.kind, e.address) for e in events] == [("disconnected", a0), ("reconnected", a1)]
        assert events[0].member is events[1].member and events[1].attempts >= 1
    finally:
        await c.stop()


async def test_a_subscription_that_cannot_reopen_ends_after_the_policys_attempts():
    from tests.harness import Cluster as InProcess

    c = await InProcess(agents=1).start()
    try:
        a0 = c.agent_nodes[0].address
        events = []
        async with Client(a0, reconnect=Reconnect(max_attempts=2, first_wait=0.05, max_wait=0.1),
                          on_disconnect=events.append, on_reconnect=events.append) as client:
            await client.create_topic("t")
            sub = client.subscribe("t", "", name="lonely")
            await sub.start()
            await c.crash(c.agent_nodes[0])
            with pytest.raises(errors.Unavailable) as e:
                await sub.next(timeout=30)
            assert "'lonely' lost its agent and was not reopened after 2 attempts" in e.value.message
            assert [x.kind for x in events] == ["disconnected"] and sub.reconnects == 0
            await sub.close()
    finally:
        await c.stop()
