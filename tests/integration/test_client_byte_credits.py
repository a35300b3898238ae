"""The SDK's byte bound beside its message bound (client/subscription.py, "Flow control"):
past `max_outstanding_bytes` received and unsettled, a settlement returns no credit, so the
agent (whose credits are the oracle here) sends nothing more until the application has
settled enough; then the withheld credits go back and the rest comes, in order."""

from __future__ import annotations

import asyncio

import pytest

from echelon.client import errors
from tests.harness import Cluster, wait_for

pytestmark = pytest.mark.asyncio
PAYLOAD = b"x" * 1000


async def test_credits_are_withheld_while_the_bytes_held_pass_the_bound():
    c = Cluster(agents=1)
    await c.start()
    try:
        client = c.client(0)
        await client.create_topic("t")
        sub = client.subscribe("t", "", max_outstanding=30, max_outstanding_bytes=5_000, shared=False)
        await sub.start()
        (held,) = c.agent_nodes[0].subscriptions.subs.values()
        async with client.publisher(producer_id="p") as pub:
            for n in range(60):
                await pub.publish("t", {"n": n}, payload=PAYLOAD)
        msgs = [await sub.next(timeout=10) for _ in range(30)]  # the window: the agent has no credit left
        assert held.credits == 0
        await sub.ack(msgs[:10])
        await sub.flush()
        await wait_for(lambda: len(held.unacked) == 20, what="the 10 acks at the agent")
        assert held.credits == 0  # 20 KB still held, past 5 KB: no credit came back
        assert sub.held_bytes > 20 * len(PAYLOAD)
        with pytest.raises(errors.Timeout):
            await sub.next(timeout=0.5)
        await sub.ack(msgs[10:])
        got = [m.attributes["n"] for m in msgs]
        while len(got) < 60:  # the withheld credits went back with the settlement under the bound
            m = await sub.next(timeout=10)
            got.append(m.attributes["n"])
            await m.ack()
        assert got == list(range(60))
        await sub.close()
    finally:
        await c.stop()


async def test_a_bad_byte_bound_is_refused():
    c = Cluster(agents=1)
    await c.start()
    try:
        with pytest.raises(errors.InvalidArgument):
            c.client(0).subscribe("t", "", max_outstanding_bytes=-1)
    finally:
        await c.stop()
