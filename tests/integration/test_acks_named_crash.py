"""A named subscription outlives a kill -9 of its agent (agent/named.py, subscriptions.py:
docs/guarantees.md, "At-least-once delivery"), on real processes (the launcher's, as
`echelon up`, each agent on its own data dir).

The subscriber on agent-1 receives part of what was published through agent-0 and acks
some of it; the rest is in agent-1's memory (delivered unacked, or queued) when agent-1 is
killed and restarted on the same disk. The oracle is the publisher's acks: every event
acked ACCEPTED is delivered to the reopened subscription, and anything the dead process
may already have delivered comes marked as a redelivery (never a silent duplicate).
Without the fix the restarted process knows no such subscription: the reopen creates a
new one, owed only what is published after it.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from echelon.client import Client, errors
from echelon.launch import Cluster, Loopback

pytestmark = pytest.mark.asyncio

TOPIC = "named-crash"
BEFORE, AFTER = 40, 10  # published before the kill, and after the restart


async def reopen(address: str, deadline: float):
    """The named subscription opened again on the restarted agent (refused until it serves)."""
    while True:
        client = Client(address)
        sub = client.subscribe(TOPIC, "", name="n", max_outstanding=8, reconnect=False)
        try:
            await asyncio.wait_for(sub.start(), 5.0)
            return client, sub
        except (errors.EchelonError, asyncio.TimeoutError):
            await client.close()
        if time.monotonic() > deadline:
            raise AssertionError("the restarted agent did not take the subscription back in time")
        await asyncio.sleep(0.3)


@pytest.mark.timeout(240)
async def test_a_named_subscription_gets_every_acked_event_through_a_kill_of_its_agent(tmp_path):
    cluster = Cluster(agents=2, matchers=1, memberships=1, placement=Loopback(0), log_dir=tmp_path,
                      common=["--grace", "1", "--beat-interval", "0.2"])
    await cluster.start()
    try:
        a0, a1 = (p.address for p in cluster.by_role("agent"))
        async with Client(a0) as admin:
            await admin.create_topic(TOPIC)
        client = Client(a1)
        sub = client.subscribe(TOPIC, "", name="n", max_outstanding=8, reconnect=False)
        await sub.start()
        seen_before: set[int] = set()
        acked_before: set[int] = set()
        async with Client(a0) as pc:
            async with pc.publisher(producer_id="p") as pub:
                for n in range(1, BEFORE + 1):
                    await pub.publish(TOPIC, {"n": n}, ordering_key="k")  # ACCEPTED: matched, handed on
                for _ in range(12):  # 8 in flight at a time: 4 acked, the rest unacked or queued at agent-1
                    msg = await sub.next(timeout=30)
                    seen_before.add(msg.sequence)
                    if len(acked_before) < 4:
                        await msg.ack()
                        acked_before.add(msg.sequence)
                await asyncio.sleep(1.0)  # the acks reach agent-1, the other 28 events are in its backlog
                cluster.signal("agent-1", signal.SIGKILL)
                await client.close()
                await cluster.launch(cluster.process("agent-1"))
                await cluster.wait_members(60)
                client, sub = await reopen(a1, time.monotonic() + 60)
                for n in range(BEFORE + 1, BEFORE + AFTER + 1):
                    await pub.publish(TOPIC, {"n": n}, ordering_key="k")
        want = set(range(1, BEFORE + AFTER + 1)) - acked_before
        got: list[tuple[int, int]] = []
        deadline = time.monotonic() + 60
        while not want <= {s for s, _ in got} and time.monotonic() < deadline:
            try:
                msg = await sub.next(timeout=2)
            except asyncio.TimeoutError:
                continue
            got.append((msg.sequence, msg.redelivery_count))
            await msg.ack()
        await client.close()
        lost = sorted(want - {s for s, _ in got})
        assert not lost, f"acked ACCEPTED, never delivered after the kill: {lost}"
        # Published before the restart: the dead process may have delivered it, so it says so.
        silent = [s for s, r in got if s <= BEFORE and r == 0]
        assert not silent, f"events from before the kill delivered again without a redelivery mark: {silent}"
        after = [s for s, r in got if s > BEFORE]
        assert after == sorted(after) and len(after) == len(set(after)) == AFTER
    finally:
        cluster.stop()
