"""Membership with three real replicas on loopback: views, failure detection, replica
crashes and restarts, replicated topics and plans, plan rejections."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import grpc
import pytest
import pytest_asyncio

from prometheus_client import generate_latest

from echelon.runtime.member import membership_channel
from echelon.v1 import common_pb2 as pb
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc
from tests.harness import Cluster, wait_for

pytestmark = pytest.mark.timeout(30)


@pytest_asyncio.fixture
async def c3():
    """Three membership replicas, one matcher, three agents."""
    c = Cluster(agents=3, memberships=3, membership_kwargs={"sync_interval": 0.5})
    try:
        yield await c.start()
    finally:
        await c.stop()


def state(node, member_id: str) -> str | None:
    """A member's state in a replica's view (None: not in the view)."""
    rec = node.replica.log.snapshot().members.get(member_id)
    return rec.state.value if rec else None


def running(c: Cluster, nodes):
    return [n for n in nodes if n not in c.crashed]


async def call(address: str, make_call):
    async with membership_channel(address) as ch:
        return await make_call(ch)


def admin(address: str, method: str, request):
    return call(address, lambda ch: getattr(pgrpc.AdminStub(ch), method)(request, timeout=5, wait_for_ready=True))


def control(address: str, method: str, request):
    return call(address, lambda ch: getattr(mgrpc.ControlStub(ch), method)(request, timeout=5, wait_for_ready=True))


async def test_views_converge_on_every_replica_and_members_watch_the_first(c3):
    ids = {n.config.id for n in (*c3.agent_nodes, *c3.matcher_nodes)}
    for m in c3.membership_nodes:
        assert {i for i in ids if state(m, i) == "alive"} == ids
    first = c3.membership_nodes[0]
    for a in c3.agent_nodes:
        # Eventually: on a loaded machine a view stream can fall silent for STALE_VIEW, and
        # the member fails over for SILENT_RETRY before it comes back to the first.
        await wait_for(lambda a=a: a.membership.watching == c3.replicas[0], 30, what="watching the first replica")
        await wait_for(lambda a=a: a.membership.version == first.replica.log.version, what="views converge")
        assert {m.id for m in a.membership.alive(mpb.ROLE_AGENT)} == {n.config.id for n in c3.agent_nodes}
        assert a.membership.members[a.config.id].incarnation > 0


async def test_a_crashed_agent_is_declared_dead_by_the_crash_rule_on_every_replica(c3):
    """A crash ends the heartbeat stream: every replica declares the member DEAD by the
    crash rule (crash_grace, 1 s by default) long before silence alone could (dead_after,
    7 s). Checked on the detector's own measure, not on the wall clock of a loaded machine
    (the chaos run reports the detection time: loadtest/chaos)."""
    victim = c3.agent_nodes[2]
    await c3.crash(victim)
    await wait_for(lambda: all(state(m, "agent-2") == "dead" for m in c3.membership_nodes), 15,
                   what="every replica declares agent-2 dead")
    for a in c3.agent_nodes[:2]:
        await wait_for(lambda a=a: a.membership.members["agent-2"].state == mpb.MEMBER_STATE_DEAD, 1,
                       what="the agents' views say DEAD")
        assert "agent-2" not in {m.id for m in a.membership.alive(mpb.ROLE_AGENT)}
    detection = c3.membership_nodes[0].metrics.detection
    silence_rule = c3.membership_nodes[0].replica.detector.dead_after
    assert detection._sum.get() < silence_rule and sum(b.get() for b in detection._buckets) == 1
    for m in c3.membership_nodes:  # nobody else was suspected meanwhile
        assert {i for i, r in m.replica.log.snapshot().members.items() if r.state.value != "alive"} == {"agent-2"}


async def test_a_graceful_stop_is_left_at_once_and_a_restart_rejoins_higher(c3):
    node = c3.agent_nodes[2]
    old = node.membership.member.incarnation
    await node.stop()
    c3.crashed.append(node)
    for m in c3.membership_nodes:
        assert state(m, "agent-2") == "left"
    again = await c3.add_agent(2)
    assert again.membership.member.incarnation > old
    await wait_for(lambda: all(state(m, "agent-2") == "alive" for m in c3.membership_nodes), 2,
                   what="the new incarnation alive everywhere")


async def test_evidence_suspects_and_the_member_refutes(c3):
    target = c3.agent_nodes[1]
    before = target.membership.member.incarnation
    await c3.agent_nodes[0].membership.report("agent-1", "relay stream broke")
    m0 = c3.membership_nodes[0]
    assert m0.metrics.evidence.labels("suspected")._value.get() == 1
    await wait_for(lambda: all(state(m, "agent-1") == "alive" for m in c3.membership_nodes), 1,
                   what="the suspicion refuted")
    # At least this one: on a loaded machine a late heartbeat gets another member suspected
    # and refuted too (the counter has no member label).
    assert m0.metrics.refuted.labels("beat")._value.get() + m0.metrics.refuted.labels("incarnation")._value.get() >= 1
    await wait_for(lambda: target.membership.member.incarnation > before, 1, what="the prompt answered")
    assert all(r.state.value == "alive" for m in c3.membership_nodes for r in m.replica.log.snapshot().members.values())


async def test_a_stale_join_is_refused_naming_the_recorded_incarnation(c3):
    victim = c3.agent_nodes[2]
    inc = victim.membership.member.incarnation
    await c3.crash(victim)
    await wait_for(lambda: state(c3.membership_nodes[0], "agent-2") == "dead", 3)
    me = mpb.Member(id="agent-2", role=mpb.ROLE_AGENT, address=victim.address, incarnation=inc)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call(c3.replicas[0], lambda ch: mgrpc.MembershipStub(ch).Join(mpb.JoinRequest(member=me), timeout=5))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "rejoin" in e.value.details()
    assert dict(e.value.trailing_metadata())["echelon-incarnation"] == str(inc)


async def test_a_replica_crash_stops_nothing(c3):
    m0, m1, m2 = c3.membership_nodes
    await c3.crash(m0)
    for a in c3.agent_nodes:
        await wait_for(lambda a=a: a.membership.watching == c3.replicas[1] and a.membership.view_age() < 1, 3,
                       what="the agents watch the next replica")
    # Longer than the time to DEAD: the beats to the other replicas keep everyone alive there.
    await asyncio.sleep(2.0)
    ids = {n.config.id for n in (*c3.agent_nodes, *c3.matcher_nodes)}
    for m in (m1, m2):
        assert {i for i in ids if state(m, i) == "alive"} == ids
    # Topics created through one replica are served by the other, and reach the views.
    await admin(c3.replicas[1], "CreateTopic", ppb.CreateTopicRequest(name="after-crash"))
    await wait_for(lambda: "after-crash" in m2.replica.topics, 2, what="the topic pushed to replica 2")
    assert (await admin(c3.replicas[2], "GetTopic", ppb.GetTopicRequest(name="after-crash"))).name == "after-crash"
    await wait_for(lambda: all("after-crash" in a.membership.topics for a in c3.agent_nodes), 2)
    # The data plane goes on: the agents reach the topic admin through the live replicas.
    c0, c1 = c3.client(0), c3.client(1)
    await c0.create_topic("quotes", ["Symbol:string"])
    async with c1.subscribe("quotes", 'Symbol = "a"') as sub:
        await wait_for(lambda: "quotes" in c3.agent_nodes[1].membership.member.subscribes, 2)
        await c0.publisher().publish("quotes", {"Symbol": "a"})
        m = await sub.next(timeout=5)
        assert m.attributes == {"Symbol": "a"}
        await m.ack()


async def test_members_leave_a_replica_whose_view_stream_goes_silent(c3):
    # A paused (SIGSTOPped) replica keeps its connections open: only the silence tells.
    c3.membership_nodes[0].streams.keepalive = 1000.0
    # Only the silence can move them (keepalive would take 1000 s); the bound is loose
    # because a loaded machine stretches STALE_VIEW's three seconds.
    for a in c3.agent_nodes:
        await wait_for(lambda a=a: a.membership.watching == c3.replicas[1], 20, what="failover from the silent replica")
    await asyncio.sleep(1.5)  # and they stay away for a while instead of flapping back
    assert all(a.membership.watching == c3.replicas[1] and a.membership.view_age() < 1.5 for a in c3.agent_nodes)


async def test_a_restarted_replica_pulls_topics_and_plans_before_it_serves(c3):
    m0 = c3.membership_nodes[0]
    await admin(c3.replicas[0], "CreateTopic", ppb.CreateTopicRequest(name="kept"))
    await admin(c3.replicas[0], "CreateTopic", ppb.CreateTopicRequest(name="doomed"))
    await create_quotes(c3.replicas[0])
    await control(c3.replicas[0], "PushPlan", plan(1))
    await c3.crash(c3.membership_nodes[2])
    await admin(c3.replicas[1], "CreateTopic", ppb.CreateTopicRequest(name="while-down"))
    await admin(c3.replicas[0], "DeleteTopic", ppb.DeleteTopicRequest(name="doomed"))
    await c3.restart_membership(2)
    listed = await admin(c3.replicas[2], "ListTopics", ppb.ListTopicsRequest())
    assert [t.name for t in listed.topics] == ["kept", "quotes", "while-down"]
    assert (await control(c3.replicas[2], "GetPlan", mpb.GetPlanRequest())).version == 1
    await wait_for(c3.replicas_agree, 3, what="every member rejoined the restarted replica")
    assert m0.replica.digest() == c3.membership_nodes[2].replica.digest()


async def test_with_every_replica_down_members_keep_their_last_view(c3):
    agent = c3.agent_nodes[0]
    members = {i: m.state for i, m in agent.membership.members.items()}
    for m in c3.membership_nodes:
        await c3.crash(m)
    await asyncio.sleep(1.5)
    assert {i: m.state for i, m in agent.membership.members.items()} == members
    age = agent.registry.get_sample_value("echelon_membership_view_age_seconds")
    assert age > 1.0
    for i in range(3):
        await c3.restart_membership(i)
    await wait_for(c3.replicas_agree, 5, what="every member rejoined")
    await wait_for(lambda: agent.membership.view_age() < 1.5 and agent.membership.watching == c3.replicas[0], 5,
                   what="the view flows again from the first replica")


async def test_dead_and_left_members_leave_the_view_after_their_tombstone_period():
    c = Cluster(agents=3, memberships=2, membership_kwargs={"tombstone_ttl": 0.5})
    try:
        await c.start()
        left, dead = c.agent_nodes[1], c.agent_nodes[2]
        await left.stop()
        c.crashed.append(left)
        await c.crash(dead)
        watcher = c.agent_nodes[0].membership
        await wait_for(lambda: watcher.members.get("agent-2", mpb.Member()).state == mpb.MEMBER_STATE_DEAD, 3)
        await wait_for(lambda: "agent-1" not in watcher.members and "agent-2" not in watcher.members, 3,
                       what="tombstones dropped from the member's view")
        for m in c.membership_nodes:  # each replica drops its tombstones on its own clock
            await wait_for(lambda m=m: set(m.replica.log.snapshot().members) == {"agent-0", "matcher-0"}, 1)
            assert m.registry.get_sample_value("echelon_membership_members", {"state": "dead"}) == 0
        again = await c.add_agent(2)  # a new process comes back as an upsert
        await wait_for(lambda: watcher.members.get("agent-2", mpb.Member()).state == mpb.MEMBER_STATE_ALIVE, 3)
        assert again.membership.member.incarnation > 0
    finally:
        await c.stop()


async def test_a_foreign_known_version_gets_a_snapshot_then_keepalives(c3):
    async def first_two(ch):
        out = []
        async for u in mgrpc.MembershipStub(ch).Watch(mpb.WatchRequest(member_id="t", known_version=12345)):
            out.append(u)
            if len(out) == 2:
                return out

    snap, keepalive = await asyncio.wait_for(call(c3.replicas[0], first_two), 5)
    assert snap.WhichOneof("kind") == "snapshot" and len(snap.snapshot.members) == 4
    assert keepalive.WhichOneof("kind") == "keepalive" and keepalive.keepalive == snap.snapshot.version


QUOTES = ppb.CreateTopicRequest(name="quotes", schema=pb.Schema(attributes=[
    pb.AttributeSpec(name="Symbol", type=pb.ATTRIBUTE_TYPE_STRING)]))


def create_quotes(address: str):
    """The topic the test plans cut into zones: one string attribute, a 2-dim space."""
    return admin(address, "CreateTopic", QUOTES)


def plan(version: int, owner: str = "matcher-0", **kw) -> mpb.RoutingPlan:
    zone = mpb.Zone(id="z0", topic="quotes", **{"low": [0, 0], "high": [1, 1], **kw}, owner=owner)
    return mpb.RoutingPlan(version=version, zones=[zone], origin="test")


async def test_plans_are_validated_replicated_and_adopted(c3):
    r0, r1 = c3.replicas[0], c3.replicas[1]
    await create_quotes(r0)
    await wait_for(lambda: all("quotes" in m.replica.topics for m in c3.membership_nodes), 3)
    assert (await control(r1, "PushPlan", plan(3))).version == 3
    for a in c3.agent_nodes:
        await wait_for(lambda a=a: a.membership.plan_version == 3, 3, what="members adopt the plan")
        assert a.registry.get_sample_value("echelon_membership_plan_version") == 3
    await wait_for(lambda: all(m.replica.plans.version == 3 for m in c3.membership_nodes), 3)
    got = await control(r0, "GetPlan", mpb.GetPlanRequest())
    assert got.version == 3 and got.epoch == c3.membership_nodes[0].replica.plan_epoch > 0

    async def rejected(p: mpb.RoutingPlan, address: str = r0) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await control(address, "PushPlan", p)
        return e.value

    for stale in (plan(3), plan(2)):
        e = await rejected(stale)
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert e.details() == f"plan version {stale.version} is not above the current 3"
    e = await rejected(plan(4, low=[0.5]))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed plan" in e.details()
    assert "one bound per dimension" in e.details()
    e = await rejected(plan(4, high=[2, -1]))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "low <= high" in e.details()
    e = await rejected(plan(4, low=[0, 0.5]))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.details().startswith("zones of topic 'quotes' do not tile its content space")
    e = await rejected(plan(4, owner="matcher-9"))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details() == "zone owners not alive: 'matcher-9'"
    await c3.crash(c3.matcher_nodes[0])
    await wait_for(lambda: state(c3.membership_nodes[1], "matcher-0") == "dead", 3)
    e = await rejected(plan(4), r1)
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and e.details() == "zone owners not alive: 'matcher-0'"
    for m in c3.membership_nodes:
        assert m.replica.plans.version == 3  # every rejection left the plan as it was


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
async def test_replica_metrics_pass_promtool(c3):
    await c3.crash(c3.agent_nodes[2])
    m0 = c3.membership_nodes[0]
    await wait_for(lambda: state(m0, "agent-2") == "dead", 3)
    body = generate_latest(m0.registry)
    check = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
    text = body.decode()
    for line in ('echelon_membership_members{state="dead"} 1.0',
                 'echelon_membership_transitions_total{from_state="suspect",to_state="dead"} 1.0',
                 "echelon_membership_detection_seconds_count 1.0",
                 'echelon_membership_suspicions_refuted_total{kind="beat"} 0.0',
                 "echelon_membership_plan_version 0.0"):
        assert line in text, line
    assert m0.registry.get_sample_value("echelon_membership_view_version") == m0.replica.log.version
