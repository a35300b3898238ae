"""The run: for each system, selectivity (2%, 20%), publishers (1, 4), mode and rate
(1k/s, 10k/s, saturation) one cell, bounded by a time and an event count; then the
table (ratios to NATS), the plot and the JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from echelon.runtime import loop
from loadtest.bench_events.systems import MODES, NODE_MODES, SYSTEMS, missing_peers
from loadtest.bench_events.workload import (POOL, RANGE, Pool, Received, cpu_seconds, cpu_waiting, oracle,
                                            percentile, subscriptions, hop_bytes, tcp_sockets)

RATES = (1000, 10000, None)  # None: saturation
QUICK_RATES = (1000, None)  # --quick: a paced cell and a saturated one (10,000/s is paced alike)
WINDOW = 4096  # events in flight over all publishers (the bound on what a cell leaves behind)
BATCH = 256  # events per send() at saturation
SUSTAINED = 0.95  # a fixed rate counts as held when this share of it was published and delivered


class Run:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.next_id = 0
        self.sink = None
        self.ready: set[int] = set()
        self.cells: list[dict] = []
        self.profile: dict | None = None
        self.floor: list[dict] = []

    def deliver(self, sub: int, event_id: int, sent_ns: int) -> None:
        if event_id < 0:
            self.ready.add(sub)
        elif self.sink is not None:
            self.sink(sub, event_id, sent_ns, time.perf_counter_ns())

    async def warm_up(self, system, subs, pool: Pool) -> None:
        """Until every subscription got an event meant for it (registration is done)."""
        self.ready.clear()
        (send,) = await system.publishers(1, MODES[system.name][0], pool)
        probes = [-(next(k for k in range(POOL) if s.index in pool.receivers[k]) + 1) for s in subs]
        deadline = time.monotonic() + 60
        while len(self.ready) < len(subs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{system.name}: {len(subs) - len(self.ready)} subscriptions never got an event")
            await send([p for s, p in zip(subs, probes) if s.index not in self.ready])
            for _ in range(30):  # until every probe is in, at most 0.3 s, then the missing ones again
                await asyncio.sleep(0.01)
                if len(self.ready) == len(subs):
                    break
        await system.close_publishers()

    async def cell(self, system, sends, rate: int | None, pool: Pool, subs, meta: dict) -> dict:
        seconds, cap = self.args.seconds, self.args.max_events
        received = Received(ids={} if self.args.check else None)
        first = self.next_id
        late = [0]  # deliveries of an earlier cell's events (its drain timed out): not this cell's

        def sink(sub, i, sent, now):
            if i >= first:
                received.record(sub, i, sent, now)
            else:
                late[0] += 1
        self.sink = sink
        pids = system.pids()
        own = os.getpid()
        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
        overflowed0 = getattr(system, "overflowed", 0)
        filtered0 = getattr(system, "filtered", 0)
        load0 = os.getloadavg()[0]
        gens = [own, *getattr(system, "client_pids", list)()]  # the load generator's processes
        gen0 = sum(map(cpu_seconds, gens))
        roles = {pid: hop_role(name, system.name) for name, pid in pids.items()} | dict.fromkeys(gens, "client")
        wire0 = tcp_sockets(roles)
        window = WINDOW // len(sends)
        acked, errors, last_ack = [0], Counter(), [0]
        waiting0, t0 = cpu_waiting(), time.perf_counter_ns()
        end = t0 + int(seconds * 1e9)

        async def publisher(send, share: float) -> None:
            inflight, room, done, tasks = [0], asyncio.Event(), [0], set()

            def settled(task, n):
                tasks.discard(task)
                inflight[0] -= n
                room.set()
                if task.exception() is None:
                    acked[0] += n
                    last_ack[0] = time.perf_counter_ns()
                else:
                    errors[type(task.exception()).__name__] += n

            while (now := time.perf_counter_ns()) < end and self.next_id - first < cap:
                n = BATCH if share is None else min(BATCH, int(share * (now - t0) / 1e9) - done[0])
                if n <= 0:
                    # Until the next event is due (at least the loops' 1 ms timer grain), not a
                    # fixed 0.5 ms: 4 publishers at 250/s each woke 4,000 times a second for
                    # nothing on the cores the cluster needs. Each event carries its own send
                    # time, so a late wakeup delays the send, never the latency measured.
                    await asyncio.sleep(max(0.001, (done[0] + 1) / share - (now - t0) / 1e9))
                    continue
                while inflight[0] + n > window:
                    room.clear()
                    await room.wait()
                n = min(n, cap - (self.next_id - first))
                ids = range(self.next_id, self.next_id + n)
                self.next_id += n
                done[0] += n
                inflight[0] += n
                task = asyncio.create_task(send(ids))
                tasks.add(task)
                task.add_done_callback(lambda t, n=n: settled(t, n))
                await asyncio.sleep(0)
            if tasks:
                await asyncio.wait(set(tasks), timeout=self.args.drain)

        share = None if rate is None else rate / len(sends)
        await asyncio.gather(*(publisher(s, share) for s in sends))
        last = self.next_id
        expected = pool.expected(first, last)
        deadline = time.monotonic() + self.args.drain
        while received.useful < expected and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # a cell's last delivery is seen within a few ms (its latency is not)
        if self.args.check and system.name == "echelon":
            await asyncio.sleep(0.1)  # anything extra shows up in the oracle (the peers have none)
        self.sink = None
        cpu = {k: cpu_seconds(p) - cpu0[k] for k, p in pids.items()}
        hops = hop_bytes(tcp_sockets(roles), wire0)
        wire = sum(hops.values())
        waiting, wall = cpu_waiting(), (time.perf_counter_ns() - t0) / 1e9
        lat = sorted(received.latencies)
        pub_s = (last_ack[0] - t0) / 1e9 if last_ack[0] else None
        dlv_s = (received.last_ns - t0) / 1e9 if received.last_ns else None
        published = acked[0] / pub_s if pub_s else 0.0
        row = {**meta, "rate": rate or "max", "events": last - first, "acked": acked[0], "errors": dict(errors),
               "expected_deliveries": expected, "useful_deliveries": received.useful,
               "late_deliveries_of_earlier_cells": late[0],
               "subscriptions_overflowed": getattr(system, "overflowed", 0) - overflowed0,
               "published_per_s": published, "delivered_per_s": received.useful / dlv_s if dlv_s else 0.0,
               "p50_ms": percentile(lat, 0.5), "p99_ms": percentile(lat, 0.99), "p999_ms": percentile(lat, 0.999),
               "cpu_s_per_1k": {k: v / max(acked[0], 1) * 1000 for k, v in cpu.items()},
               "cpu_s_per_1k_services": sum(cpu.values()) / max(acked[0], 1) * 1000,
               "cpu_s_per_1k_loadgen": (sum(map(cpu_seconds, gens)) - gen0) / max(acked[0], 1) * 1000,
               "wire_bytes": wire, "bytes_per_useful_delivery": wire / received.useful if received.useful else None,
               # Where those bytes went: sender>receiver, per useful delivery (hop_role).
               "bytes_by_hop": {f"{a}>{b}": round(n / received.useful, 1) for (a, b), n in sorted(hops.items())
                                if n > 0} if received.useful else {},
               # What the whole run paid per delivery a subscriber wanted: the services and the load
               # generator (publishers, and subscribers with their filtering in the client).
               "cpu_us_per_useful_delivery":
                   (sum(cpu.values()) + sum(map(cpu_seconds, gens)) - gen0) / received.useful * 1e6
                   if received.useful else None,
               "client_filtered_per_useful": (getattr(system, "filtered", 0) - filtered0) / received.useful
               if received.useful else None,
               "load_average": [round(load0, 2), round(os.getloadavg()[0], 2)],
               "cpu_pressure": None if waiting is None or waiting0 is None else round((waiting - waiting0) / wall, 3),
               "trees_pinned": getattr(system, "pinned", None)}
        if rate is not None:
            target = min(rate, cap / seconds)
            row["sustained"] = published >= SUSTAINED * target and received.useful >= SUSTAINED * expected
        if self.args.check and system.name == "echelon":
            row["oracle"] = oracle(pool, first, last, subs, received.ids)
        return row

    async def system(self, name: str) -> None:
        out = Path(self.args.out)
        system = SYSTEMS[name](out / "logs", **({"base_port": self.args.base_port} if name == "echelon" else {}))
        await system.start()
        try:
            for sel in self.args.selectivity:
                subs = subscriptions(sel, self.args.range_subs if sel == RANGE else self.args.subs)
                pool = Pool.draw(subs)
                await system.open_subs(subs, pool, self.deliver)
                await self.warm_up(system, subs, pool)
                loop.started()  # the load generator's GC as the services' (runtime/loop.py)
                for npub in self.args.publishers:
                    for mode in [m for m in MODES[name] if name != "echelon" or m in self.args.modes]:
                        if hasattr(system, "for_mode") and await system.for_mode(mode):  # zbatch-*: compressed
                            await self.warm_up(system, subs, pool)
                        sends = await system.publishers(npub, mode, pool)
                        for rate in self.args.rates:
                            for rep in range(self.args.repeat):  # back to back: the spread shows the noise
                                meta = {"system": name, "mode": mode, "selectivity": sel, "publishers": npub,
                                        "repeat": rep}
                                row = await self.cell(system, sends, rate, pool, subs, meta)
                                self.cells.append(row)
                                print(line(row), flush=True)
                        await system.close_publishers()
                if name == "echelon" and sel == self.args.selectivity[0] and self.args.profile:
                    self.profile = await self.profiled(system, pool, subs)
                await system.close_subs()
        finally:
            await system.stop()

    async def profiled(self, system, pool, subs) -> dict:
        """A saturation cell (batch-DELIVERED, 1 publisher) with py-spy sampling the
        publishing agent; kept out of the table (the sampler costs CPU too)."""
        out = Path(self.args.out) / "agent-0.folded"
        beside = Path(sys.executable).parent / "py-spy"  # the venv's, from the dev extra
        exe = str(beside) if beside.exists() else shutil.which("py-spy")
        if exe is None:
            return {"error": "py-spy not installed (dev extra)"}
        spy = subprocess.Popen([exe, "record", "--pid", str(system.publishing_pid()), "--duration",
                                str(int(self.args.seconds)), "--rate", "200", "--format", "raw", "--output",
                                str(out), "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        sends = await system.publishers(1, self.args.profile_mode, pool)
        row = await self.cell(system, sends, None, pool, subs, {"system": "echelon", "mode": "profiled"})
        await system.close_publishers()
        try:
            spy.wait(timeout=self.args.seconds + 30)
        except subprocess.TimeoutExpired:
            spy.kill()
        return {"published_per_s": row["published_per_s"], **top_costs(out)}


OUTER = ("(services/echelon/__main__.py", "(services/echelon/cli/main.py")  # the process's entry, under every stack


def top_costs(folded: Path, n: int = 15) -> dict:
    """py-spy's raw (folded) stacks -> shares of all samples: by the function on top of
    the stack (self), and by the deepest Echelon frame (services/echelon/...) of each stack, the
    libraries it called charged to it. A Python thread whose top frame is Thread.run runs
    native code: in the agent that is gRPC's completion-queue poller (HTTP/2 and sockets)."""
    self_, ours, total = Counter(), Counter(), 0
    if not folded.exists():
        return {"error": f"no {folded}"}
    for line_ in folded.read_text().splitlines():
        stack, _, count = line_.rpartition(" ")
        if not count.isdigit():
            continue
        c = int(count)
        total += c
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if frames:
            self_[frames[-1]] += c
        mine = [f for f in frames if "(services/echelon/" in f and not any(m in f for m in OUTER)]
        ours[mine[-1] if mine else "(outside Echelon's code) " + (frames[-1] if frames else "?")] += c
    share = lambda counter: [(f, round(100 * c / total, 1)) for f, c in counter.most_common(n)]  # noqa: E731
    return {"samples": total, "self_pct": share(self_), "by_echelon_frame_pct": share(ours)}


