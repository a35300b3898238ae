"""Meghdoot zones: a CAN tiling of the 2n-dim space (Gupta et al., sections 3-4).

A zone is a hyper-rectangle [low, high) per dimension, closed at the top of the domain
so the zones of a tiling cover every point exactly once. A subscription is stored at
the zone holding its point (3.3) and mirrored at the zone holding its reflection (4.3);
an event visits every zone that intersects its affected region (3.4). Propagating from
the event point's zone to upper-left neighbours reaches exactly that set; here it is
found by one vectorised scan over the zones (fine to ~10k zones), and a simulator that
counts propagation messages counts one per zone, the paper's duplicate suppression.

Choices where the paper is vague:
- split (4.1, subscription load): in every dimension, the cut nearest the median of the
  zone's subscription coordinates (between two distinct values, at their midpoint).
  Among the cuts within 5% of k (at least 1) of the best balance, the winner is the one
  on the attribute whose subscription ranges are narrowest on average (relative to the
  domain), then on the zone's widest side relative to the domain, then the lowest
  dimension. Both tie-breaks decide how many zones an event visits: cutting along an
  attribute with narrow ranges (Symbol = P1) separates the events of the two halves,
  cutting along a wide one (Low <= P2) mostly does not; and a point subscription (s, s)
  balances equally on its l and h axes, where cutting only l axes leaves every zone left
  of an event affected (its h range spans the domain), so zones stay roughly square as in
  CAN. With no cut (all points equal) the zone is halved along its widest side relative
  to the domain. The lower half keeps the zone's id, owner and replicas; the upper half is new.
- replicas (4.1, event load): a zone's members are its owner and replicas, each holding
  all of the zone's subscriptions; `Replicas.pick` takes them round-robin per zone.
- mirror (4.3): the copy goes to the zone holding the reflection (h1, l1, ..., hn, ln).
  If that is the primary zone itself, the reflection moves along increasing odd
  dimensions (the l_i axes) until it leaves the zone through its nearest upper face,
  and the copy goes to the zone just beyond. Axes where the zone reaches the top of the
  domain would wrap around, so they stay put; read literally, the paper would give up
  on any such axis, which is every axis of an attribute no subscription constrains
  (reflected from (L, H) to (H, L)). If every l_i axis would wrap, the reflection moves
  along decreasing even dimensions (the h_i axes) through the nearest lower face that
  is not the bottom of the domain. When neither exists (a case the paper leaves open)
  the copy goes to the other zone nearest the reflection. A single zone keeps both.

One module past 400 lines on purpose: split, reflection and the affected-region walk all
read the same tiling invariants, written down once here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from echelon.core.space import Point, Space, reflect


class TilingError(ValueError):
    """Zones that do not tile the space: an overlap, a gap, an empty or stray zone."""


@dataclass(frozen=True)
class Zone:
    id: str
    low: Point
    high: Point
    owner: str = ""
    replicas: tuple[str, ...] = ()

    @property
    def members(self) -> tuple[str, ...]:
        """The peers holding this zone: its owner first, then its replicas."""
        return (self.owner, *self.replicas)


def _inside(lo: np.ndarray, hi: np.ndarray, top: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Which boxes [lo, hi) (closed where hi is the domain top) hold the point p."""
    return np.all((lo <= p) & ((p < hi) | ((p == hi) & (hi == top))), axis=1)


