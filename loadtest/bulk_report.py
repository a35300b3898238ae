"""Tables and plots of the bulk experiment (`loadtest.bulk`).

Speedups are ratios measured side by side in one run: every mode against the p2p round
of the same size and subscriber count. The ideal bounds (docs/papers.md, "LBDD") for N
receivers with equal upload u and data F: point-to-point N*F/u, a pipelined binary tree
about 2F/u (speedup N/2), a striped multi-tree or swarm about F/u (speedup N). An LBDD
tree is pipelined but its busiest node uploads one copy per child, so this tree's own
bound is N / (max out-degree).
"""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console(width=None if sys.stdout.isatty() else 120)  # tables stay readable in logs
MB = 1 << 20


def _reference(rounds: list, r) -> tuple[float | None, str]:
    """The p2p time to compare r with: measured in this run, else the ideal N*F/u."""
    p2p = next((x for x in rounds if x.mode == "p2p" and x.subscribers == r.subscribers and x.size == r.size
                and x.ok), None)
    if p2p:
        return p2p.seconds, "measured side by side"
    return r.subscribers * r.size * 8 / (r.rate_mbit * 1e6), "vs the ideal p2p time N*F/u: p2p did not run"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _cpu(r) -> str:
    """Python is the limit where one service process nears a whole core."""
    if not r.cpu:
        return "-"
    busiest = max(r.cpu, key=r.cpu.get)
    return (f"busiest service {busiest} {_pct(r.cpu[busiest])} of a core; all services "
            f"{sum(r.cpu.values()):.2f} cores; machine {_pct(r.cpu_busy)} busy (shared with other work)")


def mode_table(r, rounds: list, labels: dict[str, str]) -> Table:
    n, f, u = r.subscribers, r.size, r.rate_mbit
    once = f * 8 / (u * 1e6)  # one copy of the payload through one uplink, seconds
    t = Table(title=f"{labels.get(r.mode, r.mode)}: {f / MB:g} MiB to {n} subscribers, uploads {u:g} Mbit/s",
              show_header=False, title_justify="left")
    t.add_column("metric", style="bold")
    t.add_column("value")
    if not r.ok:
        t.add_row("result", f"[red]FAILED[/]: {'; '.join(r.errors[:4])}")
    else:
        ref, how = _reference(rounds, r)
        speedup, bound = ref / r.seconds, n / r.busiest_copies
        t.add_row("completion time", f"{r.seconds:.1f} s  (ideal: p2p N*F/u {n * once:.1f} s, tree 2F/u "
                                     f"{2 * once:.1f} s, swarm F/u {once:.1f} s)")
        t.add_row("distribution rate", f"{r.rate:.2f} Mbit/s per subscriber  ({r.rate * n:.1f} Mbit/s delivered "
                                       f"in all, {100 * r.rate * n / u:.0f}% of one uplink)")
        t.add_row("speedup over p2p", f"[bold]{speedup:.2f}x[/]  ({how})")
        trees = "" if r.mode == "p2p" else (f"; these trees N / busiest node's copies = {bound:.2f}x "
                                             f"(reached: {_pct(speedup / bound)})")
        t.add_row("ideal bounds", f"tree N/2 = {n / 2:.1f}x, swarm N = {n}x{trees}")
        t.add_row("publisher's share of bytes sent",
                  f"{_pct(r.pub_share)} by interface counters, {_pct(r.pub_relay_share)} by the agents' "
                  f"echelon_relay_sent_bytes_total")
        t.add_row("publisher's uplink load", f"{_pct(r.pub_load)} of {u:g} Mbit/s over the transfer")
        t.add_row("network events", f"{r.link_breaks} relay streams broke (and resent their window); uplink "
                                    f"qdiscs refused {r.drops} packets (at the sender: TCP retries at once)")
        t.add_row("CPU", _cpu(r))
        t.add_row("bytes on the wire / payload", f"{r.wire_copies:.2f} (all hosts' uploads; {n} copies are "
                                                 f"the minimum)")
    stripes = f"; {len(r.depths)} stripes, depths {min(r.depths)}-{max(r.depths)}" if len(r.depths) > 1 else ""
    if r.mode == "p2p":
        t.add_row("LBDD tree (build_tree)", f"not used here; the same hosts' tree has depth {r.depth}")
    else:
        t.add_row("LBDD tree (build_tree)", f"depth {r.depth}{stripes}; copies of each slice sent by the publisher "
                                            f"{r.root_copies:.2f}, by the busiest node {r.busiest_copies:.2f}")
    if r.incidents:
        t.add_row("view changes mid-transfer", "[yellow]" + ", ".join(r.incidents) + "[/]")
    t.add_row("payload verified", f"{r.verified}/{n} subscribers hold the exact payload (SHA-256); "
                                  f"{r.duplicates} duplicates, {r.reordered} out of order")
    return t


