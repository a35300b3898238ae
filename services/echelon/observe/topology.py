"""`echelon topology`: a picture of the cluster as it runs — members by region and state,
the LBDD tree of a topic (one panel per stripe) and the router links, each link coloured
by its congestion from live metrics.

The tree is the one every agent computes from the view (LBDD section 3.5.1, the same
`core.lbdd` and stripe salting as `dataplane.trees`): rooted at the topic's publisher,
spanning the agents that subscribe to it. Congestion is the catalog's (OctopiA's CE with
the queue length, `link:echelon_link_congestion_element:ratio1m` and
`echelon_link_queue_length`), read from Prometheus per (member, peer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from echelon.dataplane.trees import salted
from echelon.core.lbdd import build_tree
from echelon.observe.catalog import CONGESTED_QUEUE
from echelon.observe.prometheus import PrometheusAPI, PromQLError
from echelon.v1 import membership_pb2 as mpb

ROLE_ROWS = {"membership": 0, "matcher": 1, "router": 2}  # agents go below, by tree depth
STATE_COLOURS = {"alive": "#2e7d32", "suspect": "#f9a825", "dead": "#c62828", "left": "#9e9e9e"}
LINK_COLOURS = {"idle": "#9e9e9e", "flowing": "#2e7d32", "backlogged": "#f9a825", "congested": "#c62828"}
BACKLOGGED_CE = 1.1  # a display margin: in steady flow CE hovers around 1 (enqueued = dequeued)


@dataclass(frozen=True)
class Member:
    id: str
    role: str
    region: str
    state: str
    address: str
    publishes: tuple[str, ...] = ()
    subscribes: tuple[str, ...] = ()


@dataclass(frozen=True)
class LinkState:
    ce: float = math.nan  # enqueued / dequeued over 1m
    queue: float = 0.0
    bytes_per_s: float = 0.0

    @property
    def level(self) -> str:
        """congested (CE >= 1 or nothing dequeued, with a queue over delta: the alert's
        rule), backlogged (the queue grows, still short), flowing, idle (no frames)."""
        if self.queue > CONGESTED_QUEUE and (math.isnan(self.ce) or self.ce >= 1):
            return "congested"
        if math.isnan(self.ce):
            return "idle"
        return "backlogged" if self.ce >= BACKLOGGED_CE and self.queue > 0 else "flowing"


@dataclass
class Topology:
    members: list[Member]
    topic: str
    root: str | None
    trees: list[list[tuple[str, str]]]  # per stripe: (parent id, child id)
    links: dict[tuple[str, str], LinkState] = field(default_factory=dict)  # (member, peer) -> state


def members_of(view: mpb.View) -> list[Member]:
    def name(enum, value, prefix):
        return enum.Name(value).removeprefix(prefix).lower()

    return [Member(m.id, name(mpb.Role, m.role, "ROLE_"), m.region or "local",
                   name(mpb.MemberState, m.state, "MEMBER_STATE_"), m.address, tuple(m.publishes),
                   tuple(m.subscribes)) for m in view.members]


def replicas(api: PrometheusAPI) -> list[Member]:
    """Membership replicas (not members of their own view), as Prometheus scrapes them."""
    try:
        found = api.query('up{job="membership"}')
    except PromQLError:
        return []
    return [Member(s["metric"].get("member", s["metric"]["instance"]), "membership", s["metric"].get("region", "local"),
                   "alive" if s["value"][1] == "1" else "dead", s["metric"]["instance"]) for s in found]


def tree_edges(members: list[Member], topic: str, root: str, stripe: int) -> list[tuple[str, str]]:
    """The topic's LBDD tree from `root` in `stripe`, as member ids (what `dataplane.trees` routes on)."""
    agents = {m.id: m for m in members if m.role == "agent" and m.state == "alive"}
    ids = {salted(m.address, stripe): i for i, m in agents.items() if topic in m.subscribes and i != root}
    tree = build_tree(salted(agents[root].address, stripe), ids)
    names = {**ids, salted(agents[root].address, stripe): root}
    return [(names[p], names[c]) for p, c in tree.edges]


def pick_root(members: list[Member], topic: str, root: str | None, api: PrometheusAPI | None = None) -> str | None:
    """`root`, else the first agent the view says publishes the topic, else the agent that
    sends the most copies as a tree root (live metrics)."""
    alive = {m.id for m in members if m.role == "agent" and m.state == "alive"}
    if root:
        return root
    publishers = sorted(m.id for m in members if m.id in alive and topic in m.publishes)
    if publishers:
        return publishers[0]
    try:
        busiest = api.query('topk(1, sum by (member) (rate(echelon_agent_copies_sent_total{as="root"}[1m])) > 0)') \
            if api else []
    except PromQLError:
        busiest = []
    found = [s["metric"]["member"] for s in busiest if s["metric"].get("member") in alive]
    return found[0] if found else None


