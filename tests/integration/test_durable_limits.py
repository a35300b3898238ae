"""Durable subscriptions' limits on an in-process cluster (real gRPC servers, logs in tmp
dirs): backlog policies, retention expiry, idle expiry, start at the earliest event."""

from __future__ import annotations

import pytest

from echelon.client import Client, Durable, errors
from echelon.core.durability import holders
from echelon.v1.membership_pb2 import ROLE_AGENT
from loadtest import checker
from tests.harness import Cluster, wait_for

pytestmark = pytest.mark.asyncio

TOPIC = "t"


@pytest.fixture
async def cluster(tmp_path):
    c = Cluster(agents=0, matchers=1)
    await c.start()
    for i in range(2):
        await c.add_agent(i, data_dir=str(tmp_path / f"agent-{i}"))
    await wait_for(lambda: all(len(a.membership.alive(ROLE_AGENT)) == 2 for a in c.agent_nodes), what="agents")
    try:
        yield c
    finally:
        await c.stop()


async def publish(client: Client, ns, producer: str) -> list:
    """Publish n for each of `ns`; the results (or errors) in order."""
    out = []
    async with client.publisher(producer_id=producer) as pub:
        for n in ns:
            try:
                out.append(await pub.publish(TOPIC, {"n": n}))
            except errors.ResourceExhausted as e:
                out.append(e)
    return out


async def drain(sub) -> list[int]:
    return [m.attributes["n"] for m in await checker.drain(sub, idle=1.0)]


@pytest.mark.parametrize("policy,kept", [("drop-oldest", [5, 6, 7]), ("drop-new", [0, 1, 2])])
async def test_backlog_policy_drops_count_the_loss(cluster, policy, kept):
    c = cluster.client(0)
    await c.create_topic(TOPIC)
    sub = c.subscribe(TOPIC, "", name="bounded", durable=Durable(max_messages=3, policy=policy, replicas=1))
    await sub.start()
    await sub.close()  # nothing out for delivery: the bound is all backlog
    await publish(c, range(8), "p")
    node = cluster.agent_nodes[[a.config.id for a in cluster.agent_nodes].index(
        (await c.get_subscription("bounded")).holders[0])]
    await wait_for(lambda: node.durables.subs["bounded"].dropped == 5, what="5 counted drops")
    info = await c.get_subscription("bounded")
    assert (info.backlog_messages, info.dropped) == (3, 5)
    assert node.durables.dropped._value.get() == 5
    sub = c.subscribe(TOPIC, "", name="bounded", durable=True)
    await sub.start()
    assert await drain(sub) == kept
    await sub.close()


async def test_reject_publish_refuses_matching_publishes_on_every_agent(cluster):
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic(TOPIC)
    sub = c0.subscribe(TOPIC, "n < 100", name="strict",
                       durable=Durable(max_messages=3, policy="reject-publish", replicas=1))
    await sub.start()
    await sub.close()
    await publish(c1, range(3), "a")
    await wait_for(lambda: all("strict" in a.durables.refusing for a in cluster.agent_nodes),
                   what="every agent was told it is full")
    results = await publish(c1, [3, 4, 500], "b")
    assert [type(r).__name__ for r in results] == ["ResourceExhausted", "ResourceExhausted", "PublishResult"]
    sub = c1.subscribe(TOPIC, "n < 100", name="strict", durable=True)
    await sub.start()
    assert await drain(sub) == [0, 1, 2]  # nothing lost, nothing past the bound
    await sub.close()
    await wait_for(lambda: not any("strict" in a.durables.refusing for a in cluster.agent_nodes),
                   what="the notice withdrawn")
    assert all(isinstance(r, type(results[2])) for r in await publish(c1, [5], "c"))


async def test_retention_expires_what_no_one_owes_and_start_earliest(cluster):
    c = cluster.client(0)
    await c.create_topic(TOPIC, retention_seconds=1)
    sub = c.subscribe(TOPIC, "", name="r", durable=Durable(replicas=1))
    await sub.start()
    await publish(c, range(3), "old")
    assert await drain(sub) == [0, 1, 2]
    await sub.close()
    await publish(c, [3, 4], "owed")  # not acked: retention never takes them
    holder = next(a for a in cluster.agent_nodes if "r" in a.durables.subs)
    await wait_for(lambda: holder.durables.retention_expired._value.get() == 3, timeout=15,
                   what="the three acked events expired")
    assert await c.seek("r", time=0) == 2  # replay reaches only what is retained
    ids = [a.config.id for a in cluster.agent_nodes]
    name = next(n for n in (f"late{i}" for i in range(100)) if holders(n, ids, 1) == [holder.config.id])
    late = c.subscribe(TOPIC, "", name=name, durable=Durable(start="earliest", replicas=1))
    await late.start()  # held where the topic's retained events are logged
    assert await drain(late) == [3, 4]
    await late.close()


async def test_idle_subscription_is_deleted_on_every_holder(cluster):
    c = cluster.client(0)
    await c.create_topic(TOPIC)
    sub = c.subscribe(TOPIC, "", name="idle", durable=Durable(idle_seconds=1))
    await sub.start()
    await wait_for(lambda: all("idle" in a.durables.subs for a in cluster.agent_nodes), what="both hold it")
    await sub.close()
    await wait_for(lambda: not any("idle" in a.durables.subs for a in cluster.agent_nodes), timeout=15,
                   what="deleted after its idle time")
    assert await c.list_subscriptions() == []
    with pytest.raises(errors.NotFound):
        await c.get_subscription("idle")


async def test_bad_durable_opens_are_refused_and_change_nothing(cluster):
    c = cluster.client(0)
    await c.create_topic(TOPIC)
    for name, options in (("a/b", Durable()), ("~x", Durable()), ("ok", Durable(replicas=9))):
        with pytest.raises(errors.InvalidArgument):
            await c.subscribe(TOPIC, "", name=name, durable=options).start()
    with pytest.raises(errors.InvalidArgument):
        c.subscribe(TOPIC, "", durable=True)  # a durable subscription needs a name
    with pytest.raises(errors.InvalidArgument):
        await c.subscribe(TOPIC, "nope >", name="ok", durable=True).start()
    with pytest.raises(errors.NotFound):
        await c.subscribe("no-such-topic", "", name="ok", durable=True).start()
    assert await c.list_subscriptions() == []
    assert not any(a.durables.subs or a.durables.store.records() for a in cluster.agent_nodes)
