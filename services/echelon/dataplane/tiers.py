"""Which matcher tier serves which region (docs/event-path.md, "Regions that stand alone").

A matcher serves the region it joined with (`--region`), and the tier of region R is R's
matchers: its layouts, zones and answers span R only, so a publish in R needs no matcher
elsewhere. A region none of whose matchers is in the view (not even DEAD: only LEFT ones
stop counting) is served by the tier of the first region, in name order, that has matchers:
so a cluster whose matchers all sit in one region (every cluster before per-region tiers,
and the tests that run one) keeps one tier over every region, as before.

Regions here are the ones members joined with, never the routing plan's Kyra cliques: a
clique moves members between the data plane's regions, not their subscriptions.

An agent's tier answers with agents of the regions it serves; every other region that has
a router is reached through the agent's router as the pseudo-destination `@<region>`
(`far(...)`), which that region's router matches against its own tier.
"""

from __future__ import annotations

from collections.abc import Iterable

from echelon.v1 import membership_pb2 as mpb

PSEUDO = "@"  # a destination naming a region, matched by its router: never a member id


def pseudo(region: str) -> str:
    return PSEUDO + region


def is_pseudo(destination: str) -> bool:
    return destination.startswith(PSEUDO)


def region_named(destination: str) -> str:
    """The region a pseudo-destination names."""
    return destination[len(PSEUDO):]


class Tiers:
    """From one view: the region whose matchers serve each region."""

    def __init__(self, members: Iterable[mpb.Member]):
        members = [m for m in members if m.state != mpb.MEMBER_STATE_LEFT]
        self.matcher_regions = sorted({m.region for m in members if m.role == mpb.ROLE_MATCHER})
        # DEAD routers too: a region cut off is still sent to (what goes there is parked).
        self.router_regions = sorted({m.region for m in members if m.role == mpb.ROLE_ROUTER})

    def serving(self, region: str) -> str:
        """The region whose matchers serve `region`."""
        if region in self.matcher_regions or not self.matcher_regions:
            return region
        return self.matcher_regions[0]

    def matchers(self, alive: Iterable[mpb.Member], region: str) -> list[mpb.Member]:
        """Of the live matchers `alive`, the tier serving `region`."""
        tier = self.serving(region)
        return [m for m in alive if m.region == tier]

    def far(self, region: str) -> list[str]:
        """The pseudo-destinations of the regions with a router that the tier serving `region`
        does not serve: each is matched by a router there."""
        tier = self.serving(region)
        return [pseudo(r) for r in self.router_regions if self.serving(r) != tier]


def tiers(membership) -> Tiers:
    return Tiers(membership.members.values())
