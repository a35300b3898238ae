"""Regions that stand alone, cut by the network (docs/event-path.md, "Regions that stand
alone"; run as root: `python -m loadtest.regions_cut [--events 40]`). Region-2's routers cut off by the network (their namespaces' cable out), with a matcher
tier per region and the routers' summaries: real processes, every router and agent in a
namespace of its own (loadtest/octopia_net.py's placement), 198.18.0.0/15 only.

Phases: before (every region publishes), cut (region-2's routers' eth0 down), during
(every region publishes), heal (cable in), after. Checks: every delivery against brute
force, local traffic during the cut complete and in order, eu<->us during the cut complete,
region-2's events and the events for it arrive after healing, in each publisher's order.
Prints inter-router iLink messages, skipped regions, unmatched, lost, parked per phase.
Namespaces rc-<pid>-<i>, addresses in 198.18.0.0/15 (loadtest/netns.py)."""
from __future__ import annotations

import asyncio
import os
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from echelon import launch
from echelon.client import DELIVERED, Client
from echelon.contract.filters import parse
from echelon.v1 import router_pb2 as opb
from echelon.v1 import router_pb2_grpc as ogrpc
from loadtest.netns import Network, Unsupported, check_available
from loadtest.octopia_net import RegionsPlacement, REGIONS, ROUTERS
from loadtest.checker import drain


def scrape(cluster, last):
    """Each reachable router's counters into `last` (a router cut off keeps its last
    values: its counts of the cut show in the phase it is reached again)."""
    for p in cluster.by_role("router"):
        try:
            body = urllib.request.urlopen(f"http://{p.metrics}/metrics", timeout=3).read().decode()
        except OSError:
            continue
        out = {}
        for fam in text_string_to_metric_families(body):
            for s in fam.samples:
                key = s.name + (f"{{{s.labels['link']}}}" if "link" in s.labels else "")
                if s.name in ("echelon_router_messages_total", "echelon_router_regions_skipped_total",
                              "echelon_router_unmatched_total", "echelon_router_destinations_lost_total",
                              "echelon_router_destinations_parked_total"):
                    out[key] = out.get(key, 0) + s.value
        last[p.id] = out
    return {k: sum(v.get(k, 0) for v in last.values()) for k in {k for v in last.values() for k in v}}


