"""CBDLO's routing cost (section 5.3): CRAWL against the paper's Simple protocol.

    python -m loadtest.crawl_sim [--nodes 3000] [--view 10] [--apt 20] [--hops 10]
                                 [--subs 1000,2000,4000,8000] [--data 500] [--quick]

The setting is the paper's: a random overlay where each node's view holds `view` others,
each node holding at most 100 subscriptions, a hop limit of 10. A subscription is a
conjunction of ranges over some of `attributes` attributes; attribute i appears with
probability i^-alpha (the paper's Zipf law, 5.2: common attributes in most
subscriptions, rare ones in few); the mean is about 8 attributes, as in the paper.
The nodes subscribing to an attribute form its attribute topology (CBDLO's upper
layer); each node's APT caches `apt` entries, sampled from all (attribute, member)
pairs. A data item carries every attribute, uniform values.

- CRAWL (core/crawl.py): one walk per attribute from the publisher until a node's APT
  (or the node itself) knows that attribute's topology, then one message to the entry;
  inside the topology, the height of its balanced tree over the virtual nodes
  (subscriptions + 2, 5.2): the paper counts the second stage as that height (5.3).
  Delivery is exact once every walk arrived; the messages to the nodes holding a
  matching subscription are printed apart (Simple's visits are its deliveries).
- Simple: the data goes from node to random node (no trace) until the hop limit; each
  node it visits matches its own subscriptions.

Effective distribution cost, the paper's measure (Fig. 5 and 6): all messages sent
divided by the share of the matching subscriptions actually reached. The paper prints
one point in its text (Simple at its first subscription count: 68,605 messages, 68 of
408 matches, 411,630); its curves are figures without values, so the rest is compared
in shape: CRAWL far lower than Simple, flat in the subscription count, Simple falling
as subscriptions grow and levelling off as the hop limit grows.
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from echelon.core.crawl import walk

PAPER_SIMPLE_POINT = {"messages": 68605, "should": 408, "matched": 68, "effective": 411630}


@dataclass
class World:
    view: list[list[int]]  # node -> its view
    apt: list[dict[int, int]]  # node -> attribute -> an entry of its topology
    owner: np.ndarray  # subscription -> node
    has: np.ndarray  # subscription x attribute: constrained?
    lo: np.ndarray  # subscription x attribute ranges (unconstrained: [0, 1])
    hi: np.ndarray
    members: list[set[int]]  # attribute -> nodes in its topology


def build(nodes: int, view: int, apt: int, subs: int, attributes: int, alpha: float, seed: int) -> World:
    rng = np.random.default_rng(seed)
    views = [list(rng.choice(np.delete(np.arange(nodes), i), size=view, replace=False)) for i in range(nodes)]
    # Owners: at most 100 subscriptions per node (the paper's local cache).
    owner = rng.integers(0, nodes, subs)
    while (counts := np.bincount(owner, minlength=nodes)).max() > 100:
        over = np.flatnonzero(counts[owner] > 100)
        owner[over[: len(over) // 2 + 1]] = rng.integers(0, nodes, len(over) // 2 + 1)
    p = np.arange(1, attributes + 1, dtype=float) ** -alpha
    has = rng.random((subs, attributes)) < p
    has[~has.any(axis=1), 0] = True
    width = rng.uniform(0.3, 0.9, (subs, attributes))
    start = rng.uniform(0, 1 - width)
    lo, hi = np.where(has, start, 0.0), np.where(has, start + width, 1.0)
    members = [set(owner[has[:, a]].tolist()) for a in range(attributes)]
    pairs = [(a, m) for a in range(attributes) for m in sorted(members[a])]
    apts = []
    for _ in range(nodes):
        table: dict[int, int] = {}
        for k in rng.choice(len(pairs), size=min(apt, len(pairs)), replace=False):
            a, m = pairs[int(k)]
            table.setdefault(a, m)
        apts.append(table)
    return World(views, apts, owner, has, lo, hi, members)


@dataclass
class Cost:
    messages: int = 0  # routing: walks, trees, hops
    deliveries: int = 0  # CRAWL's last messages, to the nodes holding a reached subscription
    should: int = 0  # matching subscriptions, summed over the data items
    reached: int = 0  # of those, reached

    @property
    def effective(self) -> float:
        return self.messages / (self.reached / self.should) if self.reached else math.inf


def crawl_cost(w: World, data: np.ndarray, sources: Sequence[int], hops: int, trace: int, seed: int) -> Cost:
    rng = random.Random(seed)
    cost = Cost()
    attributes = w.has.shape[1]
    per_attr = w.has.sum(axis=0)
    for x, src in zip(data, sources):
        covers = (w.lo <= x) & (x <= w.hi)  # subscription x attribute
        match = covers.all(axis=1)
        cost.should += int(match.sum())
        arrived = np.zeros(attributes, dtype=bool)
        for a in range(attributes):
            def lookup(n: int, a: int = a) -> int | None:
                if n == src:
                    return None  # the publisher sends at once (3.1, step 1)
                return n if n in w.members[a] else w.apt[n].get(a)

            found = walk(src, lookup, w.view.__getitem__, max_hops=hops, trace=trace, rng=rng)
            cost.messages += found.messages
            if found.holder is None:
                continue
            arrived[a] = True
            cost.messages += math.ceil(math.log2(per_attr[a] + 2))  # down the attribute's tree
        # A subscription is reached when every one of its attributes arrived; one message
        # to each node holding one.
        reached = match & ~(w.has & ~arrived).any(axis=1)
        cost.reached += int(reached.sum())
        cost.deliveries += len(set(w.owner[reached].tolist()))
    return cost


def simple_cost(w: World, data: np.ndarray, sources: Sequence[int], hops: int, seed: int) -> Cost:
    rng = random.Random(seed)
    cost = Cost()
    by_node: dict[int, np.ndarray] = {}
    for s, n in enumerate(w.owner.tolist()):
        by_node.setdefault(n, []).append(s)  # type: ignore[arg-type]
    by_node = {n: np.asarray(s) for n, s in by_node.items()}
    for x, src in zip(data, sources):
        match = ((w.lo <= x) & (x <= w.hi)).all(axis=1)
        cost.should += int(match.sum())
        here, seen = src, {src}
        for _ in range(hops):
            here = rng.choice(w.view[here])
            seen.add(here)
            cost.messages += 1
        cost.reached += sum(int(match[by_node[n]].sum()) for n in seen if n in by_node)
    return cost


def run(nodes: int, view: int, apt: int, subs: int, hops: int, data: int, trace: int, seed: int,
        attributes: int = 20, alpha: float = 0.6) -> tuple[Cost, Cost]:
    w = build(nodes, view, apt, subs, attributes, alpha, seed)
    rng = np.random.default_rng(seed + 1)
    items = rng.random((data, attributes))
    sources = rng.integers(0, nodes, data).tolist()
    return crawl_cost(w, items, sources, hops, trace, seed), simple_cost(w, items, sources, hops, seed)


def table(rows: list[tuple[str, Cost, Cost]], title: str) -> list[str]:
    out = [title, f"{'':>12} {'CRAWL msgs':>11} {'delivery':>9} {'reached':>8} {'effective':>11} "
                  f"{'Simple msgs':>12} {'reached':>8} {'effective':>12} {'Simple/CRAWL':>13}"]
    for label, c, s in rows:
        out.append(f"{label:>12} {c.messages:>11,} {c.deliveries:>9,} {100 * c.reached / max(1, c.should):7.1f}% "
                   f"{c.effective:>11,.0f} "
                   f"{s.messages:>12,} {100 * s.reached / max(1, s.should):7.1f}% {s.effective:>12,.0f} "
                   f"{s.effective / c.effective:>12.1f}x")
    return out


def main(argv: Sequence[str] | None = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m loadtest.crawl_sim", description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=3000)
    ap.add_argument("--view", type=int, default=10)
    ap.add_argument("--apt", type=int, default=20)
    ap.add_argument("--hops", type=int, default=10)
    ap.add_argument("--trace", type=int, default=8)
    ap.add_argument("--subs", default="1000,2000,4000,8000", help="subscription counts (Fig. 5)")
    ap.add_argument("--hop-range", default="5,10,20,30", help="hop limits (Fig. 6), at the first count")
    ap.add_argument("--data", type=int, default=300, help="data items published per point")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 300 nodes, 50 items")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.data, args.subs, args.hop_range = 300, 50, "200,800", "5,10"
    counts = [int(s) for s in args.subs.split(",") if s]
    fig5 = [(f"{n:,} subs", *run(args.nodes, args.view, args.apt, n, args.hops, args.data, args.trace, args.seed))
            for n in counts]
    fig6 = [(f"{h} hops", *run(args.nodes, args.view, args.apt, counts[0], h, args.data, args.trace, args.seed))
            for h in (int(x) for x in args.hop_range.split(",") if x)]
    p = PAPER_SIMPLE_POINT
    lines = [f"CBDLO routing cost: {args.nodes:,} nodes, view {args.view}, APT {args.apt}, "
             f"{args.data} data items per point, trace {args.trace}", ""]
    lines += table(fig5, f"Fig. 5 -- effective distribution cost by subscription count (hop limit {args.hops})")
    lines.append("")
    lines += table(fig6, f"Fig. 6 -- effective distribution cost by hop limit ({counts[0]:,} subscriptions)")
    lines += ["", "Against the paper (section 5.3; its curves have no printed values):",
              f"  its one printed point, Simple at its first subscription count: {p['messages']:,} messages, "
              f"{p['matched']} of {p['should']} matches reached ({100 * p['matched'] / p['should']:.1f}%), "
              f"effective cost {p['effective']:,}",
              f"  here, Simple at {counts[0]:,} subscriptions: {fig5[0][2].messages:,} messages, "
              f"{fig5[0][2].reached:,} of {fig5[0][2].should:,} reached "
              f"({100 * fig5[0][2].reached / max(1, fig5[0][2].should):.1f}%), effective {fig5[0][2].effective:,.0f}",
              "  the paper's shape: CRAWL far below Simple and nearly flat in the subscription count "
              f"(here {fig5[0][1].effective:,.0f} .. {fig5[-1][1].effective:,.0f}); Simple falling as "
              f"subscriptions grow (here {fig5[0][2].effective:,.0f} .. {fig5[-1][2].effective:,.0f})"]
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