def hop_role(name: str, system: str) -> str:
    """A process's part in the byte breakdown: Echelon's publishing agent (agent-0, where
    the publishers connect) apart from the subscribing agents; the load generator is
    "client" (publishers and subscribers)."""
    if system != "echelon":
        return system
    return "pub-agent" if name == "agent-0" else name.rpartition("-")[0]


def hop_table(cells: list[dict]) -> str:
    """Bytes per useful delivery by hop (sender>receiver) at saturation, one row per cell:
    where the bytes of a delivery go (publish, matching, relay frames and their acks,
    deliveries and the subscribers' acks, the control plane)."""
    cells = [c for c in cells if c["rate"] == "max" and c.get("bytes_by_hop")]
    if not cells:
        return ""
    hops = sorted({h for c in cells for h, n in c["bytes_by_hop"].items() if n >= 0.5})
    head = f"{'system':8} {'mode':17} {'sel':>4} {'pubs':>4} {'B/dlv':>6}  " + "  ".join(hops)
    rows = ["bytes per useful delivery by hop, sender>receiver (saturation cells)", head, "-" * len(head)]
    for c in cells:
        rows.append(f"{c['system']:8} {c['mode']:17} {str(c['selectivity']) + '%':>4} {c['publishers']:>4} "
                    f"{fmt(c['bytes_per_useful_delivery']):>6}  "
                    + "  ".join(f"{fmt(c['bytes_by_hop'].get(h), '.1f'):>{len(h)}}" for h in hops))
    return "\n".join(rows)


