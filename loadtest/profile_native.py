"""Where every process's CPU goes at saturation, below Python (docs/performance.md): one saturation
cell (batch publish acked at DELIVERED, 1 publisher, 2% selectivity or `--selectivity 20`; `--rate N`: a
cell paced at N events/s instead) of the bench_events cluster, and per process (the load generator too):

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

`--spy native` runs a second saturation cell with `py-spy record --native` on every process
(`--spy-only agent-0 ...`: those alone) and charges each sample to its owner: the innermost
frame that is not the interpreter or libc. A Python frame owns the interpreter's work under
it (its bytecode and the builtins it calls: what compiling it would remove), so Echelon's
functions are listed by name beside grpc (grpc.aio's Cython and gRPC core), protobuf (upb),
the cyclic GC, asyncio, uvloop; a thread blocked in a wait is left out. Each sample stops the
process while py-spy unwinds it, so the cell runs slower (fewer events a batch) and the GC
looks bigger than perf shows. `--spy python` (`--nonblocking`, Python frames only) does not
stop them: a Python function then owns the native calls it makes too (protobuf's, gRPC's),
and native code under the loop or a thread is one bucket. py-spy cannot see the kernel;
perf's split above gives that.

`python -m loadtest.profile_native [--seconds 8] [--top 8] [--mode batch-DELIVERED] [--selectivity 2|20]
[--spy python|native [--spy-only PROCESS ...]]`; run from a worktree with its `.venv`.
Absolute figures move with the machine's load; the shares are what to read.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
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


NATIVE = (("grpc", ("cygrpc", "grpc", ".pyx", ".pxi", "chttp2", "iomgr", "absl")), ("protobuf", ("upb", "_message", "protobuf")),
          ("uvloop", ("uvloop", "libuv")), ("asyncio", ("_asynciomodule",)), ("gc", ("gc_collect",)), ("numpy", ("numpy", "multiarray")))
PYTHON = (("echelon", "echelon/"), ("grpc", "grpc/"), ("protobuf", "google/protobuf"), ("asyncio", "asyncio/"),
          ("uvloop", "uvloop/"))


# Without --native, a sample whose last Python frame is one of these runs native code: the
# event loop's callbacks (uvloop, grpc.aio's Cython) or gRPC's poller thread.
NATIVE_UNDER = ("Runner.run (asyncio/runners.py", "Thread.run (threading.py", "run (echelon/runtime/loop.py")
# A thread blocked in one of these is waiting, not working: py-spy --native samples it anyway.
WAITS = ("poll (", "epoll_wait (", "epoll_pwait (", "select (", "syscall (", "pthread_cond_wait", "pthread_cond_timedwait",
         "sem_wait", "sem_timedwait", "nanosleep (", "__futex_abstimed_wait")


def owner(stack: list[str]) -> str:
    """The component a py-spy --native sample's CPU belongs to (the module docstring): an
    Echelon frame is named "echelon module:function"; "waiting" for a blocked thread."""
    if stack and stack[-1].startswith(WAITS):
        return "waiting"
    if stack and stack[-1].startswith(NATIVE_UNDER):  # Python frames only: native code below the loop or a thread
        return "native under the loop or a thread"
    for frame in reversed(stack):
        where = frame[frame.rfind("(") + 1:].rstrip(")")
        if ".py:" in where:
            path = where.rpartition(":")[0]
            for group, needle in PYTHON:
                if needle in path:
                    if group == "echelon":
                        func = frame[:frame.rfind(" (")]
                        return f"echelon {path.split('echelon/', 1)[1].removesuffix('.py')}:{func}"
                    return group
            return "other Python"
        for group, needles in NATIVE:
            if any(n in frame for n in needles):  # the library, or the function (the GC's)
                return group
    return "interpreter/libc (no Python frame)"


def spy_shares(raw: Path, top: int) -> dict:
    counts: collections.Counter = collections.Counter()
    for line in raw.read_text().splitlines() if raw.exists() else []:
        stack, _, n = line.rpartition(" ")
        if n.isdigit():
            counts[owner(stack.split(";"))] += int(n)
    waiting = counts.pop("waiting", 0)
    total = sum(counts.values()) or 1
    ours = sum(n for k, n in counts.items() if k.startswith("echelon "))
    groups = collections.Counter({"echelon (all)": ours})
    for k, n in counts.items():
        if not k.startswith("echelon "):
            groups[k] += n
    return {"samples": sum(counts.values()), "waiting": waiting,
            "groups": [(k, 100 * n / total) for k, n in groups.most_common()],
            "echelon": [(k, 100 * n / total) for k, n in counts.most_common() if k.startswith("echelon ")][:top]}


async def spied(run, system, pool, subs, mode: str, seconds: float, out: Path, top: int, native: bool,
                only: list[str], selectivity: int = 2, rate: int | None = None) -> None:
    """One more cell like the first (saturation, or `rate`), py-spy on every service process (or
    those named in `only`: fewer samplers, less of the machine taken from the cluster)."""
    exe = str(Path(sys.executable).parent / "py-spy")
    sends = await system.publishers(1, mode, pool)
    pids = {name: pid for name, pid in system.pids().items() if not only or name in only}
    how = ["--native", "--rate", "50"] if native else ["--nonblocking", "--rate", "100"]
    spies = {name: subprocess.Popen([exe, "record", *how, "--pid", str(pid), "--duration", str(int(seconds)),
                                     "--format", "raw", "--output", str(out / f"{name}.raw")],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for name, pid in pids.items()}
    row = await run.cell(system, sends, rate, pool, subs, {"system": "echelon", "mode": mode, "selectivity": selectivity,
                                                            "publishers": 1})
    await system.close_publishers()
    for spy in spies.values():
        try:
            spy.wait(timeout=seconds + 60)
        except subprocess.TimeoutExpired:
            spy.kill()
    print(f"\npy-spy {how[0]}, {row['published_per_s']:,.0f} events/s; % of each process's samples by owner"
          + (" (the sampler pauses each process: slower than the cell above)" if native else ""))
    result = {name: spy_shares(out / f"{name}.raw", top) for name in pids}
    for name, r in sorted(result.items(), key=lambda kv: -kv[1]["samples"]):
        if r["samples"] < 50:
            continue
        print(f"\n{name} ({r['samples']} samples working, {r['waiting']} waiting): " + "; ".join(f"{k} {v:.1f}%" for k, v in r["groups"] if v >= 0.5))
        for k, v in r["echelon"]:
            print(f"    {v:5.1f}%  {k}")
    (out / "spy.json").write_text(json.dumps(result))


async def profile(seconds: float, top: int, mode: str = "batch-DELIVERED", spy: str = "",
                  only: list[str] | None = None, selectivity: int = 2, rate: int | None = None) -> None:
    from echelon.runtime import loop
    from loadtest.bench_events.run import Run, parse
    from loadtest.bench_events.systems import SYSTEMS
    from loadtest.bench_events.workload import Pool, subscriptions

    out = Path(tempfile.mkdtemp(prefix="profile_native."))
    run = Run(parse(["--out", str(out), "--seconds", str(seconds), "--max-events", "10000000"]))
    system = SYSTEMS["echelon"](out / "logs")
    await system.start()
    try:
        subs = subscriptions(selectivity, run.args.subs)
        pool = Pool.draw(subs)
        await system.open_subs(subs, pool, run.deliver)
        await run.warm_up(system, subs, pool)
        loop.started()
        sends = await system.publishers(1, mode, pool)
        pids = {**system.pids(), "loadgen": os.getpid()}
        perf = None
        if shutil.which("perf"):
            perf = subprocess.Popen(["perf", "record", "-q", "-F", "499", "-p", ",".join(map(str, pids.values())),
                                     "-o", str(out / "perf.data"), "--", "sleep", str(seconds)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        before = threads(pids)
        row = await run.cell(system, sends, rate, pool, subs, {"system": "echelon", "mode": mode,
                                                                "selectivity": selectivity, "publishers": 1})
        after = threads(pids)
        await system.close_publishers()
        if perf is not None:
            perf.wait(timeout=120)
        if spy:
            await spied(run, system, pool, subs, mode, seconds, out, top, spy == "native", only or [], selectivity, rate)
        await system.close_subs()
    finally:
        await system.stop()
    per_k = row["events"] / 1000
    print(f"{'saturation' if rate is None else f'{rate:,}/s:'} {row['published_per_s']:,.0f} events/s, {row['events']:,} events; "
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
    ap.add_argument("--mode", default="batch-DELIVERED", help="the publishers of the cell (bench_events' modes)")
    ap.add_argument("--spy", choices=("python", "native"), default="",
                    help="a second cell with py-spy on every process: Python frames only (--nonblocking: "
                         "the processes run on), or --native (each sample pauses the process)")
    ap.add_argument("--spy-only", nargs="+", default=[], metavar="PROCESS", help="with --spy: only these (agent-0 ...)")
    ap.add_argument("--selectivity", type=int, choices=(2, 20), default=2, help="the stock workload's selectivity, %%")
    ap.add_argument("--rate", type=int, default=None, help="events/s of the cell (default: saturation)")
    args = ap.parse_args(argv)
    from echelon.runtime.loop import run

    run(profile(args.seconds, args.top, args.mode, args.spy, args.spy_only, args.selectivity, args.rate))


if __name__ == "__main__":
    main()
