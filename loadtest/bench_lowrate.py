"""The latency at fixed rates (docs/performance.md, "Small events"), this tree against a base
revision, side by side:
`python -m loadtest.bench_lowrate --base main --rounds 3`
(`--rates 1000 10000 --publishers 1 --modes batch-DELIVERED raw-DELIVERED` for latency under load).

Every 1,000/s cell of `make bench-events` (2% and 20% selectivity, 1 and 4 publishers,
every mode; `--selectivity 2` for half of them; `--rates`, `--publishers`, `--modes` choose),
on whole clusters of the base revision (its `services/echelon/` and `loadtest/` unpacked as
bench_hotpath does) and of this tree, alternating (base, head, base, head...): each round
one child process per tree builds bench_events' cluster and runs the cells with that
tree's driver. Per cell: the median over rounds of p50 and p99, the load generator's
stream messages per event (publish acks, Delivery messages, subscriber acks: at 1,000/s
every event travels nearly alone, so the messages are the cost) and the services' CPU per
1,000 events. The machine is shared with whatever else runs: only the ratios of one run
mean anything, and a round that met a busy moment shows in its column ("per round").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MESSAGES = (("publish read", "pub acks"), ("read", "deliveries"), ("written", "sub acks"))


def child(seconds: float, selectivity: list[int], rates: list[str], publishers: list[int], modes: list[str]) -> None:
    # Run as a script: this directory first on sys.path, `echelon` and `loadtest` from
    # PYTHONPATH (either tree's), as bench_hotpath's children.
    from hotpath_cluster import _count_subscribe_messages

    from echelon.runtime import loop
    from loadtest.bench_events.run import Run, parse
    from loadtest.bench_events.systems import MODES, SYSTEMS
    from loadtest.bench_events.workload import Pool, subscriptions

    count = _count_subscribe_messages()

    async def cells() -> list[dict]:
        out = Path(tempfile.mkdtemp(prefix="bench_lowrate."))
        run = Run(parse(["--systems", "echelon", "--seconds", str(seconds), "--out", str(out)]))
        system = SYSTEMS["echelon"](out / "logs")
        await system.start()
        rows = []
        try:
            for sel in selectivity:
                subs = subscriptions(sel, run.args.subs)
                pool = Pool.draw(subs)
                await system.open_subs(subs, pool, run.deliver)
                await run.warm_up(system, subs, pool)
                loop.started()
                for npub in publishers:
                    for mode in [m for m in MODES["echelon"] if not modes or m in modes]:
                        sends = await system.publishers(npub, mode, pool)
                        for rate in [None if r == "max" else int(r) for r in rates]:
                            before = dict(count)
                            row = await run.cell(system, sends, rate, pool, subs, {
                                "system": "echelon", "mode": mode, "selectivity": sel, "publishers": npub})
                            events = max(row["events"], 1)
                            rows.append({"cell": f"{sel:>2}% {npub}p {rate or 'max':>5}/s {mode}", "p50": row["p50_ms"],
                                         "p99": row["p99_ms"], "cpu": 1000 * row["cpu_s_per_1k_services"],
                                         "rate": row["published_per_s"],
                                         **{name: (count[k] - before[k]) / events for k, name in MESSAGES}})
                        await system.close_publishers()
                await system.close_subs()
        finally:
            await system.stop()
        return rows

    print(json.dumps(loop.run(cells())))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m loadtest.bench_lowrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="main", help="the revision to compare with (default: main)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="publishing time per cell")
    ap.add_argument("--selectivity", type=int, nargs="+", default=[2, 20], choices=[2, 20])
    ap.add_argument("--rates", nargs="+", default=["1000"], help="events/s of the cells (`max`: saturation)")
    ap.add_argument("--publishers", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--modes", nargs="+", default=[], help="Echelon's modes (bench_events'; default: all)")
    ap.add_argument("--json", default="", help="also write every round's cells here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.seconds, args.selectivity, args.rates, args.publishers, args.modes)
        return
    from loadtest.bench_events.workload import cpu_waiting
    from loadtest.bench_hotpath import tree_env, unpack

    runs: dict[str, list[list[dict]]] = {"base": [], "head": []}
    short: dict[str, list[float]] = {"base": [], "head": []}  # per round: the share of it the machine was short of cores
    with tempfile.TemporaryDirectory(prefix="bench_lowrate.") as tmp:
        trees = {"base": str(unpack(args.base, Path(tmp))), "head": str(ROOT)}
        paths = {**trees, "head": os.pathsep.join((str(ROOT / "services"), str(ROOT)))}  # as bench_hotpath's
        for r in range(args.rounds):
            for tree in ("base", "head"):
                waiting0, t0 = cpu_waiting(), time.monotonic()
                out = subprocess.run([sys.executable, __file__, "--child", "--seconds", str(args.seconds),
                                      "--selectivity", *map(str, args.selectivity), "--rates", *map(str, args.rates),
                                      "--publishers", *map(str, args.publishers),
                                      *(["--modes", *args.modes] if args.modes else [])],
                                     env=tree_env(paths[tree]), cwd=trees[tree],
                                     capture_output=True, text=True, timeout=1800)
                if out.returncode:
                    raise SystemExit(f"{tree} child failed:\n{out.stderr}")
                runs[tree].append(json.loads(out.stdout.strip().splitlines()[-1]))
                if waiting0 is not None:
                    short[tree].append((cpu_waiting() - waiting0) / (time.monotonic() - t0))
            print(f"round {r + 1}/{args.rounds} done (load average {os.getloadavg()[0]:.1f})", file=sys.stderr,
                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(runs))
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.base], capture_output=True,
                         text=True).stdout.strip()
    print(report(runs, short, f"{', '.join(args.rates)} events/s, {args.rounds} alternating rounds of "
                       f"{args.seconds:g} s cells; "
                       f"base {args.base} ({rev}), head this tree; medians over rounds"))


def report(runs: dict[str, list[list[dict]]], short: dict[str, list[float]], title: str) -> str:
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    lines = [title, f"{'cell':35} {'p50 base':>8} {'head':>6} {'p99 base':>8} {'head':>6}   "
             + "   ".join(f"{name} base/head" for _, name in MESSAGES) + "   cpu ms/1k base/head   published/s base/head"]
    for i, first in enumerate(runs["head"][0]):
        b, h = [rows[i] for rows in runs["base"]], [rows[i] for rows in runs["head"]]
        lines.append(f"{first['cell']:35} {med(b, 'p50'):8.2f} {med(h, 'p50'):6.2f} {med(b, 'p99'):8.2f} "
                     f"{med(h, 'p99'):6.2f}   "
                     + "   ".join(f"{med(b, name):{len(name) + 5}.2f}/{med(h, name):.2f}" for _, name in MESSAGES)
                     + f"   {med(b, 'cpu'):9.0f}/{med(h, 'cpu'):<5.0f}"
                     + (f"   {med(b, 'rate'):10.0f}/{med(h, 'rate'):.0f}" if "rate" in first else ""))
    for k in ("p50", "p99"):
        for tree in ("base", "head"):
            means = [statistics.fmean(r[k] for r in rows) for rows in runs[tree]]
            worst = [max(r[k] for r in rows) for rows in runs[tree]]
            met = " ".join(f"{sum(r['p50'] < 3 and r['p99'] < 15 for r in rows)}/{len(rows)}" for rows in runs[tree])
            lines.append(f"{tree:4} {k}: per round, the mean over cells {' '.join(f'{v:.2f}' for v in means)}, the "
                         f"worst {' '.join(f'{v:.2f}' for v in worst)}"
                         + (f"; cells under p50 3 ms and p99 15 ms {met}" if k == "p99" else ""))
    for tree in ("base", "head"):
        if short.get(tree):
            lines.append(f"{tree}: the machine short of cores (/proc/pressure/cpu, some) per round "
                         + " ".join(f"{100 * v:.0f}%" for v in short[tree]))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
