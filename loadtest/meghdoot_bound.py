"""How few zones an event can meet when subscriptions lie on the Symbol diagonal.

    python -m loadtest.meghdoot_bound [--zones 62,76,600,6000] [--events 20000]

With Symbol = P1 in 95% of the stock subscriptions (loadtest/stock.py), their points
in Symbol's plane lie on the diagonal l = h, and an event's affected region there is the
quadrant l <= c <= h above-left of its point (c, c) (Meghdoot 3.4). This builds box
zones over that plane alone, as Meghdoot's splits do (core/can.py `split`: the zone
with the most subscriptions halved by count, again and again), and counts the zones
the quadrant of a uniform event meets. No other attribute, no routing hop: every
other part of the simulator can only add zones. docs/papers.md (Meghdoot) uses it.
"""

from __future__ import annotations

import argparse
from typing import Sequence

import numpy as np

from echelon.core.can import Zone, split


def tile(zones: int, symbols: int = 5000, subs: int = 14029, seed: int = 7) -> np.ndarray:
    """(zones, 4) boxes [l_lo, h_lo, l_hi, h_hi] over the unit Symbol plane."""
    rng = np.random.default_rng(seed)
    universe = np.sort(rng.random(symbols))
    s = universe[rng.integers(0, symbols, subs)]
    held = [(Zone("z0", (0.0, 0.0), (1.0, 1.0)), np.stack([s, s], axis=1))]
    while len(held) < zones:
        i = max(range(len(held)), key=lambda j: len(held[j][1]))
        zone, pts = held.pop(i)
        low, high = split(zone, pts, new_id=f"z{len(held) + 2}")
        d = int(np.flatnonzero(np.asarray(high.low) != np.asarray(zone.low))[0])
        up = pts[:, d] >= high.low[d]
        held += [(low, pts[~up]), (high, pts[up])]
    return np.array([(*z.low, *z.high) for z, _ in held])


def met(boxes: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Zones met by the quadrant [0, c] x [c, 1] of each event, for boxes [lo, hi)."""
    return ((boxes[None, :, 0] <= c[:, None]) & (c[:, None] < boxes[None, :, 3])).sum(axis=1)


def main(argv: Sequence[str] | None = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m loadtest.meghdoot_bound", description=__doc__.splitlines()[0])
    ap.add_argument("--zones", default="62,76,600,6000")
    ap.add_argument("--events", type=int, default=20000)
    args = ap.parse_args(argv)
    c = np.random.default_rng(1).random(args.events)
    lines = ["Zones met in Symbol's plane alone (box zones split by subscription count, uniform events)",
             f"{'zones':>6} {'mean':>6} {'median':>6} {'<= 5 zones':>11} {'<= 5% of zones':>15}"]
    for k in (int(x) for x in args.zones.split(",") if x):
        m = met(tile(k), c)
        lines.append(f"{k:>6,} {m.mean():6.2f} {np.median(m):6.0f} {100 * np.mean(m <= 5):10.1f}% "
                     f"{100 * np.mean(m <= 0.05 * k):14.1f}%")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
