"""Regions that stand alone as real processes (`echelon.launch.Cluster` with a matcher in
each region): one region's router paused with SIGSTOP, its links cut as a network partition
would (the process is there, nothing comes out of it), then resumed with SIGCONT, the same
process. Local traffic in every region goes on with nothing lost; the events the cut region
and the others published for each other meanwhile arrive after healing, once each and in
each publisher's order. The in-process version (a router killed, another started) is in
test_regions.py, in the default suite."""

from __future__ import annotations

import asyncio
import signal

import pytest

from echelon.client import DELIVERED, Client
from echelon.launch import Cluster, Loopback
from echelon.runtime.member import fetch_view
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import router_pb2 as opb
from echelon.v1 import router_pb2_grpc as ogrpc
from tests.integration.test_pubsub import drain

REGIONS = ("region-0", "region-1", "region-2")


async def member_state(cluster: Cluster, member: str) -> int:
    view = await fetch_view(cluster.by_role("membership")[0].address, cluster.transport)
    return next(m.state for m in view.members if m.id == member)


async def summaries_settled(cluster: Cluster, timeout: float = 60.0) -> None:
    """Every router's summary of its region is complete, and it holds the other regions'
    complete summaries answering every advertisement it holds (router.proto Describe;
    docs/guarantees.md: where a subscription's events from other regions start). Their
    groups come once this region advertises: until then every region is sent everything."""
    routers = cluster.by_role("router")
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        settled = True
        for p in routers:
            channel = cluster.transport.dial(p.address)
            try:
                d = await ogrpc.RouterStub(channel).Describe(opb.DescribeRequest(), timeout=5)
            finally:
                await channel.close()
            others = {(s.region, s.complete, s.answered == d.advertisements) for s in d.summaries}
            settled &= d.complete and others == {(r, True, True) for r in REGIONS if r != d.region}
        if settled:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("the routers' summaries never settled")
        await asyncio.sleep(0.1)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_region_paused_serves_its_own_and_catches_up_after_sigcont(tmp_path):
    cluster = Cluster(agents=6, matchers=1, memberships=1, regions=3, routers=1, regional_matchers=True,
                      placement=Loopback(0), log_dir=tmp_path, extra={"router": ["--interval", "0.1"]})
    clients: list[Client] = []
    await cluster.start()
    try:
        agents = cluster.by_role("agent")  # agent-i in region-(i mod 3)
        clients = [Client(p.address) for p in agents]
        await clients[0].create_topic("t", ["x:int:0:99", "r:string"])
        subs = {REGIONS[i]: clients[i + 3].subscribe("t", "") for i in range(3)}
        for s in subs.values():
            await s.start()
        await summaries_settled(cluster)  # a subscription is owed other regions' events from here
        pubs = {REGIONS[i]: clients[i].publisher(ack_level=DELIVERED) for i in range(3)}

        async def publish(tag: str, n: int) -> dict[str, list[str]]:
            sent = {r: [f"{tag}-{r}-{k}" for k in range(n)] for r in REGIONS}

            async def one(region):
                for k, name in enumerate(sent[region]):
                    await pubs[region].publish("t", {"x": k % 100, "r": name})

            await asyncio.wait_for(asyncio.gather(*(one(r) for r in REGIONS)), 120)
            return sent

        before = await publish("before", 10)
        cluster.signal("router-2-0", signal.SIGSTOP)  # region-2 cut off
        for _ in range(300):
            if await member_state(cluster, "router-2-0") == mpb.MEMBER_STATE_DEAD:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("router-2-0 never declared DEAD while paused")
        during = await publish("during", 20)
        got = {r: [m.attributes["r"] for m in await drain(subs[r], idle=1.0)] for r in REGIONS}
        for region in REGIONS:
            assert [n for n in got[region] if n.startswith(f"during-{region}-")] == during[region], region
            for other in REGIONS:
                assert [n for n in got[region] if n.startswith(f"before-{other}-")] == before[other]
        assert [n for n in got["region-0"] if n.startswith("during-region-1-")] == during["region-1"]
        assert [n for n in got["region-1"] if n.startswith("during-region-0-")] == during["region-0"]
        assert not [n for n in got["region-2"] if n.startswith(("during-region-0", "during-region-1"))]

        cluster.signal("router-2-0", signal.SIGCONT)  # healed
        for region in REGIONS:
            others = [o for o in REGIONS if o != region and "region-2" in (o, region)]
            expected = {n for o in others for n in during[o]}
            seen: list[str] = []
            for _ in range(60):
                seen += [m.attributes["r"] for m in await drain(subs[region], idle=0.5)]
                if expected <= set(seen):
                    break
            assert expected <= set(seen), (region, sorted(expected - set(seen))[:5])
            for o in others:
                assert [n for n in seen if n.startswith(f"during-{o}-")] == during[o], (region, o)
    finally:
        for c in clients:
            await c.close()
        cluster.stop()
