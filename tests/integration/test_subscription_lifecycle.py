"""Subscriptions leave no ghosts (docs/guarantees.md, "At-least-once delivery"): hundreds
opened and cancelled at random
moments, subscriber processes killed, an agent killed and restarted; afterwards the
matcher tier's own answers (`ListZones` copies, `Match`, `Reconcile`) hold nothing and a
publish reaches no destination. Reconciliation, checked direction by direction, and the
matchers' reaping of a dead agent's copies."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import urllib.request

import grpc
import pytest

from echelon.agent.subscriptions import Subscription
from echelon.client import Client
from echelon.contract.filters import parse
from echelon.core.holdings import BUCKETS, digests
from echelon.launch import Cluster as ProcessCluster, Loopback
from echelon.contract.transport import PLAIN
from echelon.contract.wire import attributes_to_pb, filter_to_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import matcher_pb2_grpc as xgrpc
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc
from tests.harness import Cluster, wait_for

SCHEMA = ["x:int:0:999"]
SUB_PER_PROCESS = 25  # subscriptions a subscriber process opens before it is killed

# A subscriber process: starts opening a subscription every 10 ms without waiting for
# the last (so some are always in flight) until it is killed; prints a line per
# subscription the agent has confirmed.
SUBSCRIBER = """
import asyncio, sys
from echelon.client import Client

def opened(task):
    if not task.cancelled() and task.exception() is None:
        print("opened", flush=True)

async def main(address, n):
    client = Client(address)
    subs = []
    for i in range(n):
        sub = client.subscribe("t", f"x >= {i}")
        asyncio.ensure_future(sub.start()).add_done_callback(opened)
        subs.append(sub)
        await asyncio.sleep(0.01)
    await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


async def tier_copies(addresses: list[str]) -> list[int]:
    """Each matcher's own count of the subscription copies it holds."""
    out = []
    for a in addresses:
        async with grpc.aio.insecure_channel(a) as ch:
            out.append((await xgrpc.MatcherStub(ch).ListZones(xpb.ListZonesRequest(), timeout=5)).copies)
    return out


async def tier_matches(address: str, events: list[dict]) -> list[list[str]]:
    """The tier's answer to `Match` (asked at one entry): the agents per event."""
    async with grpc.aio.insecure_channel(address) as ch:
        call = xgrpc.MatcherStub(ch).Match()
        await call.write(xpb.MatchRequest(batch_id=1, events=[pb.Event(topic="t", attributes=attributes_to_pb(e))
                                                               for e in events]))
        response = await call.read()
        call.cancel()
    return [[a.agent for a in r.agents] for r in response.results]


async def tier_holdings(address: str, agent: str) -> list[str]:
    """What the tier holds for `agent`, through its own Reconcile (an empty agent side)."""
    async with grpc.aio.insecure_channel(address) as ch:
        r = await xgrpc.MatcherStub(ch).Reconcile(
            xpb.ReconcileRequest(agent=agent, digests=digests([], BUCKETS)), timeout=5)
    return sorted(h.id for h in r.holdings)


async def nothing_left(matchers: list[str], publish) -> bool:
    """Every matcher holds no copy, Match finds no agent, a publish has no destination."""
    try:
        if any(await tier_copies(matchers)):
            return False
        if any(await tier_matches(matchers[0], [{"x": v} for v in (0, 500, 999)])):
            return False
    except grpc.aio.AioRpcError:
        return False
    return (await publish()).destinations == 0


