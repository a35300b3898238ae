"""Regions that stand alone, through real servers on loopback (docs/event-path.md, "Regions
that stand alone"): three regions, each with its own matcher, router and agents.

- Every delivery equals brute force (every subscription's filter applied to every
  published event), with random filters and events published from every region, under
  mTLS (a router asks its region's matchers as a member with a router's certificate); each
  region's matcher holds its own region's subscriptions only, and each agent calls its own
  region's matcher only.
- A region cut off (its router killed): local traffic goes on in every region with
  nothing lost, and once a router of the region is back, the events published elsewhere
  meanwhile reach it (they were parked for it, not lost).
"""

from __future__ import annotations

import asyncio
import random

import pytest

from echelon.agent.server import AgentNode
from echelon.client import DELIVERED
from echelon.contract.filters import parse
from echelon.matcher.server import MatcherNode
from echelon.router.server import RouterNode
from echelon.runtime.node import NodeConfig
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import router_pb2 as opb
from echelon.v1 import router_pb2_grpc as ogrpc
from tests.harness import Cluster, wait_for
from tests.integration.test_pubsub import drain, publish_in_turn_and_check

REGIONS = ("eu", "us", "ap")
SCHEMA = ["x:int:0:99", "y:int:0:99", "r:string"]


class Regions:
    def __init__(self, cluster: Cluster, agents: int = 2):
        self.cluster = cluster
        self.n_agents = agents
        self.matchers: list[MatcherNode] = []
        self.routers: list[RouterNode] = []
        self.agents: list[AgentNode] = []

    def config(self, member_id: str, region: str, **kw) -> NodeConfig:
        return NodeConfig(id=member_id, region=region, membership=self.cluster.replicas, grace=0.5,
                          tls_dir=self.cluster.tls_dir(member_id), **kw)

    async def add_router(self, region: str, name: str) -> RouterNode:
        node = RouterNode(self.config(name, region), routing="snr", interval=0.05)
        await node.start()
        self.routers.append(node)
        return node

    async def start(self) -> "Regions":
        for region in REGIONS:
            node = MatcherNode(self.config(f"matcher-{region}", region))
            await node.start()
            self.matchers.append(node)
            await self.add_router(region, f"router-{region}-0")
            for i in range(self.n_agents):
                agent = AgentNode(self.config(f"agent-{region}-{i}", region))
                await agent.start()
                self.agents.append(agent)
        everyone = {n.config.id for n in self.nodes()}
        await wait_for(lambda: all({m.id for r in (mpb.ROLE_AGENT, mpb.ROLE_ROUTER, mpb.ROLE_MATCHER)
                                    for m in n.membership.alive(r)} >= everyone for n in self.nodes()),
                       what="every member sees everyone")
        return self

    async def summaries_settled(self, topic: str, groups: dict[str, int], publishing=()) -> None:
        """Every live router holds its region's subgroups on `topic` (`groups`: how many per
        region; `terms`) and a complete summary; the routers of `publishing` (the regions whose
        agents have a producer on `topic`) hold its advertisement, and every router of the
        other regions that answers them holds exactly those groups: from here a new event
        is routed by them. A router of a region that publishes nothing on `topic` holds none
        of its groups (router/control.py)."""
        why = [""]
        ad = (topic, b"")  # an agent's advertisement: the topic, no bounds

        def settled() -> bool:
            live = [r for r in self.routers if r not in self.cluster.crashed]
            for r in live:
                own = {k for k in r.control.subgroups.groups() if k[0] == topic}
                if len(own) != groups.get(r.config.region, 0) or not r.control.complete:
                    why[0] = f"{r.config.id}: {len(own)} groups, complete {r.control.complete} ({r.control.waiting})"
                    return False
                if (r.config.region in publishing) != (ad in r.control.advertised.count):
                    why[0] = f"{r.config.id}: advertisement of {topic!r} {ad in r.control.advertised.count}"
                    return False
                for o in live:
                    s = o.control.summaries
                    if o.config.region == r.config.region:
                        continue
                    publishes = o.config.region in publishing
                    expect = own if publishes else set()
                    if not s.known(r.config.region) or s.keys(r.config.region, topic) != expect or \
                            publishes and ad not in s.answers(r.config.region):
                        why[0] = f"{o.config.id} on {r.config.region}: {s.known(r.config.region)}, " \
                                 f"{len(s.keys(r.config.region, topic))} groups, answered " \
                                 f"{ad in s.answers(r.config.region)}"
                        return False
            return True
        try:
            await wait_for(settled, timeout=30, what="every region's summary at every other region's router")
        except AssertionError as e:
            raise AssertionError(f"{e}: {why[0]}") from None

    async def advertise(self, pubs, topic: str, events: list[dict]) -> None:
        """Each publisher's first event (`events`, one each; not routed by the summaries
        yet): its producer's stream advertises `topic` from here (dataplane/control.py)."""
        for pub, e in zip(pubs, events):
            await pub.publish(topic, e)

    def nodes(self):
        return [n for n in (*self.matchers, *self.routers, *self.agents) if n not in self.cluster.crashed]

    async def stop(self) -> None:
        # Clients, then agents (their removals still reach the matchers), then the rest.
        await asyncio.gather(*(c.close() for c in self.cluster.clients), return_exceptions=True)
        self.cluster.clients.clear()
        await asyncio.gather(*(n.stop(0.2) for n in self.agents if n not in self.cluster.crashed),
                             return_exceptions=True)
        await asyncio.gather(*(n.stop(0.2) for n in self.nodes() if n not in self.agents), return_exceptions=True)

    def client(self, i: int):
        from echelon.client import Client

        c = Client(self.agents[i].address, tls=self.cluster.tls_dir("client-test", "client") or None)
        self.cluster.clients.append(c)
        return c