# A one-event-a-request mode's counterpart in gRPC alone: (the floor's mode, its client).
FLOOR_OF = {"raw": ("ack each", "python"), "rawc": ("coalesced", "python"),
            "node": ("ack each", "node"), "nodec": ("coalesced", "node")}


def floor_ratios(cells: list[dict], floor: list[dict]) -> str:
    """Each raw-stub saturation cell's published rate over gRPC alone's requests/s with the
    same acks and the same client (loadtest/grpc_floor.py): 1 means the agent's coalescing
    reached the floor of one event a request; above 1, the agent answers several requests
    per message."""
    alone = {(f["mode"], f.get("client", "python")): f["requests_per_s"] for f in floor}
    rows = []
    for c in cells:
        how = c["mode"].split("-")[0]
        if c["system"] == "echelon" and c["rate"] == "max" and alone.get(FLOOR_OF.get(how)):
            ref = alone[FLOOR_OF[how]]
            rows.append(f"  {c['mode']} {c['selectivity']}% {c['publishers']}p: {c['published_per_s']:,.0f}/s = "
                        f"{c['published_per_s'] / ref:.2f}x gRPC alone, {FLOOR_OF[how][0]}, "
                        f"{FLOOR_OF[how][1]} client ({ref:,.0f} requests/s)")
    return "raw-stub cells against the floor:\n" + "\n".join(rows) if rows else ""


