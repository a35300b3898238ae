"""Zones for a routing plan from observed load (Meghdoot section 3.3 and 4.1; Kyra III.B).

Input: a sample of subscription points and of event points of one topic (the routing job
collects them from the matchers), the alive matchers, optionally the current zones.

- Subscription load: the space is split (`core.can.split`, the median cut of 4.1) at the
  zone holding the most sampled points, until owners assigned by longest-processing-time
  (the zone with most points to the matcher holding least) leave the largest matcher
  within `tolerance` of the mean, or there are `max_per_matcher` zones per matcher.
- Event load: a zone's event load is the number of sampled events whose affected region
  it intersects (3.4), shared by its members round-robin. While the busiest matcher's
  event load is above `replicate_above` times the mean, its hottest zone gets a replica
  on the matcher with the least event load, provided that matcher's subscription load
  stays within `tolerance` of the mean (a replica indexes the whole zone).
- `loads` scores any zone set on the same sample, so the job compares the current plan
  with the candidate on equal terms (`imbalance`: the larger of the two max/mean ratios).

Zones come out as continuous boxes that tile the space (they are made only by halving),
which `check_tiling` verifies before they are returned.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from echelon.core.can import Zone, _inside, _intersects, check_tiling, split
from echelon.core.space import Space


@dataclass(frozen=True)
class Load:
    """One matcher's load under a zone set, scored on a sample."""

    subscriptions: float  # sampled points in the zones it holds (owner or replica)
    events: float  # sampled events visiting its zones, divided among each zone's members


def zone_positions(zones: Sequence[Zone], space: Space, points: np.ndarray) -> np.ndarray:
    """The zone (index into `zones`) holding each point (section 3.3); one pass per zone."""
    pts = np.asarray(points, dtype=np.float64).reshape(-1, space.dims)
    top = np.asarray(space.high)
    out = np.full(len(pts), -1, dtype=np.int64)
    for i, z in enumerate(zones):
        out[(out < 0) & _inside(np.asarray(z.low), np.asarray(z.high), top, pts)] = i
    if (out < 0).any():
        raise ValueError("a point lies outside the zones")
    return out


def zone_event_hits(zones: Sequence[Zone], space: Space, events: np.ndarray) -> np.ndarray:
    """Per zone: how many sampled events' affected regions it intersects (section 3.4)."""
    if not len(events):
        return np.zeros(len(zones), dtype=np.int64)
    corners = [space.affected_region(e) for e in events]
    a = np.array([c[0] for c in corners], dtype=np.float64)
    b = np.array([c[1] for c in corners], dtype=np.float64)
    top = np.asarray(space.high)
    return np.array([int(_intersects(np.asarray(z.low), np.asarray(z.high), top, a, b).sum()) for z in zones],
                    dtype=np.int64)


def loads(zones: Sequence[Zone], space: Space, points: np.ndarray, events: np.ndarray,
          matchers: Sequence[str], *, counts: np.ndarray | None = None, hits: np.ndarray | None = None
          ) -> dict[str, Load]:
    """Every matcher's subscription and event load under `zones`, on the sample
    (`counts`/`hits`: per zone, when already known for this geometry)."""
    subs = np.bincount(zone_positions(zones, space, points), minlength=len(zones)) if counts is None else counts
    hits = zone_event_hits(zones, space, events) if hits is None else hits
    out = {m: [0.0, 0.0] for m in matchers}
    for z, s, h in zip(zones, subs, hits):
        for m in z.members:
            if m in out:
                out[m][0] += float(s)
                out[m][1] += float(h) / len(z.members)
    return {m: Load(*v) for m, v in out.items()}


def _ratio(values: Sequence[float]) -> float:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else 1.0


def imbalance(load: dict[str, Load]) -> float:
    """max/mean of subscription load or of event load, whichever is worse (1.0 = even)."""
    return max(_ratio([x.subscriptions for x in load.values()]), _ratio([x.events for x in load.values()]))


def _assign(weights: Sequence[float], matchers: Sequence[str]) -> list[str]:
    """Longest processing time first: each zone, heaviest first, to the least loaded matcher."""
    held = {m: 0.0 for m in matchers}
    owner = [""] * len(weights)
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        m = min(matchers, key=lambda m: (held[m], m))
        owner[i] = m
        held[m] += weights[i]
    return owner


def _assign_capped(weights: Sequence[float], counts: Sequence[int], matchers: Sequence[str],
                   cap: float) -> list[str]:
    """LPT by event weight, each zone to the least loaded matcher whose subscriptions stay
    under `cap` (the least subscribed one when none does)."""
    load = {m: 0.0 for m in matchers}
    subs = {m: 0 for m in matchers}
    owner = [""] * len(weights)
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], -counts[i], i)):
        fits = [m for m in matchers if subs[m] + counts[i] <= cap] or [min(matchers, key=lambda m: (subs[m], m))]
        m = min(fits, key=lambda m: (load[m], subs[m], m))
        owner[i] = m
        load[m] += weights[i]
        subs[m] += counts[i]
    return owner


