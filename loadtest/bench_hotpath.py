"""The hot path's per-event pieces, this tree against a base revision, side by side in
one run (issue 12): `make bench-hotpath` or `python -m loadtest.bench_hotpath --base REV`.

The base revision's `services/` is unpacked (git archive) beside this tree; each round
runs one child process per tree, alternating (base, head, base, head...), and each
child times every piece on identical inputs: microseconds per event, the best of a
few repeats in CPU time. The table gives per piece the median over the rounds for each
tree and the gain (base/head for a cost, head/base for a rate: above 1 is better now).
On this shared machine absolute figures drift with the load; the ratio of alternating
runs is what to read.

Pieces (the 2% and 20% workload of loadtest.bench_events: `Symbol`, `Price`):
- `deliver`: a subscribing agent's local delivery of one relay frame (dedup, filter
  check over its 17 local subscriptions, offer), for a frame of 170 events and of 1;
- `admit`: the publishing agent's per-event admission (conversion, schema check, dedup
  digest and window, the Event built);
- `match`: a matcher's CDM index, 50 subscriptions, a batch of 256 events;
- `client encode`: the publisher's request of one event;
- `GC pass`: one full collection with a subscribing agent's dedup window of 500k ids
  (milliseconds, not per event).
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
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _events(n: int, seed: int = 3):
    import random

    from loadtest.bench_events.workload import SYMBOLS

    rnd = random.Random(seed)
    return [{"Symbol": rnd.choice(SYMBOLS), "Price": rnd.uniform(0.0, 100.0)} for _ in range(n)]


def _best(fn, per: int, number: int = 20, repeat: int = 7) -> float:
    """CPU microseconds per event: the best of `repeat` timings of `number` calls of `fn`
    (each handling `per` events), in this process's CPU time (time spent waiting for a
    core on the shared machine is not counted)."""
    return min(timeit.repeat(fn, number=number, repeat=repeat, timer=time.process_time)) / number / per * 1e6


def _deliver_piece(sel: int, frame: int) -> float:
    from prometheus_client import CollectorRegistry

    from echelon.agent.delivery import LocalDelivery
    from echelon.agent.metrics import AgentMetrics
    from echelon.agent.subscriptions import Subscription
    from echelon.core.dedup import DedupWindow
    from echelon.core.filters import parse
    from echelon.runtime.wire import attributes_to_pb
    from echelon.v1 import common_pb2 as pb
    from loadtest.bench_events.workload import subscriptions

    subs = {}
    for s in subscriptions(sel, 50):
        if s.index % 3 == 0:  # one subscribing agent's share of the 50
            sub = Subscription(f"a/{s.index}", f"~{s.index}", "bench", parse(s.echelon_filter()), 1 << 30)
            sub.attach(1 << 30)
            subs[sub.name] = sub
    d = LocalDelivery(lambda: subs, AgentMetrics(CollectorRegistry()), lambda s: None)
    now = time.time_ns()
    events = [pb.Event.FromString(pb.Event(id=pb.MessageId(producer_id="p", sequence=i + 1), topic="bench",
                                     attributes=attributes_to_pb(a), publish_time_unix_nanos=now).SerializeToString())
              for i, a in enumerate(_events(frame))]
    many = getattr(d, "deliver_many", None)

    def once():
        d.dedup = DedupWindow()
        if many is not None:
            many(events)
        else:
            for e in events:
                d.deliver(e)
        for sub in subs.values():
            sub.backlog.clear()

    return _best(once, frame, number=max(5, 2000 // frame))


def _admit_piece() -> float:
    """The publishing agent's `_admit` with a stub node: the schema cache and no durable
    subscription (what the per-event path touches)."""
    from types import SimpleNamespace

    from echelon.agent.pubsub import PubSubServicer
    from echelon.agent.topics import Topics
    from echelon.core.dedup import DedupWindow
    from echelon.core.schema import Schema, parse_attribute
    from echelon.runtime.wire import attributes_to_pb, schema_to_pb
    from echelon.v1 import common_pb2 as pb
    from echelon.v1 import pubsub_pb2 as ppb
    from loadtest.bench_events.workload import SCHEMA

    topic = pb.Topic(name="bench", created_unix_ms=1,
                     schema=schema_to_pb(Schema(tuple(parse_attribute(a) for a in SCHEMA))))
    node = SimpleNamespace(topics=Topics(lambda: None, None), durables=SimpleNamespace(refuse=lambda t, a: None))
    servicer = PubSubServicer.__new__(PubSubServicer)
    servicer.node = node
    outer = ppb.PublishRequest(batch=[ppb.PublishRequest(topic="bench", attributes=attributes_to_pb(a),
                                                         payload=i.to_bytes(16, "little"), sequence=i + 1)
                                      for i, a in enumerate(_events(256))])
    reqs = ppb.PublishRequest.FromString(outer.SerializeToString()).batch  # as parsed off the wire

    def once():
        servicer.accepted = DedupWindow(capacity=200_000)
        for r in reqs:
            servicer._admit(topic, r, "p", r.sequence, r.payload)

    return _best(once, len(reqs))


def _match_piece(sel: int) -> float:
    from echelon.core.cdm import CountingIndex, Subscription
    from echelon.core.filters import parse
    from loadtest.bench_events.workload import subscriptions

    index = CountingIndex(Subscription(str(s.index), f"agent-{s.index % 3}", parse(s.echelon_filter()))
                          for s in subscriptions(sel, 50))
    events = _events(256)
    return _best(lambda: index.match_agents(events), len(events))


def _encode_piece() -> float:
    from echelon.client.publisher import Publisher

    events = _events(256)
    payload = bytes(16)
    return _best(lambda: [Publisher._requests(None, "bench", a, payload, "") for a in events], len(events))


def _gc_piece() -> float:
    """CPU ms of one full pass of the cyclic GC while a subscribing agent's delivery
    window holds 500,000 message ids (not per event: the pause every such pass adds)."""
    import gc

    from echelon.core.dedup import DedupWindow

    w = DedupWindow()
    for i in range(500_000):
        w.first_time(("agent-0:1:1763900000000000000", i), 1.0)
    return _best(gc.collect, 1, number=1) / 1000


PIECES = {
    "deliver 2%, frame of 170": lambda: _deliver_piece(2, 170),
    "deliver 20%, frame of 170": lambda: _deliver_piece(20, 170),
    "deliver 2%, frame of 1": lambda: _deliver_piece(2, 1),
    "admit (publishing agent)": _admit_piece,
    "match 2% (matcher CDM)": lambda: _match_piece(2),
    "match 20% (matcher CDM)": lambda: _match_piece(20),
    "client encode (publish)": _encode_piece,
    "GC pass, 500k delivered ids (ms)": _gc_piece,
}


def _count_subscribe_messages() -> dict[str, int]:
    """Counts the messages of every Subscribe stream this process opens from here on (the
    load generator's subscribers, in either tree: wrapped at the generated stub): Delivery
    messages read, requests written (acks, nacks, opens)."""
    from echelon.v1 import pubsub_pb2_grpc as pgrpc

    count = {"read": 0, "written": 0}

    class Counted:
        def __init__(self, call):
            self._call = call

        def __getattr__(self, name):
            return getattr(self._call, name)

        async def write(self, request):
            count["written"] += 1
            return await self._call.write(request)

        async def _read(self):
            async for message in self._call:
                count["read"] += 1
                yield message

        def __aiter__(self):
            return self._read()

    init = pgrpc.PubSubStub.__init__

    def counting_init(stub, channel):
        init(stub, channel)
        subscribe = stub.Subscribe
        stub.Subscribe = lambda *a, **kw: Counted(subscribe(*a, **kw))

    pgrpc.PubSubStub.__init__ = counting_init
    return count


async def _cluster(seconds: float, selectivity: int = 2) -> dict:
    """One Echelon cluster (loadtest.bench_events' processes, 1 publisher): a saturation
    cell and a 1k/s cell, batch-DELIVERED; per-service CPU per 1,000 events, and the
    subscribers' Subscribe messages per event."""
    from loadtest.bench_events.run import Run, parse
    from loadtest.bench_events.systems import SYSTEMS
    from loadtest.bench_events.workload import Pool, subscriptions

    count = _count_subscribe_messages()
    messages = {}
    out = Path(tempfile.mkdtemp(prefix="bench_hotpath_cluster."))
    run = Run(parse(["--systems", "echelon", "--seconds", str(seconds), "--out", str(out)]))
    system = SYSTEMS["echelon"](out / "logs")
    await system.start()
    rows = {}
    try:
        subs = subscriptions(selectivity, 50)
        pool = Pool.draw(subs)
        await system.open_subs(subs, pool, run.deliver)
        await run.warm_up(system, subs, pool)
        for rate in (None, 1000):
            sends = await system.publishers(1, "batch-DELIVERED", pool)
            before = dict(count)
            rows[rate or "max"] = await run.cell(system, sends, rate, pool, subs, {
                "system": "echelon", "mode": "batch-DELIVERED", "selectivity": selectivity, "publishers": 1})
            messages[rate or "max"] = {k: (count[k] - before[k]) / max(rows[rate or "max"]["events"], 1)
                                       for k in count}
            await system.close_publishers()
    finally:
        await system.stop()
    sat, low = rows["max"], rows[1000]
    cpu = sat["cpu_s_per_1k"]
    result = {"saturation published/s": sat["published_per_s"],
              "1k/s p50 ms": low["p50_ms"], "1k/s p99 ms": low["p99_ms"],
              "cpu ms/1k: publishing agent": 1000 * cpu.get("agent-0", 0.0),
              "cpu ms/1k: subscribing agents": 1000 * sum(v for k, v in cpu.items() if k.startswith("agent-")
                                                          and k != "agent-0"),
              "cpu ms/1k: matchers": 1000 * sum(v for k, v in cpu.items() if k.startswith("matcher")),
              "cpu ms/1k: load generator": 1000 * sat["cpu_s_per_1k_loadgen"],
              "cpu ms/1k: all services": 1000 * sat["cpu_s_per_1k_services"],
              # At 1k/s the cost is the number of messages (each event travels nearly alone).
              "1k/s cpu ms/1k: subscribing agents": 1000 * sum(v for k, v in low["cpu_s_per_1k"].items()
                                                               if k.startswith("agent-") and k != "agent-0"),
              "1k/s cpu ms/1k: load generator": 1000 * low["cpu_s_per_1k_loadgen"],
              "1k/s cpu ms/1k: all services": 1000 * low["cpu_s_per_1k_services"],
              # The subscribers' stream messages per event published (each costs ~90-100 us per endpoint).
              "1k/s Delivery msgs per event": messages[1000]["read"],
              "1k/s ack msgs per event": messages[1000]["written"],
              "max: Delivery msgs per event": messages["max"]["read"],
              "max: ack msgs per event": messages["max"]["written"]}
    return result


def child(cluster: float, selectivity: int) -> None:
    if cluster:
        import asyncio

        print(json.dumps(asyncio.run(_cluster(cluster, selectivity))))
        return
    out = {}
    for name, piece in PIECES.items():
        try:
            out[name] = piece()
        except Exception as e:  # noqa: BLE001 - a piece the base lacks: reported, not fatal
            out[name] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))