def _intersects(lo: np.ndarray, hi: np.ndarray, top: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Which boxes [lo, hi) meet the closed box [a, b]."""
    return np.all((lo <= b) & ((a < hi) | ((a == hi) & (hi == top))), axis=1)


def adjacent(zone: Zone, lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """CAN neighbours: boxes that abut `zone` along exactly one dimension and overlap in the rest."""
    lo, hi = np.asarray(zone.low), np.asarray(zone.high)
    overlap = (lows < hi) & (lo < highs) | ((lows == highs) & (lo == hi) & (lo == lows))
    abut = (highs == lo) | (lows == hi)
    return (np.sum(~overlap, axis=1) == 1) & np.all(overlap | abut, axis=1)


def _cut(zone: Zone, points: np.ndarray, extent: np.ndarray) -> tuple[int, float]:
    """The (dimension, value) splitting `zone`; see the module doc."""
    lo, hi = np.asarray(zone.low), np.asarray(zone.high)
    k = len(points)
    scale = np.where(extent > 0, extent, 1)
    options = []  # (imbalance, range width of the attribute, -relative side, dimension, value)
    if k:
        width = np.mean(np.clip(points[:, 1::2] - points[:, 0::2], 0, None), axis=0) / scale[0::2]
    for d in range(points.shape[1] if k else 0):
        v = np.sort(points[:, d])
        cuts = np.flatnonzero(v[1:] > v[:-1]) + 1
        mids = (v[cuts - 1] + v[cuts]) / 2
        mids = np.where((v[cuts - 1] < mids) & (mids <= v[cuts]), mids, v[cuts])
        ok = mids < hi[d]
        cuts, mids = cuts[ok], mids[ok]
        if cuts.size:
            j = int(np.argmin(np.abs(cuts - k / 2)))
            options.append((abs(cuts[j] - k / 2), width[d // 2], -(hi[d] - lo[d]) / scale[d], d, float(mids[j])))
    if options:
        slack = min(o[0] for o in options) + max(1, k // 20)
        best = min(o[1:] for o in options if o[0] <= slack)
        return best[2], best[3]
    for d in np.argsort(-(hi - lo) / scale, kind="stable"):
        mid = lo[d] / 2 + hi[d] / 2
        if lo[d] < mid < hi[d]:
            return int(d), float(mid)
    raise ValueError(f"zone {zone.id} is too small to split")


def split(
    zone: Zone, points: np.ndarray | Sequence[Point], *, new_id: str, new_owner: str = "", space: Space | None = None
) -> tuple[Zone, Zone]:
    """Section 4.1: halve `zone` so the subscription points in it divide evenly.

    Returns (lower half: the zone's id, owner and replicas; upper half: `new_id`).
    """
    pts = np.asarray(points, dtype=np.float64).reshape(-1, len(zone.low))
    extent = np.asarray(space.high) - np.asarray(space.low) if space else np.ones(len(zone.low))
    d, value = _cut(zone, pts, extent)
    low_high = zone.high[:d] + (value,) + zone.high[d + 1 :]
    new_low = zone.low[:d] + (value,) + zone.low[d + 1 :]
    return replace(zone, high=low_high), Zone(new_id, new_low, zone.high, new_owner)


def check_tiling(zones: Sequence[Zone], space: Space) -> None:
    """Raise TilingError unless `zones` are disjoint, non-empty and cover `space` exactly.

    Coordinates are replaced by their rank among all zone boundaries of their dimension,
    so volumes are exact integers: pairwise disjoint zones inside the space cover it iff
    their volumes add up to the space's.
    """
    L, H = np.asarray(space.low), np.asarray(space.high)
    ids = [z.id for z in zones]
    if len(set(ids)) != len(ids):
        raise TilingError("duplicate zone ids")
    if not zones:
        raise TilingError("no zones")
    try:
        lo = np.array([z.low for z in zones], dtype=np.float64).reshape(len(zones), -1)
        hi = np.array([z.high for z in zones], dtype=np.float64).reshape(len(zones), -1)
    except ValueError:
        raise TilingError("zones of different dimensions") from None
    if lo.shape[1] != len(L) or hi.shape[1] != len(L):
        raise TilingError(f"zones must have {len(L)} dimensions")
    flat = L == H  # a one-value domain: every zone spans it as [L, L]
    for i, z in enumerate(zones):
        if np.any(lo[i] < L) or np.any(hi[i] > H):
            raise TilingError(f"zone {z.id} reaches outside the space")
        if np.any((lo[i] >= hi[i]) & ~flat) or np.any((lo[i] != hi[i]) & flat):
            raise TilingError(f"zone {z.id} is empty")
    for i in range(len(zones) - 1):
        meet = np.all((lo[i + 1 :] < hi[i]) & (lo[i] < hi[i + 1 :]) | flat, axis=1)
        if meet.any():
            raise TilingError(f"zones {zones[i].id} and {zones[i + 1 + int(np.argmax(meet))].id} overlap")
    total, covered = 1, 0
    ranks = []
    for d in np.flatnonzero(~flat):
        grid = np.unique(np.concatenate([lo[:, d], hi[:, d], [L[d], H[d]]]))
        ranks.append((np.searchsorted(grid, lo[:, d]), np.searchsorted(grid, hi[:, d])))
        total *= len(grid) - 1
    for i in range(len(zones)):
        covered += math.prod(int(b[i] - a[i]) for a, b in ranks)
    if covered != total:
        raise TilingError(f"the zones leave gaps: they cover {covered} of {total} grid cells")


class Replicas:
    """Section 4.1: round-robin choice among a zone's members, one counter per zone."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def pick(self, zone: Zone) -> str:
        i = self._next.get(zone.id, 0)
        self._next[zone.id] = i + 1
        return zone.members[i % len(zone.members)]


@dataclass(frozen=True)
class Recovery:
    """Section 4.3: where to fetch the copies a lost zone held."""

    primaries: dict[str, str]  # subscription -> zone holding its mirror copy
    mirrors: dict[str, str]  # subscription -> zone holding its primary copy
    lost: frozenset[str]  # both copies were in the lost zone


@dataclass(frozen=True)
class Transfer:
    """A copy a peer must receive after a zone change (split, move, replicate)."""

    subscription: str
    role: str  # "primary" or "mirror"
    source: str  # a peer that held it before
    target: str


class ZoneMap:
    """The zones of one space and where each subscription and its mirror live.

    Shared by the matcher tier and the simulator: assign a subscription (`add`), route an
    event (`zones_for_event`, `route`), change the zones (`split`, `replicate`,
    `set_owner`), recover a lost zone (`recover`) and diff two maps (`handoff`).
    """

    def __init__(self, space: Space, zones: Sequence[Zone] | None = None, *, owner: str = "", mirrors: bool = True):
        self.space = space
        self.mirrors = mirrors
        self._low, self._top = np.asarray(space.low), np.asarray(space.high)
        zones = list(zones) if zones else [Zone("z0", space.low, space.high, owner)]
        if len(zones) > 1:
            check_tiling(zones, space)
        self._zones: list[Zone] = []
        self._pos: dict[str, int] = {}
        self._lo = np.empty((max(16, len(zones)), space.dims))
        self._hi = np.empty_like(self._lo)
        self._cut = np.zeros(space.dims, dtype=bool)
        self.points: dict[str, Point] = {}
        self.primary: dict[str, str] = {}
        self.mirror: dict[str, str] = {}
        self._held: dict[str, set[str]] = {}
        self._mirrored: dict[str, set[str]] = {}
        self._fallback: set[str] = set()
        self.replicas = Replicas()
        for z in zones:
            self._put(z)

    # -- zones ---------------------------------------------------------------------

    @property
    def zones(self) -> list[Zone]:
        return list(self._zones)

    def zone(self, zone_id: str) -> Zone:
        return self._zones[self._pos[zone_id]]

    def _put(self, z: Zone) -> None:
        i = self._pos.get(z.id)
        if i is None:
            i = self._pos[z.id] = len(self._zones)
            self._zones.append(z)
            self._held[z.id], self._mirrored[z.id] = set(), set()
            if i == len(self._lo):
                self._lo = np.concatenate([self._lo, np.empty_like(self._lo)])
                self._hi = np.concatenate([self._hi, np.empty_like(self._hi)])
        self._zones[i] = z
        self._lo[i], self._hi[i] = z.low, z.high
        # Only dimensions some zone does not span can tell zones apart: scan just those
        # (zones only ever shrink, so the set only grows).
        self._cut |= (self._lo[i] > self._low) | (self._hi[i] < self._top)
        self._cols = np.flatnonzero(self._cut)

    def index(self, zone_id: str) -> int:
        """The zone's position in `zones` (positions never change; new zones append)."""
        return self._pos[zone_id]

    def zone_of(self, point: Sequence[float]) -> Zone:
        n, c = len(self._zones), self._cols
        p = np.asarray(point)[c]
        hits = np.flatnonzero(_inside(self._lo[:n, c], self._hi[:n, c], self._top[c], p))
        if not hits.size:
            raise ValueError(f"point {tuple(point)} lies outside the space")
        return self._zones[hits[0]]

    def affected(self, event_point: Sequence[float]) -> np.ndarray:
        """Positions of the zones intersecting the event's affected region (section 3.4)."""
        a, b = (np.asarray(x)[self._cols] for x in self.space.affected_region(event_point))
        n, c = len(self._zones), self._cols
        return np.flatnonzero(_intersects(self._lo[:n, c], self._hi[:n, c], self._top[c], a, b))

    def zones_for_event(self, event_point: Sequence[float]) -> list[Zone]:
        """Section 3.4: the zones intersecting the event's affected region."""
        return [self._zones[i] for i in self.affected(event_point)]

    def route(self, event_point: Sequence[float]) -> list[tuple[Zone, str]]:
        """Each zone the event must visit, with the member picked round-robin to match it."""
        return [(z, self.replicas.pick(z)) for z in self.zones_for_event(event_point)]

    def neighbours(self, zone_id: str) -> list[Zone]:
        n = len(self._zones)
        mask = adjacent(self.zone(zone_id), self._lo[:n], self._hi[:n])
        return [self._zones[i] for i in np.flatnonzero(mask)]

    def replicate(self, zone_id: str, peer: str) -> Zone:
        """Section 4.1: `peer` becomes one more member of the zone."""
        z = self.zone(zone_id)
        self._put(replace(z, replicas=(*z.replicas, peer)))
        return self.zone(zone_id)

    def set_owner(self, zone_id: str, peer: str) -> Zone:
        """Move the zone to `peer` (a departure or a rebalancing)."""
        self._put(replace(self.zone(zone_id), owner=peer))
        return self.zone(zone_id)

    def split(self, zone_id: str, new_id: str, new_owner: str = "") -> Zone:
        """Section 4.1: split a zone by subscription count; returns the new (upper) half."""
        z = self.zone(zone_id)
        held = sorted(self._held[zone_id])
        pts = np.array([self.points[s] for s in held]).reshape(-1, self.space.dims)
        kept, new = split(z, pts, new_id=new_id, new_owner=new_owner, space=self.space)
        self._put(kept)
        self._put(new)
        d = int(np.flatnonzero(np.asarray(new.low) != np.asarray(z.low))[0])
        for s in (s for s, moved in zip(held, pts[:, d] >= new.low[d]) if moved):
            self._held[zone_id].discard(s)
            self._held[new_id].add(s)
            self.primary[s] = new_id
        if self.mirrors:
            for s in self._mirrored[zone_id] | set(held) | self._fallback:
                self._place_mirror(s)
        return new

    # -- subscriptions ---------------------------------------------------------------

    def add(self, sid: str, point: Point) -> tuple[str, str | None]:
        """Section 3.3: store `sid` at its point's zone (and its mirror); (primary, mirror) ids."""
        self.remove(sid)
        self.points[sid] = tuple(point)
        z = self.zone_of(point).id
        self.primary[sid] = z
        self._held[z].add(sid)
        if self.mirrors:
            self._place_mirror(sid)
        return z, self.mirror.get(sid)

    def remove(self, sid: str) -> None:
        if sid in self.points:
            del self.points[sid]
            self._held[self.primary.pop(sid)].discard(sid)
            m = self.mirror.pop(sid, None)
            if m is not None:
                self._mirrored[m].discard(sid)
            self._fallback.discard(sid)

    def count(self, zone_id: str) -> int:
        """The zone's subscription load: how many primary copies it stores."""
        return len(self._held[zone_id])

    def subscriptions(self, zone_id: str) -> set[str]:
        """The subscriptions whose primary copy this zone stores."""
        return set(self._held[zone_id])

    def mirrored(self, zone_id: str) -> set[str]:
        """The mirror copies this zone stores."""
        return set(self._mirrored[zone_id])

    def _place_mirror(self, sid: str) -> None:
        old = self.mirror.get(sid)
        if old is not None:
            self._mirrored[old].discard(sid)
        self._fallback.discard(sid)
        m = self._mirror_zone(self.points[sid], self.primary[sid], sid)
        self.mirror[sid] = m
        self._mirrored[m].add(sid)

    def _mirror_zone(self, point: Point, primary: str, sid: str) -> str:
        r = np.asarray(reflect(point))
        z = self.zone_of(r)
        if z.id != primary or len(self._zones) == 1:
            return z.id
        lo, hi = np.asarray(z.low), np.asarray(z.high)
        odd = np.flatnonzero((np.arange(len(r)) % 2 == 0) & (hi < self._top))
        if odd.size:  # leave through the nearest upper face of an l_i axis with room
            d = odd[np.argmin(hi[odd] - r[odd])]
            q = r.copy()
            q[odd] = np.minimum(r[odd] + (hi[d] - r[d]), hi[odd])
            q[d] = hi[d]
            return self.zone_of(q).id
        even = np.flatnonzero((np.arange(len(r)) % 2 == 1) & (lo > self._low))
        if even.size:  # else through the nearest lower face of an h_i axis
            d = even[np.argmin(r[even] - lo[even])]
            q = r.copy()
            q[even] = np.maximum(r[even] - (r[d] - lo[d]), lo[even])
            q[d] = math.nextafter(lo[d], -math.inf)
            return self.zone_of(q).id
        self._fallback.add(sid)
        n = len(self._zones)
        gap = np.maximum(self._lo[:n] - r, 0) + np.maximum(r - self._hi[:n], 0)
        dist = np.sum((gap / np.where(self._top > self._low, self._top - self._low, 1)) ** 2, axis=1)
        dist[self._pos[z.id]] = np.inf
        return self._zones[int(np.argmin(dist))].id

    def recover(self, zone_id: str) -> Recovery:
        """Section 4.3: rebuild a zone lost with all its members from the copies elsewhere."""
        prim = {s: self.mirror[s] for s in self._held[zone_id] if self.mirror.get(s, zone_id) != zone_id}
        mirr = {s: self.primary[s] for s in self._mirrored[zone_id] if self.primary[s] != zone_id}
        lost = frozenset(s for s in self._held[zone_id] if s not in prim)
        return Recovery(prim, mirr, lost)

    def copy(self) -> "ZoneMap":
        other = ZoneMap(self.space, self._zones[:1], mirrors=self.mirrors)
        for z in self._zones[1:]:
            other._put(z)
        other.points, other.primary, other.mirror = dict(self.points), dict(self.primary), dict(self.mirror)
        other._held = {k: set(v) for k, v in self._held.items()}
        other._mirrored = {k: set(v) for k, v in self._mirrored.items()}
        other._fallback = set(self._fallback)
        return other


def handoff(old: ZoneMap, new: ZoneMap) -> tuple[list[Transfer], list[tuple[str, str, str]]]:
    """Which copies move where when `old` becomes `new` (after split, move or replicate).

    Every member of a subscription's new zone that did not hold the copy before receives
    it from the old zone's owner; a peer that held it and no longer does drops it.
    Returns (transfers, drops as (subscription, role, peer)). Subscriptions added or
    removed between the two maps are installs and deletes, not handoffs.
    """
    transfers: list[Transfer] = []
    drops: list[tuple[str, str, str]] = []
    for role, before, after in (("primary", old.primary, new.primary), ("mirror", old.mirror, new.mirror)):
        for sid, zid in after.items():
            if sid not in before:
                continue
            was = old.zone(before[sid])
            now = new.zone(zid).members
            transfers += [Transfer(sid, role, was.owner, p) for p in now if p not in was.members]
            drops += [(sid, role, p) for p in was.members if p not in now]
    return transfers, drops