def link_states(api: PrometheusAPI) -> dict[tuple[str, str], LinkState]:
    """Per (member, peer): CE, queue length, bytes/s, from Prometheus (agents' and routers' links)."""
    def by_link(expr: str) -> dict[tuple[str, str], float]:
        try:
            return {(s["metric"].get("member", ""), s["metric"].get("peer", "")): float(s["value"][1])
                    for s in api.query(expr)}
        except PromQLError:
            return {}

    ce = by_link("link:echelon_link_congestion_element:ratio1m")
    queue = by_link("echelon_link_queue_length")
    rate = by_link("rate(echelon_relay_sent_bytes_total[1m])")
    return {k: LinkState(ce.get(k, math.nan), queue.get(k, 0.0), rate.get(k, 0.0)) for k in {*ce, *queue, *rate}}


def positions(topo: Topology, stripe: int = 0) -> dict[str, tuple[float, float]]:
    """Regions side by side; in each, services in rows on top, agents below by their depth
    in the stripe's tree (edges are listed level by level)."""
    regions = sorted({m.region for m in topo.members})
    depth: dict[str, int] = {}
    if topo.root:
        depth[topo.root] = 0
        for parent, child in topo.trees[stripe] if topo.trees else []:
            depth[child] = depth.get(parent, 0) + 1
    rows: dict[tuple[str, float], list[str]] = {}
    for m in sorted(topo.members, key=lambda m: m.id):
        row = ROLE_ROWS.get(m.role, 3 + depth.get(m.id, max(depth.values(), default=0) + 1))
        rows.setdefault((m.region, row), []).append(m.id)
    pos = {}
    for (region, row), ids in rows.items():
        x0 = regions.index(region) * 1.0
        for i, mid in enumerate(ids):
            pos[mid] = (x0 + (i + 1) / (len(ids) + 1), -row)
    return pos


def draw(topo: Topology, out: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    by_id = {m.id: m for m in topo.members}
    regions = sorted({m.region for m in topo.members})
    low = min((y for s in range(max(1, len(topo.trees))) for _, y in positions(topo, s).values()), default=0) - 0.7
    panels = max(1, len(topo.trees))
    fig, axes = plt.subplots(1, panels, figsize=(max(6.0, 4.2 * len(regions)) * min(panels, 4) ** 0.5 + 1, 6.5),
                             squeeze=False)
    for s, ax in enumerate(axes[0]):
        pos = positions(topo, s)
        for i, region in enumerate(regions):
            ax.add_patch(Rectangle((i + 0.02, low), 0.96, -low + 0.6, fill=False, ls="--", ec="#607d8b"))
            ax.text(i + 0.5, 0.45, f"region {region}", ha="center", fontsize=9, color="#37474f")
        edges = topo.trees[s] if topo.trees else []
        tree_links = set(edges)
        for a, b in edges:
            _edge(ax, pos, a, b, topo.links.get((a, b)), "-")
        for (a, b), state in topo.links.items():  # router links, and agent links off the tree
            if (a, b) not in tree_links and a in pos and b in pos and by_id[a].role == "router":
                _edge(ax, pos, a, b, state, "--")
        for mid, (x, y) in pos.items():
            m = by_id[mid]
            marker = {"membership": "s", "matcher": "D", "router": "h"}.get(m.role, "o")
            ax.scatter([x], [y], s=420 if mid == topo.root else 260, marker=marker, zorder=3,
                       c=STATE_COLOURS.get(m.state, "#9e9e9e"), edgecolors="black" if mid == topo.root else "white")
            if m.role == "agent":
                ax.text(x - 0.04, y, mid, ha="right", va="center", fontsize=7)
            else:
                ax.text(x, y - 0.28, mid, ha="center", va="top", fontsize=6)
        ax.set_xlim(0, len(regions))
        ax.set_ylim(low - 0.1, 0.8)
        ax.axis("off")
        if panels > 1:
            ax.set_title(f"stripe {s}", fontsize=9)
    handles = [Line2D([], [], color=c, lw=2, label=f"link {k}") for k, c in LINK_COLOURS.items()]
    handles += [Line2D([], [], marker="o", ls="", color=c, label=k) for k, c in STATE_COLOURS.items()]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)
    fig.suptitle(title or f"Echelon topology: topic {topo.topic!r}, LBDD tree from {topo.root or '(no publisher)'}",
                 fontsize=10)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return out


def _edge(ax, pos, a: str, b: str, state: LinkState | None, style: str) -> None:
    if a not in pos or b not in pos:
        return
    level = state.level if state else "idle"
    width = 1.2 + (min(4.0, math.log10(1 + state.bytes_per_s) / 1.5) if state else 0)
    (x0, y0), (x1, y1) = pos[a], pos[b]
    ax.annotate("", xy=(x1, y1), xytext=(x0, y0), zorder=2,
                arrowprops={"arrowstyle": "-|>", "color": LINK_COLOURS[level], "lw": width, "ls": style,
                            "shrinkA": 10, "shrinkB": 10})
    if state and not math.isnan(state.ce):
        ax.text((x0 + x1) / 2 + 0.02, (y0 + y1) / 2, f"CE {state.ce:.2g}, q {state.queue:.0f}", fontsize=6,
                color=LINK_COLOURS[level], ha="left", va="center")
