"""What placing each service process on one CPU buys a whole cluster: `python -m loadtest.placement`.

The bench_events cluster (4 agents, 3 matchers, 3 membership replicas, 50 subscriptions,
one publisher on agent-0, `publish_batch` at DELIVERED) runs its cells alternating between
two placements of the same processes, round after round (free, pinned, pinned, free, ...):

- free: every thread may run on any CPU (the kernel places them);
- pinned: each service process's threads (its event loop, gRPC's poller, the metrics
  thread) on one CPU, the processes spread round-robin over the CPUs by name (agent-0 on
  the first, agent-1 on the second, ...). The load generator stays free.

A process's event loop and gRPC's poller take turns under the GIL, so one CPU costs them
no parallelism; on one CPU the poller's wakeup of the loop is a switch there instead of a
wakeup of another CPU (`python -m loadtest.grpc_echo --compare placement` measures that
alone). What the whole cluster gains is in docs/performance.md ("Where the cores go").
The kernel cannot move a pinned process off a busy CPU: this is a measurement, and the
way to get it in production is the orchestrator's (docs/operations.md).

`python -m loadtest.placement [--rounds 4] [--seconds 2] [--rates 1000 10000 max] [--selectivity 2]`
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
from pathlib import Path


def cpus_of(names: list[str]) -> dict[str, int]:
    """Round-robin over the CPUs this process may use, in the order of the names."""
    cpus = sorted(os.sched_getaffinity(0))
    order = sorted(names, key=lambda n: (n.split("-")[0] != "agent", n.split("-")[0] != "matcher", n))
    return {name: cpus[i % len(cpus)] for i, name in enumerate(order)}


def place(pids: dict[str, int], pinned: bool) -> None:
    allowed = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    on = cpus_of(list(pids))
    for name, pid in pids.items():  # -a: every thread of the process
        subprocess.run(["taskset", "-a", "-p", "-c", str(on[name]) if pinned else allowed, str(pid)],
                       check=True, stdout=subprocess.DEVNULL)


async def measure(rounds: int, seconds: float, rates: list[int | None], selectivity: int) -> None:
    from echelon.runtime import loop
    from loadtest.bench_events.run import Run, parse
    from loadtest.bench_events.systems import SYSTEMS
    from loadtest.bench_events.workload import Pool, subscriptions

    out = Path(tempfile.mkdtemp(prefix="placement."))
    run = Run(parse(["--out", str(out), "--seconds", str(seconds)]))
    system = SYSTEMS["echelon"](out / "logs")
    await system.start()
    rows: dict[tuple[bool, int | None], list[dict]] = {}
    load0 = os.getloadavg()[0]
    try:
        subs = subscriptions(selectivity, 50)
        pool = Pool.draw(subs)
        await system.open_subs(subs, pool, run.deliver)
        await run.warm_up(system, subs, pool)
        loop.started()
        sends = await system.publishers(1, "batch-DELIVERED", pool)
        print(f"pinned: {cpus_of(list(system.pids()))}", flush=True)
        for r in range(rounds):
            for pinned in (False, True) if r % 2 == 0 else (True, False):
                place(system.pids(), pinned)
                for rate in rates:
                    row = await run.cell(system, sends, rate, pool, subs, {})
                    rows.setdefault((pinned, rate), []).append(row)
                    print(f"round {r + 1} {'pinned' if pinned else 'free':6} {rate or 'max':>6}: "
                          f"{row['published_per_s']:8.0f}/s p50 {row['p50_ms']:7.2f} p99 {row['p99_ms']:7.1f} ms, "
                          f"services {row['cpu_s_per_1k_services'] * 1000:7.1f} ms/1k", flush=True)
        place(system.pids(), False)
        await system.close_publishers()
        await system.close_subs()
    finally:
        await system.stop()
    print(f"\nmedians of {rounds} alternating rounds, {selectivity}% selectivity, load average "
          f"{load0:.1f} -> {os.getloadavg()[0]:.1f} (gain: free / pinned for a cost, pinned / free for a rate)")
    print(f"{'rate':>6} {'events/s free':>14} {'pinned':>8} {'gain':>5} {'p50 free':>9} {'pinned':>7} "
          f"{'p99 free':>9} {'pinned':>7} {'CPU ms/1k free':>15} {'pinned':>7} {'gain':>5}")
    cpu = "cpu_s_per_1k_services"
    for rate in rates:
        def f(key: str, pinned: bool = False) -> float:
            return statistics.median(row[key] for row in rows[(pinned, rate)])

        def p(key: str) -> float:
            return f(key, True)
        print(f"{rate or 'max':>6} {f('published_per_s'):14.0f} {p('published_per_s'):8.0f} "
              f"{p('published_per_s') / f('published_per_s'):5.2f} {f('p50_ms'):9.2f} {p('p50_ms'):7.2f} "
              f"{f('p99_ms'):9.1f} {p('p99_ms'):7.1f} {f(cpu) * 1000:15.1f} {p(cpu) * 1000:7.1f} "
              f"{f(cpu) / p(cpu):5.2f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m loadtest.placement", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=2.0, help="publishing time per cell")
    ap.add_argument("--rates", nargs="+", type=lambda v: None if v == "max" else int(v), default=[1000, 10000, None])
    ap.add_argument("--selectivity", type=int, choices=(2, 20), default=2)
    args = ap.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2:
        ap.error("needs at least 2 CPUs (one CPU is one placement)")
    from echelon.runtime.loop import run

    run(measure(args.rounds, args.seconds, args.rates, args.selectivity))


if __name__ == "__main__":
    main()
