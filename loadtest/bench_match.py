"""Matching throughput on one core: the CDM index against a numpy brute force, side by side.

    python -m loadtest.bench_match [--sizes 14029,150000,1000000] [--events N] [--out DIR]

For each number of stock subscriptions (loadtest/stock.py) both matchers see the same
uniform events. The brute force tests every subscription point in the Meghdoot space
at once (space.affected_mask, one vectorised range test over the 2n coordinates), then
runs the exact `Filter.matches` on the points it keeps. Both run batched (many events
per call) and one event at a time; every event the brute force matches is also checked
against the CDM answer. Prints a table with the ratios and writes bench_match.png.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from echelon.core.cdm import CountingIndex, Entry
from echelon.core.space import Space
from loadtest import stock

TARGETS = {150_000: 100_000, 1_000_000: 20_000}  # events/s, batched, from the brief


class BruteForce:
    """Every subscription point tested against each event, then the exact check."""

    def __init__(self, space: Space, subs: Sequence[Entry]):
        self.space = space
        self.subs = list(subs)
        pts = np.array([space.subscription_point(s.filter) for s in self.subs]).reshape(len(self.subs), space.dims)
        self.low, self.high = pts[:, 0::2].T.copy(), pts[:, 1::2].T.copy()  # (n attributes, k)

    def match_batch(self, events: Sequence[Mapping[str, object]], chunk: int = 8) -> list[list[str]]:
        out: list[list[str]] = []
        for start in range(0, len(events), chunk):
            part = events[start : start + chunk]
            ep = np.array([self.space.event_point(e) for e in part]).reshape(len(part), self.space.dims)
            hit = np.ones((len(part), self.low.shape[1]), dtype=bool)
            for a in range(self.low.shape[0]):  # l_a <= c_a1 and c_a2 <= h_a, all events at once
                hit &= self.low[a] <= ep[:, 2 * a, None]
                hit &= self.high[a] >= ep[:, 2 * a + 1, None]
            for e, row in zip(part, hit):
                out.append([self.subs[j].id for j in np.flatnonzero(row) if self.subs[j].filter.matches(e)])
        return out

    def match(self, event: Mapping[str, object]) -> list[str]:
        return self.match_batch([event], chunk=1)[0]


@dataclass
class Row:
    size: int
    build_s: float
    cdm_batch: float
    cdm_single: float
    brute_batch: float
    brute_single: float
    matches: float
    agree: bool


def _rate(fn, items: Sequence) -> tuple[float, list]:
    t = time.perf_counter()
    out = fn(items)
    return len(items) / (time.perf_counter() - t), out


def measure(size: int, n_events: int, n_single: int, n_brute: int, seed: int = 1) -> Row:
    subs = [Entry(f"s{i}", f"agent{i % 64}", f) for i, f in enumerate(stock.subscriptions(size, seed))]
    events = stock.events(n_events, seed + 1)
    t = time.perf_counter()
    index = CountingIndex(subs)
    index.match(events[0])  # runs are built lazily: count the build here
    build = time.perf_counter() - t
    brute = BruteForce(space=Space.of(stock.STOCK_SCHEMA), subs=subs)
    cdm_batch, got = _rate(index.match_batch, events)
    cdm_single, _ = _rate(lambda es: [index.match(e) for e in es], events[:n_single])
    brute_batch, want = _rate(brute.match_batch, events[:n_brute])
    brute_single, _ = _rate(lambda es: [brute.match(e) for e in es], events[: max(1, n_brute // 4)])
    agree = all(set(g) == set(w) for g, w in zip(got, want))
    return Row(size, build, cdm_batch, cdm_single, brute_batch, brute_single, float(np.mean([len(g) for g in got])), agree)


def table(rows: Sequence[Row]) -> str:
    head = (
        f"{'subs':>9} {'build s':>8} {'matches/ev':>10} {'CDM batch ev/s':>15} {'CDM 1-by-1':>11} "
        f"{'brute batch':>12} {'brute 1-by-1':>13} {'batch ratio':>12} {'1-by-1 ratio':>13} {'agree':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.size:>9,} {r.build_s:>8.1f} {r.matches:>10.1f} {r.cdm_batch:>15,.0f} {r.cdm_single:>11,.0f} "
            f"{r.brute_batch:>12,.0f} {r.brute_single:>13,.0f} {r.cdm_batch / r.brute_batch:>11,.0f}x "
            f"{r.cdm_single / r.brute_single:>12,.0f}x {'yes' if r.agree else 'NO':>6}"
        )
    for r in rows:
        if r.size in TARGETS:
            ok = "met" if r.cdm_batch >= TARGETS[r.size] else "MISSED"
            lines.append(f"target at {r.size:,} subscriptions: >= {TARGETS[r.size]:,} events/s batched -- {ok}")
    return "\n".join(lines)


def plot(rows: Sequence[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r.size for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, attr, style in (
        ("CDM batched", "cdm_batch", "o-"),
        ("CDM one at a time", "cdm_single", "o--"),
        ("brute force batched", "brute_batch", "s-"),
        ("brute force one at a time", "brute_single", "s--"),
    ):
        ax.plot(sizes, [getattr(r, attr) for r in rows], style, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("stock subscriptions")
    ax.set_ylabel("events matched per second (one core)")
    ax.set_title("CDM counting index vs brute force")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(prog="python -m loadtest.bench_match", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="14029,150000,1000000", help="numbers of subscriptions, comma separated")
    ap.add_argument("--events", type=int, default=50_000, help="events matched batched by CDM")
    ap.add_argument("--single", type=int, default=5_000, help="events matched one at a time by CDM")
    ap.add_argument("--brute", type=int, default=400, help="events matched by the brute force (it is slow)")
    ap.add_argument("--out", default="out/bench_match", help="directory for the plot")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    print(f"CDM vs brute force, stock workload, one core (pid {os.getpid()}); uniform events")
    rows = []
    for size in sizes:
        rows.append(measure(size, args.events, min(args.single, args.events), min(args.brute, args.events)))
        print(f"  measured {size:,} subscriptions", flush=True)
    print(table(rows))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot(rows, out / "bench_match.png")
    print(f"plot: {out / 'bench_match.png'}")
    return rows


if __name__ == "__main__":
    main()