@pytest.fixture
async def regions(request, tmp_path):
    # With mTLS when asked: each member's certificate names its role (a router's Match call).
    cluster = Cluster(agents=0, matchers=0, tls=tmp_path / "tls" if getattr(request, "param", "") == "tls" else None)
    await cluster.start()
    r = Regions(cluster)
    try:
        yield await r.start()
    finally:
        await r.stop()
        await cluster.stop()


def terms(texts) -> int:
    """Subgroups made of filters `texts`: an agent registers a disjunction term by term."""
    return len({str(t) for f in texts for t in parse(f).terms})


def region_of(node_id: str) -> str:
    return node_id.split("-")[1]


def random_filter(rng: random.Random) -> str:
    terms = []
    for attr in rng.sample(["x", "y"], rng.randint(1, 2)):
        lo = rng.randrange(90)
        terms.append(f"{attr} >= {lo} and {attr} < {lo + rng.randrange(5, 60)}")
    f = " and ".join(terms)
    return f if rng.random() < 0.8 else f"{f} or x = {rng.randrange(100)}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("regions", ["tls"], indirect=True)
async def test_each_region_matches_its_own_and_deliveries_equal_brute_force(regions):
    rng = random.Random(29)
    clients = [regions.client(i) for i in range(len(regions.agents))]
    await clients[0].create_topic("t", SCHEMA)
    filters = {f"s{k}": (rng.randrange(len(clients)), random_filter(rng)) for k in range(14)}
    subs = {name: clients[i].subscribe("t", f) for name, (i, f) in filters.items()}
    for s in subs.values():
        await s.start()
    # Each region's matcher holds its own region's subscriptions, and nothing else.
    want = {region: {n for n, (i, _) in filters.items() if region_of(regions.agents[i].config.id) == region}
            for region in REGIONS}
    for m in regions.matchers:
        held = {c.agent for c in m.tier.store.copies.values()}
        assert all(region_of(a) == region_of(m.config.id) for a in held), (m.config.id, held)
    assert all(len(v) for v in want.values())  # the seed gives every region subscriptions
    for a in regions.agents:
        assert {m.id for m in a.matching.matchers()} == {f"matcher-{region_of(a.config.id)}"}
    events = [{"x": rng.randrange(100), "y": rng.randrange(100), "r": f"e{k}"} for k in range(90)]
    pubs = [c.publisher(ack_level=DELIVERED) for c in clients]
    await regions.advertise(pubs, "t", events[:len(pubs)])  # each producer advertises with its first event
    await regions.summaries_settled("t", {r: terms(filters[n][1] for n in want[r]) for r in REGIONS}, REGIONS)
    unmatched = sum(r.metrics.unmatched._value.get() for r in regions.routers)
    skipped = sum(r.metrics.skipped._value.get() for r in regions.routers)
    for k, e in enumerate(events[len(pubs):]):  # from every region in turn
        await pubs[k % len(pubs)].publish("t", e)
    for name, (_, f) in filters.items():
        got = sorted(m.attributes["r"] for m in await drain(subs[name]))
        assert got == sorted(e["r"] for e in events if parse(f).matches(e)), name
    # Routed by the summaries: a region got an event only when one of its filters matched it.
    assert sum(r.metrics.skipped._value.get() for r in regions.routers) > skipped
    assert sum(r.metrics.unmatched._value.get() for r in regions.routers) == unmatched
    assert sum(r.metrics.lost._value.get() for r in regions.routers) == 0
    assert all(a.metrics.duplicates._value.get() == 0 for a in regions.agents)
    # Each matcher answered as entry only for its own region's publishers and routers.
    assert all(m.metrics.events._value.get() > 0 for m in regions.matchers)


