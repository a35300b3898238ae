"""`Control.PushPlan` acceptance: the shape of a routing plan, then `core.view.check_plan`.

A plan is checked once, by the replica that receives the push, against its own view
(replication.py, rule 4). Order: a version not above the current one is refused first
(FAILED_PRECONDITION: a retried or raced push), then a malformed plan, zones that do not
tile, and members that are not alive (INVALID_ARGUMENT). Every member a plan names (zone
owners and replicas, clique members, bucket hints) must be ALIVE or SUSPECT here.
"""

from __future__ import annotations

import math
from echelon.core.view import PlanRejection, check_plan
from echelon.v1 import membership_pb2 as mpb


def shape_error(plan: mpb.RoutingPlan) -> str | None:
    """Why the plan is malformed, or None."""
    ids: set[str] = set()
    dims: dict[str, int] = {}
    for i, z in enumerate(plan.zones):
        where = f"zone {z.id!r}" if z.id else f"zone #{i}"
        if not z.id:
            return f"{where}: id is required"
        if z.id in ids:
            return f"{where}: duplicate id"
        ids.add(z.id)
        if not z.topic:
            return f"{where}: topic is required"
        if not z.low or len(z.low) != len(z.high):
            return f"{where}: low and high need one bound per dimension ({len(z.low)} and {len(z.high)} given)"
        if dims.setdefault(z.topic, len(z.low)) != len(z.low):
            return f"{where}: {len(z.low)} dimensions, other zones of topic {z.topic!r} have {dims[z.topic]}"
        for d, (lo, hi) in enumerate(zip(z.low, z.high)):
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                return f"{where}: dimension {d} needs finite bounds with low < high, got [{lo}, {hi})"
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


def zones_tile(plan: mpb.RoutingPlan) -> bool:
    """Whether each topic's zones tile its content space.

    TODO(core/can.py): call `echelon.core.can.check_tiling(zones, dims)` for each topic's
    zones (dims = len(zone.low)) once it exists; until then only the shape is checked.
    """
    return True


def check(plan: mpb.RoutingPlan, current_version: int, alive: set[str]) -> PlanRejection | None:
    """None: accept. Else the reason, whose `.stale` says FAILED_PRECONDITION."""
    if plan.version <= current_version:
        return check_plan(plan.version, current_version, [], alive, True)
    reason = shape_error(plan)
    if reason:
        return PlanRejection(f"malformed plan: {reason}")
    owners = [o for z in plan.zones for o in (z.owner, *z.replicas)]
    rejection = check_plan(plan.version, current_version, owners, alive, zones_tile(plan))
    if rejection:
        return rejection
    others = {m for c in plan.cliques for m in c.members} | {h.member_id for h in plan.bucket_hints}
    dead = sorted(others - alive)
    if dead:
        return PlanRejection(f"clique or bucket hint members not alive: {', '.join(map(repr, dead[:5]))}"
                             + (f" and {len(dead) - 5} more" if len(dead) > 5 else ""))
    return None
