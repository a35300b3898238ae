"""Durable subscriptions on an in-process cluster (real gRPC servers, each agent's log in a
tmp dir): they outlive the agent that serves them (restart, and loss of its disk thanks
to the replica), resume from any agent, and seek within the topic's retention."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from echelon.agent.server import AgentNode
from echelon.client import Client, Durable, errors
from echelon.core.durability import holders
from echelon.v1.membership_pb2 import ROLE_AGENT as AGENT
from tests.harness import Cluster, wait_for

pytestmark = pytest.mark.asyncio

TOPIC = "orders"


async def start(tmp_path, agents: int = 3, **kw) -> Cluster:
    cluster = Cluster(agents=0, matchers=1)
    await cluster.start()
    for i in range(agents):
        await cluster.add_agent(i, data_dir=str(tmp_path / f"agent-{i}"), **kw)
    await wait_for(lambda: all(len(a.membership.alive(AGENT)) == agents for a in cluster.agent_nodes),
                   what="every agent sees every agent")
    return cluster


async def restart(cluster: Cluster, i: int, **kw) -> AgentNode:
    """A new process for agent i (after `crash`), on the same data dir unless told."""
    old = cluster.agent_nodes[i]
    node = AgentNode(cluster.config(old.config.id), data_dir=kw.pop("data_dir", old.data_dir), **kw)
    await node.start()
    cluster.agent_nodes[i] = node
    return node


def index(cluster: Cluster, agent_id: str) -> int:
    return next(i for i, a in enumerate(cluster.agent_nodes) if a.config.id == agent_id)


async def publish(client: Client, n: int, start: int = 0) -> None:
    """Events n = start .. start+n-1, from producer f"p{start}" (sequences 1..n)."""
    async with client.publisher(producer_id=f"p{start}") as pub:
        for i in range(start, start + n):
            await pub.publish(TOPIC, {"n": i}, ordering_key="k")


async def take(sub, n: int, ack: bool = True, timeout: float = 15.0) -> list[int]:
    got = []
    for _ in range(n):
        msg = await sub.next(timeout=timeout)
        got.append(msg.attributes["n"])
        if ack:
            await msg.ack()
    if ack:
        await sub.flush()  # acks are delayed (client/acks.py): the agent has them from here
    return got


async def test_survives_serving_agent_loss_and_resumes_elsewhere(tmp_path):
    """Acked messages never come back; unacked ones come back from the replica, in order,
    through an agent that does not hold the subscription."""
    cluster = await start(tmp_path)
    try:
        ids = [a.config.id for a in cluster.agent_nodes]
        name = next(f"s{i}" for i in range(100) if holders(f"s{i}", ids, 2)[0] == ids[0])
        primary, replica = holders(name, ids, 2)
        other = next(i for i in ids if i not in (primary, replica))
        c_primary = cluster.client(index(cluster, primary))
        await c_primary.create_topic(TOPIC)
        c_other = cluster.client(index(cluster, other))
        sub = c_other.subscribe(TOPIC, "", name=name, durable=True, max_outstanding=5)
        await sub.start()
        await wait_for(lambda: all(name in cluster.agent_nodes[index(cluster, h)].durables.subs
                                   for h in (primary, replica)), what="both holders hold it")
        await wait_for(lambda: len(cluster.agent_nodes[index(cluster, replica)].matching.subscriptions) >= 1,
                       what="replica registered")
        await publish(c_other, 20)
        assert await take(sub, 10) == list(range(10))
        await wait_for(lambda: cluster.agent_nodes[index(cluster, replica)].durables.subs[name].depth == 10,
                       what="the acks reached the replica")
        await sub.close()
        await cluster.crash(cluster.agent_nodes[index(cluster, primary)])
        await wait_for(lambda: primary not in {m.id for m in cluster.agent_nodes[index(cluster, other)]
                                               .membership.alive(AGENT)}, what="the primary is dead")
        sub = c_other.subscribe(TOPIC, "", name=name, durable=True, max_outstanding=5)
        await sub.start()
        assert await take(sub, 10) == list(range(10, 20))
        with pytest.raises(errors.Timeout):
            await sub.next(timeout=0.5)
        await sub.close()
    finally:
        await cluster.stop()


async def test_restart_with_wiped_disk_takes_the_replicas_copy(tmp_path):
    """The serving holder restarts with an empty data dir: it learns the subscription and
    its backlog (including what was published and acked while it was down) from the
    replica, and serves it."""
    cluster = await start(tmp_path, agents=2)
    try:
        ids = [a.config.id for a in cluster.agent_nodes]
        name = next(f"w{i}" for i in range(100) if holders(f"w{i}", ids, 2)[0] == ids[0])
        c0, c1 = cluster.client(0), cluster.client(1)
        await c0.create_topic(TOPIC)
        sub = c0.subscribe(TOPIC, "", name=name, durable=True)
        await sub.start()
        await wait_for(lambda: name in cluster.agent_nodes[1].durables.subs, what="the replica holds it")
        await publish(c1, 6)
        assert await take(sub, 3) == [0, 1, 2]
        await wait_for(lambda: cluster.agent_nodes[1].durables.subs[name].depth == 3,
                       what="the acks reached the replica")
        await sub.close()
        await cluster.crash(cluster.agent_nodes[0])
        await wait_for(lambda: "agent-0" not in {m.id for m in cluster.agent_nodes[1].membership.alive(AGENT)},
                       what="agent-0 dead")
        await publish(c1, 4, start=6)  # while the serving holder is down
        sub = c1.subscribe(TOPIC, "", name=name, durable=True)
        await sub.start()
        assert await take(sub, 2) == [3, 4]  # served by the replica meanwhile
        await sub.close()
        await restart(cluster, 0, data_dir=str(tmp_path / "agent-0-new"))
        await wait_for(lambda: name in cluster.agent_nodes[0].durables.subs
                       and cluster.agent_nodes[0].durables.subs[name].synced, what="agent-0 adopted it")
        c0b = Client(cluster.agent_nodes[0].address)
        try:
            sub = c0b.subscribe(TOPIC, "", name=name, durable=True)
            await sub.start()
            assert await take(sub, 5) == [5, 6, 7, 8, 9]
            await sub.close()
        finally:
            await c0b.close()
    finally:
        await cluster.stop()


async def test_restart_on_same_disk_and_seek(tmp_path):
    """A restart on the same disk keeps the backlog; seek by time and by message id
    replays acked messages; a message not retained is OUT_OF_RANGE and changes nothing."""
    cluster = await start(tmp_path, agents=1)
    try:
        c = cluster.client(0)
        await c.create_topic(TOPIC)
        sub = c.subscribe(TOPIC, "n >= 0", name="replay", durable=Durable(replicas=1))
        await sub.start()
        await publish(c, 5)
        middle = time.time()
        await publish(c, 5, start=5)
        assert await take(sub, 4) == [0, 1, 2, 3]
        await sub.close()
        await cluster.crash(cluster.agent_nodes[0])
        await restart(cluster, 0)
        c2 = Client(cluster.agent_nodes[0].address)
        try:
            sub = c2.subscribe(TOPIC, "n >= 0", name="replay", durable=True)
            await sub.start()
            assert await take(sub, 6) == [4, 5, 6, 7, 8, 9]
            assert await c2.seek("replay", time=middle) == 5
            # The open stream ends (ABORTED) and the subscription reopens by itself, from the point sought.
            assert await take(sub, 5) == [5, 6, 7, 8, 9]
            assert sub.reconnects == 1 and not sub.gaps
            await sub.close()
            no_reopen = c2.subscribe(TOPIC, "n >= 0", name="replay", durable=True, reconnect=False)
            await no_reopen.start()
            await c2.seek("replay", message=("p0", 2))
            with pytest.raises(errors.Aborted):  # without reconnect the application reopens
                await no_reopen.next(timeout=10)
            await no_reopen.close()
            assert await c2.seek("replay", message=("p0", 2)) == 9
            sub = c2.subscribe(TOPIC, "n >= 0", name="replay", durable=True)
            await sub.start()
            assert await take(sub, 9) == list(range(1, 10))
            with pytest.raises(errors.OutOfRange):
                await c2.seek("replay", message=("p0", 99))
            info = await c2.get_subscription("replay")
            assert (info.topic, info.backlog_messages) == (TOPIC, 0)
            assert [s.name for s in await c2.list_subscriptions()] == ["replay"]
            await sub.close()
            await c2.delete_subscription("replay")
            assert await c2.list_subscriptions() == []
        finally:
            await c2.close()
    finally:
        await cluster.stop()


async def test_subscription_commands(tmp_path):
    """`echelon subscription list|show|seek|delete` as a user runs them (click's runner, in a
    thread: the CLI runs its own event loop) against real agents: what they print is the
    Durable API's answer; a bad --message is a usage error; an unknown name fails by name."""
    from click.testing import CliRunner

    from echelon.cli.main import cli

    async def echelon(*args: str):
        r = await asyncio.to_thread(CliRunner().invoke, cli, ["subscription", *args, "--agent", agent])
        return r.exit_code, r.output

    cluster = await start(tmp_path, agents=1)
    try:
        agent = cluster.agent_nodes[0].address
        c = cluster.client(0)
        await c.create_topic(TOPIC)
        sub = c.subscribe(TOPIC, "n >= 0", name="audit", durable=Durable(replicas=1))
        await sub.start()
        await publish(c, 4)
        assert await take(sub, 4) == [0, 1, 2, 3]
        await sub.close()
        code, out = await echelon("list", "--json")
        assert code == 0, out
        [listed] = json.loads(out)
        assert (listed["name"], listed["topic"], listed["holders"]) == ("audit", TOPIC, ["agent-0"])
        code, out = await echelon("seek", "audit", "--message", "p0:2")
        assert (code, out.split()) == (0, ["audit:", "3", "messages", "owed"])
        code, out = await echelon("show", "audit")
        assert code == 0 and json.loads(out)["backlog_messages"] == 3, out
        code, out = await echelon("seek", "audit", "--message", "p0")
        assert code == 2 and "PRODUCER:SEQUENCE" in out
        code, out = await echelon("delete", "audit")
        assert (code, out.strip()) == (0, "deleted audit")
        assert await c.list_subscriptions() == []
        code, out = await echelon("show", "audit")
        assert code == 1 and "NOT_FOUND" in out and "audit" in out, out
    finally:
        await cluster.stop()


