"""OctopiA's control-plane experiment on real routers (OctopiA section VIII, "Publisher
Scalability" and "Subscriber Scalability"; docs/papers.md, "Control-plane figures on real
routers"): router processes in regions on loopback, run once with OctopiA's control plane
(`--control scot`) and once with the PADRES/TID baseline (`--control tid`), the same
workload, every figure read from the routers themselves (router.proto `Describe`: SRT and
PRT sizes, control messages written by kind, the time the last control message was
applied), printed beside the paper's and beside `loadtest/octopia_control_sim.py` run at the
same size.

Workload (the simulation's): `--advertisements` publishers, publisher p advertising topic
`stock` with bounds `Symbol = S(p mod 50) and Volume between p and 10^6` at a random router,
then `--subscriptions` subscriptions `Symbol = s and Volume > v` at random routers, so
each overlaps 2% of the advertisements. The tool plays the agents: one per router
(`load-<c>-<a>`, attached to router a of region c), with its own Control streams. Under
SCOT it sends a subscription to every router of its region (what Echelon's agents do:
OctopiA's broadcast in the host cluster, made by the agent) and an advertisement to its
router; under TID both go to its router only.

TID as made real here (router/control.py `peers`): a router floods its advertisements to
every other router over one-hop streams (a star per advertisement: n - 1 messages and no
duplicates, where the paper's flood over a sparse overlay pays for duplicates), and sends
each subscription to the host of every advertisement it overlaps; its tables are
measured, not routed by.

Each advertisement and subscription is issued alone and the routers polled until quiet:
its inter-broker messages are the routers' control messages written meanwhile (agents'
own messages counted apart), its delay the last `control_applied_ns` of a router minus the
time it was written (one machine, one clock); an advertisement's delay, as the paper's, runs
until the last router stored it (`advertisement_applied_ns`), and also until the last answer
came back. OctopiA broadcasts a subscription inside its
cluster from broker to broker (T - 1 messages); in Echelon the agent sends it to each
router itself, so the row "with the in-region broadcast" adds those T - 1 to compare with
the paper.

Run: python -m loadtest.octopia_control_real [--regions 4 --routers 3 --advertisements 100
--subscriptions 500]
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import click
import grpc

from echelon.contract.filters import parse
from echelon.contract.transport import Transport
from echelon.contract.wire import filter_to_pb
from echelon.dataplane.control import METHOD
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import router_pb2 as opb
from echelon.v1 import router_pb2_grpc as ogrpc
from loadtest import octopia_control_sim as sim

SYMBOLS = sim.SYMBOLS
ROUTER_KINDS = ("adv", "unadv", "cib_set", "cib_clear")  # what routers write to routers


def adv_bounds(p: int) -> str:
    return f'Symbol = "{sim.symbol(p)}" and Volume >= {p} and Volume <= 1000000'


def sub_filter(rng: random.Random) -> str:
    return f'Symbol = "{sim.symbol(rng.randrange(SYMBOLS))}" and Volume > {rng.randrange(0, 1_000_000)}'


class Routers:
    """Describe on every router, over channels kept open."""

    def __init__(self, addresses: dict[str, str], transport: Transport):
        self.channels = {r: transport.dial(a) for r, a in addresses.items()}
        self.stubs = {r: ogrpc.RouterStub(c) for r, c in self.channels.items()}

    async def describe(self) -> dict[str, opb.DescribeResponse]:
        rs = await asyncio.gather(*(s.Describe(opb.DescribeRequest(), timeout=10) for s in self.stubs.values()))
        return dict(zip(self.stubs, rs))

    async def close(self) -> None:
        for c in self.channels.values():
            await c.close()


def sent(ds: dict[str, opb.DescribeResponse]) -> Counter:
    out = Counter()
    for d in ds.values():
        out.update({k: v for k, v in d.control_sent.items() if k in ROUTER_KINDS})
    return out


async def quiet(routers: Routers, gap: float = 0.03, limit: float = 20.0) -> dict[str, opb.DescribeResponse]:
    """Poll until the routers' control counters and last-applied times stop moving."""
    last = None
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        ds = await routers.describe()
        now = (sent(ds), tuple(d.control_applied_ns for d in ds.values()))
        if now == last:
            return ds
        last = now
        await asyncio.sleep(gap)
    raise TimeoutError("the routers' control plane never went quiet")


