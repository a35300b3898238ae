"""The routing job's decision: from the aggregated inputs to the next RoutingPlan, or none.

Pure (no Spark, no I/O); the planners themselves are in `echelon.core`:
- zones per topic: `core.zoning.plan_zones` on the sampled points; the candidate replaces
  the current zones only if its imbalance (`core.zoning.imbalance`: max/mean matcher load,
  subscriptions or events, whichever is worse, both scored on the same sample) is below
  the current one's by the margin (default 10%): no flapping on noise;
- cliques: `core.kyra.cliques` over every data-plane member with a measured round trip.
  The current cliques stay while they are still valid (every member alive and measured,
  every clique within max_distance, every member in one): loopback latencies jitter, and
  a re-clustering on jitter would move regions for nothing. Only cliques that leave no
  agent without a router of its region are proposed (`served_cliques`; none without
  routers), as membership refuses the others;
- bucket hints: an agent whose most congested uplink was congested (OctopiA's CE >= 1 with
  a queue above delta) in at least half the intervals, or whose median round trip is
  above `slow` times the cluster's median (and above 50 ms), gets weight 1; a hinted agent
  keeps its hint until that share falls below a quarter (hysteresis).

A plan is pushed when some topic's zones change, or the cliques or the hint set change.
It carries its `predicted_gain` (the largest relative fall of a changed topic's
imbalance, 0 when only cliques or hints change).

What the job exports: nothing of its own. It is a batch (one run, then exit), so a
scrape would miss it; every plan it pushes lands in membership (`Control.PushPlan`),
which exports `echelon_membership_plan_pushes_total{result}` and
`echelon_membership_plan_predicted_gain` (the current plan's). A run that pushes nothing
says so in its log (`nothing to push: ...`) and its exit code (0; 2 refused, 1 failed),
which the launcher's periodic runner logs per run.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from echelon.core import kyra, zoning
from echelon.core.can import Zone
from echelon.core.space import Space
from echelon.v1 import membership_pb2 as mpb

SLOW_FLOOR = 0.05  # seconds: below this no member counts as slow (loopback jitter under load reaches ms)


@dataclass
class Settings:
    margin: float = 0.1
    tolerance: float = 0.1
    replicate_above: float = 1.5
    max_distance: float = 0.05  # seconds: Kyra's maxDistance
    max_servers: int = 8  # Kyra's maxNumServers
    delta: float = 8.0  # queue length above which CE >= 1 means congestion
    slow: float = 3.0


@dataclass
class Inputs:
    matchers: list[str]  # alive
    members: list[str]  # alive data-plane members (agents, matchers, routers)
    agents: list[str]
    spaces: dict[str, Space]  # topics with a schema
    current: mpb.RoutingPlan
    zones: dict[str, list[Zone]]  # each topic's active zones (with effective members)
    sources: dict[str, str]  # each topic's layout source ("default", "plan 3", ...)
    points: dict[str, np.ndarray]  # equal-rate subscription sample per topic
    events: dict[str, np.ndarray]  # recent event points per topic
    congested: dict[str, float] = field(default_factory=dict)  # agent -> share of congested intervals
    rtt: dict[tuple[str, str], float] = field(default_factory=dict)  # (member, peer) -> seconds
    routers: list[str] = field(default_factory=list)  # alive
    regions: dict[str, str] = field(default_factory=dict)  # member -> the region it joined with


@dataclass
class TopicDecision:
    topic: str
    source: str
    before: float  # imbalance of the current zones
    after: float  # of the candidate
    change: bool
    zones: list[Zone]  # the candidate's
    load_before: dict[str, zoning.Load]
    load_after: dict[str, zoning.Load]


@dataclass
class Decision:
    topics: list[TopicDecision]
    cliques: list[list[str]]
    cliques_changed: bool
    hints: dict[str, float]
    hints_changed: bool
    plan: mpb.RoutingPlan | None  # None: nothing worth pushing
    notes: list[str] = field(default_factory=list)


def decide_topic(topic: str, inputs: Inputs, s: Settings) -> TopicDecision | None:
    space, pts = inputs.spaces[topic], inputs.points.get(topic)
    if pts is None or not len(pts) or topic not in inputs.zones:
        return None
    evs = inputs.events.get(topic, np.zeros((0, space.dims)))
    now = inputs.zones[topic]
    before = zoning.loads(now, space, pts, evs, inputs.matchers)
    zones = zoning.plan_zones(space, pts, evs, inputs.matchers, tolerance=s.tolerance,
                              replicate_above=s.replicate_above, prefix=f"{topic}/z")
    after = zoning.loads(zones, space, pts, evs, inputs.matchers)
    b, a = zoning.imbalance(before), zoning.imbalance(after)
    return TopicDecision(topic, inputs.sources.get(topic, ""), b, a, a < b * (1 - s.margin), zones, before, after)


def valid_cliques(current: Sequence[Sequence[str]], members: Sequence[str],
                  rtt: Mapping[tuple[str, str], float], s: Settings) -> bool:
    seen = [m for c in current for m in c]
    if sorted(seen) != sorted(members):
        return False
    for c in current:
        if len(c) > s.max_servers:
            return False
        for a in c:
            for b in c:
                if a != b and max(rtt.get((a, b), np.inf), rtt.get((b, a), np.inf)) > s.max_distance:
                    return False
    return True


def served_cliques(cliques: list[list[str]], inputs: Inputs) -> list[list[str]]:
    """Cliques membership accepts (membership/plans.py): none without routers (they would
    change nothing); a clique holding no router is dissolved (its members stay in the
    regions they joined); none if some agent is still left without a router of its region."""
    routers = set(inputs.routers)
    kept = [c for c in cliques if routers & set(c)]
    regions = {m: f"clique-c{i}" for i, c in enumerate(kept) for m in c}
    agents = {a: inputs.regions.get(a, "") for a in inputs.agents}
    if not kept or kyra.unserved(agents, {r: inputs.regions.get(r, "") for r in routers}, regions):
        return []
    return kept


def decide_cliques(inputs: Inputs, s: Settings) -> tuple[list[list[str]], bool]:
    measured = sorted({m for pair in inputs.rtt for m in pair} & set(inputs.members))
    current = [list(c.members) for c in inputs.current.cliques]
    if not measured or valid_cliques(current, measured, inputs.rtt, s):
        kept = served_cliques(current, inputs)
        return kept, sorted(map(sorted, kept)) != sorted(map(sorted, current))
    n = len(measured)
    m = np.full((n, n), np.nan)
    index = {k: i for i, k in enumerate(measured)}
    for (a, b), v in inputs.rtt.items():
        if a in index and b in index:
            m[index[a], index[b]] = v
    new = served_cliques(kyra.named_cliques(measured, m, s.max_distance, s.max_servers), inputs)
    return new, sorted(map(sorted, new)) != sorted(map(sorted, current))


def decide_hints(inputs: Inputs, s: Settings) -> tuple[dict[str, float], bool]:
    current = {h.member_id: h.weight for h in inputs.current.bucket_hints if h.weight > 0}
    by_member: dict[str, list[float]] = {}
    for (a, _), v in inputs.rtt.items():
        by_member.setdefault(a, []).append(v)
    medians = {a: statistics.median(v) for a, v in by_member.items()}
    cluster = statistics.median(medians.values()) if medians else 0.0
    hints = {}
    for agent in inputs.agents:
        share = inputs.congested.get(agent, 0.0)
        slow = medians.get(agent, 0.0) > max(SLOW_FLOOR, s.slow * cluster)
        if share >= 0.5 or slow or (agent in current and share >= 0.25):
            hints[agent] = 1.0
    return hints, set(hints) != set(current)


def predicted_gain(changed: Sequence[TopicDecision]) -> float:
    """The largest relative fall of a changed topic's imbalance (0 when no zones change)."""
    return max((1 - t.after / t.before for t in changed if t.before > 0), default=0.0)