def unpack(rev: str, into: Path) -> Path:
    """The base revision's services/ (as the `echelon` package) and loadtest/ under `into`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "services", "loadtest"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "echelon").symlink_to(into / "services")
    return into


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m loadtest.bench_hotpath", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="main", help="the revision to compare with (default: main)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cluster", type=float, default=0.0, metavar="SECONDS",
                    help="instead of the pieces: a whole cluster per tree and round (saturation and 1k/s "
                         "cells of SECONDS each, 1 publisher): events/s, latency, CPU per service")
    ap.add_argument("--selectivity", type=int, choices=(2, 20), default=2,
                    help="the cluster's workload: 2%% or 20%% of the events match each subscription")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.cluster, args.selectivity)
        return
    runs: dict[str, list[dict]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="bench_hotpath.") as tmp:
        base = unpack(args.base, Path(tmp))
        trees = {"base": str(base), "head": str(ROOT)}
        for r in range(args.rounds):
            for tree in ("base", "head"):
                env = {**os.environ, "PYTHONPATH": trees[tree]}
                # This file runs as a script in either tree: `echelon` and `loadtest` are that tree's.
                out = subprocess.run([sys.executable, __file__, "--child", "--cluster", str(args.cluster),
                                      "--selectivity", str(args.selectivity)], env=env,
                                     cwd=trees[tree], capture_output=True, text=True, timeout=900)
                if out.returncode:
                    raise SystemExit(f"{tree} child failed:\n{out.stderr}")
                runs[tree].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.base], capture_output=True,
                         text=True).stdout.strip()
    print(f"{f'{args.selectivity}% selectivity, ' if args.cluster else 'us per event, '}median of {args.rounds} alternating rounds; base {args.base} ({rev}), head this tree; "
          f"load average {os.getloadavg()[0]:.1f}")
    unit = "" if args.cluster else " us"
    print(f"{'piece':32} {'base' + unit:>9} {'head' + unit:>9} {'gain':>9}   gain per round")
    for name in runs["head"][0]:
        vals = {t: [r[name] for r in runs[t] if isinstance(r[name], float)] for t in runs}
        if not vals["base"] or not vals["head"]:
            why = runs["base" if not vals["base"] else "head"][0][name]
            print(f"{name:32} {'-':>9} {'-':>9}  ({why})")
            continue
        b, h = statistics.median(vals["base"]), statistics.median(vals["head"])
        # Each round's own ratio too: base and head ran back to back, under about the same load.
        pairs = sorted((hh / bb if name.endswith("/s") else bb / hh) for bb, hh in zip(vals["base"], vals["head"]))
        print(f"{name:32} {b:9.2f} {h:9.2f} {(h / b if name.endswith('/s') else b / h):9.2f}"
              f"   {' '.join(f'{p:.2f}' for p in pairs)}")


if __name__ == "__main__":
    main()
