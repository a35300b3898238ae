"""The agent's hand-off to its region's router (docs/event-path.md, step 4;
OctopiA's mapping in core/scot.py).

A member's region is its Kyra clique when the adopted routing plan puts it in one
(`region_map`; the plan switches every member at the same epoch), else its `--region`.
With regions, an agent's LBDD trees span the agents of its own region only (`region_view`,
which the router's trees use too); destinations in other regions go to one router of its
region, which carries them over the SCOT overlay. The hand-off is a second `DataPlane` whose routes
(`Gateway`) send every destination to that router: so it gets the root's frames,
slices, byte window, holds and FIFO fences, and a publish counts as delivered when the
router acknowledges, which it does once every region it serves holds the message.

The agent attaches to the router of its region at index md5(agent id) mod n among the
live routers sorted by id; when that router leaves the view the data plane's path update
re-routes its unacknowledged frames to the next one. No router in the region: the
destinations are lost and counted (`echelon_agent_destinations_lost_total`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from echelon.dataplane.tiers import is_pseudo
from echelon.v1 import membership_pb2 as mpb


_LIVE = (mpb.MEMBER_STATE_ALIVE, mpb.MEMBER_STATE_SUSPECT)


def clique_regions(plan: mpb.RoutingPlan | None) -> dict[str, str]:
    """Member id -> "clique-<id>" for the members of the plan's cliques."""
    return {m: f"clique-{c.id}" for c in (plan.cliques if plan else ()) for m in c.members}


def region_map(members: Iterable[mpb.Member], plan: mpb.RoutingPlan | None) -> dict[str, str]:
    """Member id -> region: "clique-<id>" for a member of one of the plan's cliques, else
    the region it joined with. With no live router nothing joins regions, so cliques
    change nothing (a clique would be a region nobody serves)."""
    members = list(members)
    routed = any(m.role == mpb.ROLE_ROUTER and m.state in _LIVE for m in members)
    cliques = clique_regions(plan) if routed else {}
    return {m.id: cliques.get(m.id, m.region) for m in members}


def region_view(membership, me: str, region: str) -> tuple[dict[str, str], str, list[mpb.Member], set[str]]:
    """From a membership view: (member id -> region, this member's region, the live agents
    of that region, the DEAD agents of that region) - an agent's trees and a router's
    LBDD trees span only these."""
    regions = region_map(membership.members.values(), membership.plan)
    here = regions.get(me, region)
    agents = [m for m in membership.alive(mpb.ROLE_AGENT) if regions[m.id] == here]
    dead = {m.id for m in membership.members.values() if m.role == mpb.ROLE_AGENT
            and m.state == mpb.MEMBER_STATE_DEAD and regions[m.id] == here}
    return regions, here, agents, dead


class _Table:
    def __init__(self, members: dict[str, mpb.Member]):
        self.members = members


class Gateway:
    """Routes for the hand-off data plane (the interface `DataPlane` uses of `Trees`)."""

    def __init__(self, self_id: str, region: str):
        self.self_id = self_id
        self.region = region
        self.regions: dict[str, str] = {}  # member id -> region, from the view and the plan
        self.table = _Table({})
        self.dead: frozenset[str] = frozenset()  # `@region`s while no router is live (agents: their router parks)
        self.router: str | None = None
        self.far: list[str] = []  # regions matched by their own tier: `@region` (tiers.py)
        self._rank = int.from_bytes(hashlib.md5(self_id.encode()).digest()[:8], "big")

    def waits_for(self, member_id: str) -> bool:
        """Only a DEAD agent is waited for: a region with no router is failed at once, but
        what goes to other regions as a whole (`@region`) is parked while this region has
        no live router (its routers cut off or down), and sent when one is back."""
        return member_id in self.dead or is_pseudo(member_id)

    def update(self, routers: Iterable[mpb.Member], regions: dict[str, str], region: str,
               far: Sequence[str] = ()) -> None:
        self.regions, self.region, self.far = regions, region, list(far)
        mine = sorted((m for m in routers if regions.get(m.id) == region), key=lambda m: m.id)
        self.table = _Table({m.id: m for m in mine})
        self.router = mine[self._rank % len(mine)].id if mine else None
        self.dead = frozenset(self.far) if self.router is None else frozenset()

    def elsewhere(self, destinations: Iterable[str]) -> list[str]:
        """The destinations in other regions (for the router), and every region whose own
        matcher tier finds them (`@region`: its router matches the event there)."""
        return [d for d in destinations if self.regions.get(d, self.region) != self.region] + self.far

    def alive(self, member_id: str) -> bool:
        return member_id in self.table.members or self.router is not None and is_pseudo(member_id)

    def schedule(self, topic: str, destinations: Sequence[str]) -> tuple[int, ...]:
        return (0,)

    def route(self, source_key: str, topic: str, stripe: int,
              destinations: Sequence[str]) -> tuple[dict[str, list[str]], list[str]]:
        if not destinations:
            return {}, []
        if self.router is None:
            return {}, list(destinations)
        return {self.router: list(destinations)}, []