@pytest.mark.timeout(150)
async def test_a_region_cut_off_serves_its_own_and_catches_up_after_healing(regions):
    clients = [regions.client(i) for i in range(len(regions.agents))]
    await clients[0].create_topic("t", SCHEMA)
    # One catch-all subscriber on the second agent of every region; publishers on the first.
    subs = {region: clients[2 * c + 1].subscribe("t", "") for c, region in enumerate(REGIONS)}
    for s in subs.values():
        await s.start()
    await regions.summaries_settled("t", {r: 1 for r in REGIONS})  # owed the other regions' events from here
    pubs = {region: clients[2 * c].publisher(ack_level=DELIVERED) for c, region in enumerate(REGIONS)}

    async def publish(tag: str, n: int) -> dict[str, list[str]]:
        sent = {region: [f"{tag}-{region}-{k}" for k in range(n)] for region in REGIONS}
        await asyncio.gather(*(asyncio.wait_for(_publish(pubs[region], sent[region]), 60) for region in REGIONS))
        return sent

    async def _publish(pub, names):
        for k, name in enumerate(names):
            await pub.publish("t", {"x": k % 100, "y": 0, "r": name})

    before = await publish("before", 10)
    # Cut ap off: its router killed. Its agents keep their own matcher; the others' routers
    # see ap's router DEAD, and what they send to ap is parked.
    ap_router = next(r for r in regions.routers if r.config.id == "router-ap-0")
    await regions.cluster.crash(ap_router)
    survivors = [n for n in regions.nodes() if n.role != mpb.ROLE_MATCHER]
    await wait_for(lambda: all(not any(m.id == "router-ap-0" for m in n.membership.alive(mpb.ROLE_ROUTER))
                               for n in survivors), timeout=30, what="router-ap-0 out of every view")
    during = await publish("during", 30)
    got = {region: [m.attributes["r"] for m in await drain(subs[region])] for region in REGIONS}
    for region in REGIONS:
        # Local traffic in every region, the cut one included: nothing lost, in order.
        assert [r for r in got[region] if r.startswith(f"during-{region}-")] == during[region], region
        # Across regions: everything before the cut; during it, eu and us reach each other.
        for other in REGIONS:
            assert [r for r in got[region] if r.startswith(f"before-{other}-")] == before[other], (region, other)
            if "ap" not in (region, other):
                assert [r for r in got[region] if r.startswith(f"during-{other}-")] == during[other], (region, other)
    assert not [r for r in got["ap"] if r.startswith(("during-eu", "during-us"))]
    assert not [r for r in got["eu"] + got["us"] if r.startswith("during-ap")]
    # Parked for ap at the other regions' routers, and for the others at ap's agents.
    assert sum(r.metrics.parked._value.get() for r in regions.routers if r is not ap_router) > 0
    assert sum(a.metrics.parked._value.get() for a in regions.agents if region_of(a.config.id) == "ap") > 0
    # Heal: a router of ap again (a new process in the same region).
    await regions.add_router("ap", "router-ap-1")
    for region in REGIONS:
        others = [o for o in REGIONS if o != region and "ap" in (o, region)]
        expected = {name for o in others for name in during[o]}
        seen: list[str] = []
        for _ in range(100):
            seen += [m.attributes["r"] for m in await drain(subs[region], 0.2)]
            if expected <= set(seen):
                break
        assert expected <= set(seen), (region, sorted(expected - set(seen))[:5])
        for o in others:  # once each, in each publisher's order (parked in arrival order)
            assert [r for r in seen if r.startswith(f"during-{o}-")] == during[o], (region, o)
    assert sum(r.metrics.lost._value.get() for r in regions.routers) == 0
    assert all(a.metrics.lost._value.get() == 0 for a in regions.agents)


