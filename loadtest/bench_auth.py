"""What the access checks cost on the hot path (docs/security.md, "What the checks
cost"): the same cluster of processes (one agent, one matcher, one membership replica)
twice, side by side in one run, alternating (A, B, B, A, ...) so the machine's load falls
on both alike. `python -m loadtest.bench_auth [--rounds N]` compares this tree with auth
off and on (`--auth tokens`, a user that holds only publish and subscribe on the topic):
every check a client's call passes (identity, ACLs, rate, quotas, ownership, caps,
revocation) against none, an upper bound on what any one of them costs.
`--base REV` compares REV's tree with this one, both with auth on.

`--pieces` times the checks themselves in this process, alternating, in CPU time (what a
loaded machine disturbs least): the publishing agent's Publish stream (loadtest
hotpath_publish.py's `publish stream` piece, 256 events one per request and in one batch)
with the real Access of a `--auth tokens` agent and a user holding publish on the topic,
against a caller with nothing to check; and one pass of the re-check of open streams
(revocation) over 1,000 streams, the cost per stream per second.

Per child: events/s delivered end to end (one publisher with a bounded window, one
subscriber) and the CPU time of the cluster's processes per 1,000 of them (what the
checks cost, and what a shared machine's load disturbs least), the p99 delivery latency
at 1,000 events/s, and unary calls/s (GetTopic, which the head tree reads only after
authenticating). The table gives the median over
the rounds per side, B/A of the medians, and the spread of the per-round ratios (each
round's two runs were adjacent in time): min, median, max. Above 1 is better for a rate,
worse for CPU and p99. On a shared machine absolute figures drift with the load; read
the ratios, and CPU per 1,000 events first (the load disturbs it least).
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
EVENTS = 40_000
USER = "bench"  # with auth: holds publish and subscribe on the topic, nothing else
WINDOW = 2_000


async def _measure(auth: bool) -> dict:
    from echelon.client import Client
    from echelon.launch import Cluster, Loopback
    from echelon.client.errors import PermissionDenied

    out = Path(tempfile.mkdtemp(prefix="bench-auth-"))
    c = Cluster(agents=1, matchers=1, memberships=1, placement=Loopback(0), log_dir=out, auth=auth)
    if auth:
        from echelon.runtime.credentials import write_tokens_file
        c._tokens = write_tokens_file(c.tokens_file, {"admin": ["admins"], "replan": ["admins"], USER: []})
    await c.start()
    try:
        admin = Client(c.agent_addresses()[0], token=c.admin_token or None)
        await admin.create_topic("bench", ["Symbol:string", "Price:float:0:1000"])
        if auth:
            await admin.grant_acl(f"user:{USER}", "bench", ["publish", "subscribe"])
        await admin.close()
        client = Client(c.agent_addresses()[0], token=c.tokens.get(USER) or None)
        for attempt in range(100):  # the grant reaches the agent with the next view
            sub = client.subscribe("bench", shared=False, max_outstanding=WINDOW)
            try:
                await sub.start()
                break
            except PermissionDenied:
                await asyncio.sleep(0.1)
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


def run_child(tree: Path, auth: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree / "services"))
    r = subprocess.run([sys.executable, "-m", "loadtest.bench_auth", "--child", "on" if auth else "off"], cwd=ROOT,
                       env=env,
                       capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise RuntimeError(f"child on {tree} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def pieces(rounds: int) -> None:
    """The checks' own cost, side by side in this process (`--pieces`; see the module doc)."""
    import json as _json

    from prometheus_client import CollectorRegistry

    sys.path.insert(0, str(ROOT / "loadtest"))
    from hotpath_publish import stream_piece

    from echelon.core.acl import Acl, Identity, Rule
    from echelon.runtime.auth import CALLER, Access, AuthConfig, Caller, OpenStream

    tokens = Path(tempfile.mkdtemp(prefix="bench-auth-")) / "tokens.json"
    tokens.write_text(_json.dumps({"tokens": [{"token": "t-bench", "name": USER}]}))
    access = Access(AuthConfig(mode="tokens", tokens_file=str(tokens)), CollectorRegistry())
    rules = Acl([Rule(f"user:{USER}", "bench", frozenset({"publish", "subscribe"}))])
    access.acl = lambda: rules
    CALLER.set(Caller(Identity(USER), f"user:{USER}", "ipv4:127.0.0.1:5", True, "t-bench"))
    cells = {"per request": False, "batch of 256": True}
    rows: dict[str, dict[str, list[float]]] = {c: {"none": [], "checked": []} for c in cells}
    for r in range(rounds):
        for cell, batched in cells.items():
            sides = (("none", None), ("checked", access))
            for side, acc in sides if r % 2 == 0 else sides[::-1]:
                rows[cell][side].append(stream_piece(batched, handler=True, access=acc))
        print(f"round {r}: " + ", ".join(f"{c} {rows[c]['none'][-1]:.2f}/{rows[c]['checked'][-1]:.2f} us"
                                         for c in cells), flush=True)
    print(f"\n{'publish stream, us per event':30} {'no checks':>10} {'checked':>10} {'checked/none':>13}   "
          f"per-round ratio: min  median  max")
    for cell in cells:
        a, b = rows[cell]["none"], rows[cell]["checked"]
        per = sorted(y / x for x, y in zip(a, b))
        print(f"{cell:30} {statistics.median(a):10.3f} {statistics.median(b):10.3f} "
              f"{statistics.median(b) / statistics.median(a):13.3f}   {per[0]:16.3f} {statistics.median(per):7.3f} "
              f"{per[-1]:6.3f}")
    # Revocation: one pass over 1,000 open streams of 10 tokens, each relying on one right.
    streams = [OpenStream(Caller(Identity(USER), f"user:{USER}", f"ipv4:127.0.0.1:{i}", True, "t-bench"),
                          "echelon.v1.PubSub", None, [("subscribe", "bench", None)]) for i in range(1000)]
    access.streams.update(streams)
    access.recheck()
    passes = []
    for _ in range(max(5, rounds)):
        t0 = time.process_time()
        for _ in range(20):
            access.recheck()
        passes.append((time.process_time() - t0) / 20 / len(streams) * 1e6)
    print(f"\nre-check of open streams: {statistics.median(passes):.2f} us per stream per pass "
          f"(min {min(passes):.2f}, max {max(passes):.2f}), one pass a second")


