"""The router tier through real servers on loopback: 3 regions x 2 routers, 2 agents per
region, subscriptions everywhere. Every delivery equals brute force (each filter applied
to every published event), under SNR and IDR; a router crashed mid-stream loses nothing
that was acknowledged; the metrics pass promtool."""

from __future__ import annotations

import asyncio
import random
import subprocess
import urllib.request

import grpc
import pytest

from echelon.dataplane.gateway import region_map
from echelon.agent.server import AgentNode
from echelon.client import DELIVERED
from echelon.router.server import RouterNode
from echelon.runtime.node import NodeConfig
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc
from echelon.v1 import router_pb2, router_pb2_grpc
from tests.harness import Cluster, wait_for
from tests.integration.test_pubsub import drain, publish_in_turn_and_check

REGIONS = ("eu", "us", "ap")
SCHEMA = ["x:int:0:99", "r:string"]


class Regions:
    def __init__(self, cluster: Cluster, routing: str, routers: int = 2, agents: int = 2):
        self.cluster = cluster
        self.routing = routing
        self.n_routers = routers
        self.n_agents = agents
        self.routers: list[RouterNode] = []
        self.agents: list[AgentNode] = []

    def config(self, member_id: str, region: str, **kw) -> NodeConfig:
        return NodeConfig(id=member_id, region=region, membership=self.cluster.replicas, grace=0.5, **kw)

    async def start(self) -> "Regions":
        for region in REGIONS:
            for a in range(self.n_routers):
                node = RouterNode(self.config(f"router-{region}-{a}", region, metrics_port=0),
                                  routing=self.routing, interval=0.05)
                await node.start()
                self.routers.append(node)
            for i in range(self.n_agents):
                node = AgentNode(self.config(f"agent-{region}-{i}", region))
                await node.start()
                self.agents.append(node)
        everyone = {n.config.id for n in (*self.routers, *self.agents)}
        await wait_for(lambda: all({m.id for r in (mpb.ROLE_AGENT, mpb.ROLE_ROUTER) for m in n.membership.alive(r)}
                                   >= everyone for n in (*self.routers, *self.agents)),
                       what="every router and agent sees everyone")
        return self

    async def stop(self) -> None:
        await self.cluster.close_clients()
        await asyncio.gather(*(n.stop(0.2) for n in (*self.agents, *self.routers) if n not in self.cluster.crashed),
                             return_exceptions=True)


@pytest.fixture
async def regions(request):
    cluster = Cluster(agents=0)
    await cluster.start()
    r = Regions(cluster, getattr(request, "param", "idr"))
    try:
        yield await r.start()
    finally:
        await r.stop()
        await cluster.stop()


def client(regions: Regions, i: int):
    from echelon.client import Client

    c = Client(regions.agents[i].address)
    regions.cluster.clients.append(c)
    return c


@pytest.mark.parametrize("regions", ["snr", "idr"], indirect=True)
async def test_deliveries_across_regions_equal_brute_force(regions):
    rng = random.Random(11)
    clients = [client(regions, i) for i in range(len(regions.agents))]
    await clients[0].create_topic("t", SCHEMA)
    filters = {}
    for i, c in enumerate(clients):
        lo = rng.randrange(0, 60)
        filters[f"s{i}"] = (c, f"x >= {lo} and x < {lo + rng.randrange(10, 50)}")
    filters["all"] = (clients[3], "")
    subs = {name: c.subscribe("t", f) for name, (c, f) in filters.items()}
    for s in subs.values():
        await s.start()
    events = [{"x": rng.randrange(100), "r": f"e{k}"} for k in range(60)]
    await publish_in_turn_and_check(clients, "t", events, subs, filters)  # from every region in turn
    # Every region other than the publisher's was reached over the overlay, once per event.
    handed = sum(r.metrics.events._value.get() for r in regions.routers)
    messages = sum(r.metrics.messages.labels(k)._value.get() for r in regions.routers for k in ("ilink", "alink"))
    assert handed > 0 and messages >= handed
    lost = sum(r.metrics.lost._value.get() for r in regions.routers)
    assert lost == 0
    assert all(a.metrics.duplicates._value.get() == 0 for a in regions.agents)


async def test_a_router_crash_loses_nothing_acknowledged(regions):
    clients = [client(regions, i) for i in range(len(regions.agents))]
    await clients[0].create_topic("t", SCHEMA)
    far = [clients[i] for i in (2, 3, 4, 5)]  # the us and ap agents: every event crosses regions
    subs = [c.subscribe("t", "") for c in far]
    for s in subs:
        await s.start()
    pub = clients[0].publisher(ack_level=DELIVERED)
    gateway = regions.agents[0].gateway.trees.router  # the eu router agent-eu-0 hands over to
    acked = []

    async def publish():
        for k in range(200):
            await pub.publish("t", {"x": k % 100, "r": f"e{k}"})
            acked.append(f"e{k}")

    task = asyncio.create_task(publish())
    await wait_for(lambda: len(acked) >= 40, what="40 acknowledged publishes")
    victim = next(r for r in regions.routers if r.config.id == gateway)
    await regions.cluster.crash(victim)
    await asyncio.wait_for(task, 60)
    assert regions.agents[0].gateway.trees.router != gateway  # attached to the region's other router
    for s in subs:
        got = {m.attributes["r"] for m in await drain(s)}
        assert set(acked) <= got  # at least once: nothing acknowledged is lost


