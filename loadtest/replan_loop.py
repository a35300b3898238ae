"""The control loop measured end to end: 4 matcher processes, 150k stock subscriptions
(Meghdoot section 5), the default plan, then `echelon replan`, under a steady Match load.

    python -m loadtest.replan_loop [--subscriptions 150000] [--phase 30] [--streams 4] [--out DIR]

Subscriptions are registered with the matcher tier directly (Matcher.Register through one
entry, as agents do); the load is `--streams` Match streams per matcher, each sending
batches of uniform stock events back to back (one batch in flight per stream). Every second the run records each matcher process's
CPU seconds (/proc/<pid>/stat) and the events answered. Phases: `before` on the default
plan; then `echelon replan` runs as a child process (the real CLI, scraping the cluster's
/metrics while the load goes on) and the matchers hand off; `after` starts once every
matcher routes with the new plan (if the handoff is still going when replan returns, the
load pauses until it is done, so `after` measures the new plan, not the handoff). Prints
matched events/s of the tier and the largest matcher's share of the tier's CPU, before and
after, with ratios, and how many layouts each matcher adopted and how many suspicions
membership logged (a settled switch: two layouts each, default then plan); writes
replan_loop.png (per-matcher CPU over time, the push and the settled switch marked).

Before layouts were keyed by process lifetime (runtime.member), a starved matcher's late
Sync answer was reported as evidence, it refuted with a new incarnation, and every
refutation started another layout: at 150k subscriptions the tier adopted ~100 layouts in
3 minutes and never settled.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import grpc

from echelon.client import Client
from echelon import launch
from echelon.contract.transport import PLAIN
from echelon.contract.wire import attributes_to_pb, filter_to_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import matcher_pb2_grpc as xgrpc
from loadtest import stock

TOPIC = "quotes"
BATCH = 200
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def register(address: str, n: int) -> None:
    filters = stock.subscriptions(n, seed=5)
    async with PLAIN.dial(address) as ch:
        stub = xgrpc.MatcherStub(ch)
        for start in range(0, n, 2000):
            subs = [xpb.Subscription(id=f"load/s{i}", agent="agent-0", topic=TOPIC, filter=filter_to_pb(filters[i]))
                    for i in range(start, min(n, start + 2000))]
            await stub.Register(xpb.RegisterRequest(subscriptions=subs), timeout=120)


async def layouts(addresses: list[str]) -> set[tuple[str, str, str]]:
    out = set()
    for a in addresses:
        async with PLAIN.dial(a) as ch:
            r = await xgrpc.MatcherStub(ch).ListZones(xpb.ListZonesRequest(topic=TOPIC), timeout=10)
        out |= {(t.active, t.pending, t.source) for t in r.topics}
    return out


async def wait_source(addresses: list[str], prefix: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            ls = await layouts(addresses)
            if len(ls) == 1 and not next(iter(ls))[1] and next(iter(ls))[2].startswith(prefix):
                return
        except grpc.aio.AioRpcError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"matchers did not settle on {prefix!r} within {timeout:.0f}s")
        await asyncio.sleep(0.5)


class Load:
    """`streams` Match streams per matcher entry, batches back to back; counts events answered.
    Cleared `running` holds the streams between batches (while the matchers hand off)."""

    def __init__(self, addresses: list[str], streams: int):
        self.addresses = addresses * streams
        self.answered = 0
        self.matches = 0
        self.stop = asyncio.Event()
        self.running = asyncio.Event()
        self.running.set()
        events = stock.events(4000, seed=9)
        self.batches = [[pb.Event(topic=TOPIC, attributes=attributes_to_pb(e)) for e in events[i:i + BATCH]]
                        for i in range(0, len(events), BATCH)]

    async def stream(self, address: str) -> None:
        async with PLAIN.dial(address) as ch:
            call = xgrpc.MatcherStub(ch).Match()
            k = 0
            while not self.stop.is_set():
                await self.running.wait()
                await call.write(xpb.MatchRequest(batch_id=k + 1, events=self.batches[k % len(self.batches)]))
                r = await call.read()
                self.answered += len(r.results)
                self.matches += sum(len(a.subscriptions) for res in r.results for a in res.agents)
                k += 1
            await call.done_writing()

    async def run(self) -> None:
        await asyncio.gather(*(self.stream(a) for a in self.addresses))


async def measure(args) -> dict:
    # A 1 s heartbeat (DEAD after 35 s of silence): the load saturates the machine's cores,
    # and a starved process declared dead would rejoin in a new lifetime, a new layout.
    # A long matcher deadline too: a starved peer answers its holder-mode Match requests late.
    slow = ["--beat-interval", "1.0"]
    c = launch.Cluster(agents=1, matchers=4, memberships=1, placement=launch.Loopback(0), log_dir=args.out / "logs",
                       extra={"membership": slow, "matcher": [*slow, "--deadline", "60"], "agent": slow})
    samples: list[dict] = []
    marks: dict[str, float] = {}
    try:
        await c.start()
        matchers = c.by_role("matcher")
        addresses = [m.address for m in matchers]
        membership = c.by_role("membership")[0].address
        client = Client(c.by_role("agent")[0].address)
        await client.create_topic(TOPIC, stock.STOCK_SCHEMA)
        await client.close()
        t0 = time.monotonic()
        await register(addresses[0], args.subscriptions)
        await wait_source(addresses, "default", 600)
        print(f"registered {args.subscriptions} subscriptions in {time.monotonic() - t0:.0f}s", flush=True)
        load = Load(addresses, args.streams)
        runner = asyncio.create_task(load.run())
        start = time.monotonic()

        async def sampler() -> None:
            while not load.stop.is_set():
                samples.append({"t": time.monotonic() - start, "answered": load.answered,
                                "cpu": {m.id: cpu_seconds(m.pid) for m in matchers}})
                await asyncio.sleep(1.0)

        sampling = asyncio.create_task(sampler())
        await asyncio.sleep(args.phase)
        marks["replan"] = time.monotonic() - start
        cmd = [sys.executable, "-m", "echelon", "replan", "--membership", membership, "--window", "6s",
               "--step", "2s", "--master", "local[2]"]
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.DEVNULL)
        out, _ = await proc.communicate()
        marks["pushed"] = time.monotonic() - start
        print(out.decode(), flush=True)
        if proc.returncode != 0:
            raise RuntimeError(f"replan exited with {proc.returncode}")
        load.running.clear()  # the handoff gets the cores; see the module doc
        await wait_source(addresses, "plan", 900)
        load.running.set()
        marks["settled"] = time.monotonic() - start
        await asyncio.sleep(args.phase)
        marks["end"] = time.monotonic() - start
        load.stop.set()
        await sampling
        await runner
        return {"samples": samples, "marks": marks, "matchers": [m.id for m in matchers]}
    finally:
        c.stop()


def phase(samples: list[dict], a: float, b: float) -> tuple[float, dict[str, float]]:
    """(events/s answered, CPU seconds per matcher) between times a and b."""
    inside = [s for s in samples if a <= s["t"] <= b]
    first, last = inside[0], inside[-1]
    dt = last["t"] - first["t"]
    return (last["answered"] - first["answered"]) / dt, {m: last["cpu"][m] - first["cpu"][m] for m in first["cpu"]}


def churn(logs: Path) -> tuple[dict[str, int], int]:
    """(layouts adopted per matcher, suspicions membership logged), from the run's logs."""
    adopted = {f.stem: f.read_text().count("adopted layout") for f in sorted(logs.glob("matcher-*.log"))}
    return adopted, sum(f.read_text().count("alive -> suspect") for f in logs.glob("membership-*.log"))