@pytest.mark.timeout(120)
async def test_a_region_whose_matchers_are_all_dead_does_not_hold_the_others_back(regions):
    """ap's only matcher crashed: eu's DELIVERED publishes do not wait on it (ap's router
    acknowledges and keeps them, as for a DEAD destination); once a matcher of ap is back,
    ap's subscriber gets them, in order."""
    clients = [regions.client(i) for i in range(len(regions.agents))]
    await clients[0].create_topic("t", SCHEMA)
    subs = {region: clients[2 * c + 1].subscribe("t", "x < 50") for c, region in enumerate(REGIONS)}
    for s in subs.values():
        await s.start()
    await regions.summaries_settled("t", {r: 1 for r in REGIONS})
    pub = clients[0].publisher(ack_level=DELIVERED)  # agent-eu-0
    victim = next(m for m in regions.matchers if m.config.id == "matcher-ap")
    await regions.cluster.crash(victim)
    router = next(r for r in regions.routers if r.config.id == "router-ap-0")
    await wait_for(lambda: not router.matching._matchers(), timeout=30, what="ap's tier DEAD at its router")
    sent = [f"e{k}" for k in range(20)]
    for k, name in enumerate(sent):
        await asyncio.wait_for(pub.publish("t", {"x": k * 5, "y": 0, "r": name}), 30)
    want = [n for k, n in enumerate(sent) if k * 5 < 50]
    for region in ("eu", "us"):
        assert [m.attributes["r"] for m in await drain(subs[region])] == want, region
    assert not await drain(subs["ap"])
    # A matcher of ap again: the agents refill it, the router matches what it kept.
    node = MatcherNode(regions.config("matcher-ap-1", "ap"))
    await node.start()
    regions.matchers.append(node)
    got: list[str] = []
    for _ in range(100):
        got += [m.attributes["r"] for m in await drain(subs["ap"], 0.2)]
        if len(got) >= len(want):
            break
    assert got == want
    assert sum(r.metrics.lost._value.get() for r in regions.routers) == 0