def fmt(v, spec=".0f") -> str:
    return "-" if v is None else format(v, spec)


def line(r: dict) -> str:
    held = "" if r.get("sustained", True) else " NOT HELD"
    if r.get("subscriptions_overflowed"):
        held += f" ({r['subscriptions_overflowed']} slow subscriptions closed by their agents, subscribed again)"
    return (f"{r['system']:8} {r['mode']:17} {r['selectivity']:>3}% {r['publishers']}p {str(r['rate']):>6}: "
            f"pub {r['published_per_s']:9.0f}/s dlv {r['delivered_per_s']:9.0f}/s p50 {fmt(r['p50_ms'], '.2f')} "
            f"p99 {fmt(r['p99_ms'], '.2f')} ms{held}"
            + (f" (short of cores {100 * r['cpu_pressure']:.0f}% of the cell)" if r.get("cpu_pressure") is not None
               else ""))


def table(cells: list[dict]) -> str:
    nats = {(c["selectivity"], c["publishers"], c["rate"]): c for c in cells if c["system"] == "nats"}
    head = (f"{'system':8} {'mode':17} {'sel':>4} {'pubs':>4} {'rate':>6} {'pub ev/s':>9} {'dlv ev/s':>9} "
            f"{'p50 ms':>7} {'p99 ms':>7} {'p999 ms':>7} {'cpu ms/1k':>9} {'B/dlv':>6} {'held':>4} "
            f"{'pub/NATS':>8} {'p50/NATS':>8}")
    rows = [head, "-" * len(head)]
    for c in cells:
        n = nats.get((c["selectivity"], c["publishers"], c["rate"]))
        pub_ratio = c["published_per_s"] / n["published_per_s"] if n and n["published_per_s"] else None
        p50_ratio = c["p50_ms"] / n["p50_ms"] if n and n["p50_ms"] and c["p50_ms"] is not None else None
        held = {True: "yes", False: "NO"}.get(c.get("sustained"), "")
        rows.append(f"{c['system']:8} {c['mode']:17} {c['selectivity']:>3}% {c['publishers']:>4} {str(c['rate']):>6} "
                    f"{c['published_per_s']:9.0f} {c['delivered_per_s']:9.0f} {fmt(c['p50_ms'], '7.2f')} "
                    f"{fmt(c['p99_ms'], '7.2f')} {fmt(c['p999_ms'], '7.2f')} "
                    f"{1000 * c['cpu_s_per_1k_services']:9.1f} {fmt(c['bytes_per_useful_delivery'], '6.0f')} "
                    f"{held:>4} {fmt(pub_ratio, '8.3f')} {fmt(p50_ratio, '8.1f')}")
    return "\n".join(rows)


