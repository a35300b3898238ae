"""Where one event's latency goes, hop by hop: `python -m loadtest.trace_hops`.

The bench cluster of loadtest.bench_events (4 agents, 3 matchers, 3 membership replicas,
2% selectivity or `--selectivity 20`, 50 subscriptions, one publisher on agent-0,
`publish_batch` at DELIVERED) runs with a tracer in every service process: a
`sitecustomize` on the children's PYTHONPATH wraps a few functions on the event's way and
writes, per event id (the payload's first 8 bytes), the wall-clock time each was reached.
The load generator adds its own: sent, delivered to the subscriber, acknowledged to the
publisher. One machine, one clock, so the differences are the time between the points:

| point | process | wrapped |
|---|---|---|
| sent | load generator | the payload's send time |
| admit | agent-0 | `Admission._admit` returns (validated, id recorded) |
| match out / back | agent-0 | `MatchClient.send` called / its batch answered |
| matcher in / out | the entry matcher | its `Match` stream: an agent's request read / its response yielded (only from a tree whose agents send the matcher the events' ids: since `dispatch.for_matching` they do not) |
| holder in / out | a zone's holder | its `Match` stream: a peer matcher's request read / answered |
| relay out | agent-0 | `Link.send` (a frame queued on the link to a subscriber's agent) |
| sub in | agent-1..3 | `LocalDelivery.deliver_many` (the relay frame read, before filtering) |
| delivered | load generator | the subscriber's message handed to the application |
| acked | load generator | `publish_batch` returned (DELIVERED) |

Beside the hops, per cell and process: how late the event loop ran a timer (a probe
every PROBE seconds: its lateness is the time the loop could not turn, busy or not
scheduled) and the share of that wall time the process was on a core (the rest of a
late timer is a wait for the machine's cores, not for Echelon's work); the gRPC messages per event, by kind (relay frames written and
RelayAcks read by the links, Match requests, and the load generator's Publish and
Subscribe streams): at a low rate every event travels nearly alone, so at ~90-100 us of
CPU per message at each end they are the cluster's CPU per event.

Cells: a trickle (one event every 20 ms: each event alone in the cluster, the cost of the
hops themselves) and fixed rates (default 1,000/s: the hops plus the queueing behind the
other events). A function the code no longer has is reported missing and its points are
left out (the tracer follows the code of this tree, it does not shape it).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import functools
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict, deque
from pathlib import Path

TRACE_ENV = "ECHELON_TRACE_DIR"
PROBE = 0.005  # seconds between the loop-lag probe's timers
ORDER = ["sent", "admit", "match out", "matcher in", "holder in", "holder out", "matcher out", "match back", "relay out", "sub in",
         "delivered", "acked"]


# -- the tracer (runs in every service process via sitecustomize) --------------------------

class _Sink:
    def __init__(self, path: Path):
        self.file = open(path, "a", buffering=1 << 16)
        self.n = 0
        atexit.register(self.file.flush)

    def stamp(self, point: str, ids) -> None:
        t = time.time_ns()
        for i in ids:
            self.file.write(f"{point}\t{i}\t{t}\n")
            self.n += 1
        if self.n >= 2000:  # a SIGKILLed process loses at most this much
            self.file.flush()
            self.n = 0


def _id(payload: bytes) -> int | None:
    return int.from_bytes(payload[:8], "little", signed=True) if len(payload) >= 8 else None


def _keys(events) -> list[str]:
    """Events are told apart by their message id past admission (the matcher gets no payload)."""
    return [f"{e.id.producer_id}:{e.id.sequence}" for e in events]


_SINK: _Sink | None = None
# The load generator's streams (loadtest.hotpath_cluster's counter) by what they carry.
_STREAMS = {"publish written": "publish request", "publish read": "publish ack", "read": "Delivery",
            "written": "subscriber ack"}


def install() -> list[str]:
    """Wrap the traced functions of this process's `echelon`; returns those missing."""
    directory = os.environ.get(TRACE_ENV)
    if not directory:
        return []
    global _SINK
    sink = _SINK = _Sink(Path(directory) / f"{os.getpid()}.tsv")
    missing = []

    def wrap(module: str, qualname: str, make):
        try:
            mod = __import__(module, fromlist=["_"])
            owner_name, attr = qualname.rsplit(".", 1)
            owner = getattr(mod, owner_name)
            original = getattr(owner, attr)
        except (ImportError, AttributeError):
            missing.append(f"{module}.{qualname}")
            return
        setattr(owner, attr, functools.wraps(original)(make(original)))

    def admit(original):
        async def _admit(self, unit, reqs, seqs, payloads, *a, **kw):
            out = await original(self, unit, reqs, seqs, payloads, *a, **kw)
            producer = unit.producer
            for seq, payload in zip(seqs, payloads):
                if isinstance(payload, bytes) and (i := _id(payload)) is not None and i >= 0:
                    sink.stamp("admit", (f"{producer}:{seq}",))
                    sink.stamp("map", (f"{producer}:{seq}={i}",))
            return out
        return _admit

    cut = [()]  # the ids of the batch `for_matching` last cut (the matcher's copy carries none)

    def for_matching(original):
        def _for_matching(events, encoded, *a, **kw):
            cut[0] = _keys(events)
            return original(events, encoded, *a, **kw)
        return _for_matching

    try:  # a module function, looked up at each call: replaced in the module
        from echelon.agent import dispatch as _dispatch
        _dispatch.for_matching = functools.wraps(_dispatch.for_matching)(for_matching(_dispatch.for_matching))
    except (ImportError, AttributeError):
        pass  # an older tree: its matcher copy carries the ids

    def match(original):
        from echelon.v1 import common_pb2 as pb

        async def send(self, encoded, *a, **kw):
            # Called right after `for_matching` (no await between): its ids are this batch's.
            ids = cut[0] if len(cut[0]) == len(encoded) else _keys(pb.Event.FromString(data) for data in encoded)
            cut[0] = ()
            sink.stamp("match out", ids)
            sink.stamp("msg", ("match request",))
            answer = await original(self, encoded, *a, **kw)  # the batch's future: done when answered
            answer.add_done_callback(lambda _: sink.stamp("match back", ids))
            return answer
        return send

    def matcher(original):
        async def Match(self, request_iterator, context):
            pending: deque[tuple[str, list[str]]] = deque()

            async def requests():
                async for batch in request_iterator:
                    ids = [k for k in _keys(batch.events) if k != ":0"]  # none: ids not sent (for_matching)
                    side = "holder" if batch.layout else "matcher"  # a peer's zones, or an agent's batch
                    sink.stamp(f"{side} in", ids)
                    pending.append((side, ids))
                    yield batch
            async for response in original(self, requests(), context):
                side, ids = pending.popleft() if pending else ("matcher", ())
                sink.stamp(f"{side} out", ids)
                yield response
        return Match

    def link_send(original):
        from echelon.dataplane.dissemination import event_of  # a whole event travels as the root's bytes
        from echelon.v1 import relay_pb2 as rpb

        def send(self, frame, *a, **kw):  # an OutFrame: its bytes in pieces
            messages = rpb.RelayFrame.FromString(b"".join(frame.parts)).messages
            sink.stamp("relay out", _keys(event_of(m) for m in messages if m.slice_count <= 1))
            return original(self, frame, *a, **kw)
        return send

    def frames(original):  # a link's stream: each message yielded is a relay frame written
        async def _frames(self, *a, **kw):
            async for data in original(self, *a, **kw):
                sink.stamp("msg", ("relay frame",))
                yield data
        return _frames

    def acked(original):  # one RelayAck message read by a link
        def _acked(self, seqs, *a, **kw):
            sink.stamp("msg", ("relay ack",))
            return original(self, seqs, *a, **kw)
        return _acked

    def deliver_many(original):
        def _deliver_many(self, events, *a, **kw):
            sink.stamp("sub in", _keys(events))
            return original(self, events, *a, **kw)
        return _deliver_many

    started = [0, 0]

    def collected(phase: str, info: dict) -> None:  # the cyclic GC's pauses, by generation
        if phase == "start":
            started[:] = time.perf_counter_ns(), time.thread_time_ns()
        else:
            sink.stamp(f"gc{info['generation']}", (f"{time.perf_counter_ns() - started[0]}/"
                                                   f"{time.thread_time_ns() - started[1]}",))
    gc.callbacks.append(collected)

    try:  # every service process runs its main coroutine through runtime.loop.run: the probe beside it
        from echelon.runtime import loop as service_loop

        def run_probed(original):
            def run(main, *a, **kw):
                async def probed():
                    probe = asyncio.get_running_loop().create_task(_probe(sink))
                    try:
                        return await main
                    finally:
                        probe.cancel()
                return original(probed(), *a, **kw)
            return run
        service_loop.run = run_probed(service_loop.run)
    except ImportError:
        missing.append("echelon.runtime.loop.run")
    wrap("echelon.agent.admission", "Admission._admit", admit)
    wrap("echelon.agent.matching", "MatchClient.send", match)
    wrap("echelon.matcher.server", "MatcherServicer.Match", matcher)
    wrap("echelon.dataplane.links", "Link.send", link_send)
    wrap("echelon.dataplane.links", "Link._frames", frames)
    wrap("echelon.dataplane.links", "Link._acked", acked)
    wrap("echelon.agent.delivery", "LocalDelivery.deliver_many", deliver_many)
    if missing:
        (Path(directory) / f"{os.getpid()}.missing").write_text("\n".join(missing))
    return missing


