"""The control-plane experiment's short version (loadtest/octopia_control_real.py) on real
routers in-process (3 regions x 2 routers, loopback): OctopiA's control plane and the TID
baseline on the same workload. Checked against an oracle computed from the workload alone
(which router hosts what, and the filters' overlap): every router's SRT and PRT size, and
the ADV messages of each system; and the paper's directions: SCOT's SRT and ADV messages
below TID's, its PRT above."""

from __future__ import annotations

import pytest

from echelon.contract.filters import overlaps, parse
from echelon.contract.schema import Schema
from echelon.router.server import RouterNode
from echelon.runtime.node import NodeConfig
from loadtest.octopia_control_real import measure, table
from tests.harness import Cluster

REGIONS, PER_REGION = 3, 2


async def run(mode: str) -> dict:
    cluster = Cluster(agents=0, matchers=0)
    await cluster.start()
    routers = []
    try:
        for c in range(REGIONS):
            for a in range(PER_REGION):
                node = RouterNode(NodeConfig(id=f"router-{c}-{a}", region=f"region-{c}", membership=cluster.replicas,
                                             grace=0.5), routing="snr", control=mode)
                await node.start()
                routers.append(node)
        addresses = {n.config.id: (n.address, int(n.config.id.split("-")[1]), int(n.config.id.split("-")[2]))
                     for n in routers}
        return await measure(addresses, mode, advertisements=8, subscriptions=24, seed=3)
    finally:
        for n in routers:
            await n.stop(0.1)
        await cluster.stop()


def oracle(issued: dict, mode: str) -> dict[str, tuple[int, int]]:
    """Router id -> (SRT, PRT) from the workload. SCOT stores an advertisement at its host
    and at the host's secondary router in each other region (the same position: every
    region has as many routers), a subscription at every router of its region and at each
    host in another region of an advertisement it overlaps (each router of the region
    answers the hosts at its position). TID stores an advertisement at every router, a
    subscription at its router and at the host of each advertisement it overlaps.
    Identical filters of one region are one entry (a subgroup)."""
    ids = [f"router-{c}-{a}" for c in range(REGIONS) for a in range(PER_REGION)]

    def place(r: str) -> tuple[int, int]:
        return int(r.split("-")[1]), int(r.split("-")[2])

    ads = [((c, a), parse(f)) for c, a, f in issued["adv"]]
    srt = {r: 0 for r in ids}
    prt: dict[str, set] = {r: set() for r in ids}
    for (c, a), _ in ads:
        for r in ids:
            rc, ra = place(r)
            srt[r] += mode == "tid" or (rc, ra) == (c, a) or (rc != c and ra == a)
    for c, a, f in issued["sub"]:
        for b in range(PER_REGION) if mode == "scot" else [a]:
            prt[f"router-{c}-{b}"].add((c, f))
        for (hc, ha), bounds in ads:
            far = hc != c if mode == "scot" else (hc, ha) != (c, a)
            if far and overlaps(bounds, parse(f), Schema()):
                prt[f"router-{hc}-{ha}"].add((c, f))
    return {r: (srt[r], len(prt[r])) for r in ids}


@pytest.mark.timeout(240)
async def test_scot_against_tid_on_real_routers_tables_equal_the_oracle_and_the_papers_directions():
    results = {mode: await run(mode) for mode in ("tid", "scot")}
    print(table(results["scot"], results["tid"], None))
    n, c = REGIONS * PER_REGION, REGIONS
    for mode, r in results.items():
        assert r["issued"] == results["tid"]["issued"]  # the same workload
        assert r["tables"] == oracle(r["issued"], mode), mode
    tid, scot = results["tid"], results["scot"]
    # ADV: flooded to the n - 1 other routers against the c - 1 secondary routers.
    assert tid["kinds"]["adv"] == 8 * (n - 1) and scot["kinds"]["adv"] == 8 * (c - 1)
    assert scot["srt"] < tid["srt"] and scot["adv_ims"] < tid["adv_ims"] and scot["prt"] > tid["prt"]
    assert all(r["adv_delay"] > 0 and r["sub_delay"] > 0 for r in results.values())