def targets(cells: list[dict]) -> str:
    """The small-event targets (docs/performance.md) on their workload (2% selectivity), each
    with the cells it is read
    from and MET / NOT MET; '-' where the run had no such cell."""
    def pick(mode: str | None, rate) -> list[dict]:
        return [c for c in cells if c["system"] == "echelon" and c["selectivity"] == 2 and c["rate"] == rate
                and (mode is None or c["mode"] == mode)]

    def rates(mode: str) -> tuple[list[str], float | None]:
        got = pick(mode, "max")
        return [f"{c['publishers']}p {c['published_per_s']:,.0f}/s" for c in got], \
            max((c["published_per_s"] for c in got), default=None)

    def verdict(ok: bool | None) -> str:
        return "-" if ok is None else "MET" if ok else "NOT MET"

    out = ["small-event targets (2% selectivity, Echelon; the best cell counts, 1,000/s: one cell meeting both):"]
    for mode, floor, what in (("batch-DELIVERED", 50_000, "batched, acked at DELIVERED"),
                              ("single-DELIVERED", 10_000, "one event per publish(), DELIVERED")):
        each, best = rates(mode)
        out.append(f"  {what}, saturation >= {floor:,}/s: {', '.join(each) or '-'}: "
                   f"{verdict(None if best is None else best >= floor)}")
    low = [c for c in pick(None, 1000) if c["p50_ms"] is not None]
    if low:
        p50 = min(low, key=lambda c: c["p50_ms"])
        p99 = min(low, key=lambda c: c["p99_ms"])
        out.append(f"  1,000/s: p50 < 3 ms and p99 < 15 ms: best p50 {p50['p50_ms']:.2f} ms ({p50['mode']} "
                   f"{p50['publishers']}p), best p99 {p99['p99_ms']:.2f} ms ({p99['mode']} {p99['publishers']}p), "
                   f"worst p50 {max(c['p50_ms'] for c in low):.2f} / p99 {max(c['p99_ms'] for c in low):.2f} ms: "
                   f"{verdict(any(c['p50_ms'] < 3 and c['p99_ms'] < 15 for c in low))}")
    else:
        out.append("  1,000/s: p50 < 3 ms and p99 < 15 ms: -")
    nats = {c["publishers"]: c["published_per_s"] for c in cells
            if c["system"] == "nats" and c["selectivity"] == 2 and c["rate"] == "max"}
    ratios = [(c["published_per_s"] / nats[c["publishers"]], c) for c in pick(None, "max")
              if nats.get(c["publishers"])]
    if ratios:
        r, c = max(ratios, key=lambda x: x[0])
        out.append(f"  published rate within 4x of nats-server (>= 0.25): best {r:.3f} ({c['mode']} "
                   f"{c['publishers']}p): {verdict(r >= 0.25)}")
    else:
        out.append("  published rate within 4x of nats-server (>= 0.25): - (no NATS cells)")
    return "\n".join(out)