def report(result: dict, out: Path) -> str:
    s, mk = result["samples"], result["marks"]
    rate_b, cpu_b = phase(s, 2.0, mk["replan"])
    rate_a, cpu_a = phase(s, mk["settled"], mk["end"])
    share_b, share_a = max(cpu_b.values()) / sum(cpu_b.values()), max(cpu_a.values()) / sum(cpu_a.values())
    lines = [f"{'':<34}{'before':>10}{'after':>10}{'ratio':>8}",
             f"{'matched events/s (whole tier)':<34}{rate_b:>10.0f}{rate_a:>10.0f}{rate_a / rate_b:>8.2f}",
             f"{'max matcher CPU share':<34}{share_b:>10.2f}{share_a:>10.2f}{share_a / share_b:>8.2f}",
             "per matcher CPU seconds/s: "
             + ", ".join(f"{m} {cpu_b[m] / (mk['replan'] - 2):.2f} -> {cpu_a[m] / (mk['end'] - mk['settled']):.2f}"
                         for m in sorted(cpu_b)),
             f"replan ran {mk['pushed'] - mk['replan']:.0f}s; the switch settled {mk['settled'] - mk['pushed']:.0f}s "
             "after the push"]
    adopted, suspicions = churn(out / "logs")
    lines.append("layouts adopted: " + ", ".join(f"{m} {n}" for m, n in adopted.items())
                 + f"; suspicions: {suspicions}")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4))
    ts = [x["t"] for x in s]
    for m in result["matchers"]:
        cpu = [x["cpu"][m] for x in s]
        ax.plot(ts[1:], [(cpu[i] - cpu[i - 1]) / (ts[i] - ts[i - 1]) for i in range(1, len(ts))], label=m)
    for name, colour in (("replan", "grey"), ("pushed", "red"), ("settled", "green")):
        ax.axvline(mk[name], color=colour, linestyle="--", label=f"{name} ({mk[name]:.0f}s)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("matcher CPU (cores)")
    ax.set_title("Per-matcher load, default plan -> echelon replan")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "replan_loop.png", dpi=120)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--subscriptions", type=int, default=150_000)
    p.add_argument("--phase", type=float, default=30.0, help="seconds of load before and after")
    p.add_argument("--streams", type=int, default=4, help="Match streams per matcher entry (batches in flight)")
    p.add_argument("--out", type=Path, default=Path("out/replan_loop"))
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(measure(args))
    (args.out / "replan_loop.json").write_text(json.dumps(result))
    print(report(result, args.out))


if __name__ == "__main__":
    main()