async def _probe(sink: _Sink) -> None:
    """Every PROBE seconds: how late the timer fired, and the process's CPU over the wait."""
    loop = asyncio.get_running_loop()
    while True:
        t0, c0 = loop.time(), time.process_time()
        await asyncio.sleep(PROBE)
        wall = loop.time() - t0
        sink.stamp("lag", (f"{(wall - PROBE) * 1e3:.3f}/{wall * 1e3:.3f}/{(time.process_time() - c0) * 1e3:.3f}",))


# -- the driver -----------------------------------------------------------------------------

async def _cell(system, pub, pool, rate: float, seconds: float, first_id: int, received: dict, acked: dict,
                sent: dict) -> int:
    """Publish at `rate` for `seconds` as bench_events' fixed-rate cells do: every event
    due by now in one publish_batch call (at 1,000/s mostly one, at 10,000/s about ten:
    the loop's timers have a 1 ms grain), many calls in flight; returns the next free id."""
    from loadtest.bench_events.systems import pool_index
    from loadtest.bench_events.workload import PAYLOAD, TOPIC

    attrs = [{"Symbol": pool.symbols[k], "Price": pool.prices[k]} for k in range(len(pool.symbols))]
    offset = time.time_ns() - time.perf_counter_ns()
    tasks = set()
    t0 = time.perf_counter()
    i = first_id
    n = int(rate * seconds)
    while i < first_id + n:
        due = min(first_id + n, first_id + int((time.perf_counter() - t0) * rate) + 1)
        if due <= i:
            await asyncio.sleep(max(0.001, t0 + (i - first_id) / rate - time.perf_counter()))
            continue

        async def some(ids):
            now = time.perf_counter_ns()
            for k in ids:
                sent[k] = now + offset
            await pub.publish_batch(TOPIC, [(attrs[pool_index(k)], PAYLOAD.pack(k, now)) for k in ids])
            done = time.perf_counter_ns() + offset
            for k in ids:
                acked[k] = done
        t = asyncio.create_task(some(range(i, due)))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
        i = due
        await asyncio.sleep(0)
    deadline = time.monotonic() + 10
    while (tasks or len([k for k in received if k >= first_id]) < n) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return i