def spread_table(cells: list[dict]) -> str:
    """Cells run more than once (--repeat): per cell, the median and [min, max] of the
    published and delivered rates and of p50 and p99, and the load averages seen."""
    groups: dict[tuple, list[dict]] = {}
    for c in cells:
        groups.setdefault((c["system"], c["mode"], c["selectivity"], c["publishers"], str(c["rate"])), []).append(c)
    if all(len(g) < 2 for g in groups.values()):
        return ""

    def spread(g: list[dict], key: str, spec: str) -> str:
        v = sorted(c[key] for c in g if c[key] is not None)
        return "-" if not v else f"{format(v[len(v) // 2], spec)} [{format(v[0], spec)}-{format(v[-1], spec)}]"

    head = (f"{'system':8} {'mode':17} {'sel':>4} {'pubs':>4} {'rate':>6} {'n':>2} {'pub ev/s':>22} "
            f"{'dlv ev/s':>22} {'p50 ms':>22} {'p99 ms':>22} {'load':>10}")
    rows = ["median [min-max] over repeats", head, "-" * len(head)]
    for (system, mode, sel, pubs, rate), g in groups.items():
        loads = [v for c in g for v in c.get("load_average", [])]
        load = f"{min(loads):.0f}-{max(loads):.0f}" if loads else "-"
        rows.append(f"{system:8} {mode:17} {str(sel):>3}% {pubs:>4} {rate:>6} {len(g):>2} "
                    f"{spread(g, 'published_per_s', '.0f'):>22} {spread(g, 'delivered_per_s', '.0f'):>22} "
                    f"{spread(g, 'p50_ms', '.1f'):>22} {spread(g, 'p99_ms', '.1f'):>22} {load:>10}")
    return "\n".join(rows)


def range_table(cells: list[dict]) -> str:
    """The range workload (what content routing is for): per system and cell, useful
    deliveries/s, CPU per useful delivery (services + load generator, which holds the
    subscribers and their filtering in the client), bytes per useful delivery, messages
    the clients filtered per useful delivery, and the ratio of Echelon to each peer."""
    rows = [c for c in cells if c["selectivity"] == RANGE]
    if not rows:
        return ""
    head = (f"{'system':8} {'mode':17} {'pubs':>4} {'rate':>6} {'useful/s':>9} {'cpu us/useful':>13} "
            f"{'B/useful':>8} {'filtered/useful':>15} {'load':>11}")
    out = [f"range workload ({RANGE}): Price window and Volume floor, 2% combined", head, "-" * len(head)]
    for c in rows:
        load = "/".join(f"{v:.1f}" for v in c.get("load_average", []))
        out.append(f"{c['system']:8} {c['mode']:17} {c['publishers']:>4} {str(c['rate']):>6} "
                   f"{c['delivered_per_s']:9.0f} {fmt(c['cpu_us_per_useful_delivery'], '13.1f')} "
                   f"{fmt(c['bytes_per_useful_delivery'], '8.0f')} {fmt(c['client_filtered_per_useful'], '15.1f')} "
                   f"{load:>11}")
    best = {}
    for c in rows:  # per system, its best saturation cell
        if c["rate"] == "max" and c["delivered_per_s"] > best.get(c["system"], {}).get("delivered_per_s", -1):
            best[c["system"]] = c
    e = best.get("echelon")
    for peer in ("nats", "redis"):
        p = best.get(peer)
        if e and p and p["delivered_per_s"] and e["cpu_us_per_useful_delivery"] and e["bytes_per_useful_delivery"]:
            ahead = [e["delivered_per_s"] > p["delivered_per_s"],
                     e["cpu_us_per_useful_delivery"] < p["cpu_us_per_useful_delivery"],
                     e["bytes_per_useful_delivery"] < p["bytes_per_useful_delivery"]]
            out.append(f"echelon ({e['mode']} {e['publishers']}p) over {peer} at saturation: useful/s "
                       f"{e['delivered_per_s'] / p['delivered_per_s']:.2f}x, CPU per useful "
                       f"{e['cpu_us_per_useful_delivery'] / p['cpu_us_per_useful_delivery']:.2f}x, bytes per useful "
                       f"{e['bytes_per_useful_delivery'] / p['bytes_per_useful_delivery']:.2f}x: ahead on "
                       f"{sum(ahead)} of 3 (target: all 3)")
    return "\n".join(out)


def _service(process: str) -> str:
    if process == "agent-0":
        return "pub agent"  # the publishers' agent
    if process.startswith("agent-"):
        return "sub agents"  # the subscribers' agents, together
    return process.split("-")[0]  # matcher-1 -> matcher: the tier together; nats, redis