class Agent:
    """A stand-in agent: Control streams to routers, written one message at a time."""

    def __init__(self, me: str, region: str, channels: dict[str, grpc.aio.Channel]):
        self.me, self.region = me, region
        self.calls = {r: c.stream_unary(METHOD, request_serializer=opb.ControlMessage.SerializeToString,
                                        response_deserializer=opb.ControlReply.FromString)()
                      for r, c in channels.items()}
        self.written = 0

    async def begin(self) -> None:
        """An agent's stream begins with its subscriptions' full state (none here)."""
        await self.write(self.calls, kind=opb.CONTROL_KIND_SUB, full=True, last=True)

    async def write(self, routers, **fields) -> None:
        for r in routers:
            await self.calls[r].write(opb.ControlMessage(sender=self.me, region=self.region, **fields))
            self.written += 1

    def close(self) -> None:
        for c in self.calls.values():
            c.cancel()


async def settled(routers: Routers, regions: list[str], limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        ds = await routers.describe()
        if all(d.complete and {s.region for s in d.summaries if s.complete} >= set(regions) - {d.region}
               for d in ds.values()):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError("the routers' summaries never became complete")


async def measure(addresses: dict[str, tuple[str, int, int]], mode: str, advertisements: int, subscriptions: int,
                  seed: int, transport: Transport | None = None) -> dict:
    """`addresses`: router id -> (address, region index, position in it), every router
    started with `--control mode`. Returns the figures (module doc)."""
    transport = transport or Transport()
    rng = random.Random(seed)
    regions = sorted({c for _, c, _ in addresses.values()})
    by_place = {(c, a): r for r, (_, c, a) in addresses.items()}
    routers = Routers({r: a for r, (a, _, _) in addresses.items()}, transport)
    ds0 = await routers.describe()
    names = {c: next(d.region for r, d in ds0.items() if addresses[r][1] == c) for c in regions}
    await settled(routers, list(names.values()))
    agents: dict[tuple[int, int], Agent] = {}
    for (c, a), r in by_place.items():
        targets = [by_place[p] for p in by_place if p[0] == c] if mode == "scot" else [r]
        agents[c, a] = Agent(f"load-{c}-{a}", names[c], {t: routers.channels[t] for t in targets})
    await asyncio.gather(*(a.begin() for a in agents.values()))
    places = sorted(by_place)
    out = {k: {"ims": [], "delay": [], "stored": [], "agent": []} for k in ("adv", "sub")}
    kinds = Counter()
    kinds_adv = Counter()
    issued = {"adv": [], "sub": []}  # (region index, position, filter text), in order
    try:
        before = await quiet(routers, gap=0.5)  # past a stream re-opened at start (dataplane/control.py MAX_RETRY)
        for k in range(advertisements):
            c, a = rng.choice(places)
            issued["adv"].append((c, a, adv_bounds(k)))
            ad = opb.Advertisement(topic="stock", bounds=filter_to_pb(parse(adv_bounds(k))))
            before = await _one(routers, agents[c, a], [by_place[c, a]], before, out["adv"], kinds_adv,
                                kind=opb.CONTROL_KIND_ADV, advertisements=[ad])
        for k in range(subscriptions):
            c, a = rng.choice(places)
            agent = agents[c, a]
            issued["sub"].append((c, a, sub_filter(rng)))
            s = xpb.Subscription(id=f"{agent.me}/s{k}", agent=agent.me, topic="stock",
                                 filter=filter_to_pb(parse(issued["sub"][-1][2])))
            before = await _one(routers, agent, list(agent.calls), before, out["sub"], kinds,
                                kind=opb.CONTROL_KIND_SUB, subscriptions=[s])
        ds = before
        srt = [d.advertisements + d.srt for d in ds.values()]
        prt = [d.subgroups + sum(s.subgroups for s in d.summaries) for d in ds.values()]
        return {"mode": mode, "routers": len(addresses), "regions": len(regions),
                "srt": statistics.mean(srt), "prt": statistics.mean(prt),
                "adv_ims": statistics.mean(out["adv"]["ims"] or [0]),
                "adv_only": kinds_adv["adv"] / max(1, advertisements),
                "adv_delay": statistics.mean(out["adv"]["stored"] or [0]),
                "adv_answered": statistics.mean(out["adv"]["delay"] or [0]),
                "adv_agent": statistics.mean(out["adv"]["agent"] or [0]),
                "sub_ims": statistics.mean(out["sub"]["ims"] or [0]),
                "sub_delay": statistics.mean(out["sub"]["delay"] or [0]),
                "sub_agent": statistics.mean(out["sub"]["agent"] or [0]),
                "kinds": dict(kinds_adv + kinds), "issued": issued,
                "tables": {r: (d.advertisements + d.srt, d.subgroups + sum(s.subgroups for s in d.summaries))
                           for r, d in ds.items()}}
    finally:
        for agent in agents.values():
            agent.close()
        await routers.close()


async def _one(routers: Routers, agent: Agent, targets, before, tally, kinds, **fields):
    """Issue one message (to `targets`), wait until quiet: its IMs, delay, agent messages."""
    written = agent.written
    t0 = time.time_ns()
    await agent.write(targets, **fields)
    ds = await quiet(routers)
    moved = sent(ds) - sent(before)
    kinds.update(moved)
    tally["ims"].append(sum(moved.values()))
    tally["agent"].append(agent.written - written)
    applied = [d.control_applied_ns for r, d in ds.items() if d.control_applied_ns != before[r].control_applied_ns]
    tally["delay"].append(max(0, max(applied, default=t0) - t0) / 1e6)  # until the last message it caused
    stored = [d.advertisement_applied_ns for r, d in ds.items()
              if d.advertisement_applied_ns != before[r].advertisement_applied_ns]
    tally["stored"].append(max(0, max(stored, default=t0) - t0) / 1e6)  # until the last router stored it
    return ds


async def run_processes(mode: str, regions: int, per_region: int, advertisements: int, subscriptions: int,
                        seed: int, log_dir: Path) -> dict:
    from echelon.launch import Cluster, Loopback

    cluster = Cluster(agents=regions, matchers=1, memberships=1, regions=regions, routers=per_region,
                      regional_matchers=True, placement=Loopback(0), log_dir=log_dir / mode,
                      common=["--beat-interval", "0.2", "--grace", "3"],  # no router declared DEAD under load
                      extra={"router": ["--routing", "snr", "--control", mode]})
    await cluster.start(180)
    try:
        addresses = {}
        for p in cluster.by_role("router"):
            _, c, a = p.id.split("-")
            addresses[p.id] = (p.address, int(c), int(a))
        return await measure(addresses, mode, advertisements, subscriptions, seed)
    finally:
        cluster.stop()


def change(a: float, b: float) -> str:
    """a against b, signed: "-50.0%" is half."""
    return f"{100 * (a / b - 1):+.1f}%" if b else "-"


def fewer(a: float, b: float) -> str:
    return f"{b / a:.1f}x fewer" if a else "-"


def table(scot: dict, tid: dict, simulated: dict | None) -> str:
    """The figures: TID, SCOT, the comparison, the simulation's at this size, the paper's."""
    P = sim.PAPER
    s = simulated or {}

    def simcol(key: str) -> str:
        return s.get(key, "-")

    rows = [
        ("SRT size per router", f"{tid['srt']:.1f}", f"{scot['srt']:.1f}", change(scot["srt"], tid["srt"]),
         simcol("srt"), f"-{P['srt_lower']}%"),
        ("router msgs per advertisement", f"{tid['adv_ims']:.2f}", f"{scot['adv_ims']:.2f}",
         fewer(scot["adv_ims"], tid["adv_ims"]), simcol("adv_ims"), f"{P['adv_ims_fewer_x']}x fewer"),
        ("  of them ADV", f"{tid['adv_only']:.2f}", f"{scot['adv_only']:.2f}",
         fewer(scot["adv_only"], tid["adv_only"]), "", ""),
        ("advertisement delay (ms)", f"{tid['adv_delay']:.2f}", f"{scot['adv_delay']:.2f}",
         change(scot["adv_delay"], tid["adv_delay"]), simcol("adv_delay"), f"-{P['adv_delay_lower']}%"),
        ("  until answered", f"{tid['adv_answered']:.2f}", f"{scot['adv_answered']:.2f}",
         change(scot["adv_answered"], tid["adv_answered"]), "", ""),
        ("PRT size per router", f"{tid['prt']:.1f}", f"{scot['prt']:.1f}", change(scot["prt"], tid["prt"]),
         simcol("prt"), f"+{P['prt_higher']}%"),
        ("router msgs per subscription", f"{tid['sub_ims']:.2f}", f"{scot['sub_ims']:.2f}",
         f"TID {change(tid['sub_ims'], scot['sub_ims'])}", simcol("sub_ims"), f"TID -{P['sub_ims_tid_fewer']}%"),
        ("  with the in-region broadcast", f"{tid['sub_ims'] + tid['sub_agent'] - 1:.2f}",
         f"{scot['sub_ims'] + scot['sub_agent'] - 1:.2f}",
         f"TID {change(tid['sub_ims'] + tid['sub_agent'] - 1, scot['sub_ims'] + scot['sub_agent'] - 1)}", "",
         ""),
        ("subscription delay (ms)", f"{tid['sub_delay']:.2f}", f"{scot['sub_delay']:.2f}",
         change(scot["sub_delay"], tid["sub_delay"]), simcol("sub_delay"), f"-{P['sub_delay_lower']}%"),
        ("agent msgs per advertisement", f"{tid['adv_agent']:.1f}", f"{scot['adv_agent']:.1f}", "", "", ""),
        ("agent msgs per subscription", f"{tid['sub_agent']:.1f}", f"{scot['sub_agent']:.1f}", "", "", ""),
    ]
    head = ("figure", "TID", "SCOT", "real: SCOT vs TID", "simulation, same size", "paper")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(r, widths)) for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    n, c = tid["routers"], tid["regions"]
    ads = len(tid["issued"]["adv"])
    lines.append(f"ADV messages, whole run: TID {tid['kinds'].get('adv', 0)} (a flood: {ads} x (n - 1) = "
                 f"{ads * (n - 1)}), SCOT {scot['kinds'].get('adv', 0)} (to the secondaries: {ads} x (c - 1) = "
                 f"{ads * (c - 1)}); more means streams re-opened during the run (full states again)")
    lines.append(f"router messages by kind, TID: {dict(sorted(tid['kinds'].items()))}")
    lines.append(f"router messages by kind, SCOT: {dict(sorted(scot['kinds'].items()))}")
    return "\n".join(lines)


