"""LBDD at scale without a network: the paper's Tab. 1 and Fig. 4 (Li et al., section 4.3).

For each n, many random sets of n + 1 IPv4 addresses (the first, in sorted order, is the
publisher) are built into a tree with `echelon.core.lbdd.build_tree`, and we report:

- Tab. 1: depth min / median / max, the number of non-empty buckets (always equal to the
  depth -- asserted) and the span of bucket numbers (the paper: 24..32 at n = 500);
- Fig. 4: contribution rate = copies a node sends / n. The publisher sends one copy per
  member of the first non-empty bucket; the subscribers carry the rest;
- the out-degree bound (not in the paper; core/lbdd.py): on the same sets, depth and the
  largest out-degree of any node without the bound and with `--max-degree D`.

Run: python -m loadtest.lbdd_sim [--max-n 100000] [--out out/lbdd] [--seeds 1000] [--max-degree 4]
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from echelon.core.lbdd import build_tree

PAPER_SIZES = (100, 200, 300, 400, 500)
LARGE_SIZES = (1_000, 10_000, 100_000)


def sample(n: int, seed: int) -> tuple[str, list[str]]:
    """One address set: a publisher and n distinct subscribers, reproducible from (n, seed)."""
    rng = random.Random(f"lbdd-{n}-{seed}")
    keys: set[str] = set()
    while len(keys) < n + 1:
        keys.add(".".join(str(rng.randrange(256)) for _ in range(4)))
    source, *members = sorted(keys)
    return source, members


def seeds_for(n: int, seeds: int) -> int:
    """All seeds for the paper's sizes; fewer for large n so a run stays near a minute."""
    return seeds if n <= PAPER_SIZES[-1] else min(seeds, max(10, seeds * 500 // n))


@dataclass(frozen=True)
class Row:
    n: int
    sets: int
    depths: list[int]
    lowest_bucket: list[int]  # per set: lowest non-empty bucket number
    publisher_copies: list[int]
    busiest_subscriber: list[int]  # per set: the largest out-degree among subscribers
    inner_degree: list[float]  # per set: mean out-degree of nodes that send at all
    max_degree: list[int]  # per set: the largest out-degree of any node, publisher included
    bounded_depths: list[int]  # per set, with the out-degree bound
    bounded_max_degree: list[int]

    @property
    def publisher_rate(self) -> float:
        return statistics.mean(self.publisher_copies) / self.n


def measure(n: int, sets: int, bound: int = 4) -> Row:
    depths, lowest, pub, busiest, inner = [], [], [], [], []
    top, b_depths, b_top = [], [], []
    for seed in range(sets):
        source, members = sample(n, seed)
        tree = build_tree(source, members)
        used = set(tree.bucket.values()) - {0}
        assert tree.depth == len(used), "depth must equal the number of non-empty buckets"
        degrees = tree.out_degree
        depths.append(tree.depth)
        lowest.append(min(used))
        pub.append(degrees[source])
        busiest.append(max(d for k, d in degrees.items() if k != source))
        inner.append(statistics.mean(d for d in degrees.values() if d))
        top.append(max(degrees.values()))
        bounded = build_tree(source, members, max_degree=bound)
        assert len(bounded.parent) == n, "the bound must keep every member in the tree"
        b_depths.append(bounded.depth)
        b_top.append(max(bounded.out_degree.values()))
    return Row(n, sets, depths, lowest, pub, busiest, inner, top, b_depths, b_top)


def _table(title: str, columns: tuple[str, ...], rows: list[Row], cells) -> Table:
    """One row per n; a rule separates the paper's sizes from the large ones."""
    table = Table(title=title)
    for name in columns:
        table.add_column(name, justify="right")
    for r in rows:
        if r.n == LARGE_SIZES[0]:
            table.add_section()
        table.add_row(str(r.n), *cells(r))
    return table


def depth_table(rows: list[Row]) -> Table:
    return _table(
        "Tab. 1 - path depth (= non-empty buckets) and bucket span",
        ("n", "sets", "min", "median", "max", "log2 n", "buckets", "span"),
        rows,
        lambda r: (
            str(r.sets),
            str(min(r.depths)),
            f"{statistics.median(r.depths):g}",
            str(max(r.depths)),
            f"{math.log2(r.n):.1f}",
            f"{statistics.median(r.depths):g}",
            f"{statistics.median(r.lowest_bucket):g}..32",
        ),
    )


def contribution_table(rows: list[Row]) -> Table:
    # busiest sub: the largest out-degree among subscribers, median / max over the sets.
    return _table(
        "Fig. 4 - contribution rate (copies sent / n)",
        ("n", "pub copies", "pub rate", "subs share", "busiest sub", "inner deg"),
        rows,
        lambda r: (
            f"{statistics.mean(r.publisher_copies):.2f}",
            f"{r.publisher_rate:.3%}",
            f"{1 - r.publisher_rate:.3%}",
            f"{statistics.median(r.busiest_subscriber):g} / {max(r.busiest_subscriber)}",
            f"{statistics.mean(r.inner_degree):.2f}",
        ),
    )


def bound_table(rows: list[Row], bound: int) -> Table:
    # median / max over the sets, without and with the bound.
    def mm(xs: list[int]) -> str:
        return f"{statistics.median(xs):g} / {max(xs)}"

    return _table(
        f"Out-degree bound D = {bound} (not in the paper) - depth and largest out-degree",
        ("n", "depth", f"depth D={bound}", "max out-deg", f"max out-deg D={bound}"),
        rows,
        lambda r: (mm(r.depths), mm(r.bounded_depths), mm(r.max_degree), mm(r.bounded_max_degree)),
    )


def plot(rows: list[Row], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r.n for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    lows, highs = [min(r.depths) for r in rows], [max(r.depths) for r in rows]
    ax.fill_between(ns, lows, highs, alpha=0.25, label="min..max")
    ax.plot(ns, [statistics.median(r.depths) for r in rows], "o-", label="median depth")
    ax.plot(ns, [math.log2(n) for n in ns], "--", label="log2 n")
    ax.set(xscale="log", xlabel="subscribers n", ylabel="tree depth", title="LBDD depth (Tab. 1)")
    ax.legend()
    depth_png = out / "depth.png"
    fig.tight_layout()
    fig.savefig(depth_png, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ns, [r.publisher_rate for r in rows], "o-", label="publisher")
    ax.plot(ns, [1 - r.publisher_rate for r in rows], "s-", label="subscribers (all)")
    busiest = [statistics.median(r.busiest_subscriber) / r.n for r in rows]
    ax.plot(ns, busiest, "^-", label="busiest subscriber")
    ax.set(xscale="log", yscale="log", xlabel="subscribers n", ylabel="copies sent / n")
    ax.set_title("LBDD contribution rate (Fig. 4)")
    ax.legend()
    contribution_png = out / "contribution.png"
    fig.tight_layout()
    fig.savefig(contribution_png, dpi=120)
    plt.close(fig)
    return [depth_png, contribution_png]


@click.command()
@click.option("--max-n", default=100_000, show_default=True, help="Largest number of subscribers.")
@click.option("--out", default="out/lbdd", show_default=True, type=click.Path(path_type=Path))
@click.option(
    "--seeds", default=1000, show_default=True, help="Address sets per n up to 500 (fewer above)."
)
@click.option(
    "--max-degree", default=4, show_default=True, type=click.IntRange(min=2),
    help="Out-degree bound for the bounded column.",
)
def main(max_n: int, out: Path, seeds: int, max_degree: int) -> None:
    """Simulate LBDD trees over random address sets; print tables, write plots."""
    console = Console()
    started = time.perf_counter()
    sizes = [n for n in (*PAPER_SIZES, *LARGE_SIZES) if n <= max_n]
    rows = [measure(n, seeds_for(n, seeds), max_degree) for n in sizes]
    console.print(depth_table(rows))
    console.print(contribution_table(rows))
    console.print(bound_table(rows, max_degree))
    out.mkdir(parents=True, exist_ok=True)
    for png in plot(rows, out):
        console.print(f"wrote {png}")
    console.print(f"done in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