async def test_an_agent_whose_view_lost_the_holders_for_a_moment_does_not_create_it_anew(tmp_path):
    """A view rebuilt by restarted membership replicas lists the members again only as they
    beat: an agent opening a durable subscription in that moment must not take "nobody
    alive holds it" for "it does not exist" and create an empty one under its name (its
    holders' backlog would then never reach the subscriber). The open is refused as
    UNAVAILABLE until the holders are back in the view, then resumes with the backlog."""
    cluster = await start(tmp_path, agents=4)
    try:
        ids = [a.config.id for a in cluster.agent_nodes]
        name = next(f"s{i}" for i in range(200) if ids[3] not in holders(f"s{i}", ids, 2))
        held_by = holders(name, ids, 2)
        c_other = cluster.client(3)
        await c_other.create_topic(TOPIC)
        sub = c_other.subscribe(TOPIC, "", name=name, durable=True, max_outstanding=5)
        await sub.start()
        await wait_for(lambda: all(name in cluster.agent_nodes[index(cluster, h)].durables.subs for h in held_by),
                       what="both holders hold it")
        await sub.close()
        await publish(c_other, 10)
        await wait_for(lambda: all(cluster.agent_nodes[index(cluster, h)].durables.subs[name].depth == 10
                                   for h in held_by), what="both holders logged the events")
        other = cluster.agent_nodes[3]
        members = other.membership.members
        kept = {i: m for i, m in members.items() if i not in held_by}
        other.membership.members = kept  # as a restarted replica's first snapshot would have it
        with pytest.raises(errors.Unavailable, match="were alive moments ago"):
            await other.durables.peers.locate(name)
        assert name not in other.durables.subs  # nothing made here
        other.membership.members = members  # the holders beat again
        sub = c_other.subscribe(TOPIC, "", name=name, durable=True, max_outstanding=5)
        await sub.start()
        assert await take(sub, 10) == list(range(10))
        await sub.close()
    finally:
        await cluster.stop()
