"""The whole-cluster modes of `loadtest.bench_hotpath`: `--cluster` (a
saturation and a 1k/s cell with publish_batch, a saturation cell with one event per
publish(): events/s, latency, CPU per 1,000 events per service, the subscribers' and the
publisher's stream messages per event) and `--idle` (CPU per second of a cluster doing
nothing). Imported by name from this directory in a child process of either tree, like
hotpath_pieces."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

def _count_subscribe_messages() -> dict[str, int]:
    """Counts the messages of every Subscribe and Publish stream this process opens from
    here on (the load generator's subscribers and publishers, in either tree: wrapped where
    the channel makes the call, whether through the generated stub or not): Delivery
    messages read, requests written (acks, nacks, opens); Publish requests written,
    PublishAck messages read."""
    from grpc.aio import _channel

    count = {"read": 0, "written": 0, "publish written": 0, "publish read": 0}

    class Counted:
        def __init__(self, call, prefix: str = ""):
            self._call, self._prefix = call, prefix

        def __getattr__(self, name):
            return getattr(self._call, name)

        async def write(self, request):
            count[self._prefix + "written"] += 1
            return await self._call.write(request)

        async def _read(self):
            async for message in self._call:
                count[self._prefix + "read"] += 1
                yield message

        def __aiter__(self):
            return self._read()

    stream_stream = _channel.Channel.stream_stream

    def counting(channel, method, *args, **kwargs):
        make = stream_stream(channel, method, *args, **kwargs)
        if method.endswith("PubSub/Publish"):
            def publish(requests, *a, **kw):
                async def written():
                    async for request in requests:
                        count["publish written"] += 1
                        yield request
                return Counted(make(written(), *a, **kw), "publish ")
            return publish
        if not method.endswith("PubSub/Subscribe"):
            return make
        return lambda *a, **kw: Counted(make(*a, **kw))

    _channel.Channel.stream_stream = counting
    return count


async def _cluster(seconds: float, selectivity: int = 2, publishers: int = 1) -> dict:
    """One Echelon cluster (loadtest.bench_events' processes, 1 publisher): a saturation
    cell and a 1k/s cell, batch-DELIVERED; per-service CPU per 1,000 events in each, and
    the subscribers' Subscribe messages per event. `publishers` above 1: a third cell,
    saturation with that many publishers on the one agent (they share its dispatcher)."""
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
        cells = [("max", None, 1, "batch-DELIVERED"), (1000, 1000, 1, "batch-DELIVERED"),
                 ("single", None, 1, "single-DELIVERED")]
        if publishers > 1:
            cells.append(("many", None, publishers, "batch-DELIVERED"))
        for name, rate, n, mode in cells:
            sends = await system.publishers(n, mode, pool)
            before = dict(count)
            rows[name] = await run.cell(system, sends, rate, pool, subs, {
                "system": "echelon", "mode": mode, "selectivity": selectivity, "publishers": n})
            messages[name] = {k: (count[k] - before[k]) / max(rows[name]["events"], 1) for k in count}
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
              # The tree's inner relay (which agent it is depends on the ports drawn) forwards
              # most events to the other two on top of its own deliveries: the busiest of them.
              "cpu ms/1k: busiest subscribing agent": 1000 * max(v for k, v in cpu.items()
                                                                 if k.startswith("agent-") and k != "agent-0"),
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
              "max: ack msgs per event": messages["max"]["written"],
              # The publisher's stream: requests written, PublishAck messages read, per event.
              "1k/s publish msgs per event": messages[1000]["publish written"],
              "1k/s publish ack msgs per event": messages[1000]["publish read"],
              # One event per publish() call (publish_nowait, many in flight), at saturation.
              "single: saturation published/s": rows["single"]["published_per_s"],
              "single: cpu ms/1k: publishing agent": 1000 * rows["single"]["cpu_s_per_1k"].get("agent-0", 0.0),
              "single: cpu ms/1k: load generator": 1000 * rows["single"]["cpu_s_per_1k_loadgen"]}
    if "many" in rows:
        result[f"saturation {publishers}p published/s"] = rows["many"]["published_per_s"]
        result[f"{publishers}p cpu ms/1k: publishing agent"] = 1000 * rows["many"]["cpu_s_per_1k"].get("agent-0", 0.0)
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