def simulated(regions: int, per_region: int, advertisements: int, subscriptions: int, seed: int) -> dict:
    """octopia_control_sim at this size: the same comparisons, from the model."""
    s = sim.Setting(t=per_region, regions=regions, advertisements=(advertisements,), publishers=advertisements,
                    subscribers=(subscriptions,), seed=seed)
    pub = sim.publisher_sweep(s)[0]
    sub = sim.subscriber_sweep(s)[0][0]
    o, t = pub["octopia"], pub["tid"]
    so, st = sub["octopia"], sub["tid"]
    return {"srt": change(o["srt"], t["srt"]), "adv_ims": fewer(o["ims"], t["ims"]),
            "adv_delay": change(o["delay"], t["delay"]), "prt": change(so["prt"], st["prt"]),
            "sub_ims": f"TID {change(st['ims'], so['ims'])}", "sub_delay": change(so["delay"], st["delay"])}


@click.command()
@click.option("--regions", default=4, type=click.IntRange(2, 8), show_default=True, help="OctopiA's clusters.")
@click.option("--routers", "per_region", default=3, type=click.IntRange(1, 8), show_default=True,
              help="Routers per region (OctopiA's tree T).")
@click.option("--advertisements", default=100, type=click.IntRange(1), show_default=True)
@click.option("--subscriptions", default=500, type=click.IntRange(0), show_default=True)
@click.option("--seed", default=1, show_default=True)
def main(regions, per_region, advertisements, subscriptions, seed) -> None:
    """OctopiA's control plane against the TID baseline on real router processes."""
    log_dir = Path(tempfile.mkdtemp(prefix="octopia-control-real-"))
    results = {}
    for mode in ("tid", "scot"):
        t = time.monotonic()
        results[mode] = asyncio.run(run_processes(mode, regions, per_region, advertisements, subscriptions, seed,
                                                  log_dir))
        print(f"{mode}: {regions} regions x {per_region} routers, {advertisements} advertisements, "
              f"{subscriptions} subscriptions, {time.monotonic() - t:.0f} s", file=sys.stderr)
    print(f"OctopiA's control plane on real routers: {regions} regions x {per_region} routers "
          f"({regions * per_region}; the paper's 5 x 14 = 70), {advertisements} advertisements, "
          f"{subscriptions} subscriptions")
    print(table(results["scot"], results["tid"], simulated(regions, per_region, advertisements, subscriptions,
                                                             seed)))
    print(f"process logs: {log_dir}")


if __name__ == "__main__":
    main()