def spawn_subscriber(address: str, n: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-c", SUBSCRIBER, address, str(n)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env, start_new_session=True)


async def read_lines(proc: subprocess.Popen, n: int) -> None:
    """Wait for `n` lines from a subscriber process (or its end)."""
    loop = asyncio.get_running_loop()
    for _ in range(n):
        if not await loop.run_in_executor(None, proc.stdout.readline):
            return


async def kill_after(proc: subprocess.Popen, opened: int) -> None:
    """SIGKILL once `opened` of the process's subscriptions are confirmed (others are in flight)."""
    try:
        await asyncio.wait_for(read_lines(proc, opened), 20)
    except asyncio.TimeoutError:
        pass  # killed all the same; the test checks what is left, not how many opened
    proc.send_signal(signal.SIGKILL)
    await asyncio.get_running_loop().run_in_executor(None, proc.wait)


async def churn_one(ch: grpc.aio.Channel, rng: random.Random, deliveries: int) -> str:
    """Open one subscription on a raw stream and cancel it at a random moment; returns the moment."""
    stub = pgrpc.PubSubStub(ch)
    call = stub.Subscribe()
    when = rng.choice(["after-open", "after-open", "headers", "deliveries"])
    try:
        await call.write(ppb.SubscribeRequest(open=ppb.SubscriptionOpen(topic="t", filter_text=f"x >= {rng.randrange(0, 999)}",
                                                                        credits=8)))
        if when == "after-open":
            await asyncio.sleep(rng.uniform(0, 0.01))
        else:
            await call.initial_metadata()
            if when == "deliveries":
                for _ in range(rng.randrange(1, deliveries + 1)):
                    await asyncio.wait_for(call.read(), 2.0)
    except (grpc.aio.AioRpcError, asyncio.TimeoutError):
        pass
    call.cancel()
    return when


@pytest.mark.parametrize("churn, killed", [(300, 3), pytest.param(3000, 12, marks=pytest.mark.slow)])
async def test_cancelled_and_killed_subscriptions_leave_no_trace(churn, killed):
    """`churn` subscriptions cancelled right after the open request, after the headers, or
    during their first deliveries, while a matcher joins (a handoff) and `killed`
    subscriber processes are killed. Reconciliation is kept out of it (one round at start
    only), so the lifecycle alone must leave nothing behind. (The 3000 run: `-m slow`.)"""
    cluster = Cluster(agents=2, matchers=2, agent_kwargs={"reconcile_seconds": 3600})
    await cluster.start()
    procs: list[subprocess.Popen] = []
    try:
        clients = [cluster.client(0), cluster.client(1)]
        raw = [PLAIN.dial(a.address) for a in cluster.agent_nodes[:2]]  # the client hides its channels
        await clients[0].create_topic("t", SCHEMA)
        pub = clients[0].publisher()
        stop = asyncio.Event()

        async def publish_forever():
            rng = random.Random(1)
            while not stop.is_set():
                await asyncio.gather(*(pub.publish_nowait("t", {"x": rng.randrange(0, 1000)}) for _ in range(20)))
                await asyncio.sleep(0.005)

        publisher = asyncio.create_task(publish_forever())
        for i in range(killed):
            procs.append(spawn_subscriber(cluster.agent_nodes[i % 2].address, SUB_PER_PROCESS))
        rng = random.Random(8)
        kills = [kill_after(p, rng.randrange(3, SUB_PER_PROCESS)) for p in procs]
        gate = asyncio.Semaphore(24)
        moments: list[str] = []

        handing_off = 0
        started = asyncio.Event()

        async def churn_at(k: int):
            nonlocal handing_off
            async with gate:
                if k == churn // 3:
                    started.set()
                if any(m.tier.layouts.topics.get("t") and m.tier.layouts.topics["t"].pending for m in cluster.matcher_nodes):
                    handing_off += 1
                moments.append(await churn_one(raw[k % 2], random.Random(k), deliveries=3))

        async def handoff():
            await started.wait()
            await cluster.add_matcher(2)  # a new layout: the topic is handed off meanwhile

        await asyncio.gather(*(churn_at(k) for k in range(churn)), handoff(), *kills)
        stop.set()
        await publisher
        for ch in raw:
            await ch.close()
        assert len(moments) == churn and {"after-open", "headers", "deliveries"} <= set(moments)
        assert handing_off > 0, "no subscription was opened during the handoff"
        matchers = [m.address for m in cluster.matcher_nodes]

        async def destinations():
            return await pub.publish("t", {"x": 999})

        try:
            await wait_for(lambda: nothing_left(matchers, destinations), timeout=30, interval=0.3,
                           what="no subscription left in the matcher tier")
        except AssertionError as e:  # say what was left, and where, for whoever debugs it
            left = {m.config.id: {k: (c.agent, c.version) for k, c in m.tier.store.copies.items()}
                    for m in cluster.matcher_nodes}
            agents = {a.config.id: (list(a.subs), dict(a.matching._removals), list(a.matching.registering))
                      for a in cluster.agent_nodes}
            raise AssertionError(f"{e}: copies {left}; agents (subs, removals queued, registering) {agents}")
        for agent in cluster.agent_nodes:
            assert agent.subs == {} and agent.metrics.subscriptions._value.get() == 0
            assert await tier_holdings(matchers[0], agent.config.id) == []
            # The lifecycle did it: reconciliation fixed nothing.
            assert sum(s.value for m in agent.metrics.reconciled.collect() for s in m.samples
                       if s.name.endswith("_total")) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        await cluster.stop()


def reconciled(metrics_text: str) -> dict[str, float]:
    """echelon_agent_subscriptions_reconciled_total by direction, from a /metrics page."""
    out = {}
    for line in metrics_text.splitlines():
        if line.startswith("echelon_agent_subscriptions_reconciled_total{"):
            direction = line.split('direction="', 1)[1].split('"', 1)[0]
            out[direction] = float(line.rsplit(" ", 1)[1])
    return out


async def test_an_agent_killed_and_restarted_clears_what_it_left_in_the_tier(tmp_path):
    """Real processes: subscriber processes open subscriptions on agent-1 while it is
    killed (SIGKILL, registrations in flight); the tier still holds them. The restarted
    agent reconciles at its start: the tier ends up holding nothing, a publish reaches no
    destination, and the agent counted what it removed."""
    cluster = ProcessCluster(agents=2, matchers=2, memberships=1, placement=Loopback(0), log_dir=tmp_path,
                             extra={"agent": ["--reconcile-seconds", "1"]})
    await cluster.start()
    procs: list[subprocess.Popen] = []
    try:
        a0, a1 = cluster.by_role("agent")
        matchers = [p.address for p in cluster.by_role("matcher")]
        async with Client(a0.address) as c0:
            await c0.create_topic("t", SCHEMA)
            procs = [spawn_subscriber(a1.address, 60) for _ in range(2)]
            await asyncio.wait_for(asyncio.gather(*(read_lines(p, 15) for p in procs)), 30)
            a1.popen.send_signal(signal.SIGKILL)
            a1.popen.wait()
            left = await tier_holdings(matchers[0], "agent-1")
            assert len(left) >= 30, left  # the ghosts of the dead process
            for p in procs:
                p.kill()
                p.wait()
            await cluster.launch(a1)
            pub = c0.publisher()
            await wait_for(lambda: nothing_left(matchers, lambda: pub.publish("t", {"x": 999})), timeout=30,
                           interval=0.3, what="the restarted agent's ghosts removed")
            assert await tier_holdings(matchers[1], "agent-1") == []
        page = urllib.request.urlopen(f"http://{a1.metrics}/metrics", timeout=5).read().decode()
        assert reconciled(page).get("tier", 0) >= len(left)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        cluster.stop()


async def test_matchers_reap_the_subscriptions_of_an_agent_dead_for_the_park_time():
    """Named subscriptions outlive their stream, so nobody removes them when their agent
    crashes: each matcher drops its copies once the view has held the agent DEAD for the
    park time."""
    cluster = Cluster(agents=2, matchers=2, matcher_kwargs={"park_seconds": 1.0})
    await cluster.start()
    try:
        c0, c1 = cluster.client(0), cluster.client(1)
        await c0.create_topic("t", SCHEMA)
        for i in range(3):
            sub = c1.subscribe("t", f"x >= {i}", name=f"kept-{i}")
            await sub.start()
        matchers = [m.address for m in cluster.matcher_nodes]
        assert len(await tier_holdings(matchers[0], "agent-1")) == 3
        await cluster.crash(cluster.agent_nodes[1])
        assert len(await tier_holdings(matchers[0], "agent-1")) == 3  # a crash removes nothing
        pub = c0.publisher()
        await wait_for(lambda: nothing_left(matchers, lambda: pub.publish("t", {"x": 999})), timeout=20,
                       interval=0.2, what="the dead agent's copies reaped")
        assert sum(m.metrics.reaped._value.get() for m in cluster.matcher_nodes) >= 3
    finally:
        await cluster.stop()


async def test_reconciliation_fixes_each_direction_and_counts_it():
    """A ghost put straight into the tier is removed there, a subscription removed straight
    from the tier is registered again (and delivers), an ephemeral subscription with no
    stream is closed here; each counted under its direction."""
    cluster = Cluster(agents=1, matchers=2, agent_kwargs={"reconcile_seconds": 0.3})
    await cluster.start()
    try:
        agent = cluster.agent_nodes[0]
        client = cluster.client(0)
        await client.create_topic("t", SCHEMA)
        async with client.subscribe("t", "x >= 500") as live:
            (sid,) = agent.matching.subscriptions
            entry = cluster.matcher_nodes[0].address
            async with grpc.aio.insecure_channel(entry) as ch:
                stub = xgrpc.MatcherStub(ch)
                ghost = xpb.Subscription(id="agent-0/~ghost", agent="agent-0", topic="t",
                                         filter=filter_to_pb(parse("x >= 0")), version=1)
                await stub.Register(xpb.RegisterRequest(subscriptions=[ghost]), timeout=5)
                await stub.Remove(xpb.RemoveRequest(ids=[sid], version=agent.matching.subscriptions[sid].version),
                                 timeout=5)
            orphan = Subscription("agent-0/~orphan", "~orphan", "t", parse(""), 10)
            agent.subs[orphan.name] = orphan

            def counts():
                return {s.labels["direction"]: s.value for m in agent.metrics.reconciled.collect()
                        for s in m.samples if s.name.endswith("_total")}

            await wait_for(lambda: counts() == {"tier": 1, "agent": 1, "stream": 1}, timeout=20,
                           what=f"each direction reconciled once (now {counts()})")
            # Counted when the agent sends each fix: the tier applies them a moment later.
            async def fixed():
                return await tier_holdings(entry, "agent-0") == [sid]
            await wait_for(fixed, what="the ghost removed and the lost one registered again")
            assert list(agent.subs) == [live_name(agent)]
            assert (await client.publisher().publish("t", {"x": 700})).destinations == 1
            assert (await live.next(timeout=5)).attributes == {"x": 700}
    finally:
        await cluster.stop()


def live_name(agent) -> str:
    (name,) = [n for n, s in agent.subs.items() if s.attached]
    return name
