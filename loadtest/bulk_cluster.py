"""The moving parts of the bulk experiment (`loadtest.bulk`): the modes and the agent
flags they need, the cluster of real processes across the hosts' namespaces, the
bulk_client endpoints, and the probes read around each transfer -- kernel interface and
qdisc counters, the agents' relay metrics, CPU per process, the trees the agents build.

The cluster is the launcher's (`echelon.launch`) on `loadtest.netns.NetnsPlacement`:
membership and the matcher in the root namespace on the bridge address, agent i in host
i's namespace bound to its address.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import click

from echelon import launch
from echelon.dataplane.trees import Trees, salted
from echelon.runtime.member import fetch_view
from echelon.core.lbdd import build_tree
from echelon.v1 import membership_pb2 as mpb
from loadtest.netns import Host, Network, NetnsPlacement


@dataclass(frozen=True)
class Mode:
    name: str  # p2p, lbdd, striped
    label: str  # for tables and plots
    flags: tuple[str, ...]  # extra agent flags
    needs: tuple[str, ...]  # agent options this mode needs


def modes(names: list[str], stripes: int, slice_bytes: int) -> list[Mode]:
    sliced = ("--slice-bytes", str(slice_bytes))
    known = {
        "p2p": Mode("p2p", "point-to-point", ("--dissemination", "p2p", *sliced),
                    ("--dissemination", "--slice-bytes")),
        "lbdd": Mode("lbdd", "LBDD tree", ("--dissemination", "lbdd", *sliced, "--stripes", "1"),
                     ("--dissemination", "--slice-bytes", "--stripes")),
        "striped": Mode("striped", f"LBDD, {stripes} stripes",
                        ("--dissemination", "lbdd", *sliced, "--stripes", str(stripes)),
                        ("--dissemination", "--slice-bytes", "--stripes")),
    }
    unknown = [n for n in names if n not in known]
    if unknown:
        raise click.BadParameter(f"unknown mode(s) {unknown}; choose from {list(known)}")
    return [known[n] for n in names]


def agent_options() -> set[str]:
    """The options `echelon agent` accepts today (the data plane grows them)."""
    out = subprocess.run([sys.executable, "-m", "echelon", "agent", "--help"], capture_output=True, text=True,
                         timeout=60).stdout
    return {w.rstrip(",") for w in out.split() if w.startswith("--")}


def agent_flags(mode: Mode, options: set[str]) -> tuple[list[str], str | None]:
    """(flags, None), or ([], reason to skip). An agent without --dissemination is
    point-to-point only, so p2p runs on it without flags."""
    missing = [o for o in mode.needs if o not in options]
    if not missing:
        return list(mode.flags), None
    if mode.name == "p2p" and "--dissemination" not in options:
        return [], None
    return [], f"the agent has no {', '.join(missing)} option yet (`python -m echelon agent --help`)"


class Endpoint:
    """A bulk_client process in a host; its JSON lines are collected by a thread."""

    def __init__(self, net: Network, host: Host, argv: list[str], log: Path):
        self.host = host
        with open(log, "w") as err:
            self.proc = net.popen(host, argv, stdout=subprocess.PIPE, stderr=err, text=True)
        self.events: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.events.append(json.loads(line))
            except ValueError:
                pass

    def event(self, name: str) -> dict | None:
        return next((e for e in self.events if e.get("event") == name), None)


class Cluster:
    """The launcher's cluster on the hosts (`NetnsPlacement`: membership and matcher in the
    root namespace, agent i in host i), with the probes a transfer reads."""

    def __init__(self, net: Network, mode: Mode, flags: list[str], log_dir: Path, beat_interval: float = 0.5):
        self.net, self.mode, self.flags, self.log_dir = net, mode, flags, log_dir
        self.beat_interval = beat_interval
        self.stripes = int(flags[flags.index("--stripes") + 1]) if "--stripes" in flags else 1
        self.services = launch.Cluster(agents=len(net.hosts), matchers=1, memberships=1,
                                       placement=NetnsPlacement(net), log_dir=log_dir,
                                       common=["--grace", "1", "--beat-interval", str(beat_interval)],
                                       extra={"agent": flags})
        self.membership = self.services.replicas[0]

    def start(self, timeout: float = 90.0) -> None:
        """Every process serving and every member ALIVE in the view."""
        asyncio.run(self.services.start(timeout))

    def agent(self, host: Host) -> launch.Process:
        return self.services.by_role("agent")[host.index]

    def wait_view(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if predicate(asyncio.run(fetch_view(self.membership))):
                    return
            except Exception:  # noqa: BLE001 - membership not answering yet: retry until the deadline
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.2)

    def agents(self) -> dict[str, tuple[int, int]]:
        """Agent id -> (incarnation, state) in membership's view ({} if it does not answer)."""
        try:
            view = asyncio.run(fetch_view(self.membership))
        except Exception:  # noqa: BLE001 - a missed look is not an incident
            return {}
        return {m.id: (m.incarnation, m.state) for m in view.members if m.role == mpb.ROLE_AGENT}

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) each service process has used so far."""
        return {p.id: process_cpu_seconds(p.pid) for p in self.services.processes if p.running()}

    def link_breaks(self) -> int:
        """Relay streams that broke so far (the agents log each one)."""
        return sum(p.log.read_text(errors="replace").count("broke:") for p in self.services.by_role("agent")
                   if p.log.exists())

    def crashed(self) -> list[str]:
        return self.services.exited()

    def stop(self) -> None:
        self.services.stop()


def tree_stats(pub: launch.Process, subs: list[launch.Process], stripes: int) -> dict:
    """The trees the agents build (keys are advertised host:port, stripe s salts them with
    "#s") and the copies per slice each node sends under the root's stripe schedule: the
    busiest node bounds the speedup at N / its copies."""
    trees = [build_tree(salted(pub.address, s), [salted(p.address, s) for p in subs]) for s in range(stripes)]
    schedule: tuple[int, ...] = (0,)
    if stripes > 1:
        members = [mpb.Member(id=p.id, address=p.address, role=mpb.ROLE_AGENT, state=mpb.MEMBER_STATE_ALIVE,
                              subscribes=["t"]) for p in subs]
        planner = Trees(pub.id, pub.address, "lbdd", stripes)
        planner.update(members)
        schedule = planner.schedule("t", [m.id for m in members])
    copies: dict[str, float] = {}
    for s in schedule:
        for node, children in trees[s].children.items():
            k = node.split("#")[0]
            copies[k] = copies.get(k, 0.0) + len(children) / len(schedule)
    return {"depth": trees[0].depth, "depths": [t.depth for t in trees], "root_copies": copies.get(pub.address, 0.0),
            "busiest_copies": max(copies.values())}


def scrape_relay(agents: list[launch.Process]) -> dict[str, float]:
    """echelon_relay_sent_bytes_total summed over peers, per agent's host address (0 where unreachable)."""
    name = "echelon_relay_sent_bytes_total"
    return {p.site.ip: p.scrape((name,), timeout=5).get(name, 0.0) for p in agents}


def uplink_drops(net: Network) -> int:
    return sum(q.get("drops", 0) for h in net.hosts for q in net.qdisc_stats(h) if q.get("kind") == "tbf")


def process_cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def cpu_busy(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total else None
