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
from echelon.core.durability import holders
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
async def test_kill_9_of_the_subscribers_agent_mid_stream(tmp_path):
    cluster = Cluster(agents=3, matchers=1, memberships=1, placement=Loopback(0), log_dir=tmp_path)
    await cluster.start()
    events = []
    try:
        agents = {p.id: p.address for p in cluster.by_role("agent")}
        # The durable subscription's holders are agent-1 and agent-2: the stream runs
        # through agent-0 (relayed to a holder) until agent-0 dies.
        name = next(f"keep-{i}" for i in range(500) if set(holders(f"keep-{i}", agents, 2)) == {"agent-1", "agent-2"})
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
