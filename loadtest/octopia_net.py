"""OctopiA's experiment scaled to this machine, with real routers (OctopiA section VIII;
docs/papers.md, "OctopiA"): every router and agent in its own network namespace, iLinks
throttled with tc (tbf) mid-run, a high-rate publisher (HRP) plus background publishers
at 2% selectivity; SNR and IDR side by side in one run, on the same workload.

Layout: 3 regions x 2 routers (the tree T is an aLink pair), one agent per region.
agent-0 (region-0) publishes: the HRP stream, every event wanted by a subscription in
region-1 and in region-2, and background events whose `x` each of the 10 background
subscriptions per subscriber agent takes with probability 2%. Membership and the matcher
run in the root namespace on the bridge. When the HRP starts, the iLink(s) out of the
router agent-0 hands over to are throttled hard (a tbf class with a u32 filter on the
far router's address, in that router's namespace); when the burst ends they are freed.

Figures (the paper's): average delivery delay (receive time minus publish time, one
clock), share under 1 s, stabilisation (from the end of the burst to the last delivery
later than 1 s), inter-router messages (`echelon_router_messages_total` of every router)
per published event. Table, ratios, and a plot of delay over time for both.

Run (root): python -m loadtest.octopia_net [--burst 10] [--rate 200] [--throttle-kbit 400]
Namespaces are named rt-<pid>-<i>, addresses in 198.18.64.0/18.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import click
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from echelon.dataplane.gateway import Gateway
from echelon.client import Client
from echelon.v1 import membership_pb2 as mpb
from echelon import launch
from echelon.launch.placement import layout
from loadtest.netns import Network, used_subnets

RANGE = ipaddress.ip_network("198.18.64.0/18")
REGIONS, ROUTERS = 3, 2
THROTTLE_CLASS = "1:30"


@dataclass
class Run:
    routing: str
    delays: list[tuple[float, float]] = field(default_factory=list)  # (received at, delay) relative to start
    published: int = 0
    expected: int = 0  # deliveries brute force asks for: matching subscriptions of every published event
    messages: float = 0.0
    decisions: dict[str, float] = field(default_factory=dict)
    burst_end: float = 0.0

    def average(self) -> float:
        return sum(d for _, d in self.delays) / len(self.delays)

    def under(self, limit: float = 1.0) -> float:
        return sum(d < limit for _, d in self.delays) / len(self.delays)

    def stabilised(self, limit: float = 1.0) -> float:
        late = [at for at, d in self.delays if d > limit]
        return max(0.0, max(late) - self.burst_end) if late else 0.0


@dataclass
class RegionsPlacement:
    """The launcher's placement for this layout: router i in host i, agent c in host
    6 + c, membership and matcher in the root namespace on the bridge."""

    net: Network
    base_port: int = 7000
    kind: str = "netns"

    def site(self, role: str, index: int) -> launch.Site:
        host = {"router": index, "agent": REGIONS * ROUTERS + index}.get(role)
        if host is None:
            return launch.Site(self.net.gateway)
        return launch.Site(self.net.hosts[host].address, self.net.hosts[host])

    def ports(self, role: str, index: int) -> tuple[int, int]:
        return layout(self.base_port, role, 0 if role in ("router", "agent") else index)

    def popen(self, site: launch.Site, argv, **kw) -> subprocess.Popen:
        return self.net.popen(site.host, argv, **kw)


class RegionsCluster:
    """The launcher's cluster (`echelon.launch`) with 3 regions of 2 routers, one agent per
    region, each router and agent in a namespace of its own; tc on the routers' hosts."""

    def __init__(self, net: Network, routing: str, log_dir: Path, delta: int, interval: float):
        self.net = net
        self.services = launch.Cluster(agents=REGIONS, matchers=1, memberships=1, regions=REGIONS, routers=ROUTERS,
                                       placement=RegionsPlacement(net), log_dir=log_dir,
                                       common=["--grace", "1", "--beat-interval", "0.2"],
                                       extra={"router": ["--routing", routing, "--delta", str(delta),
                                                         "--interval", str(interval)]})
        self.routers = {p.id: p.site.host for p in self.services.by_role("router")}
        self.agents = {p.id: p for p in self.services.by_role("agent")}

    def start(self, timeout: float = 90.0) -> None:
        asyncio.run(self.services.start(timeout))

    def stop(self) -> None:
        self.services.stop()

    def gateway_of(self, agent: str) -> str:
        """The router of region-0 that `agent` hands over to (the agent's own choice)."""
        g = Gateway(agent, "region-0")
        routers = self.services.by_role("router")
        g.update([mpb.Member(id=p.id) for p in routers], {p.id: p.region for p in routers}, "region-0")
        return g.router

    def throttle(self, router: str, far: list[str], kbit: int) -> None:
        """tbf on the iLinks router -> far routers only: an htb class and a u32 filter per peer."""
        h, net = self.routers[router], self.net
        net.run(h, ["tc", "class", "add", "dev", "eth0", "parent", "1:", "classid", THROTTLE_CLASS, "htb",
                    "rate", f"{kbit}kbit", "ceil", f"{kbit}kbit"])
        net.run(h, ["tc", "qdisc", "add", "dev", "eth0", "parent", THROTTLE_CLASS, "handle", "30:", "tbf",
                    "rate", f"{kbit}kbit", "burst", "16kb", "latency", "2s"])
        for i, peer in enumerate(far):
            net.run(h, ["tc", "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", str(10 + i),
                        "u32", "match", "ip", "dst", f"{self.routers[peer].address}/32", "flowid", THROTTLE_CLASS])

    def free(self, router: str, far: list[str]) -> None:
        h = self.routers[router]
        for i, _ in enumerate(far):
            self.net.run(h, ["tc", "filter", "del", "dev", "eth0", "parent", "1:", "prio", str(10 + i)], check=False)

    def scrape(self) -> tuple[float, dict[str, float]]:
        messages, rules = 0.0, {}
        for p in self.services.by_role("router"):
            body = urllib.request.urlopen(f"http://{p.metrics}/metrics", timeout=5).read().decode()
            for fam in text_string_to_metric_families(body):
                for s in fam.samples:
                    if s.name == "echelon_router_messages_total":
                        messages += s.value
                    elif s.name == "echelon_router_idr_decisions_total":
                        rules[s.labels["rule"]] = rules.get(s.labels["rule"], 0) + s.value
        return messages, rules


