"""Zones from observed load (core/zoning.py) on the stock workload of Meghdoot section 5."""

from __future__ import annotations

import numpy as np

from echelon.core import zoning
from echelon.core.can import check_tiling
from echelon.core.space import Space
from echelon.matcher.layout import default_zones
from loadtest import stock

SPACE = Space.of(stock.STOCK_SCHEMA)
MATCHERS = ["m0", "m1", "m2", "m3"]


def sample(n_subs: int, n_events: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    pts = np.array([SPACE.subscription_point(f) for f in stock.subscriptions(n_subs, seed=seed)])
    evs = np.array([SPACE.event_point(e) for e in stock.events(n_events, seed=seed + 1)])
    return pts, evs


def test_plan_tiles_balances_subscriptions_and_beats_the_default():
    pts, evs = sample(4000, 400, 1)
    zones = zoning.plan_zones(SPACE, pts, evs, MATCHERS)
    check_tiling(zones, SPACE)
    load = zoning.loads(zones, SPACE, pts, evs, MATCHERS)
    subs = [x.subscriptions for x in load.values()]
    assert max(subs) <= 1.1 * np.mean(subs)
    default, _ = default_zones("quotes", SPACE, MATCHERS)
    assert zoning.imbalance(zoning.loads(default, SPACE, pts, evs, MATCHERS)) == 4.0  # one matcher holds all
    assert zoning.imbalance(load) < 2.0
    # A fresh sample of the same workload finds no plan much better than this one.
    pts2, evs2 = sample(4000, 400, 9)
    again = zoning.plan_zones(SPACE, pts2, evs2, MATCHERS)
    before = zoning.imbalance(zoning.loads(zones, SPACE, pts2, evs2, MATCHERS))
    assert zoning.imbalance(zoning.loads(again, SPACE, pts2, evs2, MATCHERS)) > 0.9 * before


def test_loads_count_points_and_affected_zones_by_brute_force():
    pts, evs = sample(500, 60, 3)
    zones = zoning.plan_zones(SPACE, pts, evs, MATCHERS[:3], replicate_above=1.0, tolerance=0.5)
    load = zoning.loads(zones, SPACE, pts, evs, MATCHERS[:3])
    lo, hi, top = (np.array([z.low for z in zones]), np.array([z.high for z in zones]), np.array(SPACE.high))
    want = {m: [0.0, 0.0] for m in MATCHERS[:3]}
    for k, z in enumerate(zones):
        inside = np.all((lo[k] <= pts) & ((pts < hi[k]) | ((pts == hi[k]) & (hi[k] == top))), axis=1)
        # A zone is visited when some point of it could be affected: its box meets the region.
        visits = sum(bool(np.all((lo[k] <= SPACE.affected_region(e)[1]) & (
            (np.array(SPACE.affected_region(e)[0]) < hi[k]) | ((np.array(SPACE.affected_region(e)[0]) == hi[k])
                                                                & (hi[k] == top))))) for e in evs)
        for m in z.members:
            want[m][0] += inside.sum()
            want[m][1] += visits / len(z.members)
    for m in want:
        assert load[m].subscriptions == want[m][0]
        assert abs(load[m].events - want[m][1]) < 1e-9
