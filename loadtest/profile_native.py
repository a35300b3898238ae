"""Where every process's CPU goes at saturation, below Python (docs/performance.md): one saturation
cell (batch publish acked at DELIVERED, 1 publisher, 2% selectivity) of the bench_events
cluster, and per process (the load generator too):

- per thread kind, from /proc: CPU ms and context switches per 1,000 events of the main
  thread (the event loop: Echelon's Python, grpc.aio's Cython, protobuf, the socket calls
  it makes inline) and of gRPC core's own threads (`event_engine`: socket reads, timers;
  `python`: grpc.aio's completion-queue poller, which wakes the loop through a socket);
- with `perf` installed (Debian `linux-perf`), the on-CPU samples of each process split
  by shared object: the interpreter, protobuf (upb), libc (malloc, memcpy), the kernel
  (syscalls, context switches, page faults), gRPC (cygrpc: core and its Cython), uvloop.

py-spy cannot give this split: it names native work by the Python frame above it, and
waits in native code leak into its samples (`--native` puts 90% of the samples under
"Runner.run" in uvloop's epoll_pwait; the metrics thread's idle poll shows as
`_PollLikeSelector.select`), so "Runner.run" / "Thread.run" self time is partly waiting.

`python -m loadtest.profile_native [--seconds 8] [--top 8]`; run from a worktree with
its `.venv`. Absolute figures move with the machine's load; the shares are what to read.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

GROUPS = (("interpreter", "libpython"), ("protobuf", "_message"), ("libc", "libc.so"), ("kernel", "kernel"),
          ("grpc", "cygrpc"), ("uvloop", "/uvloop/"), ("asyncio", "_asyncio"))
TICK = os.sysconf("SC_CLK_TCK")


def threads(pids: dict[str, int]) -> dict[tuple[str, str], tuple[float, int]]:
    """(process, thread kind) -> (CPU seconds, context switches) so far."""
    out: dict[tuple[str, str], list] = collections.defaultdict(lambda: [0.0, 0])
    for name, pid in pids.items():
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            except OSError:  # the thread ended
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            switches = sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches:" in line)
            row = out[(name, "main" if int(tid) == pid else comm)]
            row[0] += (int(fields[11]) + int(fields[12])) / TICK
            row[1] += switches
    return {k: (v[0], v[1]) for k, v in out.items()}


def shares(data: Path, pids: dict[str, int], top: int) -> dict[str, dict]:
    """Per process: samples, share per GROUPS entry, and the top symbols."""
    names = {pid: name for name, pid in pids.items()}
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,pid,tid,ip,sym,dso"],
                            capture_output=True, text=True).stdout
    count: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    symbols: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in script.splitlines():
        m = re.match(r"\s*\S+\s+(\d+)/\d+\s+[0-9a-f]+\s+(.*?)\s*\(([^()]*)\)\s*$", line)
        if not m or int(m.group(1)) not in names:
            continue
        name, sym, dso = names[int(m.group(1))], m.group(2).split("+0x")[0], m.group(3)
        group = next((g for g, needle in GROUPS if needle in dso), "other")
        count[name][group] += 1
        count[name]["samples"] += 1
        symbols[name][f"{sym} [{group}]"] += 1
    return {name: {"samples": c["samples"],
                   "pct": {g: 100 * c[g] / c["samples"] for g, _ in GROUPS + (("other", ""),)},
                   "top": [(s, 100 * n / c["samples"]) for s, n in symbols[name].most_common(top)]}
            for name, c in count.items()}


async def profile(seconds: float, top: int) -> None:
    from echelon.runtime import loop
    from loadtest.bench_events.run import Run, parse
    from loadtest.bench_events.systems import SYSTEMS
    from loadtest.bench_events.workload import Pool, subscriptions

    out = Path(tempfile.mkdtemp(prefix="profile_native."))
    run = Run(parse(["--out", str(out), "--seconds", str(seconds), "--max-events", "10000000"]))
    system = SYSTEMS["echelon"](out / "logs")
    await system.start()
    try:
        subs = subscriptions(2, run.args.subs)
        pool = Pool.draw(subs)
        await system.open_subs(subs, pool, run.deliver)
        await run.warm_up(system, subs, pool)
        loop.started()
        sends = await system.publishers(1, "batch-DELIVERED", pool)
        pids = {**system.pids(), "loadgen": os.getpid()}
        perf = None
        if shutil.which("perf"):
            perf = subprocess.Popen(["perf", "record", "-q", "-F", "499", "-p", ",".join(map(str, pids.values())),
                                     "-o", str(out / "perf.data"), "--", "sleep", str(seconds)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        before = threads(pids)
        row = await run.cell(system, sends, None, pool, subs, {"system": "echelon", "mode": "batch-DELIVERED",
                                                                "selectivity": 2, "publishers": 1})
        after = threads(pids)
        await system.close_publishers()
        if perf is not None:
            perf.wait(timeout=120)
        await system.close_subs()
    finally:
        await system.stop()
    per_k = row["events"] / 1000
    print(f"saturation {row['published_per_s']:,.0f} events/s, {row['events']:,} events; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'process':14} {'thread':14} {'cpu ms/1k':>9} {'switches/1k':>11}")
    totals: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for key in sorted(after):
        cpu, switches = (a - b for a, b in zip(after[key], before.get(key, (0.0, 0))))
        totals[key[1]][0] += cpu
        totals[key[1]][1] += switches
        if cpu * 1000 / per_k >= 0.05:
            print(f"{key[0]:14} {key[1]:14} {cpu * 1000 / per_k:9.2f} {switches / per_k:11.1f}")
    for kind, (cpu, switches) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
        print(f"{'all':14} {kind:14} {cpu * 1000 / per_k:9.2f} {switches / per_k:11.1f}")
    if perf is None:
        print("perf not installed (apt-get install linux-perf): no split by shared object")
        return
    split = shares(out / "perf.data", pids, top)
    print(f"\non-CPU samples by shared object, % of each process's samples")
    print(f"{'process':14} {'samples':>7} " + " ".join(f"{g:>11}" for g, _ in GROUPS + (("other", ""),)))
    for name, s in sorted(split.items(), key=lambda kv: -kv[1]["samples"]):
        print(f"{name:14} {s['samples']:7d} " + " ".join(f"{v:11.1f}" for v in s["pct"].values()))
    for name, s in sorted(split.items(), key=lambda kv: -kv[1]["samples"]):
        if s["samples"] >= 100:
            print(f"\n{name}: " + "; ".join(f"{sym} {pct:.1f}%" for sym, pct in s["top"]))
    (out / "shares.json").write_text(json.dumps(split))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m loadtest.profile_native", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--top", type=int, default=8, help="symbols listed per busy process")
    args = ap.parse_args(argv)
    from echelon.runtime.loop import run

    run(profile(args.seconds, args.top))


if __name__ == "__main__":
    main()