def cpu_table(cells: list[dict]) -> str:
    """CPU ms per 1,000 events of each service, per cell (the JSON has every process)."""
    order = ["pub agent", "sub agents", "matcher", "membership", "nats", "redis"]
    head = f"{'system':8} {'mode':17} {'sel':>4} {'pubs':>4} {'rate':>6} " + " ".join(f"{s:>10}" for s in order) + \
        f" {'loadgen':>8}"
    rows = [head, "-" * len(head)]
    for c in cells:
        per: dict[str, float] = {}
        for process, v in c["cpu_s_per_1k"].items():
            per[_service(process)] = per.get(_service(process), 0.0) + 1000 * v
        rows.append(f"{c['system']:8} {c['mode']:17} {c['selectivity']:>3}% {c['publishers']:>4} {str(c['rate']):>6} "
                    + " ".join(f"{per[s]:10.1f}" if s in per else f"{'-':>10}" for s in order)
                    + f" {1000 * c['cpu_s_per_1k_loadgen']:8.1f}")
    return "\n".join(rows)


def plot(cells: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    combos = sorted({(c["selectivity"], c["publishers"]) for c in cells}, key=str)
    fig, axes = plt.subplots(1, len(combos), figsize=(6 * len(combos), 5), squeeze=False)
    for ax, (sel, npub) in zip(axes[0], combos):
        for key in sorted({(c["system"], c["mode"]) for c in cells}):
            pts = sorted((c["published_per_s"], c["p50_ms"], c["p99_ms"]) for c in cells
                         if (c["system"], c["mode"]) == key and c["selectivity"] == sel and c["publishers"] == npub
                         and c["p50_ms"] is not None and c["published_per_s"] > 0)
            if pts:
                x = [p[0] for p in pts]
                line_, = ax.plot(x, [p[1] for p in pts], "o-", label=f"{key[0]} {key[1]} p50")
                ax.plot(x, [p[2] for p in pts], "x--", color=line_.get_color(), label=f"{key[0]} {key[1]} p99")
        ax.set(xscale="log", yscale="log", xlabel="published events/s", ylabel="delivery latency (ms)",
               title=f"{sel}% selectivity, {npub} publisher(s)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def run(args: argparse.Namespace) -> Run:
    r = Run(args)
    for name in args.systems:
        await r.system(name)
    if args.floor:  # what gRPC alone does with one event a request: the raw-stub cells' ceiling
        from loadtest import grpc_floor

        from loadtest.bench_events.node import missing

        clients = ("python",) if missing() else ("python", "node")
        r.floor = [await grpc_floor.cell(m, 40960, WINDOW, c) for c in clients for m in grpc_floor.MODES]
    return r


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m loadtest.bench_events", description=__doc__)
    ap.add_argument("--out", default="out/bench_events")
    ap.add_argument("--quick", action="store_true", help="a few seconds per cell's worth: structure and the oracle")
    ap.add_argument("--short", action="store_true",
                    help="the cells the small-event targets are read from: Echelon at "
                         "DELIVERED only (batch and per event), 2 s per cell, in about half the time")
    ap.add_argument("--modes", nargs="+", default=None, choices=MODES["echelon"],
                    help="Echelon's modes (the peers have one each; default all, without the node-* ones "
                         "with --quick or where the Node client is not installed)")
    ap.add_argument("--seconds", type=float, default=3.0, help="publishing time per cell")
    ap.add_argument("--max-events", type=int, default=200_000, help="events per cell at most")
    ap.add_argument("--drain", type=float, default=8.0, help="seconds a cell waits for acks and deliveries")
    ap.add_argument("--subs", type=int, default=50, help="subscriptions (each at the selectivity)")
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    ap.add_argument("--profile", action="store_true", help="py-spy the publishing agent in a saturation cell")
    ap.add_argument("--profile-mode", default="batch-DELIVERED", choices=MODES["echelon"],
                    help="the publishers of the profiled cell (e.g. nodec-DELIVERED: one event a request)")
    ap.add_argument("--selectivity", nargs="+", type=lambda v: v if v == RANGE else int(v), default=[2, 20, RANGE],
                    choices=[2, 20, RANGE], help=f"workloads: 2%%, 20%% (Symbol, Price), {RANGE}: a range over two "
                    "attributes at 2%% (workload.py)")
    ap.add_argument("--range-subs", type=int, default=100, help=f"subscriptions of the {RANGE} workload")
    ap.add_argument("--base-port", type=int, default=47100,
                    help="Echelon's ports laid out from here, the same every run, so its LBDD trees (which hang "
                         "on the members' addresses) are too; 0 or taken: free ports (the rows' trees_pinned)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each cell, back to back (the table of "
                    "spreads shows the noise of this shared machine)")
    ap.add_argument("--publishers", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--floor", action="store_true", help="also gRPC alone, one event a request "
                    "(loadtest/grpc_floor.py): the ceiling of the raw-stub cells, in the same run")
    ap.add_argument("--rates", nargs="+", type=lambda v: None if v == "max" else int(v), default=None,
                    help="events/s of the cells, `max` for saturation (default: 1000 10000 max; --quick: 1000 max)")
    ap.add_argument("--base", metavar="REV", help="Echelon's cells of this tree against revision REV, side by "
                    "side: alternating rounds of one run per tree (versus.py); the other options apply to both")
    ap.add_argument("--rounds", type=int, default=2, help="with --base: rounds (a run per tree each)")
    ap.add_argument("--base-env", action="append", default=[], metavar="NAME=VALUE",
                    help="with --base: a variable set on the base side only (e.g. `--base HEAD --base-env "
                         "ECHELON_PURE=1`: the same tree, its Python reference against its compiled hot path)")
    args = ap.parse_args(argv)
    if any("=" not in e for e in args.base_env):
        ap.error("--base-env takes NAME=VALUE")
    args.check = args.quick
    if args.modes is None:
        from loadtest.bench_events.node import missing

        # The Node publisher has a test of its own (tests/interop/test_node_loadgen.py).
        why = "--quick" if args.quick else missing()
        if why and not args.base:
            print(f"note: without the {' and '.join(NODE_MODES)} cells: {why}", flush=True)
        args.modes = [m for m in MODES["echelon"] if not why or m not in NODE_MODES]
    if args.rates is None:
        args.rates = list(QUICK_RATES if args.quick else RATES)
    if args.quick:
        args.seconds, args.max_events, args.subs = 0.3, 600, 10
    if args.short:
        args.modes = [m for m in args.modes if m.endswith("DELIVERED")]
        args.seconds = min(args.seconds, 2.0)
    return args


def main(argv: list[str] | None = None) -> Run | None:
    args = parse(argv)
    if args.base:
        from loadtest.bench_events.versus import side_by_side

        print(side_by_side(args.base, args.rounds, sys.argv[1:] if argv is None else argv,
                           dict(e.split("=", 1) for e in args.base_env)))
        return None
    missing = missing_peers()
    if missing:
        raise SystemExit(f"missing {', '.join(missing)}: `make install` as root installs them (apt)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"load generator on {loop.chosen()} (ECHELON_EVENT_LOOP), the services too", flush=True)
    r = loop.run(run(args))
    print()
    print(table(r.cells))
    print()
    print(targets(r.cells))
    spread = spread_table(r.cells)
    if spread:
        print("\n" + spread)
    ranged = range_table(r.cells)
    if ranged:
        print("\n" + ranged)
    by_hop = hop_table(r.cells)
    if by_hop:
        print("\n" + by_hop)
    if r.floor:
        from loadtest.grpc_floor import table as floor_table

        print("\n" + floor_table(r.floor))
        ratios = floor_ratios(r.cells, r.floor)
        if ratios:
            print(ratios)
    print("\nCPU ms per 1,000 events, by process")
    print(cpu_table(r.cells))
    if r.profile:
        print(f"\npublishing agent under saturation ({r.profile.get('samples')} py-spy samples)")
        for title, key in (("top of the stack", "self_pct"), ("deepest Echelon frame", "by_echelon_frame_pct")):
            print(f"  by {title}:")
            for f, pct in r.profile.get(key, []):
                print(f"    {pct:5.1f}%  {f}")
    (out / "bench_events.json").write_text(json.dumps({"cells": r.cells, "profile": r.profile, "grpc_floor": r.floor,
                                                      "seconds": time.monotonic() - started,
                                                      "event_loop": loop.chosen(),
                                                      "args": {k: v for k, v in vars(args).items()}}, indent=1))
    plot(r.cells, out / "latency_vs_rate.png")
    print(f"\nwrote {out / 'bench_events.json'}, {out / 'latency_vs_rate.png'} in {time.monotonic() - started:.0f}s")
    return r
