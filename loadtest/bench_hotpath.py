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
- `matcher answer`: a matcher holding the 3 default zones answers a batch of 256 events
  (route to zones, CDM, the MatchResponse serialized; what each tree sends an agent);
- `client encode`: the publisher's request of one event;
- `relay root`: the publishing agent's data plane sending a matched batch of 256 events
  as the root (frames built, queued on fake links, acked, the run's future done), each
  event to one of 3 agents as at 2%;
- `relay receive`: a subscribing agent's data plane taking a frame of 170 events from
  that root (the tree's own frames: decoded, keyed, handed to local delivery, acked);
  local delivery itself is the `deliver` piece;
- `GC pass`: one full collection with a subscribing agent's dedup window of 500k ids
  (milliseconds, not per event).

`--cluster SECONDS` runs whole clusters instead (saturation and 1k/s: events/s, latency,
CPU per 1,000 events per service), `--idle SECONDS` clusters doing nothing (CPU ms per
second per tier), and `--base-env NAME=VALUE` sets a variable on the base side only: with
`--base HEAD`, one setting of one tree side by side (e.g. `ECHELON_EVENT_LOOP=asyncio`).
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
    try:  # where the publish half lives in this tree
        from echelon.agent.publishing import Publishing as PubSubServicer
    except ImportError:
        from echelon.agent.pubsub import PubSubServicer
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


def _answer_piece(sel: int) -> float:
    import inspect
    from types import SimpleNamespace

    from echelon.core.can import Zone
    from echelon.core.filters import parse
    from echelon.core.schema import Schema, parse_attribute
    from echelon.core.space import Space
    from echelon.matcher.layout import Copy, Layout, default_zones
    from echelon.matcher.server import results_to_pb
    from echelon.matcher.store import CopyStore
    from echelon.matcher.zones import Zones
    from echelon.v1 import matcher_pb2 as xpb
    from loadtest.bench_events.workload import SCHEMA, subscriptions

    schema = Schema(tuple(parse_attribute(a) for a in SCHEMA))
    zones = [Zone(z.id, z.low, z.high, "m0") for z in default_zones("bench", Space.of(schema), ["m0", "m1", "m2"])[0]]
    layout = Layout("bench", schema, zones, "m0", {"m0": 1, "m1": 1, "m2": 1}, "default")
    store = CopyStore(lambda topic: [layout])
    store.install([Copy(str(s.index), f"agent-{s.index % 3 + 1}", "bench", 1, parse(s.echelon_filter()))
                   for s in subscriptions(sel, 50)], lambda held, new: None)
    layout.ready = True
    matcher = Zones("m0", SimpleNamespace(topics={"bench": SimpleNamespace(find=lambda key: layout)}), store)
    agents_only = "agents_only" in inspect.signature(Zones.match).parameters  # this tree answers agents only
    events = _events(256)

    def once():
        routed = layout.route(events)
        response = xpb.MatchResponse()
        if agents_only:
            results_to_pb(matcher.match("bench", layout.key, events, routed, True), response.results, True)
        else:
            results_to_pb(matcher.match("bench", layout.key, events, routed), response.results)
        response.SerializeToString()

    return _best(once, len(events))


class _Link:
    """A relay link that queues frames (their futures settled by the piece)."""

    def __init__(self):
        self.frames = []

    def send(self, frame):
        import asyncio

        future = asyncio.get_running_loop().create_future()
        self.frames.append((frame, future))
        return future

    async def room(self):
        return None


def _relay_plane(me: str, deliver):
    """A DataPlane over a view of 4 agents (agent-0 roots), links that queue frames."""
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from echelon.agent.dataplane import DataPlane
    from echelon.agent.metrics import AgentMetrics
    from echelon.agent.trees import Trees
    from echelon.core.dedup import DedupWindow
    from echelon.v1 import membership_pb2 as mpb

    members = [mpb.Member(id=f"agent-{i}", address=f"127.0.0.1:{7200 + i}", role=mpb.ROLE_AGENT,
                          subscribes=["bench"] if i else []) for i in range(4)]
    links: dict[str, _Link] = {}
    node = SimpleNamespace(id=me, address=f"127.0.0.1:{7200 + int(me[-1])}", metrics=AgentMetrics(CollectorRegistry()),
                           dedup=DedupWindow(), stopping=False, deliver_local=deliver, open_stream=lambda h, s: [],
                           link=lambda m: links.setdefault(m.id, _Link()))
    trees = Trees(me, node.address)
    trees.update(members)
    return DataPlane(node, trees), links


def _relay_items(n: int):
    from echelon.runtime.wire import attributes_to_pb
    from echelon.v1 import common_pb2 as pb

    now = time.time_ns()
    return [(pb.Event(id=pb.MessageId(producer_id="agent-0:1:1763900000000000000", sequence=i + 1), topic="bench",
                      attributes=attributes_to_pb(a), publish_time_unix_nanos=now), i.to_bytes(16, "little"),
             [f"agent-{1 + i % 3}"]) for i, a in enumerate(_events(n))]


def _relay_root_piece() -> float:
    import asyncio

    plane, links = _relay_plane("agent-0", lambda events: len(events))
    items = _relay_items(256)
    loop = asyncio.new_event_loop()

    async def publish():
        futures = await plane.publish(items)
        for link in links.values():
            for _, f in link.frames:
                f.set_result(True)
            link.frames.clear()
        await asyncio.sleep(0)  # the acks' callbacks: holds released, the run's future done
        assert all(f.done() for f in futures)

    try:
        return _best(lambda: loop.run_until_complete(publish()), len(items))
    finally:
        loop.close()


def _relay_receive_piece() -> float:
    """A frame of 170 events for a child of the root alone (a leaf's work), as this
    tree's root builds it."""
    import asyncio

    root, links = _relay_plane("agent-0", lambda events: len(events))
    loop = asyncio.new_event_loop()
    try:
        for child in ("agent-1", "agent-2", "agent-3"):
            items = [(e, p, [child]) for e, p, _ in _relay_items(170)]
            loop.run_until_complete(root.publish(items))
            if child in links:
                break
    finally:
        loop.close()
    frame = links[child].frames[-1][0]  # the last: for `child` alone
    leaf, _ = _relay_plane(child, lambda events: len(events))  # holds none: the frame is all for it
    acks = []

    def once():
        leaf.receive(frame, lambda: acks.append(1))

    return _best(once, len(frame.messages))


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
    "matcher answer 2%": lambda: _answer_piece(2),
    "matcher answer 20%": lambda: _answer_piece(20),
    "client encode (publish)": _encode_piece,
    "relay root, 256 events": _relay_root_piece,
    "relay receive, frame of 170": _relay_receive_piece,
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
    cell and a 1k/s cell, batch-DELIVERED; per-service CPU per 1,000 events in each, and
    the subscribers' Subscribe messages per event."""
    try:
        from echelon.runtime.loop import started
    except ImportError:  # a base tree from before it: the GC's defaults
        def started() -> None:
            pass
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
        started()
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
              # At 1,000/s every event travels alone: the cost per message, not per event.
              "1k/s cpu ms/1k: publishing agent": 1000 * low["cpu_s_per_1k"].get("agent-0", 0.0),
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


async def _idle(seconds: float) -> dict:
    """The bench cluster with no traffic: CPU milliseconds per second of each tier (the mean
    of its processes) and of all, over `seconds` once it has served for 5 s (heartbeats,
    view streams, housekeeping loops: what a cluster costs doing nothing)."""
    import asyncio

    from loadtest.bench_events.systems import Echelon
    from loadtest.bench_events.workload import cpu_seconds

    system = Echelon(Path(tempfile.mkdtemp(prefix="bench_hotpath_idle.")))
    await system.start()
    try:
        await asyncio.sleep(5)
        pids = system.pids()
        before, t0 = {k: cpu_seconds(p) for k, p in pids.items()}, time.monotonic()
        await asyncio.sleep(seconds)
        per = {k: (cpu_seconds(p) - before[k]) * 1000 / (time.monotonic() - t0) for k, p in pids.items()}
    finally:
        await system.stop()
    out = {}
    for tier in ("agent", "matcher", "membership"):
        v = [x for k, x in per.items() if k.startswith(tier + "-")]
        out[f"idle cpu ms per s: {tier} (mean)"] = sum(v) / len(v)
    out["idle cpu ms per s: all services"] = sum(per.values())
    return out


def child(cluster: float, selectivity: int = 2, idle: float = 0.0) -> None:
    if idle:
        import asyncio

        print(json.dumps(asyncio.run(_idle(idle))))
        return
    if cluster:
        try:
            from echelon.runtime.loop import run  # the load generator on the services' loop
        except ImportError:  # a base tree from before runtime/loop.py
            from asyncio import run
        print(json.dumps(run(_cluster(cluster, selectivity))))
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
    ap.add_argument("--idle", type=float, default=0.0, metavar="SECONDS",
                    help="instead: a whole cluster per tree and round doing nothing, CPU ms per second per tier")
    ap.add_argument("--base-env", action="append", default=[], metavar="NAME=VALUE",
                    help="set in the base side's environment (its cluster's processes inherit it): with "
                         "--base HEAD, one setting side by side, e.g. ECHELON_EVENT_LOOP=asyncio")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if any("=" not in e for e in args.base_env):
        ap.error("--base-env takes NAME=VALUE")
    if args.child:
        child(args.cluster, args.selectivity, args.idle)
        return
    runs: dict[str, list[dict]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="bench_hotpath.") as tmp:
        base = unpack(args.base, Path(tmp))
        trees = {"base": str(base), "head": str(ROOT)}
        for r in range(args.rounds):
            for tree in ("base", "head"):
                env = {**os.environ, "PYTHONPATH": trees[tree],
                       **(dict(e.split("=", 1) for e in args.base_env) if tree == "base" else {})}
                # This file runs as a script in either tree: `echelon` and `loadtest` are that tree's.
                out = subprocess.run([sys.executable, __file__, "--child", "--cluster", str(args.cluster),
                                      "--selectivity", str(args.selectivity),
                                      *(["--idle", str(args.idle)] if args.idle else [])], env=env,
                                     cwd=trees[tree], capture_output=True, text=True, timeout=900)
                if out.returncode:
                    raise SystemExit(f"{tree} child failed:\n{out.stderr}")
                runs[tree].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.base], capture_output=True,
                         text=True).stdout.strip()
    print(f"{f'{args.selectivity}% selectivity, ' if args.cluster else ''}"
          f"{'' if args.cluster or args.idle else 'us per event, '}median of {args.rounds} "
          f"alternating rounds; base {args.base} ({rev})"
          f"{' with ' + ' '.join(args.base_env) if args.base_env else ''}, head this tree; "
          f"load average {os.getloadavg()[0]:.1f}")
    unit = "" if args.cluster or args.idle else " us"
    print(f"{'piece':38} {'base' + unit:>9} {'head' + unit:>9} {'gain':>9}   gain per round")
    for name in runs["head"][0]:
        vals = {t: [r[name] for r in runs[t] if isinstance(r.get(name), float)] for t in runs}
        if not vals["base"] or not vals["head"]:
            why = runs["base" if not vals["base"] else "head"][0].get(name, "not measured by that tree")
            print(f"{name:38} {'-':>9} {'-':>9}  ({why})")
            continue
        b, h = statistics.median(vals["base"]), statistics.median(vals["head"])
        # Each round's own ratio too: base and head ran back to back, under about the same load.
        pairs = sorted((hh / bb if name.endswith("/s") else bb / hh) for bb, hh in zip(vals["base"], vals["head"]))
        print(f"{name:38} {b:9.2f} {h:9.2f} {(h / b if name.endswith('/s') else b / h):9.2f}"
              f"   {' '.join(f'{p:.2f}' for p in pairs)}")


if __name__ == "__main__":
    main()
