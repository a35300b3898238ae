"""The faults, one at a time, each followed by a settle period, repeated while time
remains: delay/loss on two agents' links, SIGSTOP of an inner relay, kill -9 of an inner
relay (restarted: a new process, a new incarnation), a partition of one agent, kill -9
of membership replica 0 (the one every member watches, restarted), a plan push with a
clique no router serves (refused: membership/plans.py; nothing to settle after it), kill -9
of the matcher (restarted empty: no acked event may be lost while the agents refill it,
matcher/refill.py), and a membership-wide restart (every replica killed, restarted).
`choose_roles` picks the targets from producer 0's LBDD tree."""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
from dataclasses import dataclass, field

from echelon.core import lbdd
from echelon.launch import Cluster
from loadtest.chaos.config import Config
from loadtest.chaos.network import Hosts
from loadtest.chaos.observer import Observer

SILENCE_DEAD = 7.0  # the detector's default silence timeout (core/detector.py)
# Faults that may run while delay/loss is on (`Config.overlap`): they hit other agents than
# `choose_roles`' netem targets (inner relays; the producers' last agent and a quiet leaf are
# netem's), expect no verdict on a netem target, and their own verdicts fall in their own
# window (the latest fault started: report.py), so every row keeps its meaning.
OVERLAPS = ("pause", "kill")


@dataclass
class Fault:
    kind: str
    targets: list[str]
    start: float = 0.0
    end: float = 0.0  # when the fault was removed (healed, resumed, restarted)
    note: str = ""
    expected_dead: set[str] = field(default_factory=set)
    restarted: float = 0.0  # kill / replica: when the new process served
    rejoined: float | None = None  # replica, members: seconds until every member was ALIVE in its view again
    refused: bool | None = None  # plan: membership refused the bad plan