MEASURES = ("events_per_s", "cpu_ms_per_1k", "p99_ms", "unary_per_s")


def table(rows: dict[str, list[dict]], names: tuple[str, str]) -> str:
    """Medians per side, B/A of the medians, and min/median/max of the per-round ratios."""
    a, b = names
    lines = [f"{'measure':14} {a:>14} {b:>14} {b + '/' + a:>12}   per-round {b}/{a}: min  median  max"]
    for key in MEASURES:
        ma = statistics.median(x[key] for x in rows[a])
        mb = statistics.median(x[key] for x in rows[b])
        per = sorted(y[key] / x[key] for x, y in zip(rows[a], rows[b]) if x[key])
        lines.append(f"{key:14} {ma:14.1f} {mb:14.1f} {mb / ma:12.3f}   {per[0]:18.3f} {statistics.median(per):7.3f}"
                     f" {per[-1]:6.3f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="", help="compare this revision's tree with this one (both with auth on); "
                    "default: this tree with auth off and on")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--pieces", action="store_true", help="time the checks themselves in this process")
    ap.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pieces:
        pieces(args.rounds)
        return
    if args.child:
        print(json.dumps(asyncio.run(_measure(args.child == "on"))))
        return
    if args.base:
        base = Path(tempfile.mkdtemp(prefix="bench-auth-base-"))
        archive = subprocess.run(["git", "archive", args.base, "services"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        sides = {f"base {args.base[:9]}": (base, True), "head": (ROOT, True)}
    else:
        sides = {"auth off": (ROOT, False), "auth on": (ROOT, True)}
    names = tuple(sides)
    rows: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:  # neither side always first
            rows[name].append(run_child(*sides[name]))
            print(f"round {r} {name}: {json.dumps({k: round(v, 2) for k, v in rows[name][-1].items()})}", flush=True)
    print()
    print(table(rows, names))


if __name__ == "__main__":
    main()
