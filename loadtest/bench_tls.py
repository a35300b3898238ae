"""What mTLS costs (docs/performance.md, "What TLS costs"): small-event throughput and
delivery latency of the same
Echelon cluster with TLS off and on, side by side in one run. `make bench-tls` (a few
minutes) or `python -m loadtest.bench_tls --quick`.

Both clusters (4 agents, 3 matchers, 3 membership replicas: loadtest.bench_events's
`Echelon`, every process and client over mTLS in the second) run at once, and their
cells alternate (off, on, off, on, ...) so load from elsewhere on the machine falls on
both alike; each cell is loadtest.bench_events's (2% selectivity, 50 subscriptions,
16-byte payloads, a bounded window of events in flight). Per mode, publishers and rate,
the table gives the median over `--rounds` of published events/s and p50/p99 delivery
latency for each side, the CPU time of the cluster's processes per 1,000 events, and
on/off: the target is throughput on/off >= 0.85 at saturation ("max"). On a machine
shared with other work the saturation throughput follows the scheduler as much as the
code; CPU per event is what TLS costs wherever it runs (throughput at saturation on
dedicated cores is about cores / CPU per event).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from loadtest.bench_events.run import Run, fmt
from loadtest.bench_events.systems import Echelon
from loadtest.bench_events.workload import Pool, subscriptions

MODES = ("batch-ACCEPTED", "single-ACCEPTED")
RATES = (1000, None)  # None: saturation
TARGET = 0.85  # throughput with TLS / without, at saturation


async def bench(args: argparse.Namespace) -> list[dict]:
    run = Run(args)
    out = Path(args.out)
    systems = {tls: Echelon(out / "logs", tls=tls) for tls in (False, True)}
    subs = subscriptions(2, args.subs)
    pool = Pool.draw(subs)
    rows: list[dict] = []
    try:
        for system in systems.values():
            await system.start()
        for system in systems.values():
            await system.open_subs(subs, pool, run.deliver)
            await run.warm_up(system, subs, pool)
            # One sink for both: only the system whose cell runs publishes, and ids never repeat.
        for npub in args.publishers:
            for mode in MODES:
                sends = {tls: await s.publishers(npub, mode, pool) for tls, s in systems.items()}
                for rate in RATES:
                    for k in range(args.rounds):
                        for tls, system in systems.items():
                            meta = {"system": "echelon", "tls": tls, "mode": mode, "selectivity": 2,
                                    "publishers": npub, "round": k}
                            row = await run.cell(system, sends[tls], rate, pool, subs, meta)
                            rows.append(row)
                            print(f"tls {'on ' if tls else 'off'} {k}: " + _line(row), flush=True)
                for system in systems.values():
                    await system.close_publishers()
    finally:
        for system in systems.values():
            await system.stop()
    return rows


def _line(r: dict) -> str:
    return (f"{r['mode']:16} {r['publishers']}p {str(r['rate']):>5}: pub {r['published_per_s']:8.0f}/s "
            f"p50 {fmt(r['p50_ms'], '.2f')} p99 {fmt(r['p99_ms'], '.2f')} ms")


def summary(rows: list[dict]) -> list[dict]:
    """Medians per (mode, publishers, rate) and side, and the on/off ratios."""
    out = []
    keys = list(dict.fromkeys((r["mode"], r["publishers"], r["rate"]) for r in rows))
    for mode, npub, rate in keys:
        side = {}
        for tls in (False, True):
            cells = [r for r in rows if (r["mode"], r["publishers"], r["rate"], r["tls"]) == (mode, npub, rate, tls)]
            med = lambda k: statistics.median(v for c in cells if (v := c[k]) is not None) \
                if any(c[k] is not None for c in cells) else None  # noqa: E731
            side[tls] = {"pub": med("published_per_s"), "p50": med("p50_ms"), "p99": med("p99_ms"),
                         "cpu": med("cpu_s_per_1k_services")}
        off, on = side[False], side[True]
        out.append({"mode": mode, "publishers": npub, "rate": rate, "off": off, "on": on,
                    "throughput_on_off": on["pub"] / off["pub"] if off["pub"] else None,
                    "cpu_on_off": on["cpu"] / off["cpu"] if off["cpu"] else None,
                    "p99_on_off": on["p99"] / off["p99"] if off["p99"] and on["p99"] is not None else None})
    return out


def table(summary_rows: list[dict]) -> str:
    head = (f"{'mode':16} {'pubs':>4} {'rate':>5} {'pub/s off':>9} {'pub/s on':>9} {'on/off':>6} "
            f"{'p50 off':>7} {'p50 on':>7} {'p99 off':>7} {'p99 on':>7} {'p99 on/off':>10} "
            f"{'cpu ms/1k off':>13} {'on':>6} {'on/off':>6}")
    lines = [head, "-" * len(head)]
    for s in summary_rows:
        lines.append(f"{s['mode']:16} {s['publishers']:>4} {str(s['rate']):>5} {fmt(s['off']['pub'], '9.0f')} "
                     f"{fmt(s['on']['pub'], '9.0f')} {fmt(s['throughput_on_off'], '6.3f')} "
                     f"{fmt(s['off']['p50'], '7.2f')} {fmt(s['on']['p50'], '7.2f')} {fmt(s['off']['p99'], '7.2f')} "
                     f"{fmt(s['on']['p99'], '7.2f')} {fmt(s['p99_on_off'], '10.2f')} "
                     f"{fmt(s['off']['cpu'] and 1000 * s['off']['cpu'], '13.1f')} "
                     f"{fmt(s['on']['cpu'] and 1000 * s['on']['cpu'], '6.1f')} {fmt(s['cpu_on_off'], '6.3f')}")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m loadtest.bench_tls", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/bench_tls")
    ap.add_argument("--quick", action="store_true", help="tiny cells: structure only")
    ap.add_argument("--seconds", type=float, default=3.0, help="publishing time per cell")
    ap.add_argument("--max-events", type=int, default=200_000, help="events per cell at most")
    ap.add_argument("--drain", type=float, default=8.0, help="seconds a cell waits for acks and deliveries")
    ap.add_argument("--subs", type=int, default=50, help="subscriptions (2% selectivity each)")
    ap.add_argument("--rounds", type=int, default=3, help="cells per side and setting (medians are shown)")
    args = ap.parse_args(argv)
    args.publishers, args.check = [1, 4], False
    if args.quick:
        args.seconds, args.max_events, args.subs, args.rounds, args.publishers = 0.3, 600, 10, 1, [1]
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rows = asyncio.run(bench(args))
    s = summary(rows)
    print()
    print(table(s))
    sat = [x["throughput_on_off"] for x in s if x["rate"] == "max" and x["throughput_on_off"] is not None]
    if sat:
        worst = min(sat)
        print(f"\nsaturation throughput with TLS / without: worst {worst:.3f}, median {statistics.median(sat):.3f} "
              f"(target >= {TARGET}): {'MET' if worst >= TARGET else 'NOT MET'}")
    cpu = [x["cpu_on_off"] for x in s if x["cpu_on_off"] is not None]
    if cpu:
        print(f"CPU per event with TLS / without: median {statistics.median(cpu):.3f}, worst {max(cpu):.3f} "
              f"(throughput on dedicated cores ~ 1 / this: {1 / statistics.median(cpu):.3f})")
    (out / "bench_tls.json").write_text(json.dumps({"cells": rows, "summary": s, "args": vars(args),
                                                   "seconds": time.monotonic() - started}, indent=1))
    print(f"wrote {out / 'bench_tls.json'} in {time.monotonic() - started:.0f}s")
    return s


if __name__ == "__main__":
    main()
