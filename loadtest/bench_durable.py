"""Durable vs ephemeral subscriptions, side by side (docs/performance.md, "Durable
subscriptions"): throughput and delivery
latency (p50, p99) of one subscriber, per fsync policy of the agents' log.

`python -m loadtest.bench_durable --out out/bench_durable` (`make bench-durable`). For each
policy (always, batch, never) a cluster of real processes (the launcher's: 1 membership
replica, 1 matcher, 2 agents, each agent's log in its own data dir) runs `rounds` rounds;
each round publishes `messages` small events from agent-0 through a window of
`window` in-flight publishes, first to an ephemeral subscription on agent-1, then to a
durable one (replicas 2: both agents log every event; served by its first holder, the
subscriber connected to it), alternating, so both see the same machine. Throughput is
messages over the time from the first publish to the last delivery; latency is the
event's publish time (the publishing agent's clock) to its arrival at the subscriber
(the same host clock). Every run checks that every message arrived (an oracle, not only
a timer).

Prints the table of ratios (durable / ephemeral) and writes bench_durable.json and
bench_durable.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from echelon.client import ACCEPTED, Client, Durable
from echelon.core.durability import holders
from echelon.launch import Cluster, Loopback

TOPIC = "bench"
POLICIES = ("always", "batch", "never")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def one(pub_client: Client, sub_client: Client, kind: str, name: str, messages: int, window: int,
              tag: str) -> dict:
    durable = Durable() if kind == "durable" else None
    sub = sub_client.subscribe(TOPIC, f'tag = "{tag}"', name=name if durable else "", durable=durable,
                               max_outstanding=1000)
    await sub.start()
    latencies: list[float] = []
    got: set[int] = set()
    done = asyncio.Event()

    async def consume():
        while len(got) < messages:
            msg = await sub.next(timeout=60)
            latencies.append(time.time() - msg.publish_time_ns / 1e9)
            got.add(msg.attributes["i"])
            await msg.ack()
        done.set()

    consumer = asyncio.create_task(consume())
    pub = pub_client.publisher(f"{tag}-{kind}", ACCEPTED)
    start = time.monotonic()
    in_flight: set[asyncio.Future] = set()
    for i in range(messages):
        if len(in_flight) >= window:
            _, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        in_flight.add(pub.publish_nowait(TOPIC, {"tag": tag, "i": i}, payload=b"x" * 100))
    await pub.flush(120)
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.monotonic() - start
    await consumer
    await sub.close()
    if durable:
        await sub_client.delete_subscription(name)
    assert got == set(range(messages)), f"{kind}: {messages - len(got)} messages missing"
    return {"kind": kind, "rate": messages / elapsed, "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * pct(latencies, 0.99)}


async def policy_run(policy: str, out: Path, messages: int, window: int, rounds: int) -> list[dict]:
    cluster = Cluster(agents=2, matchers=1, memberships=1, placement=Loopback(0), log_dir=out / "logs" / policy,
                      extra={"agent": ["--fsync", policy]})
    await cluster.start()
    try:
        agents = {p.id: p.address for p in cluster.by_role("agent")}
        pub_client, sub_client = Client(agents["agent-0"]), Client(agents["agent-1"])
        try:
            await pub_client.create_topic(TOPIC, ["tag:string", "i:int"])
            results = []
            for r in range(rounds):
                # Served by agent-1 (its first holder), where the subscriber connects.
                name = next(n for n in (f"{policy}-{r}-{i}" for i in range(1000))
                            if holders(n, sorted(agents), 2)[0] == "agent-1")
                for kind in ("ephemeral", "durable"):
                    row = await one(pub_client, sub_client, kind, name, messages, window, f"{policy}{r}")
                    row.update(policy=policy, round=r)
                    print(f"  {policy:6} round {r} {kind:9} {row['rate']:8.0f} msg/s  p50 {row['p50_ms']:7.1f} ms  "
                          f"p99 {row['p99_ms']:7.1f} ms", flush=True)
                    results.append(row)
            return results
        finally:
            await pub_client.close()
            await sub_client.close()
    finally:
        cluster.stop()


def table(rows: list[dict]) -> str:
    lines = ["fsync   ephemeral msg/s  durable msg/s  durable/ephemeral  ephemeral p99 ms  durable p99 ms  p99 ratio",
             "------  ---------------  -------------  -----------------  ----------------  --------------  ---------"]
    for policy in POLICIES:
        e = [r for r in rows if r["policy"] == policy and r["kind"] == "ephemeral"]
        d = [r for r in rows if r["policy"] == policy and r["kind"] == "durable"]
        if not e or not d:
            continue
        er, dr = statistics.median(r["rate"] for r in e), statistics.median(r["rate"] for r in d)
        ep, dp = statistics.median(r["p99_ms"] for r in e), statistics.median(r["p99_ms"] for r in d)
        lines.append(f"{policy:6}  {er:15.0f}  {dr:13.0f}  {dr / er:17.2f}  {ep:16.1f}  {dp:14.1f}  {dp / ep:9.2f}")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    x = range(len(POLICIES))
    for offset, kind in ((-0.2, "ephemeral"), (0.2, "durable")):
        rate = [statistics.median([r["rate"] for r in rows if r["policy"] == p and r["kind"] == kind] or [0])
                for p in POLICIES]
        p99 = [statistics.median([r["p99_ms"] for r in rows if r["policy"] == p and r["kind"] == kind] or [0])
               for p in POLICIES]
        a.bar([i + offset for i in x], rate, 0.4, label=kind)
        b.bar([i + offset for i in x], p99, 0.4, label=kind)
    for ax, title in ((a, "throughput (msg/s)"), (b, "delivery latency p99 (ms)")):
        ax.set_xticks(list(x), [f"fsync={p}" for p in POLICIES])
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("out/bench_durable"))
    ap.add_argument("--messages", type=int, default=4000)
    ap.add_argument("--window", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--policies", default=",".join(POLICIES))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for policy in args.policies.split(","):
        rows += asyncio.run(policy_run(policy, args.out, args.messages, args.window, args.rounds))
    text = table(rows)
    print("\n" + text)
    (args.out / "bench_durable.json").write_text(json.dumps({"rows": rows, "table": text}, indent=2))
    plot(rows, args.out / "bench_durable.png")
    print(f"\n{args.out / 'bench_durable.json'}, {args.out / 'bench_durable.png'}")


if __name__ == "__main__":
    main()
