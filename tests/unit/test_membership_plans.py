"""`Control.PushPlan` acceptance rules, without a server."""

from __future__ import annotations

import pytest

from echelon.dataplane.gateway import region_map
from echelon.membership.plans import check
from echelon.v1 import common_pb2 as pb
from echelon.v1 import membership_pb2 as mpb

TOPICS = {"quotes": pb.Topic(name="quotes", schema=pb.Schema(attributes=[
    pb.AttributeSpec(name="Symbol", type=pb.ATTRIBUTE_TYPE_STRING)]))}
ALIVE = {"m0", "m1", "r0", "a0"}


def zone(zid: str = "z0", low=(0, 0), high=(1, 1), owner: str = "m0", **kw) -> mpb.Zone:
    return mpb.Zone(id=zid, topic=kw.pop("topic", "quotes"), low=low, high=high, owner=owner, **kw)


def plan(*zones: mpb.Zone, version: int = 2, **kw) -> mpb.RoutingPlan:
    return mpb.RoutingPlan(version=version, zones=zones or [zone()], **kw)


def test_a_good_plan_is_accepted():
    halves = [zone("z0", (0, 0), (0.5, 1), "m0", replicas=["m1"]), zone("z1", (0.5, 0), (1, 1), "m1")]
    assert check(plan(*halves, cliques=[mpb.Clique(id="c", members=["r0"])], predicted_gain=0.4,
                      bucket_hints=[mpb.BucketHint(member_id="a0", weight=2)]), 1, ALIVE, TOPICS) is None


def test_a_version_not_above_the_current_one_is_a_precondition_failure():
    for v in (0, 1, 5):
        reason = check(plan(version=v), 5, ALIVE, TOPICS)
        assert reason.stale and reason == f"plan version {v} is not above the current 5"


@pytest.mark.parametrize("bad, says", [
    (plan(zone(zid="")), "id is required"),
    (plan(zone(), zone()), "duplicate id"),
    (plan(zone(topic="nope")), "unknown topic 'nope'"),
    (plan(zone(low=(0,))), "one bound per dimension (1 and 2 given)"),
    (plan(zone(low=(), high=())), "one bound per dimension"),
    (plan(zone(high=(1, float("nan")))), "finite bounds"),
    (plan(zone(low=(0.5, 0), high=(0.4, 1))), "low <= high"),
    (plan(zone(owner="")), "owner is required"),
    (plan(zone(replicas=["m0"])), "differ from the owner"),
    (plan(cliques=[mpb.Clique(id="c")]), "id and members are required"),
    (plan(cliques=[mpb.Clique(id="c", members=["r0"]), mpb.Clique(id="d", members=["r0"])]), "already in clique"),
    (plan(bucket_hints=[mpb.BucketHint(member_id="a0", weight=-1)]), "finite weight >= 0"),
    (plan(predicted_gain=1.5), "predicted_gain must be in [0, 1]"),
    (plan(predicted_gain=float("nan")), "predicted_gain must be in [0, 1]"),
])
def test_malformed_plans_are_invalid_and_say_why(bad, says):
    reason = check(bad, 1, ALIVE, TOPICS)
    assert reason is not None and not reason.stale
    assert reason.startswith("malformed plan: ") and says in reason


def test_zones_must_tile_their_topic_space():
    gap = [zone("z0", (0, 0), (0.5, 1)), zone("z1", (0.6, 0), (1, 1))]
    reason = check(plan(*gap), 1, ALIVE, TOPICS)
    assert not reason.stale and reason.startswith("zones of topic 'quotes' do not tile its content space")
    overlap = [zone("z0", (0, 0), (0.6, 1)), zone("z1", (0.5, 0), (1, 1))]
    assert "overlap" in check(plan(*overlap), 1, ALIVE, TOPICS)


def test_every_member_a_plan_names_must_be_alive():
    assert check(plan(zone(owner="m9")), 1, ALIVE, TOPICS) == "zone owners not alive: 'm9'"
    assert check(plan(zone(replicas=["m8"])), 1, ALIVE, TOPICS) == "zone owners not alive: 'm8'"
    reason = check(plan(cliques=[mpb.Clique(id="c", members=["r0", "r9"])],
                        bucket_hints=[mpb.BucketHint(member_id="a9")]), 1, ALIVE, TOPICS)
    assert not reason.stale and reason == "clique or bucket hint members not alive: 'a9', 'r9'"


LIVE = {"m0": ("ROLE_MATCHER", "local"), "a0": ("ROLE_AGENT", "local"), "a1": ("ROLE_AGENT", "local"),
        "a2": ("ROLE_AGENT", "local"), "r0": ("ROLE_ROUTER", "local")}


def test_a_clique_that_leaves_an_agent_without_a_router_of_its_region_is_refused():
    alive = set(LIVE)
    # a1 and a2 in a clique with no router: their events could reach nobody there.
    bad = plan(cliques=[mpb.Clique(id="c0", members=["a0", "r0"]), mpb.Clique(id="c1", members=["a1", "a2"])])
    reason = check(bad, 1, alive, TOPICS, LIVE)
    assert reason is not None and not reason.stale
    assert reason.startswith("the plan leaves 2 agents without a router of their region (clique-c1): 'a1', 'a2'")
    # The router in a clique of its own leaves every agent's region ("local") without one.
    alone = plan(cliques=[mpb.Clique(id="c0", members=["r0"])])
    assert "(local): 'a0', 'a1', 'a2'" in check(alone, 1, alive, TOPICS, LIVE)
    # Every clique with a router, or the agents left in the region that keeps one: accepted.
    good = plan(cliques=[mpb.Clique(id="c0", members=["a0", "a1", "a2", "r0"])])
    assert check(good, 1, alive, TOPICS, LIVE) is None
    assert check(plan(), 1, alive, TOPICS, LIVE) is None


def test_without_routers_cliques_change_nothing_and_are_accepted():
    live = {i: v for i, v in LIVE.items() if i != "r0"}
    p = plan(cliques=[mpb.Clique(id="c0", members=["a0"]), mpb.Clique(id="c1", members=["a1", "a2"])])
    assert check(p, 1, set(live), TOPICS, live) is None
    members = [mpb.Member(id=i, role=mpb.Role.Value(r), region=g, state=mpb.MEMBER_STATE_ALIVE)
               for i, (r, g) in live.items()]
    assert set(region_map(members, p).values()) == {"local"}  # the data plane's regions
    router = mpb.Member(id="r0", role=mpb.ROLE_ROUTER, region="local", state=mpb.MEMBER_STATE_ALIVE)
    assert region_map([*members, router], p)["a1"] == "clique-c1"