async def summaries_settled(cluster, regions: int, timeout: float = 60.0) -> None:
    """Every router's summary of its region complete, and the other regions' complete and
    answering every advertisement the router holds (router.proto Describe;
    docs/guarantees.md): an event of an advertisement not answered yet goes everywhere."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ok = True
        for p in cluster.by_role("router"):
            channel = cluster.transport.dial(p.address)
            try:
                d = await ogrpc.RouterStub(channel).Describe(opb.DescribeRequest(), timeout=5)
            finally:
                await channel.close()
            ok &= d.complete and len([s for s in d.summaries if s.complete and s.answered == d.advertisements]) \
                == regions - 1
        if ok:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("the routers' summaries never settled")


async def main(per_phase: int):
    check_available()
    log_dir = Path(tempfile.mkdtemp(prefix="regions-cut-"))
    with Network(REGIONS * ROUTERS + REGIONS, prefix=f"rc-{os.getpid()}") as net:
        cluster = launch.Cluster(agents=REGIONS, matchers=1, memberships=1, regions=REGIONS, routers=ROUTERS,
                                 regional_matchers=True, placement=RegionsPlacement(net), log_dir=log_dir,
                                 common=["--grace", "1", "--beat-interval", "0.2"],
                                 extra={"router": ["--routing", "snr"]})
        await cluster.start(120)
        try:
            agents = {p.id: p for p in cluster.by_role("agent")}
            clients = {a: Client(p.address) for a, p in agents.items()}
            names = sorted(clients)  # agent-0 region-0, agent-1 region-1, agent-2 region-2
            await clients[names[0]].create_topic("t", ["x:int:0:99", "r:string"])
            filters = {a: f"x < {40 + 10 * i}" for i, a in enumerate(names)}
            subs = {a: clients[a].subscribe("t", filters[a]) for a in names}
            for s in subs.values():
                await s.start()
            await summaries_settled(cluster, len(names))  # owed the other regions' events from here
            pubs = {a: clients[a].publisher(ack_level=DELIVERED) for a in names}
            rng = random.Random(5)
            sent = {}

            async def phase(tag):
                evs = {a: [{"x": rng.randrange(100), "r": f"{tag}-{a}-{k}"} for k in range(per_phase)] for a in names}
                async def one(a):
                    for e in evs[a]:
                        await asyncio.wait_for(pubs[a].publish("t", e), 60)
                t = time.perf_counter()
                await asyncio.gather(*(one(a) for a in names))
                sent[tag] = evs
                return time.perf_counter() - t

            last = {}
            m0 = scrape(cluster, last)
            w = await phase("before")
            got = {a: [m.attributes["r"] for m in await drain(subs[a])] for a in names}
            m1 = scrape(cluster, last)
            cut = [net.hosts[i] for i in range(REGIONS * ROUTERS) if i // ROUTERS == 2]
            for h in cut:
                net.link(h, False)
            await asyncio.sleep(6)  # region-2's routers DEAD in every view (grace 1 s)
            wd = await phase("during")
            for a in names:
                got[a] += [m.attributes["r"] for m in await drain(subs[a], 1.0)]
            m2 = scrape(cluster, last)
            for h in cut:
                net.link(h, True)
            deadline = time.monotonic() + 60
            want = {a: [e["r"] for tag in ("before", "during") for p in names for e in sent[tag][p]
                        if parse(filters[a]).matches(e)] for a in names}
            while time.monotonic() < deadline and any(set(want[a]) - set(got[a]) for a in names):
                for a in names:
                    got[a] += [m.attributes["r"] for m in await drain(subs[a], 0.5)]
            healed = time.monotonic() - (deadline - 60)
            # The streams to region-2 were re-made: their full states and answers again first.
            await summaries_settled(cluster, len(names))
            wa = await phase("after")
            for a in names:
                got[a] += [m.attributes["r"] for m in await drain(subs[a], 1.0)]
            m3 = scrape(cluster, last)
            print(f"publish phases (s): before {w:.2f}, during the cut {wd:.2f}, after {wa:.2f}; "
                  f"caught up {healed:.1f} s after healing")
            ok = True
            for a in names:
                exp = [e["r"] for tag in ("before", "during", "after") for p in names for e in sent[tag][p]
                       if parse(filters[a]).matches(e)]
                same = sorted(got[a]) == sorted(exp)
                order = all([r for r in got[a] if r.startswith(f"{tag}-{p}-")] ==
                            [r for r in exp if r.startswith(f"{tag}-{p}-")] for tag in sent for p in names)
                local = [r for r in got[a] if r.startswith(f"during-{a}-")]
                print(f"{a} ({filters[a]}): {len(got[a])} delivered, {len(exp)} by brute force, exact {same}, "
                      f"in each publisher's order {order}, local during the cut {len(local)}")
                ok &= same and order
            print("(region-2's routers cannot be scraped during the cut: what they counted then is in 'healed')")
            print(f"{'metric':<48}{'before':>8}{'cut':>8}{'healed':>8}")
            for k in sorted(set(m3)):
                print(f"{k:<48}{m1.get(k, 0) - m0.get(k, 0):>8.0f}{m2.get(k, 0) - m1.get(k, 0):>8.0f}"
                      f"{m3.get(k, 0) - m2.get(k, 0):>8.0f}")
            print("ALL EXACT" if ok else "NOT EXACT")
            print(f"process logs: {log_dir}")
            for c in clients.values():
                await c.close()
            return ok
        finally:
            cluster.stop()


if __name__ == "__main__":
    args = sys.argv[1:]
    try:
        ok = asyncio.run(main(int(args[args.index("--events") + 1]) if "--events" in args else 40))
    except Unsupported as e:
        print(f"regions_cut needs network namespaces, unavailable here: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(0 if ok else 1)
