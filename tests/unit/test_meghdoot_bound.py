"""loadtest/meghdoot_bound.py: the boxes tile Symbol's plane, the count of zones met is
checked against a direct test per zone, and at Tab. 1's 76 zones fewer than half of
uniform events meet at most 5 zones (docs/papers.md, Meghdoot)."""

from __future__ import annotations

import numpy as np

from loadtest import meghdoot_bound


def test_zones_tile_the_plane_and_the_count_is_exact():
    boxes = meghdoot_bound.tile(40, symbols=500, subs=2000)
    assert len(boxes) == 40
    area = np.prod(boxes[:, 2:] - boxes[:, :2], axis=1)
    assert np.all(area > 0) and abs(area.sum() - 1) < 1e-9
    c = np.random.default_rng(3).random(200)
    got = meghdoot_bound.met(boxes, c)
    for x, n in zip(c, got):  # a zone [l0, l1) x [h0, h1) meets {l <= x <= h} iff l0 <= x < h1
        assert n == sum(1 for l0, h0, l1, h1 in boxes if l0 <= x and x < h1)


def test_at_76_zones_most_events_meet_more_than_5():
    m = meghdoot_bound.met(meghdoot_bound.tile(76), np.random.default_rng(1).random(5000))
    assert np.median(m) >= 6 and np.mean(m <= 5) < 0.5
