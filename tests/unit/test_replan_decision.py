"""The routing job's decision rules (spark/plan.py): hints with hysteresis, cliques kept
while valid, no push without a gain beyond the margin."""

from __future__ import annotations

import numpy as np
import pytest

from echelon.matcher.layout import default_zones
from echelon.v1 import membership_pb2 as mpb
from echelon.replan import plan
from tests.unit.test_zoning import SPACE, sample

MATCHERS = ["m0", "m1", "m2", "m3"]


def inputs(current: mpb.RoutingPlan, zones, congested=None, rtt=None) -> plan.Inputs:
    pts, evs = sample(2000, 200, 4)
    return plan.Inputs(matchers=MATCHERS, members=["a0", "a1", *MATCHERS], agents=["a0", "a1"],
                       spaces={"quotes": SPACE}, current=current, zones={"quotes": zones},
                       sources={"quotes": "default"}, points={"quotes": pts}, events={"quotes": evs},
                       congested=congested or {}, rtt=rtt or {})


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
    d = plan.decide(inputs(mpb.RoutingPlan(), default, rtt=near), s, 1)
    assert d.cliques_changed and sorted(map(len, d.cliques)) == [3, 3]
    jitter = {k: v * float(np.random.default_rng(1).uniform(0.5, 2)) for k, v in near.items()}
    assert not plan.decide(inputs(d.plan, default, rtt=jitter), s, 2).cliques_changed
    a, b = next(c for c in d.cliques)[:2]
    far = {**near, (a, b): 0.5, (b, a): 0.5}  # a clique that now spans 500 ms is split
    again = plan.decide(inputs(d.plan, default, rtt=far), s, 2)
    assert again.cliques_changed and not any({a, b} <= set(c) for c in again.cliques)