@pytest.mark.timeout(150)
async def test_summaries_send_a_region_only_what_it_wants_new_subscriptions_and_restarts_included(regions):
    """Routing by the summaries (router/control.py): ap, with no subscription, gets no copy;
    a subscription made in ap later receives events from eu and us once their routers hold
    ap's new summary; a router restarted (the publishers' and the subscribers') is sent the
    full state again, and until it holds it every region gets everything (nothing lost)."""
    clients = [regions.client(i) for i in range(len(regions.agents))]
    await clients[0].create_topic("t", SCHEMA)
    filters = {"eu": (1, "x < 30"), "us": (3, "x >= 70")}
    subs = {name: clients[i].subscribe("t", f) for name, (i, f) in filters.items()}
    for s in subs.values():
        await s.start()
    router = {r.config.id: r for r in regions.routers}
    eu, ap = router["router-eu-0"], router["router-ap-0"]
    pubs = {region: clients[2 * c].publisher(ack_level=DELIVERED) for c, region in enumerate(REGIONS)}
    # Nothing advertised yet: no router holds another region's groups (nor is sent any).
    await regions.summaries_settled("t", {"eu": 1, "us": 1})
    assert not any(r.control.summaries.keys(o) for r in regions.routers for o in REGIONS)
    # Advertised with a first event that matches nobody (sent everywhere: not answered yet).
    await regions.advertise(pubs.values(), "t", [{"x": 50, "y": 0, "r": "ad"}] * len(pubs))
    await regions.summaries_settled("t", {"eu": 1, "us": 1}, REGIONS)
    ilink0, skipped0 = eu.metrics.messages.labels("ilink")._value.get(), eu.metrics.skipped._value.get()
    unmatched0 = [r.metrics.unmatched._value.get() for r in regions.routers]
    rounds = iter(range(100))

    async def publish_and_check(regions_publishing) -> list[dict]:
        n = next(rounds)
        events = [{"x": (7 * k + n) % 100, "y": 0, "r": f"{n}-{k}"} for k in range(24)]
        for k, e in enumerate(events):
            await pubs[regions_publishing[k % len(regions_publishing)]].publish("t", e)
        for name, (_, f) in filters.items():
            got = sorted(m.attributes["r"] for m in await drain(subs[name]))
            assert got == sorted(e["r"] for e in events if parse(f).matches(e)), (n, name)
        return events

    events = await publish_and_check(["eu"])
    # eu's router sent a copy over an iLink only for events us wants; ap got none.
    assert eu.metrics.messages.labels("ilink")._value.get() - ilink0 == sum(e["x"] >= 70 for e in events)
    assert eu.metrics.skipped._value.get() - skipped0 == 2 * len(events) - sum(e["x"] >= 70 for e in events)
    assert ap.metrics.unmatched._value.get() == unmatched0[regions.routers.index(ap)]
    # A subscription made in ap now: eu and us send it its events once they hold its group.
    filters["ap"] = (5, "x >= 40 and x < 60")
    subs["ap"] = clients[5].subscribe("t", filters["ap"][1])
    await subs["ap"].start()
    await regions.summaries_settled("t", {"eu": 1, "us": 1, "ap": 1}, REGIONS)
    await publish_and_check(["eu", "us"])
    # no copy nobody wanted
    assert [r.metrics.unmatched._value.get() for r in regions.routers] == unmatched0
    # The publishers' router restarted: a new one starts with no summary (everything to
    # every region, so the publish right after it is exact too), then is sent the others'.
    await regions.cluster.crash(eu)
    await wait_for(lambda: all(not any(m.id == eu.config.id for m in n.membership.alive(mpb.ROLE_ROUTER))
                               for n in regions.nodes()), timeout=30, what="router-eu-0 out of every view")
    eu1 = await regions.add_router("eu", "router-eu-1")
    await wait_for(lambda: all(any(m.id == eu1.config.id for m in a.membership.alive(mpb.ROLE_ROUTER))
                               for a in regions.agents), timeout=30, what="router-eu-1 in every agent's view")
    await publish_and_check(["eu"])
    await regions.summaries_settled("t", {"eu": 1, "us": 1, "ap": 1}, REGIONS)
    channel = eu1.server.transport.dial(eu1.address)  # what an operator sees (router.proto Describe)
    d = await ogrpc.RouterStub(channel).Describe(opb.DescribeRequest())
    await channel.close()
    assert (d.subgroups, d.complete) == (1, True)
    assert [(s.region, s.complete, s.subgroups, s.answered) for s in d.summaries] == [("ap", True, 1, 1),
                                                                                     ("us", True, 1, 1)]
    # OctopiA's SRT: eu's own advertisement of t, and us's and ap's (each has eu's router as secondary).
    assert (d.advertisements, d.srt) == (1, 2) and d.control_sent["adv"] >= 2 and d.control_sent["cib_set"] >= 2
    skipped = eu1.metrics.skipped._value.get()
    await publish_and_check(["eu"])
    assert eu1.metrics.skipped._value.get() > skipped
    # The subscribers' router restarted: until the new one has heard ap's agents, eu and us
    # send ap everything; then ap's summary again.
    await regions.cluster.crash(ap)
    await wait_for(lambda: all(not any(m.id == ap.config.id for m in n.membership.alive(mpb.ROLE_ROUTER))
                               for n in regions.nodes()), timeout=30, what="router-ap-0 out of every view")
    ap1 = await regions.add_router("ap", "router-ap-1")
    await wait_for(lambda: all(any(m.id == ap1.config.id for m in n.membership.alive(mpb.ROLE_ROUTER))
                               for n in regions.nodes()), timeout=30, what="router-ap-1 in every view")
    await publish_and_check(["eu", "us"])  # before its summary: ap gets everything
    await regions.summaries_settled("t", {"eu": 1, "us": 1, "ap": 1}, REGIONS)
    await publish_and_check(["eu", "us"])
    assert sum(r.metrics.lost._value.get() for r in regions.routers) == 0
    assert all(a.metrics.lost._value.get() == 0 for a in regions.agents)
    # ap's last producer of t goes away (its Publish stream ends): UNADV, so eu's and us's
    # routers drop ap's advertisement and the groups they had sent ap's router for it.
    await pubs["ap"].close()
    await regions.summaries_settled("t", {"eu": 1, "us": 1, "ap": 1}, ("eu", "us"))
    assert not any(r.control.srt.get(ap1.config.id) for r in regions.routers if r not in regions.cluster.crashed)
