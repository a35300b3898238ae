"""Where a router sends the copies for other regions: the SCOT over the view's live
routers, SNR or IDR at this router (core/scot.py, core/idr.py; OctopiA VII).

It offers the routing interface the agent's `DataPlane` uses (`route`, `table.members`,
`dead`, `alive`, `schedule`, like `dataplane.trees.Trees`), so the router's relaying, holds,
aggregated acks and path update are the agents' own code, with SCOT routes instead of
LBDD trees.

Regions (`dataplane.gateway.region_map`: a member's Kyra clique in the plan, else its
`--region`) of the live routers, sorted: region index c is the name's place in that
list, so every router computes the same overlay from the same view and plan.
Positions are places in the region's live routers sorted by id (so after a crash the
region's tree re-forms over the survivors and the iLinks into it land on B(a mod n, c)).
An event's CIV has the bits of the regions of its destination agents (known from the
view) and of the regions named as a whole (`@region`, dataplane/tiers.py); a copy carries
the destinations of the regions its CIV serves, so the receiver knows its CIV from the
destinations it was given. A region whose routers are all DEAD here is parked for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from echelon.core.idr import IDLE, LinkState, idr
from echelon.core.scot import Router, Scot, bits, civ, snr
from echelon.dataplane.tiers import is_pseudo, pseudo
from echelon.v1 import membership_pb2 as mpb

ANY_ALINK = ()  # handed over by an agent, or entered over an iLink: every aLink is a target aLink
NO_ALINK = None  # a re-route after a path update: where it came from is not known, stay off aLinks


class Table:
    def __init__(self, members: dict[str, mpb.Member]):
        self.members = members


class Overlay:
    def __init__(self, self_id: str, region: str, routing: str = "idr", metrics=None):
        if routing not in ("snr", "idr"):
            raise ValueError(f"routing {routing!r}: snr or idr")
        self.self_id = self_id
        self.region = region
        self.routing = routing
        self.metrics = metrics  # RouterMetrics: decisions by rule, messages by link kind
        self.table = Table({})
        self.dead: frozenset[str] = frozenset()  # `@R` of regions with no live router (agents: their router parks)
        self.regions: list[str] = []
        self.scot: Scot | None = None
        self.here: Router | None = None
        self.at: dict[Router, str] = {}  # position -> router id
        self.position: dict[str, Router] = {}  # router id -> position
        self.region_of: dict[str, int] = {}  # agent id -> region index
        self.region_name: dict[str, str] = {}  # member id -> region
        self.states: dict[Router, LinkState] = {}  # this router's output queues, by far end
        self.came_from: tuple[Router, ...] | None = NO_ALINK

    def update(self, routers: Iterable[mpb.Member], agents: Iterable[mpb.Member], regions: dict[str, str],
               known: Iterable[str] = ()) -> None:
        """A new view: `regions` maps every member id to its region; `known`: the regions of
        every router the view holds, live or not (not LEFT)."""
        routers = sorted(routers, key=lambda m: m.id)
        regions = dict(regions)
        for m in routers:  # `@R` (tiers.py): served where R's routers are (the first's, under cliques)
            regions.setdefault(pseudo(m.region), regions[m.id])
        self.region_name = regions
        self.region = regions.get(self.self_id, self.region)
        self.regions = sorted({regions[m.id] for m in routers})
        index = {r: c for c, r in enumerate(self.regions)}
        self.at, self.position = {}, {}
        sizes = [0] * len(self.regions)
        for m in routers:
            c = index[regions[m.id]]
            self.at[(sizes[c], c)] = m.id
            self.position[m.id] = (sizes[c], c)
            sizes[c] += 1
        self.scot = Scot(tuple(sizes)) if sizes else None
        self.here = self.position.get(self.self_id)
        self.table = Table({m.id: m for m in routers if m.id != self.self_id})
        self.region_of = {m.id: index[regions[m.id]] for m in agents if regions[m.id] in index}
        self.region_of.update((k, index[r]) for k, r in regions.items() if is_pseudo(k) and r in index)
        self.states = {p: s for p, s in self.states.items() if p in self.at}
        # A region whose routers are all DEAD here (cut off, or down): what is sent to it as a
        # whole (`@R`) is parked until one is back, and not waited for (the agents' rule for
        # a DEAD destination: dataplane/parking.py), so the other regions' windows keep moving.
        self.dead = frozenset(pseudo(r) for r in known) - {k for k in regions if is_pseudo(k)}

    def alive(self, member_id: str) -> bool:
        return member_id in self.table.members or member_id in self.region_of and is_pseudo(member_id)

    def waits_for(self, member_id: str) -> bool:
        """Only a region cut off is parked for; an agent of a region without routers is lost."""
        return member_id in self.dead

    def schedule(self, topic: str, destinations: Sequence[str]) -> tuple[int, ...]:
        return (0,)

    def kind(self, peer: str) -> str:
        p = self.position.get(peer)
        if p is None:
            return "agent"
        return "alink" if self.here is not None and p[1] == self.here[1] else "ilink"

    def decide(self, v: int):
        """The sends at this router for CIV `v` (own bit already cleared)."""
        if self.routing == "snr":
            return snr(self.scot, self.here, v), "none"
        came = tuple(self.scot.alink(*self.here)) if self.came_from is NO_ALINK else self.came_from
        d = idr(self.scot, self.here, v, self.states, came)
        return d.sends, d.rule

    def route(self, source_key: str, topic: str, stripe: int,
              destinations: Sequence[str]) -> tuple[dict[str, list[str]], list[str]]:
        """({next router id: destination agents behind it}, lost) for agents of other regions."""
        if self.here is None:
            return {}, list(destinations)  # not in our own view yet: the sender re-routes nothing
        by_region: dict[int, list[str]] = {}
        lost = []
        for d in destinations:
            c = self.region_of.get(d)
            if c is None or c == self.here[1]:
                lost.append(d)  # unknown, or a region without routers (or ours: never sent here)
            else:
                by_region.setdefault(c, []).append(d)
        if not by_region:
            return {}, lost
        sends, rule = self.decide(civ(by_region))
        out: dict[str, list[str]] = {}
        for s in sends:
            target = self.at[s.to]
            out.setdefault(target, []).extend(d for c in bits(s.civ) for d in by_region[c])
            if self.metrics:
                self.metrics.messages.labels("alink" if s.to[1] == self.here[1] else "ilink").inc()
        if self.metrics:
            self.metrics.decisions.labels(rule).inc()
        return out, lost

    def state(self, peer: str) -> LinkState:
        return self.states.get(self.position.get(peer), IDLE)