def decide(inputs: Inputs, s: Settings, version: int, origin: str = "echelon replan",
           created_unix_ms: int = 0) -> Decision:
    topics = [d for t in sorted(inputs.spaces) if (d := decide_topic(t, inputs, s)) is not None]
    cliques, cliques_changed = decide_cliques(inputs, s)
    hints, hints_changed = decide_hints(inputs, s)
    decision = Decision(topics, cliques, cliques_changed, hints, hints_changed, None)
    if not (any(t.change for t in topics) or cliques_changed or hints_changed):
        return decision
    changed = {t.topic: t for t in topics if t.change}
    plan = mpb.RoutingPlan(version=version, origin=origin, created_unix_ms=created_unix_ms,
                           predicted_gain=predicted_gain(list(changed.values())))
    for z in inputs.current.zones:  # topics not changed keep the zones the current plan names
        if z.topic not in changed and z.topic in inputs.spaces:
            plan.zones.append(z)
    for t in changed.values():
        for z in t.zones:
            plan.zones.add(id=z.id, topic=t.topic, low=z.low, high=z.high, owner=z.owner, replicas=z.replicas)
    for i, c in enumerate(cliques):
        plan.cliques.add(id=f"c{i}", members=c)
    for m, w in sorted(hints.items()):
        plan.bucket_hints.add(member_id=m, weight=w)
    decision.plan = plan
    return decision