def _budget(stamps: dict[str, dict[int, int]], ids: range) -> list[tuple[str, list[float]]]:
    """Per consecutive pair of points (in ORDER, those present): the milliseconds between
    them over the events that have both."""
    points = [p for p in ORDER if stamps.get(p)]
    out = []
    for a, b in zip(points, points[1:]):
        d = [(stamps[b][i] - stamps[a][i]) / 1e6 for i in ids if i in stamps[a] and i in stamps[b]]
        out.append((f"{a} -> {b}", d))
    total = [(stamps["delivered"][i] - stamps["sent"][i]) / 1e6 for i in ids
             if i in stamps["sent"] and i in stamps["delivered"]]
    out.append(("sent -> delivered (end to end)", total))
    return out


def _pct(v: list[float], q: float) -> float:
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


async def run(args) -> dict:
    from echelon.client import AckLevel
    from echelon.runtime.loop import started
    from loadtest.bench_events.systems import Echelon
    from loadtest.bench_events.workload import Pool, subscriptions
    from loadtest.bench_events.run import Run, parse

    trace = Path(tempfile.mkdtemp(prefix="trace_hops."))
    site = trace / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("from loadtest.trace_hops import install\ninstall()\n")
    root = str(Path(__file__).resolve().parent.parent)
    os.environ[TRACE_ENV] = str(trace)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(site), root, os.environ.get("PYTHONPATH", "")])
    install()  # here too: the load generator's GC pauses
    probe = asyncio.create_task(_probe(_SINK)) if _SINK is not None else None  # and its loop's lag
    from loadtest.hotpath_cluster import _count_subscribe_messages

    streams = _count_subscribe_messages()  # the load generator's Publish and Subscribe messages
    system = Echelon(trace / "logs")
    await system.start()
    pids = {**system.pids(), "load generator": os.getpid()}
    received: dict[int, int] = {}
    offset = time.time_ns() - time.perf_counter_ns()
    run_ = Run(parse(["--systems", "echelon", "--out", str(trace)]))

    def sink(sub, i, sent_ns, now_ns):
        received.setdefault(i, now_ns + offset)
    cells = []
    try:
        subs = subscriptions(args.selectivity, 50)
        pool = Pool.draw(subs)
        await system.open_subs(subs, pool, run_.deliver)
        await run_.warm_up(system, subs, pool)
        started()
        run_.sink = sink
        from echelon.client import Client

        client = Client(system.cluster.agent_addresses()[0], tls=system.cluster.client_tls)
        pub = client.publisher(ack_level=AckLevel.DELIVERED)
        sent: dict[int, int] = {}
        acked: dict[int, int] = {}
        next_id = 0
        for name, rate, seconds in [("trickle 50/s", 50.0, args.trickle), *[(f"{r}/s", float(r), args.seconds)
                                                                             for r in args.rate]]:
            start, before = next_id, dict(streams)
            next_id = await _cell(system, pub, pool, rate, seconds, start, received, acked, sent)
            cells.append((name, range(start, next_id), {k: streams[k] - before[k] for k in streams}))
        await client.close()
    finally:
        if probe is not None:
            probe.cancel()
        await system.stop()
    by_key: dict[str, dict[str, int]] = defaultdict(dict)
    ids: dict[str, int] = {}
    # (pid, gc<generation>) -> (end, wall ms, CPU ms of the collecting thread)
    pauses: dict[tuple[str, str], list[tuple[int, float, float]]] = defaultdict(list)
    messages: list[tuple[int, str]] = []  # (when, kind) of the services' messages counted
    lags: dict[str, list[tuple[int, float, float, float]]] = defaultdict(list)  # pid -> (when, late, wall, cpu) ms
    if _SINK is not None:
        _SINK.file.flush()
    missing = set()
    for f in trace.glob("*.tsv"):
        for line in f.read_text().splitlines():
            point, key, t = line.split("\t")
            if point.startswith("gc"):
                wall, cpu = key.split("/")
                pauses[(f.stem, point)].append((int(t), int(wall) / 1e6, int(cpu) / 1e6))
            elif point == "lag":
                late, wall, cpu = map(float, key.split("/"))
                lags[f.stem].append((int(t), late, wall, cpu))
            elif point == "msg":
                messages.append((int(t), key))
            elif point == "map":
                k, _, i = key.rpartition("=")
                ids[k] = int(i)
            else:
                by_key[point].setdefault(key, int(t))  # the first time it got there (one copy per hop here)
    stamps: dict[str, dict[int, int]] = {p: {ids[k]: t for k, t in v.items() if k in ids} for p, v in by_key.items()}
    for f in trace.glob("*.missing"):
        missing |= set(f.read_text().split())
    stamps["sent"], stamps["delivered"], stamps["acked"] = sent, received, acked
    report, gcs, per_event, loops = {}, {}, {}, {}
    names = {str(pid): name for name, pid in pids.items()}
    for name, ids, loadgen in cells:
        rows = _budget(stamps, ids)
        report[name] = {k: {"n": len(v), "p50_ms": _pct(v, 0.5), "p90_ms": _pct(v, 0.9), "p99_ms": _pct(v, 0.99),
                            "mean_ms": statistics.fmean(v) if v else float("nan")} for k, v in rows}
        start = min((sent[i] for i in ids if i in sent), default=0)
        end = max((t for m in (received, acked) for i, t in m.items() if i in ids), default=0)
        # Messages per event: at a low rate every event travels nearly alone, so each costs
        # a gRPC message's CPU at both ends (~90-100 us each): the cluster's CPU per event.
        n = max(len(ids), 1)
        counted = Counter(kind for t, kind in messages if start <= t <= end)
        per_event[name] = {**{k: v / n for k, v in sorted(counted.items())},
                           **{_STREAMS[k]: v / n for k, v in loadgen.items()}}
        loops[name] = {}
        for pid, v in sorted(lags.items(), key=lambda kv: names.get(kv[0], kv[0])):
            during = [(late, wall, cpu) for t, late, wall, cpu in v if start <= t <= end]
            if during:
                late = [x for x, _, _ in during]
                loops[name][names.get(pid, pid)] = {
                    "n": len(during), "p50_ms": _pct(late, 0.5), "p99_ms": _pct(late, 0.99), "max_ms": max(late),
                    "on_core": sum(c for _, _, c in during) / max(sum(w for _, w, _ in during), 1e-9)}
        gcs[name] = {}
        for (pid, gen), v in sorted(pauses.items(), key=lambda kv: (names.get(kv[0][0], kv[0][0]), kv[0][1])):
            during = [(wall, cpu) for t, wall, cpu in v if start <= t <= end]
            if during:
                gcs[name][f"{names.get(pid, pid)} {gen}"] = {
                    "n": len(during), "cpu_ms": sum(c for _, c in during), "max_cpu_ms": max(c for _, c in during),
                    "max_wall_ms": max(w for w, _ in during)}
    return {"cells": report, "messages_per_event": per_event, "gc": gcs, "loop_lag": loops, "missing": sorted(missing),
            "trace_dir": str(trace)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m loadtest.trace_hops", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, nargs="*", default=[1000], help="fixed rates, events/s")
    ap.add_argument("--seconds", type=float, default=4.0, help="publishing time per fixed-rate cell")
    ap.add_argument("--trickle", type=float, default=4.0, help="seconds of the 50/s cell")
    ap.add_argument("--selectivity", type=int, default=2, choices=[2, 20],
                    help="percent of the subscriptions an event matches")
    ap.add_argument("--json", default="", help="also write the budget here")
    args = ap.parse_args(argv)
    from echelon.runtime.loop import run as run_loop

    out = run_loop(run(args))
    print(f"per-hop latency, ms (load average {os.getloadavg()[0]:.1f}; wall clock of one machine)")
    for name, rows in out["cells"].items():
        print(f"\n{name}")
        print(f"  {'hop':36} {'n':>6} {'p50':>8} {'p90':>8} {'p99':>8} {'mean':>8}")
        for hop, r in rows.items():
            print(f"  {hop:36} {r['n']:6d} {r['p50_ms']:8.2f} {r['p90_ms']:8.2f} {r['p99_ms']:8.2f} {r['mean_ms']:8.2f}")
    for cell, kinds in out["messages_per_event"].items():
        print(f"\ngRPC messages per event during {cell}: "
              + ", ".join(f"{k} {v:.2f}" for k, v in kinds.items()) + f"; all {sum(kinds.values()):.2f}")
    for cell, procs in out["loop_lag"].items():
        print(f"\nthe event loops during {cell}: how late a {PROBE * 1e3:g} ms timer fired, ms, and the share of "
              "the time the process was on a core (the rest of the lateness: waiting for a core)")
        for name, g in procs.items():
            print(f"  {name:26} p50 {g['p50_ms']:7.2f}  p99 {g['p99_ms']:7.2f}  max {g['max_ms']:7.2f}  "
                  f"on a core {100 * g['on_core']:5.1f}%")
    for cell, passes in out["gc"].items():
        print(f"\nthe cyclic GC's passes during {cell}, per process and generation")
        for name, g in passes.items():
            print(f"  {name:26} {g['n']:5d} passes  CPU {g['cpu_ms']:7.1f} ms, the longest {g['max_cpu_ms']:6.2f} ms "
                  f"CPU / {g['max_wall_ms']:6.2f} ms wall")
    if out["missing"]:
        print(f"\nnot traced (no longer in the code): {', '.join(out['missing'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