def _per_matcher(values: Sequence[float], owners: Sequence[str], matchers: Sequence[str]) -> list[float]:
    return [sum(v for v, o in zip(values, owners) if o == m) for m in matchers]


def balanced_zones(space: Space, points: np.ndarray, events: np.ndarray, matchers: Sequence[str], *,
                   tolerance: float = 0.1, min_per_matcher: int = 2, max_per_matcher: int = 8,
                   prefix: str = "z") -> list[Zone]:
    """Split by subscription load and assign owners (see the module doc). Ids: prefix + k.

    Splitting stops once there are `min_per_matcher` zones per matcher and owners by
    subscription load are within `tolerance` of the mean. Owners are then assigned by
    event load under a subscription cap (`_assign_capped`), so a zone every event visits
    goes with light ones; if that breaks `tolerance` on subscriptions, owners by
    subscription load alone are kept.
    """
    matchers = sorted(matchers)
    if not matchers:
        raise ValueError("no matchers to own zones")
    pts = np.asarray(points, dtype=np.float64).reshape(-1, space.dims)
    zones = [Zone(f"{prefix}0", space.low, space.high)]
    held = [np.arange(len(pts))]
    while True:
        counts = [len(h) for h in held]
        owners = _assign(counts, matchers)
        balanced = _ratio(_per_matcher(counts, owners, matchers)) <= 1 + tolerance
        if (len(zones) >= min_per_matcher * len(matchers) and balanced) or len(zones) >= max_per_matcher * len(matchers):
            break
        i = int(np.argmax(counts))
        if counts[i] < 2:
            break
        try:
            lower, upper = split(zones[i], pts[held[i]], new_id=f"{prefix}{len(zones)}", space=space)
        except ValueError:  # too small to split: nothing more to gain
            break
        d = int(np.flatnonzero(np.asarray(upper.low) != np.asarray(zones[i].low))[0])
        idx = held[i]
        up = pts[idx, d] >= upper.low[d]
        zones[i], held[i] = lower, idx[~up]
        zones.append(upper)
        held.append(idx[up])
    if len(events):
        hits = zone_event_hits(zones, space, np.asarray(events, dtype=np.float64).reshape(-1, space.dims))
        mixed = _assign_capped(list(hits), counts, matchers, (1 + tolerance) * sum(counts) / len(matchers))
        if _ratio(_per_matcher(counts, mixed, matchers)) <= 1 + tolerance:
            owners = mixed
    zones = [replace(z, owner=o) for z, o in zip(zones, owners)]
    check_tiling(zones, space)
    return zones


def replicate_hot(zones: Sequence[Zone], space: Space, points: np.ndarray, events: np.ndarray,
                  matchers: Sequence[str], *, replicate_above: float = 1.5, tolerance: float = 0.1) -> list[Zone]:
    """Section 4.1, event load: replicas for the zones of the busiest matcher (module doc)."""
    zones, matchers = list(zones), sorted(matchers)
    if len(matchers) < 2 or not len(events):
        return zones
    subs = np.bincount(zone_positions(zones, space, points), minlength=len(zones)).astype(float)
    hits = zone_event_hits(zones, space, events).astype(float)
    for _ in range(len(zones) * len(matchers)):
        load = loads(zones, space, points, events, matchers, counts=subs, hits=hits)
        ev = {m: x.events for m, x in load.items()}
        if _ratio(list(ev.values())) <= replicate_above:
            break
        busiest = max(matchers, key=lambda m: (ev[m], m))
        mine = [i for i, z in enumerate(zones) if busiest in z.members and len(z.members) < len(matchers)]
        if not mine:
            break
        i = max(mine, key=lambda i: (hits[i] / len(zones[i].members), -i))
        cap = (1 + tolerance) * (sum(x.subscriptions for x in load.values()) + subs[i]) / len(matchers)
        room = [m for m in matchers if m not in zones[i].members and load[m].subscriptions + subs[i] <= cap]
        if not room:
            break
        peer = min(room, key=lambda m: (ev[m], m))
        before = max(ev.values())
        trial = zones[:i] + [replace(zones[i], replicas=(*zones[i].replicas, peer))] + zones[i + 1:]
        if max(x.events for x in loads(trial, space, points, events, matchers, counts=subs, hits=hits).values()) >= before:
            break
        zones = trial
    return zones


def plan_zones(space: Space, points: np.ndarray, events: np.ndarray, matchers: Sequence[str], *,
               tolerance: float = 0.1, replicate_above: float = 1.5, max_per_matcher: int = 8,
               prefix: str = "z") -> list[Zone]:
    """Balanced splits by subscription load, then replicas for event load."""
    zones = balanced_zones(space, points, events, matchers, tolerance=tolerance, max_per_matcher=max_per_matcher,
                           prefix=prefix)
    return replicate_hot(zones, space, points, events, matchers, replicate_above=replicate_above,
                         tolerance=tolerance)
