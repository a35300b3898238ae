"""What the hostile-client checks cost on the hot path (docs/security.md): the same
`--auth` cluster of processes (one agent, one matcher, one membership replica) from this
tree and from a base revision, side by side in one run, alternating (base, head, head,
base...). `python -m loadtest.bench_auth --base REV [--rounds N]`.

Per child: events/s delivered end to end (one publisher with a bounded window, one
subscriber) and the CPU time of the cluster's processes per 1,000 of them (what the
checks cost, and what a shared machine's load disturbs least), the p99 delivery latency
at 1,000 events/s, and unary calls/s (GetTopic, which the head tree reads only after
authenticating). The table gives the median over
the rounds per tree and head/base (above 1 is better now for a rate; for p99 the
inverse). On a shared machine absolute figures drift with the load; read the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVENTS = 20_000
WINDOW = 2_000


async def _measure() -> dict:
    from echelon.client import Client
    from echelon.launch import Cluster, Loopback

    out = Path(tempfile.mkdtemp(prefix="bench-auth-"))
    c = Cluster(agents=1, matchers=1, memberships=1, placement=Loopback(0), log_dir=out, auth=True)
    await c.start()
    try:
        client = Client(c.agent_addresses()[0], token=c.admin_token)
        await client.create_topic("bench", ["Symbol:string", "Price:float:0:1000"])
        sub = client.subscribe("bench", shared=False, max_outstanding=WINDOW)
        await sub.start()
        got, latencies = 0, []

        async def receive(n: int, timed: bool) -> None:
            nonlocal got
            while got < n:
                for msg in await sub.receive(256, timeout=30):
                    got += 1
                    if timed:
                        latencies.append(time.time() - float(msg.payload))
                    await msg.ack()

        async with client.publisher() as pub:
            # Saturation: a bounded window of events in flight.
            cpu0 = _cpu(c.pids())
            start = time.perf_counter()
            reader = asyncio.create_task(receive(EVENTS, False))
            pending = set()
            for i in range(EVENTS):
                pending.add(pub.publish_nowait("bench", {"Symbol": "s", "Price": 1.0}))
                if len(pending) >= WINDOW:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.gather(*pending)
            await reader
            rate = EVENTS / (time.perf_counter() - start)
            cpu = (_cpu(c.pids()) - cpu0) / EVENTS * 1000 * 1000  # ms of the cluster's CPU per 1,000 events
            # 1,000/s for 3 s: the latency.
            got = 0
            reader = asyncio.create_task(receive(3000, True))
            for i in range(3000):
                pub.publish_nowait("bench", {"Symbol": "s", "Price": 1.0}, payload=repr(time.time()).encode())
                if i % 10 == 9:
                    await asyncio.sleep(0.01)
            await reader
        latencies.sort()
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < 2.0:
            await client.get_topic("bench")
            calls += 1
        unary = calls / (time.perf_counter() - start)
        await sub.close()
        await client.close()
        return {"events_per_s": rate, "cpu_ms_per_1k": cpu, "p99_ms": 1000 * latencies[int(0.99 * len(latencies))],
                "unary_per_s": unary}
    finally:
        c.stop()


def _cpu(pids: list[int]) -> float:
    """User and system seconds of `pids` so far (/proc)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return total


def run_child(tree: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree / "services"))
    r = subprocess.run([sys.executable, "-m", "loadtest.bench_auth", "--child"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise RuntimeError(f"child on {tree} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="main", help="the revision to compare with (default: main)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_measure())))
        return
    base = Path(tempfile.mkdtemp(prefix="bench-auth-base-"))
    archive = subprocess.run(["git", "archive", args.base, "services"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
    rows: dict[str, list[dict]] = {"base": [], "head": []}
    for r in range(args.rounds):
        order = (("base", base), ("head", ROOT))
        for name, tree in order if r % 2 == 0 else order[::-1]:  # neither side always first
            rows[name].append(run_child(tree))
            print(f"round {r} {name}: {rows[name][-1]}", flush=True)
    print(f"\n{'measure':14} {'base ' + args.base[:10]:>18} {'head':>12} {'head/base':>10}")
    for key in ("events_per_s", "cpu_ms_per_1k", "p99_ms", "unary_per_s"):
        b = statistics.median(x[key] for x in rows["base"])
        h = statistics.median(x[key] for x in rows["head"])
        print(f"{key:14} {b:18.1f} {h:12.1f} {h / b:10.3f}")


if __name__ == "__main__":
    main()
