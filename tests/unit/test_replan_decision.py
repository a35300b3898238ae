"""The routing job's decision rules (spark/plan.py): hints with hysteresis, cliques kept
while valid, no push without a gain beyond the margin."""

from __future__ import annotations

import numpy as np
import pytest

from echelon.core import kyra
from echelon.matcher.layout import default_zones
from echelon.v1 import membership_pb2 as mpb
from echelon.replan import plan
from tests.unit.test_zoning import SPACE, sample

MATCHERS = ["m0", "m1", "m2", "m3"]


def inputs(current: mpb.RoutingPlan, zones, congested=None, rtt=None, members=None, agents=("a0", "a1"),
           routers=()) -> plan.Inputs:
    pts, evs = sample(2000, 200, 4)
    return plan.Inputs(matchers=MATCHERS, members=list(members or ["a0", "a1", *MATCHERS]), agents=list(agents),
                       spaces={"quotes": SPACE}, current=current, zones={"quotes": zones},
                       sources={"quotes": "default"}, points={"quotes": pts}, events={"quotes": evs},
                       congested=congested or {}, rtt=rtt or {}, routers=list(routers))


def test_a_plan_that_beats_the_default_is_pushed_and_then_nothing_is():
    default, _ = default_zones("quotes", SPACE, MATCHERS)
    first = plan.decide(inputs(mpb.RoutingPlan(), default), plan.Settings(), 1)
    assert first.plan is not None and first.topics[0].change and first.topics[0].before == 4.0
    assert first.plan.predicted_gain == pytest.approx(1 - first.topics[0].after / 4.0) and first.plan.predicted_gain > 0.1
    now = [z for z in first.topics[0].zones]
    again = plan.decide(inputs(first.plan, now), plan.Settings(), 2)
    assert again.plan is None and not again.topics[0].change


def test_hints_need_congestion_and_keep_it_with_hysteresis():
    default, _ = default_zones("quotes", SPACE, MATCHERS)
    s = plan.Settings(margin=10.0)  # no zone change: only hints and cliques decide
    d = plan.decide(inputs(mpb.RoutingPlan(), default, congested={"a0": 0.6, "a1": 0.3}), s, 1)
    assert d.hints == {"a0": 1.0} and d.hints_changed and d.plan is not None
    assert [(h.member_id, h.weight) for h in d.plan.bucket_hints] == [("a0", 1.0)] and d.plan.predicted_gain == 0
    kept = plan.decide(inputs(d.plan, default, congested={"a0": 0.3}), s, 2)  # above a quarter: kept
    assert kept.hints == {"a0": 1.0} and not kept.hints_changed and kept.plan is None
    dropped = plan.decide(inputs(d.plan, default, congested={"a0": 0.1}), s, 2)
    assert dropped.hints == {} and dropped.hints_changed


def test_cliques_stay_while_valid_and_are_recomputed_when_not():
    default, _ = default_zones("quotes", SPACE, MATCHERS)
    members = ["a0", "a1", *MATCHERS]
    near = {(a, b): 0.001 for a in members for b in members if a != b}
    s = plan.Settings(margin=10.0, max_distance=0.01, max_servers=3)
    r = members  # every member a router here: every clique is served (that rule is tested below)
    d = plan.decide(inputs(mpb.RoutingPlan(), default, rtt=near, routers=r), s, 1)
    assert d.cliques_changed and sorted(map(len, d.cliques)) == [3, 3]
    jitter = {k: v * float(np.random.default_rng(1).uniform(0.5, 2)) for k, v in near.items()}
    assert not plan.decide(inputs(d.plan, default, rtt=jitter, routers=r), s, 2).cliques_changed
    a, b = next(c for c in d.cliques)[:2]
    far = {**near, (a, b): 0.5, (b, a): 0.5}  # a clique that now spans 500 ms is split
    again = plan.decide(inputs(d.plan, default, rtt=far, routers=r), s, 2)
    assert again.cliques_changed and not any({a, b} <= set(c) for c in again.cliques)


def test_no_cliques_without_routers_and_none_that_leave_an_agent_without_one():
    default, _ = default_zones("quotes", SPACE, MATCHERS)
    agents = [f"a{i}" for i in range(9)]
    near = {(a, b): 0.001 for a in agents for b in agents if a != b}
    s = plan.Settings(margin=10.0, max_distance=0.01, max_servers=5)
    # Nine agents in one region, no router: Kyra makes two cliques, the job proposes none.
    d = plan.decide(inputs(mpb.RoutingPlan(), default, rtt=near, members=agents, agents=agents), s, 1)
    assert d.cliques == [] and not d.cliques_changed and d.plan is None
    # A current plan with such cliques is undone.
    bad = mpb.RoutingPlan(version=1, cliques=[mpb.Clique(id="c0", members=agents[:5]),
                                              mpb.Clique(id="c1", members=agents[5:])])
    d = plan.decide(inputs(bad, default, rtt=near, members=agents, agents=agents), s, 2)
    assert d.cliques == [] and d.cliques_changed and not d.plan.cliques
    # With routers: a clique holding none is dissolved, its agents stay in the region they
    # joined; when that leaves one without a router (both routers in cliques), none at all.
    members = [*agents, "r0", "r1"]
    rtt = {(a, b): 0.001 if (a < "a5") == (b < "a5") or "r" in a + b else 0.5 for a in members for b in members
           if a != b}
    d = plan.decide(inputs(mpb.RoutingPlan(), default, rtt=rtt, members=members, agents=agents,
                           routers=["r0", "r1"]), s, 1)
    for c in d.cliques:
        assert {"r0", "r1"} & set(c)
    lost = kyra.unserved({a: "" for a in agents}, {"r0": "", "r1": ""},
                         {m: f"clique-c{i}" for i, c in enumerate(d.cliques) for m in c})
    assert lost == {}