async def workload(cl: RegionsCluster, routing: str, burst: float, rate: float, background: float,
                   throttle_kbit: int, two: bool, seed: int, tail: float = 6.0) -> Run:
    run = Run(routing)
    rng = random.Random(seed)
    addr = {a: p.address for a, p in cl.agents.items()}
    clients = {a: Client(x) for a, x in addr.items()}
    t0 = time.time()
    try:
        await clients["agent-0"].create_topic("hrp", ["k:int"])
        await clients["agent-0"].create_topic("bg", ["x:int:0:99"])
        subs, ranges = [], []
        for a in ("agent-1", "agent-2"):
            subs.append(clients[a].subscribe("hrp", "", max_outstanding=4096))
            for lo in rng.sample(range(0, 100, 2), 10):
                ranges.append(lo)
                subs.append(clients[a].subscribe("bg", f"x >= {lo} and x < {lo + 2}", max_outstanding=4096))
        for s in subs:
            await s.start()
        await asyncio.sleep(1.0)  # registration reaches the matcher before the run (membership view too)

        async def read(s):
            while True:
                m = await s.next()
                now = time.time()
                run.delays.append((now - t0, now - m.publish_time_ns / 1e9))
                await m.ack()

        readers = [asyncio.create_task(read(s)) for s in subs]
        hrp, bg = clients["agent-0"].publisher(), clients["agent-0"].publisher()
        gateway = cl.gateway_of("agent-0")
        a = gateway.rsplit("-", 1)[1]
        far = [f"router-1-{a}"] + ([f"router-2-{a}"] if two else [])
        t0 = time.time()

        async def background_load(count: int):
            for n in range(count):  # a fixed count: both runs publish the same events
                x = rng.randrange(100)
                bg.publish_nowait("bg", {"x": x})
                run.published += 1
                run.expected += sum(lo <= x < lo + 2 for lo in ranges)
                await asyncio.sleep(max(0.0, t0 + (n + 1) / background - time.time()))

        # Background events from 2 s before the burst to `tail` s after it: the delays while
        # the throttled links' backlog drains.
        bg_task = asyncio.create_task(background_load(int(background * (2 + burst + tail))))
        await asyncio.sleep(2.0)
        cl.throttle(gateway, far, throttle_kbit)
        start = time.time()
        k = 0
        while time.time() - start < burst:
            due = int((time.time() - start) * rate)
            while k < due:
                # Incompressible: the links compress (docs/compression.md), and the burst must
                # load the throttled iLinks with its bytes.
                hrp.publish_nowait("hrp", {"k": k}, payload=os.urandom(512))
                k += 1
                run.published += 1
                run.expected += 2  # the HRP subscriptions of region-1 and region-2
            await asyncio.sleep(0.005)
        run.burst_end = time.time() - t0
        cl.free(gateway, far)
        await bg_task
        await hrp.flush()
        await bg.flush()
        deadline = time.time() + 120
        while time.time() < deadline and len(run.delays) < run.expected:
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # and a little longer, to see any duplicate
        for r in readers:
            r.cancel()
        run.messages, run.decisions = cl.scrape()
    finally:
        for c in clients.values():
            await c.close()
    return run


