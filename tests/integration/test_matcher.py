"""The matcher tier with real servers: three matcher processes, four agents, the stock
workload of Meghdoot's evaluation.

Deliveries per subscription and the tier's own `Match` answers must equal brute force
(`Filter.matches`) in three phases: on the default zones; while and after a pushed plan
splits, moves and replicates zones (Control.PushPlan through the membership replica);
and while and after a matcher is killed (SIGKILL), its zones recovered from the mirrors
by their new owners. Events of each phase are published as the change begins, so the
answers are checked during the handoff too. Invalid subscriptions get INVALID_ARGUMENT
naming the predicate and leave no trace on any matcher.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections import Counter, defaultdict

import grpc
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from echelon.client import Client, errors
from echelon.core.can import ZoneMap
from echelon.contract.filters import Filter, Predicate, parse
from echelon.core.space import Space
from echelon import launch
from echelon.contract.wire import attributes_to_pb, filter_to_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import matcher_pb2_grpc as xgrpc
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc
from loadtest import stock
from tests.harness import Cluster, wait_for

TOPIC = "quotes"
SYMBOLS = 40  # subscriptions and events share a few symbols, so most events match some
AGENTS, SUBSCRIPTIONS, EVENTS = 4, 240, 1500


def workload() -> tuple[list[Filter], list[list[dict]]]:
    """Stock subscriptions and three phases of skewed stock events over SYMBOLS symbols."""
    hot = stock.SYMBOLS[:SYMBOLS]
    remap = {s: hot[i % SYMBOLS] for i, s in enumerate(stock.SYMBOLS)}

    def narrow(f: Filter) -> Filter:
        return Filter(tuple(Predicate(p.attribute, p.op, remap[p.value]) if p.attribute == "Symbol" else p
                            for p in f.predicates))

    subs = [narrow(f) for f in stock.subscriptions(SUBSCRIPTIONS, seed=7)]
    phases = [[{**e, "Symbol": remap[e["Symbol"]]} for e in stock.events(EVENTS, seed=11 + k, skewed=True)]
              for k in range(3)]
    return subs, phases


async def list_zones(address: str) -> xpb.ListZonesResponse:
    async with grpc.aio.insecure_channel(address) as ch:
        return await xgrpc.MatcherStub(ch).ListZones(xpb.ListZonesRequest(topic=TOPIC), timeout=5)


async def settled(addresses: list[str], source: str) -> bool:
    """Every matcher routes with one layout of `source` and has nothing pending."""
    try:
        layouts = [(await list_zones(a)).topics for a in addresses]
    except grpc.aio.AioRpcError:
        return False
    if not all(len(t) == 1 for t in layouts):
        return False
    keys = {(t[0].active, t[0].pending, t[0].source) for t in layouts}
    return len(keys) == 1 and {k[1:] for k in keys} == {("", source)}


async def stored_once(addresses: list[str], n: int) -> list[xpb.ZoneInfo]:
    """Each zone's members index the same subscriptions, and each subscription is in one zone."""
    replies = [await list_zones(a) for a in addresses]
    zones: dict[str, list[int]] = defaultdict(list)
    info = {}
    for r in replies:
        for z in r.topics[0].zones:
            info[z.id] = z
            if r.member in z.members:
                zones[z.id].append(z.subscriptions)
    assert all(len(set(counts)) == 1 for counts in zones.values()), zones
    assert sum(counts[0] for counts in zones.values()) == n, zones
    return list(info.values())


async def tier_answers(address: str, events: list[dict]) -> list[set[str]]:
    """The tier's own Match answer (subscription ids per event), through one entry."""
    out: list[set[str]] = []
    async with grpc.aio.insecure_channel(address) as ch:
        call = xgrpc.MatcherStub(ch).Match()
        for start in range(0, len(events), 500):
            batch = [pb.Event(topic=TOPIC, attributes=attributes_to_pb(e)) for e in events[start:start + 500]]
            await call.write(xpb.MatchRequest(batch_id=start + 1, events=batch))
            response = await call.read()
            out += [{s for a in r.agents for s in a.subscriptions} for r in response.results]
        await call.done_writing()
    return out


