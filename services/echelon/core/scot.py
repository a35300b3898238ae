"""SCOT: OctopiA's structured cyclic overlay, and SNR (OctopiA section
III-B, IV, VII-A; docs/papers.md, "OctopiA").

The mapping to Echelon (docs/papers.md, "OctopiA"). OctopiA's cluster index c is an Echelon
*region* (a data centre, a Kubernetes topology zone, or a Kyra clique of the routing
plan). Inside region c run the routers B(a, c), a = their position in the acyclic factor
T, joined by aLinks along T (cheap, local). Router B(a, c) has an iLink to B(a, c') in
every other region c' (the expensive inter-region links, where congestion happens), so
there are |T| parallel inter-region meshes: many paths, as in the paper. Agents attach
to a router of their own region; inside a region events travel on the agents' LBDD trees,
so a router's "local subscribers" are its region's destination agents.

T is the binary-heap tree over positions 0..n-1 (parent of a is (a - 1) // 2). A region
may hold fewer routers than another for a while (one crashed): positions are indices in
the region's live routers sorted by id, and the iLink of B(a, c) into region c' lands on
B(a mod n_c', c'). With equal sizes that is exactly the paper's Cartesian product.

The cluster index vector `civ` is an int, bit c set for each region still to serve (the
paper indexes bits from the right, bit 0 = cluster 0). SNR sends one copy per set bit
over the iLink to that region; the receiving router serves its region and, having only
its own bit, stops.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

Router = tuple[int, int]  # B(a, c): (position in T, region index)


def civ(regions: Iterable[int]) -> int:
    """The cluster index vector with the bits of `regions` set."""
    v = 0
    for c in regions:
        if c < 0:
            raise ValueError(f"region index {c} < 0")
        v |= 1 << c
    return v


def bits(v: int) -> list[int]:
    """The region indices set in a CIV, lowest first."""
    out, c = [], 0
    while v:
        if v & 1:
            out.append(c)
        v >>= 1
        c += 1
    return out


@dataclass(frozen=True)
class Send:
    """One copy of a notification onto the link to router `to`, carrying `civ`: the
    regions the receiver must serve (its own, and for a CIV-N the others too)."""

    to: Router
    civ: int


@dataclass(frozen=True)
class Scot:
    """The overlay: `sizes[c]` routers in region c, each region a copy of T."""

    sizes: tuple[int, ...]

    def __post_init__(self):
        if not self.sizes or any(n < 1 for n in self.sizes):
            raise ValueError(f"every region needs at least one router: {self.sizes}")

    @classmethod
    def uniform(cls, t: int, regions: int) -> Scot:
        """The paper's SCOT: T of `t` brokers times the complete graph on `regions` clusters."""
        return cls((t,) * regions)

    @property
    def regions(self) -> int:
        return len(self.sizes)

    def routers(self) -> list[Router]:
        return [(a, c) for c, n in enumerate(self.sizes) for a in range(n)]

    def _check(self, a: int, c: int) -> None:
        if not (0 <= c < len(self.sizes) and 0 <= a < self.sizes[c]):
            raise ValueError(f"no router B({a}, {c}) in {self.sizes}")

    def alink(self, a: int, c: int) -> list[Router]:
        """Primary neighbours of B(a, c): its neighbours in region c's copy of T."""
        self._check(a, c)
        out = [((a - 1) // 2, c)] if a else []
        out += [(b, c) for b in (2 * a + 1, 2 * a + 2) if b < self.sizes[c]]
        return out

    def ilink(self, a: int, c: int, other: int) -> Router:
        """The router at the far end of B(a, c)'s iLink into region `other`."""
        self._check(a, c)
        if other == c or not 0 <= other < len(self.sizes):
            raise ValueError(f"no iLink from region {c} to region {other}")
        return (a % self.sizes[other], other)

    def ilinks(self, a: int, c: int) -> list[Router]:
        """Secondary neighbours of B(a, c): one per other region."""
        return [self.ilink(a, c, o) for o in range(len(self.sizes)) if o != c]


def snr(scot: Scot, here: Router, v: int) -> list[Send]:
    """Static Notification Routing at B(a, c) for CIV `v`: one copy per set bit of another
    region over the iLink into it (the own bit is served locally, by the caller)."""
    a, c = here
    return [Send(scot.ilink(a, c, o), 1 << o) for o in bits(v) if o != c]
