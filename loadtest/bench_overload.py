"""Overload: publishers offering more than the subscribers take, on real processes.

`python -m loadtest.bench_overload` (`make bench-overload`, 60 s; `--short`: a few
seconds, run by tests/integration/test_bench_overload.py). The launcher's cluster (1
membership replica, 1 matcher, 3 agents): two publishers (agent-0 and agent-1, DELIVERED)
offer events on an open-loop schedule of `--rate` per second each, at most `--window`
unacknowledged (when the window is full the publisher stalls: its schedule falls
behind, and the time it spends so is its stall time). Four subscribers on agent-2 take
everything, acking as fast as they can, one of each kind: ephemeral (lags past its
bound), named (lags), durable (lags past its own bound: its default policy), and
ephemeral-evict (chose eviction: closed past its bound, its loss counted). The agents run
with a small bound (`--bound` messages) so the bound is reached.

Prints offered / accepted (acked OK) / delivered rates, publisher stall time, peak RSS per
member (VmHWM), and per subscription kind the events acked OK that it never received
(after a drain): lost. The oracle is the publishers' acks: the target is 0 lost for the kinds that lag
(ephemeral, named, durable), every publish being DELIVERED, and memory bounded (peak RSS).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from echelon.client import AckLevel, Client, Durable, errors
from echelon.core.durability import holders
from echelon.launch import Cluster, Loopback

TOPIC = "overload"
KINDS = ("ephemeral", "named", "durable", "evict")
LAGGING = ("ephemeral", "named", "durable")  # the target: 0 lost
# agent-2's counts of chosen or stall-bound losses: evictions, stalls, shed, durable drops
COUNTERS = ("echelon_agent_backlog_overflows_total", "echelon_agent_subscription_stalls_total",
            "echelon_agent_backlog_shed_total", "echelon_durable_dropped_total")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Publisher:
    def __init__(self, name: str):
        self.name = name
        self.offered = 0
        self.acked: set[int] = set()
        self.failed = 0
        self.stall = 0.0

    async def run(self, address: str, rate: float, window: int, seconds: float) -> None:
        async with Client(address) as client:
            pub = client.publisher(producer_id=self.name, ack_level=AckLevel.DELIVERED)
            inflight: set[asyncio.Future] = set()
            start = time.monotonic()
            end = start + seconds

            def done(f: asyncio.Future, n: int) -> None:
                inflight.discard(f)
                if f.cancelled() or f.exception() is not None:
                    self.failed += 1
                else:
                    self.acked.add(n)

            while (now := time.monotonic()) < end:
                due = int((now - start) * rate) - self.offered  # the open-loop schedule
                if due <= 0:
                    await asyncio.sleep(0.002)
                    continue
                if len(inflight) >= window:
                    t = time.monotonic()
                    await asyncio.wait(inflight, timeout=max(0.0, end - t), return_when=asyncio.FIRST_COMPLETED)
                    self.stall += time.monotonic() - t
                    continue
                for _ in range(min(due, window - len(inflight), 200)):
                    n = self.offered
                    f = pub.publish_nowait(TOPIC, {"p": self.name, "n": n})
                    f.add_done_callback(lambda f, n=n: done(f, n))
                    inflight.add(f)
                    self.offered += 1
                await asyncio.sleep(0)
            if inflight:
                await asyncio.wait(inflight, timeout=120)
            await pub.close(timeout=10)


async def subscriber(address: str, kind: str, name: str, got: set, closed: dict, stop: asyncio.Event,
                     ready: asyncio.Event) -> None:
    async with Client(address) as client:
        sub = client.subscribe(TOPIC, "", name=name if kind in ("named", "durable") else "",
                               durable=Durable(replicas=1) if kind == "durable" else None,
                               max_outstanding=256, evict=kind == "evict")
        await sub.start()
        ready.set()
        try:
            while not stop.is_set():
                try:
                    msg = await sub.next(timeout=0.5)
                except errors.Timeout:
                    continue
                got.add((msg.attributes["p"], int(msg.attributes["n"])))
                await msg.ack()
        except errors.ResourceExhausted as e:  # evicted: it chose so
            closed[kind] = str(e)
            return
        await sub.close()


async def run(seconds: float, rate: float, window: int, bound: int, log_dir: Path) -> dict:
    cluster = Cluster(agents=3, matchers=1, memberships=1, placement=Loopback(0), log_dir=log_dir,
                      extra={"agent": ["--max-backlog", str(bound)]})
    await cluster.start()
    try:
        agents = {p.id: p.address for p in cluster.by_role("agent")}
        async with Client(agents["agent-0"]) as admin:
            await admin.create_topic(TOPIC)
        durable = next(f"durable-{i}" for i in range(500) if holders(f"durable-{i}", agents, 1) == ["agent-2"])
        names = {"ephemeral": "", "named": "named", "durable": durable, "evict": ""}
        got: dict[str, set] = {k: set() for k in KINDS}
        closed: dict[str, str] = {}
        stop = asyncio.Event()
        readies = {k: asyncio.Event() for k in KINDS}
        subs = [asyncio.create_task(subscriber(agents["agent-2"], k, names[k], got[k], closed, stop, readies[k]))
                for k in KINDS]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies.values())), 60)
        await asyncio.sleep(1.0)
        pubs = [Publisher("p0"), Publisher("p1")]
        t0 = time.monotonic()
        await asyncio.gather(pubs[0].run(agents["agent-0"], rate, window, seconds),
                             pubs[1].run(agents["agent-1"], rate, window, seconds))
        published = time.monotonic() - t0
        acked = {(p.name, n) for p in pubs for n in p.acked}
        last, quiet = -1, time.monotonic()
        while time.monotonic() - quiet < 5 and any(acked - got[k] for k in KINDS if k not in closed):
            total = sum(map(len, got.values()))
            if total != last:
                last, quiet = total, time.monotonic()
            await asyncio.sleep(0.2)
        drained = time.monotonic() - t0
        stop.set()
        await asyncio.wait_for(asyncio.gather(*subs, return_exceptions=True), 30)
        rss = {p.id: peak_rss_mib(p.popen.pid) for p in cluster.processes if p.running()}
        counted = cluster.process("agent-2").scrape(COUNTERS)
        overflows = counted.get("echelon_agent_backlog_overflows_total", 0)
        return {
            "seconds": published, "drained": drained, "scheduled": rate * len(pubs) * seconds,
            "offered": sum(p.offered for p in pubs),
            "accepted": len(acked), "failed": sum(p.failed for p in pubs),
            "stall": {p.name: p.stall for p in pubs},
            "delivered": {k: len(got[k]) for k in KINDS},
            "lost": {k: len(acked - got[k]) for k in KINDS},
            "evicted": closed, "overflows": int(overflows), "rss": rss,
            "counted": {k: int(counted.get(k, 0)) for k in COUNTERS[1:]},
        }
    finally:
        cluster.stop()


def report(r: dict) -> str:
    s = r["seconds"]
    lines = [f"published for {s:.1f} s, drained by {r['drained']:.1f} s",
             f"{'scheduled':>12} {'offered':>12} {'accepted':>12} {'failed':>8}   (events/s over the publishing "
             f"time; offered: the publishers got them out, the window let them)",
             f"{r['scheduled'] / s:12.0f} {r['offered'] / s:12.0f} {r['accepted'] / s:12.0f} {r['failed']:8d}",
             "publisher stall (s): " + ", ".join(f"{k} {v:.1f}" for k, v in r["stall"].items()),
             f"{'kind':<10} {'delivered/s':>12} {'lost':>8}  note"]
    for k in KINDS:
        note = "chose eviction (counted)" if k == "evict" else "lags"
        lines.append(f"{k:<10} {r['delivered'][k] / s:12.0f} {r['lost'][k]:8d}  {note}")
    lines.append(f"subscriptions evicted at agent-2 (echelon_agent_backlog_overflows_total): {r['overflows']}")
    lines.append("agent-2's counted losses: " + ", ".join(f"{k.removeprefix('echelon_')} {v}"
                                                        for k, v in r["counted"].items()))
    lines.append("peak RSS (MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["rss"].items())))
    lost = sum(r["lost"][k] for k in LAGGING)
    lines.append(f"target 0 lost for DELIVERED publishes to {', '.join(LAGGING)}: {'MET' if not lost else 'NOT MET'} "
                 f"({lost})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=20_000.0, help="events/s each publisher offers")
    ap.add_argument("--window", type=int, default=4096, help="unacknowledged publishes per publisher")
    ap.add_argument("--bound", type=int, default=2000, help="the agents' --max-backlog")
    ap.add_argument("--short", action="store_true", help="5 s at 4,000/s each, a bound of 200")
    ap.add_argument("--out", type=Path, default=Path("out/bench_overload"))
    a = ap.parse_args()
    if a.short:
        a.seconds, a.rate, a.bound = 5.0, 4000.0, 200
    r = asyncio.run(run(a.seconds, a.rate, a.window, a.bound, a.out / "logs" / time.strftime("%Y%m%d-%H%M%S")))
    print(report(r))


if __name__ == "__main__":
    main()