class Schedule:
    def __init__(self, cfg: Config, cluster: Cluster, observer: Observer, hosts: Hosts, roles: dict):
        self.cfg, self.cluster, self.observer, self.hosts, self.roles = cfg, cluster, observer, hosts, roles
        self.faults: list[Fault] = []

    def plan(self) -> list[str]:
        kinds = ["netem", "pause", "kill", "partition", "replica", "plan", "matcher", "members"]
        return [k for k in kinds if self.hosts.supports(k) and k not in self.cfg.skip]

    def settle(self, kind: str) -> float:
        """A refused plan disturbs nothing: no settle after it."""
        return 0.0 if kind == "plan" else self.cfg.settle

    def duration(self, kind: str) -> float:
        c = self.cfg
        return self.settle(kind) + {"netem": c.netem_seconds, "pause": c.pause_seconds, "kill": c.restart_after + 3,
                           "partition": c.partition_seconds, "replica": c.restart_after + 3,
                           "matcher": c.restart_after + 3, "members": c.restart_after + 5, "plan": 2}[kind]

    async def run(self, until: float, t0: float) -> None:
        """Rounds of every kind while time remains (`cfg.rounds`: that many, whatever the
        time, so no kind is left out on a loaded machine). With `cfg.overlap`, delay/loss
        runs in the background of the faults on other agents that follow it (OVERLAPS)."""
        rounds, background = 0, None
        try:
            while rounds < (self.cfg.rounds or 100):  # bounded; in practice 1 to 3 rounds
                for kind in self.plan():
                    if not self.cfg.rounds and time.monotonic() + self.duration(kind) > until:
                        return
                    if background is not None and kind not in OVERLAPS:
                        await background
                        background = None
                    if kind == "netem" and self.cfg.overlap:
                        f = Fault("netem", self.roles["netem"], start=time.monotonic())
                        self.faults.append(f)  # in order of start: the report's windows (report.py)
                        background = asyncio.ensure_future(self._netem(rounds, f))
                        background.add_done_callback(lambda _, f=f: self._said(f, t0))
                        continue
                    fault = await getattr(self, f"_{kind}")(rounds)
                    self.faults.append(fault)
                    self._said(fault, t0)
                    await asyncio.sleep(self.settle(kind))
                rounds += 1
        finally:
            if background is not None:
                await background

    def _said(self, fault: Fault, t0: float) -> None:
        self.cfg.log(f"  +{fault.start - t0:6.1f}s {fault.kind:9} {', '.join(fault.targets)} "
                     f"({fault.end - fault.start:.1f}s) {fault.note}")

    def _host(self, member: str):
        """The network namespace a member runs in."""
        return self.cluster.process(member).site.host

    async def _kill_and_restart(self, target: str) -> float:
        """kill -9, and after `restart_after` a new process on the same ports; when it serves."""
        self.cluster.signal(target, signal.SIGKILL)
        if self.cfg.wipe_disk and self.cluster.process(target).role == "agent":  # the node lost its disk
            shutil.rmtree(self.cluster.data_dir(target), ignore_errors=True)
        await asyncio.sleep(self.cfg.restart_after)
        await self.cluster.launch(self.cluster.process(target), 60.0)
        return time.monotonic()

    def _pick(self, key: str, rounds: int) -> str:
        options = self.roles[key]
        return options[rounds % len(options)]

    async def _netem(self, rounds: int, f: Fault | None = None) -> Fault:
        targets = self.roles["netem"]
        f = f or Fault("netem", targets, start=time.monotonic())
        how = set()
        try:
            for t in targets:
                how.add(await asyncio.to_thread(self.hosts.netem, self._host(t), True, self.cfg.netem_seconds + 30))
            await asyncio.sleep(self.cfg.netem_seconds)
        finally:
            for t in targets:
                await asyncio.to_thread(self.hosts.netem, self._host(t), False)
        f.end = time.monotonic()
        f.note = "delay 100ms +-50ms, 5% loss, both directions" + (
            " (kernel without netem: tc redirect + userspace delayer)" if "emulated" in how else " (tc netem)")
        return f

    async def _pause(self, rounds: int) -> Fault:
        target = self._pick("pause", rounds)
        f = Fault("pause", [target], start=time.monotonic())
        self.cluster.signal(target, signal.SIGSTOP)
        try:
            await asyncio.sleep(self.cfg.pause_seconds)
        finally:
            self.cluster.signal(target, signal.SIGCONT)
        f.end = time.monotonic()
        f.note = f"SIGSTOP {self.cfg.pause_seconds:.0f}s"
        return f

    async def _kill(self, rounds: int) -> Fault:
        target = self._pick("kill", rounds)
        f = Fault("kill", [target], start=time.monotonic(), expected_dead={target})
        f.end = f.restarted = await self._kill_and_restart(target)
        f.note = f"kill -9, restarted after {f.end - f.start:.1f}s"
        return f

    async def _partition(self, rounds: int) -> Fault:
        target = self._pick("partition", rounds)
        long = self.cfg.partition_seconds > SILENCE_DEAD
        f = Fault("partition", [target], start=time.monotonic(), expected_dead={target} if long else set())
        host = self._host(target)
        await asyncio.to_thread(self.hosts.partition, host, True)
        try:
            await asyncio.sleep(self.cfg.partition_seconds)
        finally:
            await asyncio.to_thread(self.hosts.partition, host, False)
        f.end = time.monotonic()
        f.note = f"all packets dropped {self.cfg.partition_seconds:.0f}s"
        return f

    async def _replica(self, rounds: int) -> Fault:
        target = "membership-0"
        f = Fault("replica", [target], start=time.monotonic())
        f.end = f.restarted = await self._kill_and_restart(target)
        members = [p.id for p in self.cluster.processes if p.role != "membership"]
        deadline = f.end + 15.0
        while not self.observer.all_alive(0, members) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        f.rejoined = time.monotonic() - f.end if self.observer.all_alive(0, members) else None
        f.note = f"kill -9 of the watched replica, restarted after {f.end - f.start:.1f}s"
        return f


    async def _matcher(self, rounds: int) -> Fault:
        target = "matcher-0"
        f = Fault("matcher", [target], start=time.monotonic(), expected_dead={target})
        f.end = f.restarted = await self._kill_and_restart(target)
        f.note = f"kill -9 of the matcher, restarted empty after {f.end - f.start:.1f}s"
        return f

    async def _members(self, rounds: int) -> Fault:
        replicas = [p.id for p in self.cluster.by_role("membership")]
        f = Fault("members", replicas, start=time.monotonic())
        for r in replicas:
            self.cluster.signal(r, signal.SIGKILL)
        await asyncio.sleep(self.cfg.restart_after)
        await asyncio.gather(*(self.cluster.launch(self.cluster.process(r), 60.0) for r in replicas))
        f.end = f.restarted = time.monotonic()
        members = [p.id for p in self.cluster.processes if p.service and p.role != "membership"]
        deadline = f.end + 20.0
        while not self.observer.all_alive(0, members) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        f.rejoined = time.monotonic() - f.end if self.observer.all_alive(0, members) else None
        f.note = f"kill -9 of every membership replica, restarted after {f.end - f.start:.1f}s"
        return f

    async def _plan(self, rounds: int) -> Fault:
        """A plan whose clique holds agents and no router: membership must refuse it."""
        import grpc

        from echelon.v1 import membership_pb2 as mpb
        from echelon.v1 import membership_pb2_grpc as mgrpc

        agents = [p.id for p in self.cluster.by_role("agent")][:2]
        f = Fault("plan", agents, start=time.monotonic())
        async with self.cluster.transport.dial(self.cluster.replicas[0]) as ch:
            control = mgrpc.ControlStub(ch)
            current = await control.GetPlan(mpb.GetPlanRequest(), timeout=10)
            plan = mpb.RoutingPlan(version=current.version + 1, zones=current.zones, origin="chaos: bad clique",
                                   cliques=[mpb.Clique(id="routerless", members=agents)])
            try:
                await control.PushPlan(plan, timeout=10)
                f.note = "ACCEPTED a clique no router serves"
                f.refused = False
            except grpc.aio.AioRpcError as e:
                f.note = f"refused {e.code().name}: {e.details()}"
                f.refused = e.code() == grpc.StatusCode.INVALID_ARGUMENT
        f.end = time.monotonic()
        return f