async def test_a_plans_cliques_become_the_regions(regions):
    """Kyra cliques in the routing plan override --region: eu and us become one region."""
    west = [n.config.id for n in (*regions.routers, *regions.agents) if n.config.region in ("eu", "us")]
    plan = mpb.RoutingPlan(version=1, cliques=[mpb.Clique(id="west", members=west)], origin="test")
    async with grpc.aio.insecure_channel(regions.cluster.replicas[0]) as ch:
        await mgrpc.ControlStub(ch).PushPlan(plan)
    nodes = (*regions.routers, *regions.agents)
    await wait_for(lambda: all(n.membership.plan_version == 1 for n in nodes), what="every member on the plan")
    assert all(r.overlay.regions == ["ap", "clique-west"] for r in regions.routers)
    eu0 = regions.agents[0]
    assert {m.id for m in eu0.plane.trees.table.members.values()} == {"agent-eu-0", "agent-eu-1", "agent-us-0",
                                                                      "agent-us-1"}
    clients = [client(regions, i) for i in range(len(regions.agents))]
    await clients[0].create_topic("t", SCHEMA)
    subs = [c.subscribe("t", "x < 50") for c in clients[1:]]
    for s in subs:
        await s.start()
    events = [{"x": k, "r": f"e{k}"} for k in range(0, 100, 7)]
    pub = clients[0].publisher(ack_level=DELIVERED)
    for e in events:
        await pub.publish("t", e)
    for s in subs:
        assert sorted(m.attributes["r"] for m in await drain(s)) == sorted(e["r"] for e in events if e["x"] < 50)
    handed = sum(r.metrics.events._value.get() for r in regions.routers)
    assert handed == sum(e["x"] < 50 for e in events)  # only the ap destinations went through a router


async def test_a_plan_with_a_clique_no_router_serves_is_refused(regions):
    """The eu agents in a clique of their own (no router in it): refused with the reason,
    and nothing changes (every member stays on the plan it had)."""
    eu = [n.config.id for n in regions.agents if n.config.region == "eu"]
    plan = mpb.RoutingPlan(version=1, cliques=[mpb.Clique(id="lonely", members=eu)], origin="test")
    async with grpc.aio.insecure_channel(regions.cluster.replicas[0]) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await mgrpc.ControlStub(ch).PushPlan(plan)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "leaves 2 agents without a router of their region (clique-lonely): 'agent-eu-0', 'agent-eu-1'" \
            in e.value.details()
        assert (await mgrpc.ControlStub(ch).GetPlan(mpb.GetPlanRequest())).version == 0
    assert all(r.overlay.regions == ["ap", "eu", "us"] for r in regions.routers)


def test_region_map_takes_cliques_over_flags():
    members = [mpb.Member(id="a", region="eu"), mpb.Member(id="b", region="us"), mpb.Member(id="c", region="us"),
               mpb.Member(id="r", region="us", role=mpb.ROLE_ROUTER, state=mpb.MEMBER_STATE_ALIVE)]
    assert region_map(members, None) == {"a": "eu", "b": "us", "c": "us", "r": "us"}
    plan = mpb.RoutingPlan(cliques=[mpb.Clique(id="k", members=["a", "b"])])
    assert region_map(members, plan) == {"a": "clique-k", "b": "clique-k", "c": "us", "r": "us"}
    # With no live router nothing joins regions: cliques change nothing.
    assert region_map(members[:3], plan) == {"a": "eu", "b": "us", "c": "us"}


async def test_a_destination_no_router_serves_fails_the_delivered_ack(regions):
    """Both eu routers gone: an eu agent cannot hand events to other regions. A DELIVERED
    publish that names a destination there fails UNAVAILABLE (counted as lost too); one
    whose destinations are all in eu is delivered and acked as ever."""
    from echelon.client import errors

    clients = [client(regions, i) for i in range(len(regions.agents))]
    await clients[0].create_topic("t", SCHEMA)
    near, far = clients[1].subscribe("t", ""), clients[2].subscribe("t", "x >= 50")  # agent-eu-1, agent-us-0
    for s in (near, far):
        await s.start()
    for r in [r for r in regions.routers if r.config.region == "eu"]:
        await regions.cluster.crash(r)
    eu0 = regions.agents[0]
    await wait_for(lambda: eu0.gateway.trees.router is None, 20, what="agent-eu-0 without a router")
    lost = eu0.metrics.lost._value.get()
    pub = clients[0].publisher(ack_level=DELIVERED)
    with pytest.raises(errors.Unavailable, match="could not be served"):
        await pub.publish("t", {"x": 60, "r": "far"})
    assert eu0.metrics.lost._value.get() == lost + 1
    await pub.publish("t", {"x": 10, "r": "near"})  # eu only: delivered, acked OK
    assert sorted(m.attributes["r"] for m in await drain(near)) == ["far", "near"]


async def test_describe_and_metrics(regions):
    r = regions.routers[0]
    async with grpc.aio.insecure_channel(r.address) as ch:
        d = await router_pb2_grpc.RouterStub(ch).Describe(router_pb2.DescribeRequest())
    assert (d.router_id, d.region, d.routing) == ("router-eu-0", "eu", "idr")
    assert list(d.regions) == sorted(REGIONS) and d.position == 0 and d.region_index == 1
    body = urllib.request.urlopen(f"http://{r.metrics_address}/metrics", timeout=5).read()
    check = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
