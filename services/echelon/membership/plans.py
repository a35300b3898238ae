"""`Control.PushPlan` acceptance: the shape of a routing plan, the tiling of its zones,
then `core.view.check_plan`.

A plan is checked once, by the replica that receives the push, against its own view
(replication.py, rule 4). Order: a version not above the current one is refused first
(FAILED_PRECONDITION: a retried or raced push), then a malformed plan, zones that do not
tile their topic's content space (Meghdoot: the 2n-dim space of the topic's schema), and
members that are not alive (INVALID_ARGUMENT). Every member a plan names (zone owners and
replicas, clique members, bucket hints) must be ALIVE or SUSPECT here. Last, a plan whose
cliques leave a live agent without a live router of its own region is refused
(INVALID_ARGUMENT naming them): its events could reach nobody there
(dataplane/gateway.py; with no router cliques change nothing, so any are accepted).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping

from echelon.core.can import TilingError, Zone, check_tiling
from echelon.core.space import Space
from echelon.core.view import PlanRejection, check_plan
from echelon.core.kyra import unserved
from echelon.dataplane.gateway import clique_regions
from echelon.contract.errors import InvalidArgument
from echelon.contract.wire import schema_from_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import membership_pb2 as mpb


def shape_error(plan: mpb.RoutingPlan, topics: Mapping[str, pb.Topic]) -> str | None:
    """Why the plan is malformed, or None."""
    if not 0 <= plan.predicted_gain <= 1:  # NaN fails too: the gauge would show nonsense
        return f"predicted_gain must be in [0, 1], got {plan.predicted_gain}"
    ids: set[str] = set()
    for i, z in enumerate(plan.zones):
        where = f"zone {z.id!r}" if z.id else f"zone #{i}"
        if not z.id:
            return f"{where}: id is required"
        if z.id in ids:
            return f"{where}: duplicate id"
        ids.add(z.id)
        if z.topic not in topics:
            return f"{where}: unknown topic {z.topic!r}"
        if not z.low or len(z.low) != len(z.high):
            return f"{where}: low and high need one bound per dimension ({len(z.low)} and {len(z.high)} given)"
        for d, (lo, hi) in enumerate(zip(z.low, z.high)):
            if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
                return f"{where}: dimension {d} needs finite bounds with low <= high, got [{lo}, {hi}]"
        if not z.owner:
            return f"{where}: owner is required"
        if z.owner in z.replicas or len(set(z.replicas)) != len(z.replicas):
            return f"{where}: replicas must be distinct and differ from the owner"
    seen: dict[str, str] = {}
    for i, c in enumerate(plan.cliques):
        if not c.id or not c.members:
            return f"clique #{i}: id and members are required"
        for m in c.members:
            if m in seen:
                return f"clique {c.id!r}: member {m!r} is already in clique {seen[m]!r}"
            seen[m] = c.id
    for h in plan.bucket_hints:
        if not h.member_id or not math.isfinite(h.weight) or h.weight < 0:
            return f"bucket hint {h.member_id!r}: a member id and a finite weight >= 0 are required"
    return None


def tiling_error(plan: mpb.RoutingPlan, topics: Mapping[str, pb.Topic]) -> str | None:
    """Why some topic's zones do not tile its content space, or None."""
    by_topic: dict[str, list[Zone]] = defaultdict(list)
    for z in plan.zones:
        by_topic[z.topic].append(Zone(z.id, tuple(z.low), tuple(z.high), z.owner, tuple(z.replicas)))
    for topic, zones in sorted(by_topic.items()):
        try:
            check_tiling(zones, Space.of(schema_from_pb(topics[topic].schema)))
        except (TilingError, InvalidArgument) as e:
            return f"zones of topic {topic!r} do not tile its content space: {e}"
    return None


def region_error(plan: mpb.RoutingPlan, members: Mapping[str, tuple[str, str]]) -> str | None:
    """Why the plan's regions leave some live agent without a router of its region, or None.
    `members`: the live members, id -> (role name, region joined with)."""
    def of(role: str) -> dict[str, str]:
        return {i: region for i, (r, region) in members.items() if r == role}

    lost = unserved(of("ROLE_AGENT"), of("ROLE_ROUTER"), clique_regions(plan))
    if not lost:
        return None
    names = sorted(lost)
    regions = sorted(set(lost.values()))
    return (f"the plan leaves {len(names)} agents without a router of their region ({', '.join(regions[:5])}): "
            f"{', '.join(map(repr, names[:5]))}" + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            + "; put a router in every clique or leave those agents out of the cliques")


def check(plan: mpb.RoutingPlan, current_version: int, alive: set[str],
          topics: Mapping[str, pb.Topic], members: Mapping[str, tuple[str, str]] | None = None
          ) -> PlanRejection | None:
    """None: accept. Else the reason, whose `.stale` says FAILED_PRECONDITION. `members`:
    the live members, id -> (role name, region), for the region rule (None: not checked)."""
    if plan.version <= current_version:
        return check_plan(plan.version, current_version, [], alive, True)
    reason = shape_error(plan, topics)
    if reason:
        return PlanRejection(f"malformed plan: {reason}")
    reason = tiling_error(plan, topics)
    if reason:
        return PlanRejection(reason)
    owners = [o for z in plan.zones for o in (z.owner, *z.replicas)]
    rejection = check_plan(plan.version, current_version, owners, alive, True)
    if rejection:
        return rejection
    others = {m for c in plan.cliques for m in c.members} | {h.member_id for h in plan.bucket_hints}
    dead = sorted(others - alive)
    if dead:
        return PlanRejection(f"clique or bucket hint members not alive: {', '.join(map(repr, dead[:5]))}"
                             + (f" and {len(dead) - 5} more" if len(dead) > 5 else ""))
    reason = region_error(plan, members) if members is not None else None
    return PlanRejection(reason) if reason else None