def summary_table(rounds: list, labels: dict[str, str]) -> Table:
    t = Table(title="Side by side", title_justify="left")
    for col in ("mode", "subscribers", "time s", "Mbit/s per sub", "speedup", "pub share", "pub load", "busiest CPU",
                "verified"):
        t.add_column(col, justify="right" if col != "mode" else "left")
    for r in rounds:
        ref, _ = _reference(rounds, r)
        t.add_row(labels.get(r.mode, r.mode), str(r.subscribers), f"{r.seconds:.1f}" if r.ok else "FAILED",
                  f"{r.rate:.2f}" if r.ok else "-", f"{ref / r.seconds:.2f}x" if r.ok else "-", _pct(r.pub_share),
                  _pct(r.pub_load), _pct(max(r.cpu.values(), default=None)), f"{r.verified}/{r.subscribers}")
    return t


def sweep_table(rounds: list, labels: dict[str, str]) -> Table:
    modes = list(dict.fromkeys(r.mode for r in rounds))
    size = rounds[0].size
    t = Table(title=f"Sweep: {size / MB:g} MiB, Mbit/s per subscriber / publisher uplink load", title_justify="left")
    t.add_column("subscribers", justify="right")
    for m in modes:
        t.add_column(labels.get(m, m), justify="right")
    for n in sorted({r.subscribers for r in rounds}):
        row = [str(n)]
        for m in modes:
            r = next((x for x in rounds if x.mode == m and x.subscribers == n), None)
            row.append("-" if r is None else "FAILED" if not r.ok else f"{r.rate:.1f} / {_pct(r.pub_load)}")
        t.add_row(*row)
    return t


def plot(rounds: list, labels: dict[str, str], out: Path) -> list[Path]:
    """Fig. 2 (distribution rate vs subscribers) and Fig. 3 (publisher's load vs subscribers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rounds if r.ok]
    if not ok:
        return []
    u = ok[0].rate_mbit
    ns = sorted({r.subscribers for r in ok})
    modes = list(dict.fromkeys(r.mode for r in ok))
    paths = []
    for name, ylabel, value, ideals in (
        ("fig2_distribution_rate.png", "distribution rate (Mbit/s per subscriber)", lambda r: r.rate,
         [("ideal p2p u/N", lambda n: u / n), ("ideal tree u/2", lambda n: u / 2), ("ideal swarm u", lambda n: u)]),
        ("fig3_publisher_load.png", "publisher's uplink load (%)", lambda r: 100 * r.pub_load,
         [("saturated uplink", lambda n: 100.0)]),
    ):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for m in modes:
            pts = sorted((r.subscribers, value(r)) for r in ok if r.mode == m)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=labels.get(m, m))
        for (label, fn), style in zip(ideals, ("--", ":", "-.")):
            ax.plot(ns, [fn(n) for n in ns], color="0.45", linestyle=style, linewidth=1, label=label)
        ax.set_xlabel("subscribers")
        ax.set_ylabel(ylabel)
        ax.set_xticks(ns)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"{ok[0].size / MB:g} MiB, every upload {u:g} Mbit/s")
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def report(results: dict, out: Path) -> None:
    main, sweep = results["main"], results["sweep"]
    labels = results.get("labels") or {}
    for r in main:
        console.print(mode_table(r, main, labels))
    if len(main) > 1:
        console.print(summary_table(main, labels))
    for name, reason in results["skipped"].items():
        console.print(f"[yellow]{labels.get(name, name)} did not run: {reason}[/]")
    if sweep:
        console.print(sweep_table(sweep, labels))
        for p in plot(sweep, labels, out):
            console.print(f"wrote {p}")
    elapsed = f"total {results['elapsed'] / 60:.1f} min; " if results.get("elapsed") else ""
    console.print(f"{elapsed}results in {out / 'results.json'}")