def choose_roles(cluster: Cluster, producers: int) -> dict:
    """Producer 0 on agent-0, the others on leaves of its LBDD tree. Kill and pause hit inner
    relays of that tree (a different one each, where there are two); the partition a leaf
    first, then relays; netem a producer's agent and a quiet one. Lists rotate over rounds."""
    agents = cluster.by_role("agent")
    key = {p.address: p.id for p in agents}
    tree = lbdd.build_tree(agents[0].address, [p.address for p in agents[1:]])
    inner = sorted((key[k] for k, c in tree.children.items() if c and k != agents[0].address),
                   key=lambda i: -len(tree.subtree(cluster.process(i).address)))
    others = [p.id for p in agents[1:]]
    leaves = [a for a in others if a not in inner]
    producer_agents = (["agent-0"] + leaves[:producers - 1] + inner)[:producers]
    kill = [a for a in inner if a not in producer_agents] or [a for a in others if a not in producer_agents][:1]
    pause = kill[1:] + kill[:1] if len(kill) > 1 else [a for a in others if a not in kill][:1]
    spare = [a for a in leaves if a not in producer_agents]
    partition = spare[:1] + [a for a in inner if a not in producer_agents] or others[-1:]
    quiet = [a for a in spare if a not in partition[:1]] or spare or others
    return {"producers": producer_agents, "kill": kill, "pause": pause, "partition": partition,
            "netem": sorted({producer_agents[-1], quiet[0]}),
            "tree": {key[k]: sorted(key[x] for x in c) for k, c in tree.children.items() if c}}