def balanced_plan(version: int, filters: list[Filter], owners: list[str]) -> mpb.RoutingPlan:
    """What the routing job would push: zones split by subscription load (Meghdoot 4.1),
    owners round-robin, the busiest zone replicated on the next matcher."""
    space = Space.of(stock.STOCK_SCHEMA)
    zm = ZoneMap(space, owner=owners[0])
    for i, f in enumerate(filters):
        zm.add(f"s{i}", space.subscription_point(f))
    for k in range(5):
        busiest = max(zm.zones, key=lambda z: zm.count(z.id))
        zm.split(busiest.id, f"z{k + 1}", owners[(k + 1) % len(owners)])
    busiest = max(zm.zones, key=lambda z: zm.count(z.id))
    zm.replicate(busiest.id, owners[(owners.index(busiest.owner) + 1) % len(owners)])
    return mpb.RoutingPlan(version=version, origin="test", zones=[
        mpb.Zone(id=z.id, topic=TOPIC, low=z.low, high=z.high, owner=z.owner, replicas=z.replicas)
        for z in zm.zones])


@pytest.mark.timeout(120)
async def test_three_matcher_processes_deliver_exactly_what_brute_force_says(tmp_path):
    filters, phases = workload()
    cluster = launch.Cluster(agents=AGENTS, matchers=3, memberships=1, placement=launch.Loopback(0), log_dir=tmp_path)
    clients: list[Client] = []
    readers: list[asyncio.Task] = []
    try:
        await cluster.start()
        agents = cluster.by_role("agent")
        matchers = {p.id: p.address for p in cluster.by_role("matcher")}
        membership = cluster.by_role("membership")[0].address
        clients = [Client(a.address) for a in agents]
        await clients[0].create_topic(TOPIC, stock.STOCK_SCHEMA)

        # Subscriptions spread over the agents; each reader records what arrives.
        got: dict[str, list[tuple[str, int]]] = defaultdict(list)
        ids = {}
        for i, f in enumerate(filters):
            k = i % AGENTS
            sub = clients[k].subscribe(TOPIC, f, name=f"s{i}", max_outstanding=1000)
            await sub.start()
            ids[f"{agents[k].id}/s{i}"] = i

            async def read(sub=sub, i=i):
                async for msg in sub:
                    got[f"s{i}"].append((msg.producer_id, msg.sequence))
                    await msg.ack()

            readers.append(asyncio.create_task(read()))
        await wait_for(lambda: settled(list(matchers.values()), "default"), 15, what="default zones settled")
        await stored_once(list(matchers.values()), len(filters))
        expected: dict[str, list[tuple[str, int]]] = defaultdict(list)

        async def publish(phase: int, change=None) -> None:
            """Publish a phase through every agent while `change` happens."""
            events = phases[phase]
            pubs = [clients[k].publisher(f"p{phase}-{k}") for k in range(AGENTS)]
            futures = []
            if change is not None:
                await change()
            for j, e in enumerate(events):
                futures.append(pubs[j % AGENTS].publish_nowait(TOPIC, e))
                for i, f in enumerate(filters):
                    if f.matches(e):
                        expected[f"s{i}"].append((f"p{phase}-{j % AGENTS}", j // AGENTS + 1))
            await asyncio.gather(*futures)
            for p in pubs:
                await p.close()

        async def check_tier(phase: int, alive: list[str]) -> None:
            for address in alive:  # every matcher as the entry answers exactly
                want = [{sid for sid, i in ids.items() if filters[i].matches(e)} for e in phases[phase][:500]]
                assert await tier_answers(address, phases[phase][:500]) == want

        await publish(0)
        await check_tier(0, list(matchers.values()))

        # A plan splits the space into six zones by subscription load and replicates one.
        async with grpc.aio.insecure_channel(membership) as ch:
            version = (await mgrpc.ControlStub(ch).GetPlan(mpb.GetPlanRequest())).version + 1

        async def push_plan() -> None:
            async with grpc.aio.insecure_channel(membership) as ch:
                await mgrpc.ControlStub(ch).PushPlan(balanced_plan(version, filters, sorted(matchers)))

        await publish(1, push_plan)
        await wait_for(lambda: settled(list(matchers.values()), f"plan {version}"), 15, what="the plan's zones settled")
        zones = await stored_once(list(matchers.values()), len(filters))
        assert len(zones) == 6 and sum(len(z.members) for z in zones) == 7
        await check_tier(1, list(matchers.values()))

        # Kill the owner of the most zones; the others take them over from the mirrors.
        victim = Counter(z.members[0] for z in zones).most_common(1)[0][0]
        proc = next(p for p in cluster.by_role("matcher") if p.id == victim)
        alive = [a for m, a in matchers.items() if m != victim]

        async def kill() -> None:
            proc.popen.kill()

        await publish(2, kill)
        await wait_for(lambda: settled(alive, f"plan {version}"), 15, what="recovery settled")
        zones = await stored_once(alive, len(filters))
        assert victim not in {m for z in zones for m in z.members}
        await check_tier(2, alive)

        # Every subscription got exactly the events brute force says, once each.
        def complete() -> bool:
            return all(len(got[s]) >= len(v) for s, v in expected.items())

        await wait_for(complete, 30, interval=0.1, what="every expected delivery")
        await asyncio.sleep(0.5)  # anything extra would show up now
        assert sum(map(len, expected.values())) > 3 * EVENTS
        for i in range(len(filters)):
            assert sorted(got[f"s{i}"]) == sorted(expected[f"s{i}"]), f"s{i}: {filters[i]}"
    finally:
        for t in readers:
            t.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        for c in clients:
            await c.close()
        cluster.stop()


INVALID = [
    ("Price > 3", "'Price'", "Price > 3"),  # unknown attribute
    ("High between 9 and 3", "empty range", "High between 9 and 3"),
    ("High > 600", "no value in [0, 500]", "High > 600"),  # outside the domain
    ('High = "x"', "expected float", 'High = "x"'),  # wrong type
    ("Volume >= 2.5", "expected int", "Volume >= 2.5"),
]


@pytest.mark.parametrize("text, reason, predicate", INVALID)
async def test_invalid_subscriptions_are_refused_naming_the_predicate_and_change_nothing(text, reason, predicate):
    c = Cluster(agents=1, matchers=3)
    try:
        await c.start()
        client = c.client(0)
        await client.create_topic(TOPIC, stock.STOCK_SCHEMA)
        good = xpb.Subscription(id="agent-0/good", agent="agent-0", topic=TOPIC,
                                filter=filter_to_pb(parse('Symbol = "ibm"')))
        bad = xpb.Subscription(id="agent-0/bad", agent="agent-0", topic=TOPIC, filter=filter_to_pb(parse(text)))
        for m in c.matcher_nodes:  # straight to any matcher: the whole request is refused
            async with grpc.aio.insecure_channel(m.address) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await xgrpc.MatcherStub(ch).Register(xpb.RegisterRequest(subscriptions=[good, bad]))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert reason in err.value.details() and predicate in err.value.details(), err.value.details()
        with pytest.raises(errors.InvalidArgument) as err:  # through an agent
            await client.subscribe(TOPIC, text, name="bad").start()
        assert reason in err.value.message
        assert all(len(m.tier.store.copies) == 0 and not m.tier.store.tombs for m in c.matcher_nodes)
        assert c.agent_nodes[0].subs == {}
    finally:
        await c.stop()


async def test_per_zone_metrics_count_what_each_zone_stores_and_matches():
    c = Cluster(agents=1, matchers=2)
    try:
        await c.start()
        client = c.client(0)
        await client.create_topic(TOPIC, stock.STOCK_SCHEMA)
        filters = stock.subscriptions(40, seed=3)
        subs = [client.subscribe(TOPIC, f, name=f"s{i}") for i, f in enumerate(filters)]
        for s in subs:
            await s.start()
        pub = client.publisher()
        for e in stock.events(50, seed=4):
            await pub.publish(TOPIC, e)
        await pub.close()
        stored = events = 0.0
        for m in c.matcher_nodes:
            body = generate_latest(m.registry)
            if shutil.which("promtool"):
                check = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
                assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
            for family in text_string_to_metric_families(body.decode()):
                for sample in family.samples:
                    if sample.name == "echelon_matcher_zone_subscriptions":
                        assert set(sample.labels) == {"topic", "zone"} and sample.labels["topic"] == TOPIC
                        stored += sample.value
                    if sample.name == "echelon_matcher_zone_events_total":
                        events += sample.value
        assert stored == len(filters)  # default zones: one holder each
        assert events >= 50  # every event visits at least the zone of its own point
        for s in subs:
            await s.close()
    finally:
        await c.stop()