def subnet() -> str:
    used = used_subnets()
    for net in RANGE.subnets(new_prefix=24):
        if net not in used:
            return str(net)
    raise RuntimeError(f"no free /24 left in {RANGE}")


def experiment(out: Path, burst: float, rate: float, background: float, throttle_kbit: int, two: bool,
               delta: int, interval: float, seed: int = 3, tail: float = 6.0) -> dict[str, Run]:
    runs = {}
    for routing in ("snr", "idr"):
        with Network(REGIONS * ROUTERS + REGIONS, subnet=subnet(), prefix=f"rt-{os.getpid()}-{routing}") as net:
            cl = RegionsCluster(net, routing, out / routing, delta, interval)
            try:
                cl.start()
                runs[routing] = asyncio.run(workload(cl, routing, burst, rate, background, throttle_kbit, two, seed,
                                                     tail))
            finally:
                cl.stop()
    return runs


def table(runs: dict[str, Run]) -> Table:
    s, i = runs["snr"], runs["idr"]
    t = Table(title="IDR vs SNR with throttled iLinks (real routers, tc tbf); paper in brackets")
    for col in ("routing", "deliveries / expected", "avg delay s", "< 1 s", "stabilised s", "inter-router msgs / event",
                "IDR rules"):
        t.add_column(col, justify="right")
    for r in (s, i):
        t.add_row(r.routing, f"{len(r.delays)} / {r.expected}", f"{r.average():.3f}", f"{100 * r.under():.1f}%",
                  f"{r.stabilised():.1f}", f"{r.messages / max(1, r.published):.3f}",
                  " ".join(f"{k}:{v:.0f}" for k, v in sorted(r.decisions.items())))
    t.add_row("IDR vs SNR", "", f"{100 * (1 - i.average() / s.average()):.1f}% lower [17.5%]",
              f"{100 * i.under():.1f} vs {100 * s.under():.1f} [53.8 vs 44.1]",
              f"{s.stabilised() - i.stabilised():.1f} earlier [239]",
              f"{100 * (i.messages / max(1, i.published) / max(1e-9, s.messages / max(1, s.published)) - 1):+.1f}% "
              "[+0.3%]", "")
    return t


def plot(runs: dict[str, Run], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for r in runs.values():
        pts = sorted(r.delays)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], ".", ms=2, label=r.routing.upper())
    ax.axvline(runs["snr"].burst_end, color="grey", ls=":", label="burst ends, iLinks freed")
    ax.set_xlabel("received at (s from start)")
    ax.set_ylabel("delivery delay (s)")
    ax.legend()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "octopia_net_delay.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@click.command()
@click.option("--burst", default=10.0, type=click.FloatRange(1, 600), show_default=True, help="HRP seconds.")
@click.option("--rate", default=200.0, type=click.FloatRange(1, 5000), show_default=True, help="HRP events/s.")
@click.option("--background", default=20.0, type=click.FloatRange(1, 1000), show_default=True,
              help="Background events/s (2% selectivity per subscription).")
@click.option("--throttle-kbit", default=400, type=click.IntRange(8, 1_000_000), show_default=True)
@click.option("--two/--one", default=True, show_default=True, help="Throttle two iLinks, or one.")
@click.option("--delta", default=10, type=click.IntRange(0), show_default=True)
@click.option("--interval", default=0.1, type=click.FloatRange(0.01, 10), show_default=True)
@click.option("--out", default="out/octopia_net", type=click.Path(file_okay=False, path_type=Path))
def main(burst, rate, background, throttle_kbit, two, delta, interval, out) -> None:
    """Run SNR then IDR on the same workload; print the table, write the plot and JSON."""
    runs = experiment(out, burst, rate, background, throttle_kbit, two, delta, interval)
    Console(width=200).print(table(runs))
    print(f"plot: {plot(runs, out)}")
    (out / "octopia_net.json").write_text(json.dumps({k: {"average": r.average(), "under_1s": r.under(),
                                                          "stabilised": r.stabilised(), "messages": r.messages,
                                                          "published": r.published, "expected": r.expected,
                                                          "delivered": len(r.delays), "decisions": r.decisions}
                                                      for k, r in runs.items()}))


if __name__ == "__main__":
    sys.exit(main())
