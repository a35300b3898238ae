"""The router tier as real processes (`echelon.launch.Cluster`, what `echelon up --regions 3
--routers-per-region 3 --agents 6` runs): subscriptions in every region, events published
from every region; every delivery equals brute force. Then the router that one agent
hands over to is killed with SIGKILL mid-stream: nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import random
import signal

import pytest

from echelon.dataplane.gateway import Gateway
from echelon.client import DELIVERED, Client
from echelon.contract.filters import parse
from echelon.launch import Cluster, Loopback
from echelon.v1 import membership_pb2 as mpb
from tests.harness import wait_for
from tests.integration.test_pubsub import drain


@pytest.mark.timeout(240)
async def test_three_regions_of_three_routers_deliver_brute_force_and_survive_a_router_kill(tmp_path):
    cluster = Cluster(agents=6, matchers=1, memberships=1, regions=3, routers=3, placement=Loopback(0),
                      log_dir=tmp_path, extra={"router": ["--interval", "0.1"]})
    clients: list[Client] = []
    await cluster.start()
    try:
        agents = cluster.by_role("agent")
        clients = [Client(p.address) for p in agents]
        await clients[0].create_topic("t", ["x:int:0:99", "r:string"])
        rng = random.Random(5)
        filters = {f"s{i}": (c, f"x >= {(lo := rng.randrange(60))} and x < {lo + rng.randrange(10, 40)}")
                   for i, c in enumerate(clients)}
        filters["all"] = (clients[1], "")
        subs = {n: c.subscribe("t", f) for n, (c, f) in filters.items()}
        for s in subs.values():
            await s.start()
        events = [{"x": rng.randrange(100), "r": f"e{k}"} for k in range(90)]
        pubs = [c.publisher(ack_level=DELIVERED) for c in clients]
        for k, e in enumerate(events):
            await pubs[k % len(pubs)].publish("t", e)
        for name, (_, f) in filters.items():
            got = sorted(m.attributes["r"] for m in await drain(subs[name]))
            assert got == sorted(e["r"] for e in events if parse(f).matches(e)), name

        # agent-0 (region-0) hands region-1 and region-2 to one router of region-0: kill it.
        routers = [mpb.Member(id=p.id, role=mpb.ROLE_ROUTER, address=p.address) for p in cluster.by_role("router")]
        gateway = Gateway("agent-0", "region-0")
        gateway.update(routers, {p.id: p.region for p in cluster.by_role("router")}, "region-0")
        victim = next(p for p in cluster.by_role("router") if p.id == gateway.router)
        far = {n: subs[n] for n in ("s1", "s2", "all")}  # agents 1 and 2: regions 1 and 2
        acked: list[str] = []

        async def publish():
            for k in range(150):
                await pubs[0].publish("t", {"x": k % 100, "r": f"k{k}"})
                acked.append(f"k{k}")

        task = asyncio.create_task(publish())
        await wait_for(lambda: len(acked) >= 30, timeout=30, what="30 acknowledged publishes")
        cluster.signal(victim.id, signal.SIGKILL)
        await asyncio.wait_for(task, 90)
        for name, s in far.items():
            got = {m.attributes["r"] for m in await drain(s, idle=1.0)}
            f = filters[name][1]
            want = {r for r in acked if parse(f).matches({"x": int(r[1:]) % 100, "r": r})}
            assert want <= got, f"{name}: lost {sorted(want - got)[:5]}"
    finally:
        for c in clients:
            await c.close()
        cluster.stop()
