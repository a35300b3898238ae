"""Fault injection against a real cluster, and what the clients saw (issue 4, DESIGN.md
"Guarantees"): `python -m loadtest.chaos --minutes 5`.

Topology. Each agent runs in its own network namespace on a bridge (198.18.K.0/24, from
`loadtest.netns`); the three membership replicas and the matcher run in the root
namespace on the bridge address, as does this runner, whose clients reach the agents
over the bridge. Where namespaces cannot be created every process runs on loopback and
the faults that need a network of their own (partition, netem) are not run: the report
says which mode ran.

Workload. `producers` publishers on different agents, each numbering its messages
(producer id, sequence) at `rate` per second over `keys` ordering keys, attributes
chosen so the filters match some; one named, acking subscription on every agent (so
every agent is in the topic's LBDD tree) and a second on some, with varied filters.
A subscriber whose stream breaks reopens the same named subscription on the same agent.

Faults, one at a time, each followed by a settle period, repeated while time remains:
  netem      delay 100 ms +- 50 ms, 5 % loss, both directions of two agents' links (tc
             netem; on a kernel without it, a tc redirect into a userspace delayer)
  pause      SIGSTOP of an inner relay for 3 s, then SIGCONT
  kill       kill -9 of an inner relay of producer 0's tree; restarted (new process,
             new incarnation) after `restart_after`
  partition  every packet to and from one agent dropped (tc filters), then healed
  replica    kill -9 of membership replica 0 (the one every member watches), restarted

Measured. Watch streams on all three replicas time every state change, so a DEAD
verdict's detection time is from the fault to the verdict on each replica. After the
schedule the publishers stop, the subscribers drain, and `loadtest.checker` compares the
acknowledged publishes with every subscription's log. Messages are attributed to the
fault during (or after) which they were sent.

Output (in --out, default out/chaos): report.txt (the tables printed at the end),
report.json, deliveries.jsonl (every message sent and every delivery, for a post-mortem),
timeline.png (delivery latency over the run, fault windows shaded, verdicts marked), and
every process's log in logs/.

Counting. A subscription on the killed agent dies with the process (subscriptions are
in memory); its client reopens it on the restarted process. For it, messages sent from
10 s before the kill until the reopened subscription exists are "maybe" (allowed, not
owed); before and after, everything is owed. The partitioned and the paused agents keep
their subscriptions, so everything is owed to them. A DEAD verdict is expected for the
killed agent and, when the partition outlasts the detector's silence timeout (7 s), for
the partitioned one; any other is false.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import click
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from echelon.client import ACCEPTED, Client, EchelonError
from echelon.core import lbdd
from echelon.core.filters import parse
from echelon.runtime.member import RECONNECT_OPTIONS, membership_channel
from echelon.runtime.server import CHANNEL_OPTIONS
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc
from loadtest import checker
from loadtest.netns import Host, Network, NetnsError, Unsupported, check_available, run as sh, stop_process

TOPIC = "chaos"
SCHEMA = ["kind:string", "v:float:0:100", "n:int:0:1000000000"]
FILTERS = ["", 'kind = "a"', "v >= 50", 'kind = "b" and v < 30', 'kind != "c" and v between 10 and 60']
MEMBERSHIP_PORT, MATCHER_PORT, AGENT_PORT, METRICS_OFFSET = 7000, 7020, 7100, 2000
DEAD, SUSPECT, ALIVE = mpb.MEMBER_STATE_DEAD, mpb.MEMBER_STATE_SUSPECT, mpb.MEMBER_STATE_ALIVE
STATE = {ALIVE: "alive", SUSPECT: "suspect", DEAD: "dead", mpb.MEMBER_STATE_LEFT: "left"}
SILENCE_DEAD = 7.0  # the detector's default silence timeout (core/detector.py)
KILL_MAYBE_BEFORE = 10.0  # seconds before a kill whose messages a dying subscription may miss
MAX_IN_FLIGHT = 2000  # unacknowledged publishes per producer before it waits
PARTITION_PRIO = "2"  # our tc filters; loadtest.netns manages prio 1


@dataclass
class Config:
    minutes: float = 5.0
    agents: int = 6
    producers: int = 3
    rate: float = 20.0  # messages per second per producer
    keys: int = 4
    netem_seconds: float = 30.0
    pause_seconds: float = 3.0
    partition_seconds: float = 10.0
    restart_after: float = 6.0
    settle: float = 12.0
    warmup: float = 8.0
    drain: float = 60.0
    loopback: bool = False  # force loopback even where namespaces work
    out: Path = Path("out/chaos")
    log: object = print

    @classmethod
    def short(cls, **kw) -> "Config":
        """One of each fault, about 75 s of faults: the CI version."""
        return cls(**{"minutes": 1.4, "netem_seconds": 10.0, "partition_seconds": 9.0, "restart_after": 4.0,
                      "settle": 6.0, "warmup": 5.0, "drain": 45.0, **kw})


# -- hosts: namespaces or loopback -----------------------------------------------------------


class Hosts:
    """Where each process runs and how the network faults are made."""

    mode = "loopback"
    reason = ""

    def __init__(self, agents: int):
        self.agents = agents
        self.procs: list[subprocess.Popen] = []

    def gateway(self) -> str:
        return "127.0.0.1"

    def agent_host(self, i: int) -> Host | None:
        return None

    def agent_ip(self, i: int) -> str:
        return "127.0.0.1"

    def ports(self, role: str, i: int) -> tuple[int, int]:
        """(gRPC port, metrics port) of a process: free ones on loopback."""
        return free_port(), free_port()

    def popen(self, host: Host | None, argv: list[str], **kw) -> subprocess.Popen:
        p = subprocess.Popen(argv, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def supports(self, kind: str) -> bool:
        return kind not in ("netem", "partition")

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGCONT)
            stop_process(p)


class NetnsHosts(Hosts):
    mode = "netns"

    def __init__(self, agents: int):
        super().__init__(agents)
        self.net = Network(agents).__enter__()
        self.delayers: dict[int, list[subprocess.Popen]] = {}

    def gateway(self) -> str:
        return self.net.gateway

    def agent_host(self, i: int) -> Host:
        return self.net.hosts[i]

    def agent_ip(self, i: int) -> str:
        return self.net.hosts[i].address

    def ports(self, role: str, i: int) -> tuple[int, int]:
        """Fixed: each agent has an address of its own, the root namespace the bridge's."""
        port = {"membership": MEMBERSHIP_PORT + i, "matcher": MATCHER_PORT + i, "agent": AGENT_PORT}[role]
        return port, port + METRICS_OFFSET

    def popen(self, host, argv, **kw):
        p = self.net.popen(host, argv, **kw)
        self.procs.append(p)
        return p

    def supports(self, kind: str) -> bool:
        return True

    def netem(self, i: int, on: bool, seconds: float = 600.0) -> str:
        """Delay 100 +- 50 ms and 5 % loss on both directions of host i's link: netem, or
        where the kernel lacks it the userspace delayer. Returns which."""
        host = self.net.hosts[i]
        if not on:
            if i in self.delayers:
                self._emulate(i, False, seconds)
                return "emulated"
            for direction in ("egress", "ingress"):
                self.net.unshape(host, direction)
            return "netem"
        try:
            for direction in ("egress", "ingress"):
                self.net.shape(host, delay_ms=100, jitter_ms=50, loss_pct=5, direction=direction)
        except Unsupported:
            self._emulate(i, True, seconds)
            return "emulated"
        return "netem"

    def _emulate(self, i: int, on: bool, seconds: float) -> None:
        host = self.net.hosts[i]
        tag = self.net.bridge.removesuffix("br")[:9]
        # (namespace, device whose egress is delayed, the redirect veth pair's two ends)
        sides = [(host.name, host.ifname, "dxe0", "dxe1"), ("", host.veth, f"{tag}d{i}a", f"{tag}d{i}b")]
        for p in self.delayers.pop(i, []):
            stop_process(p, 2.0)
        for ns, dev, a, b in sides:
            pre = ["ip", "netns", "exec", ns] if ns else []
            sh([*pre, "tc", "filter", "del", "dev", dev, "parent", "1:", "prio", DELAY_PRIO], check=False)
            sh([*pre, "ip", "link", "del", a], check=False)
        if not on:
            return
        for ns, dev, a, b in sides:
            pre = ["ip", "netns", "exec", ns] if ns else []
            sh([*pre, "ip", "link", "add", a, "type", "veth", "peer", "name", b])
            for end in (a, b):
                sh([*pre, "sysctl", "-qw", f"net.ipv6.conf.{end}.disable_ipv6=1"], check=False)
                sh([*pre, "ip", "link", "set", end, "up"])
            argv = [sys.executable, "-m", "loadtest.chaos", "_delay", b, dev, str(seconds)]
            self.delayers.setdefault(i, []).append(self.popen(host if ns else None, argv, stdout=subprocess.DEVNULL))
            sh([*pre, "tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", DELAY_PRIO,
                "bpf", "bytecode", BYPASS_MARKED, "action", "mirred", "egress", "redirect", "dev", a])

    def partition(self, i: int, on: bool) -> None:
        """Drop every IPv4 packet the host sends and every one sent to it (both ends of its veth)."""
        host = self.net.hosts[i]
        for ns, dev in ((host.name, host.ifname), ("", host.veth)):
            prefix = ["ip", "netns", "exec", ns] if ns else []
            sh([*prefix, "tc", "filter", "del", "dev", dev, "parent", "1:", "prio", PARTITION_PRIO], check=False)
            if on:
                sh([*prefix, "tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio",
                    PARTITION_PRIO, "u32", "match", "ip", "dst", "0.0.0.0/0", "flowid", "1:99"])

    def close(self) -> None:
        for p in self.procs:  # a stopped process ignores SIGTERM: let it run to die
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGCONT)
        for i in list(self.delayers):
            with contextlib.suppress(NetnsError):
                self._emulate(i, False, 0)
        self.net.__exit__(None, None, None)


# -- netem where the kernel has none: tc redirects, a userspace delayer re-sends --------------
#
# Packets leaving a device are redirected (cls_bpf + mirred) into a private veth pair, read
# there by `delay_packets` (AF_PACKET), held 100 +- 50 ms each (uniform, independently, so
# they reorder as under netem), 5 % dropped, and sent out of the device again with a socket
# mark that the redirect lets through. Virtio-net headers keep GSO packets whole.

MARK = 0xEC0
SKF_AD_MARK = 0xFFFFF000 + 20  # classic BPF: load skb->mark
BYPASS_MARKED = f"4,32 0 0 {SKF_AD_MARK},21 0 1 {MARK},6 0 0 0,6 0 0 4294967295"  # marked: pass; else match
DELAY_PRIO = "3"


def delay_packets(rx_if: str, tx_if: str, delay: float, jitter: float, loss: float, seconds: float) -> None:
    """Forward frames from rx_if to tx_if, each after delay +- jitter, dropping `loss` of them."""
    import heapq
    import random
    import select

    packet_vnet_hdr, eth_p_all = 15, 0x0003
    rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(eth_p_all))
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    for sock in (rx, tx):
        sock.setsockopt(263, packet_vnet_hdr, 1)  # SOL_PACKET
    tx.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, MARK)
    rx.bind((rx_if, 0))
    tx.bind((tx_if, 0))
    rng = random.Random()
    queue: list[tuple[float, int, bytes]] = []
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            with contextlib.suppress(OSError):
                tx.send(heapq.heappop(queue)[2])
        timeout = min(0.2, max(0.0, queue[0][0] - now)) if queue else 0.2
        if select.select([rx], [], [], timeout)[0]:
            data, addr = rx.recvfrom(1 << 17)
            if addr[2] == socket.PACKET_OUTGOING or rng.random() < loss:
                continue
            n += 1
            heapq.heappush(queue, (time.monotonic() + rng.uniform(delay - jitter, delay + jitter), n, data))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_hosts(agents: int, loopback: bool) -> Hosts:
    if loopback:
        h = Hosts(agents)
        h.reason = "asked for (--loopback)"
        return h
    try:
        check_available()
        return NetnsHosts(agents)
    except (Unsupported, NetnsError) as e:
        h = Hosts(agents)
        h.reason = f"network namespaces unavailable: {e}"
        return h


# -- the cluster's processes ---------------------------------------------------------------


@dataclass
class Proc:
    id: str
    role: str
    host: Host | None
    ip: str
    port: int
    metrics_port: int
    argv: list[str]
    popen: subprocess.Popen | None = None
    starts: int = 0

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"


class Cluster:
    def __init__(self, hosts: Hosts, log_dir: Path):
        self.hosts = hosts
        self.log_dir = log_dir
        gw = hosts.gateway()
        ports = {f"membership-{i}": hosts.ports("membership", i) for i in range(3)}
        self.replicas = [f"{gw}:{ports[f'membership-{i}'][0]}" for i in range(3)]
        peers = ",".join(self.replicas)
        self.procs: dict[str, Proc] = {}
        for i in range(3):
            self._plan(f"membership-{i}", "membership", None, gw, ports[f"membership-{i}"], ["--peers", peers])
        self._plan("matcher-0", "matcher", None, gw, hosts.ports("matcher", 0), ["--membership", peers])
        for i in range(hosts.agents):
            self._plan(f"agent-{i}", "agent", hosts.agent_host(i), hosts.agent_ip(i), hosts.ports("agent", i),
                       ["--membership", peers])

    def _plan(self, pid, role, host, ip, ports, extra) -> None:
        port, metrics = ports
        argv = [sys.executable, "-m", "echelon", role, "--id", pid, "--host", ip, "--port", str(port),
                "--metrics-port", str(metrics), "--grace", "1", "--beat-interval", "0.2", *extra]
        self.procs[pid] = Proc(pid, role, host, ip, port, metrics, argv)

    def agents(self) -> list[Proc]:
        return [p for p in self.procs.values() if p.role == "agent"]

    def spawn(self, pid: str) -> None:
        p = self.procs[pid]
        p.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{pid}.log", "ab") as log:
            log.write(f"\n=== start {p.starts} at {time.strftime('%H:%M:%S')} ===\n".encode())
            log.flush()
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            p.popen = self.hosts.popen(p.host, p.argv, stdout=log, stderr=subprocess.STDOUT, env=env)

    def signal(self, pid: str, sig: int) -> None:
        p = self.procs[pid].popen
        if p is not None and p.poll() is None:
            os.kill(p.pid, sig)  # only a process we started, by its pid
            if sig == signal.SIGKILL:
                p.wait(10)

    async def start(self, timeout: float = 90.0) -> None:
        for wave in (["membership"], ["matcher", "agent"]):
            ids = [i for i, p in self.procs.items() if p.role in wave]
            for i in ids:
                self.spawn(i)
            await asyncio.gather(*(self.serving(i, timeout) for i in ids))

    async def serving(self, pid: str, timeout: float) -> None:
        p = self.procs[pid]
        deadline = time.monotonic() + timeout
        async with grpc.aio.insecure_channel(p.address) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while True:
                if p.popen.poll() is not None:
                    tail = (self.log_dir / f"{pid}.log").read_text(errors="replace")[-1500:]
                    raise RuntimeError(f"{pid} exited with {p.popen.returncode}:\n{tail}")
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.TimeoutError):
                    r = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                    if r.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{pid} not serving on {p.address} after {timeout:.0f}s")
                await asyncio.sleep(0.2)

    def metrics(self, names: tuple[str, ...]) -> dict[str, float]:
        """Sums of some counters over the agents now running (best effort)."""
        out = dict.fromkeys(names, 0.0)
        for p in self.agents():
            try:
                url = f"http://{p.ip}:{p.metrics_port}/metrics"
                with urllib.request.urlopen(url, timeout=3) as r:
                    for line in r.read().decode().splitlines():
                        name, _, value = line.partition(" ")
                        if name in out:
                            out[name] += float(value)
            except (OSError, ValueError):
                pass
        return out


# -- watching the replicas ---------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    at: float
    replica: int
    member: str
    state: int
    incarnation: int


class Observer:
    """A Watch stream on every replica; every member state change, timed."""

    def __init__(self, replicas: list[str]):
        self.replicas = replicas
        self.changes: list[Change] = []
        self.views: list[dict[str, mpb.Member]] = [{} for _ in replicas]
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._watch(i)) for i in range(len(self.replicas))]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _set(self, i: int, members: dict[str, mpb.Member]) -> None:
        now = time.monotonic()
        old = self.views[i]
        for mid, m in members.items():
            o = old.get(mid)
            if o is None or (o.state, o.incarnation) != (m.state, m.incarnation):
                self.changes.append(Change(now, i, mid, m.state, m.incarnation))
        self.views[i] = members

    async def _watch(self, i: int) -> None:
        while True:
            ch = membership_channel(self.replicas[i])
            try:
                call = mgrpc.MembershipStub(ch).Watch(mpb.WatchRequest(member_id="chaos-observer"))
                while True:
                    u = await asyncio.wait_for(call.read(), 3.0)
                    if u is grpc.aio.EOF:
                        break
                    kind = u.WhichOneof("kind")
                    if kind == "snapshot":
                        self._set(i, {m.id: m for m in u.snapshot.members})
                    elif kind == "delta":
                        members = dict(self.views[i])
                        members.update({m.id: m for m in u.delta.upserted})
                        for mid in u.delta.removed:
                            members.pop(mid, None)
                        self._set(i, members)
            except (grpc.aio.AioRpcError, asyncio.TimeoutError):
                pass
            finally:
                await ch.close()
            await asyncio.sleep(0.3)

    def first(self, member: str, state: int, after: float, before: float = float("inf")) -> dict[int, float]:
        """Replica -> the first time after `after` it held `member` in `state`."""
        out: dict[int, float] = {}
        for c in self.changes:
            if c.member == member and c.state == state and after <= c.at < before and c.replica not in out:
                out[c.replica] = c.at
        return out

    def all_alive(self, i: int, members: list[str]) -> bool:
        v = self.views[i]
        return all(m in v and v[m].state == ALIVE for m in members)


# -- the workload -----------------------------------------------------------------------------


def attributes(producer: int, seq: int) -> dict:
    return {"kind": "abc"[(seq * 7 + producer) % 3], "v": float((seq * 37 + producer * 11) % 100), "n": seq}


@dataclass
class Sent:
    at: float
    attrs: dict
    acked: bool = False
    failed: str = ""


class Producer:
    def __init__(self, index: int, address: str, rate: float, keys: int):
        self.index = index
        self.id = f"producer-{index}"
        self.client = Client(address)
        self.pub = self.client.publisher(self.id, ACCEPTED)
        self.rate = rate
        self.keys = keys
        self.sent: dict[int, Sent] = {}
        self.in_flight = 0

    def _done(self, seq: int, future: asyncio.Future) -> None:
        self.in_flight -= 1
        if future.cancelled():
            self.sent[seq].failed = "cancelled"
        elif future.exception() is not None:
            e = future.exception()
            self.sent[seq].failed = e.code.name if isinstance(e, EchelonError) else type(e).__name__
        else:
            self.sent[seq].acked = True

    async def run(self, until: float) -> None:
        seq = 0
        start = time.monotonic()
        while time.monotonic() < until:
            wait_until = start + seq / self.rate
            await asyncio.sleep(max(0.0, wait_until - time.monotonic()))
            if self.in_flight >= MAX_IN_FLIGHT:
                await asyncio.sleep(0.05)  # the agent is stalled: hold off (the loop is bounded by `until`)
                continue
            seq += 1  # the Publisher numbers its messages 1, 2, ... in call order
            attrs = attributes(self.index, seq)
            self.sent[seq] = Sent(time.monotonic(), attrs)
            self.in_flight += 1
            future = self.pub.publish_nowait(TOPIC, attrs, ordering_key=f"k{seq % self.keys}")
            future.add_done_callback(lambda f, s=seq: self._done(s, f))

    async def close(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.pub.flush(), timeout)
        task = self.pub._task  # noqa: SLF001 - the SDK has no "close without waiting"
        if task:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self.client.close()


@dataclass
class Received:
    at: float
    d: checker.Delivered


class Subscriber:
    """One named subscription on one agent; reopens it on the same agent when its stream breaks."""

    def __init__(self, name: str, agent: str, address: str, text: str):
        self.name, self.agent, self.address, self.text = name, agent, address, text
        self.filter = parse(text)
        self.log: list[Received] = []
        self.opened: list[float] = []  # when each stream was open (registered)
        self.breaks = 0
        self.stopping = False

    async def run(self) -> None:
        backoff = 0.2
        while not self.stopping:
            client = Client(self.address)
            # A channel of its own: a shared subchannel would keep the dead process's backoff.
            client._channels[self.address] = grpc.aio.insecure_channel(  # noqa: SLF001
                self.address, options=CHANNEL_OPTIONS + RECONNECT_OPTIONS + [("grpc.use_local_subchannel_pool", 1)])
            sub = client.subscribe(TOPIC, self.text, name=self.name, max_outstanding=64)
            try:
                await asyncio.wait_for(sub.start(), 5.0)
                self.opened.append(time.monotonic())
                backoff = 0.2
                while not self.stopping:
                    try:
                        msg = await sub.next(timeout=0.5)
                    except asyncio.TimeoutError:
                        continue
                    self.log.append(Received(time.monotonic(), checker.Delivered(
                        msg.producer_id, msg.sequence, msg.redelivery_count, msg.ordering_key)))
                    await asyncio.wait_for(msg.ack(), 5.0)
            except Exception:  # noqa: BLE001 - any broken stream: reopen (bounded by `stopping`)
                self.breaks += 1
            finally:
                await sub.close()
                await client.close()
            if not self.stopping:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)


# -- faults -------------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    targets: list[str]
    start: float = 0.0
    end: float = 0.0  # when the fault was removed (healed, resumed, restarted)
    note: str = ""
    expected_dead: set[str] = field(default_factory=set)
    restarted: float = 0.0  # kill / replica: when the new process served
    rejoined: float | None = None  # replica: seconds until every member was ALIVE in its view again


class Schedule:
    def __init__(self, cfg: Config, cluster: Cluster, observer: Observer, hosts: Hosts, roles: dict):
        self.cfg, self.cluster, self.observer, self.hosts, self.roles = cfg, cluster, observer, hosts, roles
        self.faults: list[Fault] = []

    def plan(self) -> list[str]:
        kinds = ["netem", "pause", "kill", "partition", "replica"]
        return [k for k in kinds if self.hosts.supports(k)]

    def duration(self, kind: str) -> float:
        c = self.cfg
        return c.settle + {"netem": c.netem_seconds, "pause": c.pause_seconds, "kill": c.restart_after + 3,
                           "partition": c.partition_seconds, "replica": c.restart_after + 3}[kind]

    async def run(self, until: float, t0: float) -> None:
        rounds = 0
        while rounds < 100:  # bounded; in practice 1 to 3 rounds
            for kind in self.plan():
                if time.monotonic() + self.duration(kind) > until:
                    return
                fault = await getattr(self, f"_{kind}")(rounds)
                self.faults.append(fault)
                self.cfg.log(f"  +{fault.start - t0:6.1f}s {fault.kind:9} {', '.join(fault.targets)} "
                             f"({fault.end - fault.start:.1f}s) {fault.note}")
                await asyncio.sleep(self.cfg.settle)
            rounds += 1

    def _pick(self, key: str, rounds: int) -> str:
        options = self.roles[key]
        return options[rounds % len(options)]

    async def _netem(self, rounds: int) -> Fault:
        targets = self.roles["netem"]
        f = Fault("netem", targets, start=time.monotonic())
        how = set()
        try:
            for t in targets:
                how.add(await asyncio.to_thread(self.hosts.netem, int(t.split("-")[1]), True,
                                                self.cfg.netem_seconds + 30))
            await asyncio.sleep(self.cfg.netem_seconds)
        finally:
            for t in targets:
                await asyncio.to_thread(self.hosts.netem, int(t.split("-")[1]), False)
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
        self.cluster.signal(target, signal.SIGKILL)
        await asyncio.sleep(self.cfg.restart_after)
        self.cluster.spawn(target)
        await self.cluster.serving(target, 60.0)
        f.end = f.restarted = time.monotonic()
        f.note = f"kill -9, restarted after {f.end - f.start:.1f}s"
        return f

    async def _partition(self, rounds: int) -> Fault:
        target = self._pick("partition", rounds)
        long = self.cfg.partition_seconds > SILENCE_DEAD
        f = Fault("partition", [target], start=time.monotonic(), expected_dead={target} if long else set())
        i = int(target.split("-")[1])
        await asyncio.to_thread(self.hosts.partition, i, True)
        try:
            await asyncio.sleep(self.cfg.partition_seconds)
        finally:
            await asyncio.to_thread(self.hosts.partition, i, False)
        f.end = time.monotonic()
        f.note = f"all packets dropped {self.cfg.partition_seconds:.0f}s"
        return f

    async def _replica(self, rounds: int) -> Fault:
        target = "membership-0"
        f = Fault("replica", [target], start=time.monotonic())
        self.cluster.signal(target, signal.SIGKILL)
        await asyncio.sleep(self.cfg.restart_after)
        self.cluster.spawn(target)
        await self.cluster.serving(target, 60.0)
        f.end = f.restarted = time.monotonic()
        members = [p for p in self.cluster.procs if not p.startswith("membership")]
        deadline = f.end + 15.0
        while not self.observer.all_alive(0, members) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        f.rejoined = time.monotonic() - f.end if self.observer.all_alive(0, members) else None
        f.note = f"kill -9 of the watched replica, restarted after {f.end - f.start:.1f}s"
        return f


def choose_roles(cluster: Cluster, producers: int) -> dict:
    """Producer 0 on agent-0, the others on leaves of its LBDD tree. Kill and pause hit inner
    relays of that tree (a different one each, where there are two); the partition a leaf
    first, then relays; netem a producer's agent and a quiet one. Lists rotate over rounds."""
    agents = cluster.agents()
    key = {p.address: p.id for p in agents}
    tree = lbdd.build_tree(agents[0].address, [p.address for p in agents[1:]])
    inner = sorted((key[k] for k, c in tree.children.items() if c and k != agents[0].address),
                   key=lambda i: -len(tree.subtree(cluster.procs[i].address)))
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


# -- the report ---------------------------------------------------------------------------------


@dataclass
class Row:
    fault: str
    target: str
    at: float
    detection: str
    dead_expected: int
    dead_false: list[str]
    suspects: list[str]
    sent: int
    lost: int = 0
    unexpected: int = 0
    duplicated: int = 0
    redelivered: int = 0
    reordered: int = 0
    publish_errors: int = 0
    seconds: float | None = None  # detection's number: see `detection`


@dataclass
class Result:
    mode: str
    reason: str
    rows: list[Row]
    totals: dict
    targets: dict[str, tuple[bool, str]]
    notes: list[str]
    text: str = ""

    @property
    def ok(self) -> bool:
        return all(ok for ok, _ in self.targets.values())


def detection(f: Fault, obs: Observer) -> tuple[str, float | None]:
    """What the replicas made of the fault, and the one number that sums it up (seconds)."""
    target = f.targets[0]
    dead = obs.first(target, DEAD, f.start, f.end + (30 if f.kind == "kill" else 5))
    since = lambda d: sorted(t - f.start for t in d.values())  # noqa: E731
    if f.kind == "kill":
        if not dead:
            return "not declared", None
        ts = since(dead)
        return f"{ts[0]:.2f}s ({len(ts)}/3, last {ts[-1]:.2f}s)", ts[-1] if len(ts) == 3 else None
    if f.kind in ("partition", "pause"):
        if dead:
            return f"dead after {since(dead)[0]:.1f}s", since(dead)[0]
        sus = obs.first(target, SUSPECT, f.start, f.end + 2)
        return (f"suspect after {since(sus)[0]:.1f}s, not dead", since(sus)[0]) if sus else ("not suspected", None)
    if f.kind == "replica":
        back = f"members back +{f.rejoined:.1f}s" if f.rejoined is not None else "members NOT back"
        return f"served after {f.end - f.start:.1f}s, {back}", f.end - f.start
    return "-", None


SUMMARY = {"kill": "DEAD on all replicas in {}s", "partition": "DEAD after {}s of silence",
           "pause": "suspected after {}s, never DEAD", "replica": "restarted, served in {}s", "netem": "never DEAD"}


def build_report(cfg: Config, hosts: Hosts, faults: list[Fault], obs: Observer, producers: list[Producer],
                 subscribers: list[Subscriber], roles: dict, t0: float, metrics: dict) -> Result:
    starts = [f.start for f in faults]

    def window(t: float) -> int:  # -1: before the first fault
        return bisect.bisect_right(starts, t) - 1

    rows = [Row("baseline", "-", 0.0, "-", 0, [], [], 0)]
    for f in faults:
        text, seconds = detection(f, obs)
        rows.append(Row(f.kind, ",".join(f.targets), f.start - t0, text, 0, [], [], 0, seconds=seconds))
    row = lambda t: rows[window(t) + 1]  # noqa: E731

    sent_at: dict[tuple[str, int], float] = {}
    acked: dict[tuple[str, int], dict] = {}
    maybe: dict[tuple[str, int], dict] = {}
    for p in producers:
        for seq, s in p.sent.items():
            k = (p.id, seq)
            sent_at[k] = s.at
            row(s.at).sent += 1
            (acked if s.acked else maybe)[k] = s.attrs
            if s.failed:
                row(s.at).publish_errors += 1

    notes = []
    kills = [f for f in faults if f.kind == "kill"]
    for sub in subscribers:
        owed, allowed = dict(acked), dict(maybe)
        for f in kills:
            if sub.agent not in f.targets:
                continue
            reopened = next((t for t in sub.opened if t >= f.start), float("inf"))
            gap = {k for k in owed if f.start - KILL_MAYBE_BEFORE <= sent_at[k] <= reopened}
            for k in gap:
                allowed[k] = owed.pop(k)
            notes.append(f"{sub.name} on {sub.agent} died with the process at the kill: "
                         f"{sum(sub.filter.matches(acked[k]) for k in gap)} matching messages sent "
                         f"from {KILL_MAYBE_BEFORE:.0f}s before the kill until it was reopened "
                         f"{reopened - f.start:.1f}s after it were not owed to it")
        [r] = checker.check(owed, {sub.name: sub.filter}, {sub.name: [x.d for x in sub.log]}, allowed)
        for k in r.lost:
            row(sent_at[k]).lost += 1
        for k in r.unexpected:
            row(sent_at.get(k, 0.0)).unexpected += 1
        for k in r.duplicated:
            row(sent_at[k]).duplicated += 1
        for _, k in r.reordered:
            row(sent_at[k]).reordered += 1
        redelivered = [x for x in sub.log if x.d.redelivery]
        for x in redelivered:
            row(sent_at.get((x.d.producer, x.d.sequence), 0.0)).redelivered += 1

    # Verdicts: a member DEAD on any replica, once per (member, incarnation).
    seen = set()
    for c in obs.changes:
        if c.at < t0 or (c.member, c.incarnation, c.state) in seen:
            continue
        if c.state in (DEAD, SUSPECT):
            seen.add((c.member, c.incarnation, c.state))
            r, w = row(c.at), window(c.at)
            if c.state == SUSPECT:
                if c.member not in r.suspects:
                    r.suspects.append(c.member)
                continue
            f = faults[w] if w >= 0 else None
            expected = f is not None and c.member in f.expected_dead and c.at <= f.end + 5
            if expected:
                r.dead_expected += 1
            else:
                r.dead_false.append(c.member)

    totals = {k: sum(getattr(r, k) for r in rows) for k in
              ("sent", "lost", "unexpected", "duplicated", "redelivered", "reordered", "publish_errors",
               "dead_expected")}
    totals["suspected"] = sum(len(r.suspects) for r in rows)
    totals["dead_false"] = sum(len(r.dead_false) for r in rows)
    totals["received"] = sum(len(s.log) for s in subscribers)
    totals["acked"] = len(acked)
    kill_times = []
    for f in kills:
        dead = obs.first(f.targets[0], DEAD, f.start, f.end + 30)
        kill_times.append(max(dead.values()) - f.start if dead else float("inf"))
    pause_false = [m for r in rows if r.fault in ("pause", "netem") for m in r.dead_false]
    ran_kill = any(f.kind == "kill" for f in faults)
    targets = {
        "0 lost": (totals["lost"] == 0, str(totals["lost"])),
        "0 unexpected": (totals["unexpected"] == 0, str(totals["unexpected"])),
        "0 duplicates to a client": (totals["duplicated"] == 0, str(totals["duplicated"])),
        "0 false dead (delay/loss, pause)": (not pause_false, ", ".join(pause_false) or "0"),
        "0 false dead (whole run)": (totals["dead_false"] == 0, str(totals["dead_false"])),
        "crash detected < 2 s": (ran_kill and max(kill_times) < 2.0,
                                 ", ".join(f"{t:.2f}s (all 3 replicas)" for t in kill_times) or "no kill ran"),
        "every acked message was checked": (totals["acked"] > 0, f"{totals['acked']} acked"),
    }
    res = Result(hosts.mode, hosts.reason, rows, totals, targets, notes)
    res.text = render(cfg, res, roles, metrics, faults, t0)
    return res


def columns(table: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    fmt = lambda row: "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
    return [fmt(table[0]), fmt(tuple("-" * w for w in widths)), *(fmt(row) for row in table[1:])]


def render(cfg: Config, res: Result, roles: dict, metrics: dict, faults: list[Fault], t0: float) -> str:
    lines = []
    mode = ("network namespaces (each agent on its own host, 198.18.0.0/15)" if res.mode == "netns" else
            f"loopback processes, no partitions and no netem ({res.reason})")
    lines.append(f"Echelon chaos run: {mode}")
    lines.append(f"agents {cfg.agents}, producers {len(roles['producers'])} x {cfg.rate:g}/s on "
                 f"{', '.join(roles['producers'])}, 3 membership replicas, 1 matcher; "
                 f"LBDD tree of producer-0: {roles['tree']}")
    head = ("fault", "target", "at", "detection", "dead ok", "false dead", "suspected", "sent", "lost",
            "unexp", "dup", "redeliv", "reorder", "pub err")
    table = [head]
    for r in res.rows:
        table.append((r.fault, r.target, f"+{r.at:.0f}s", r.detection, str(r.dead_expected),
                      ",".join(r.dead_false) or "0", ",".join(r.suspects) or "-", str(r.sent), str(r.lost),
                      str(r.unexpected), str(r.duplicated), str(r.redelivered), str(r.reordered),
                      str(r.publish_errors)))
    lines.append("")
    lines.append("Per fault (messages counted in the window from the fault's start to the next fault):")
    lines += columns(table)
    kinds = list(dict.fromkeys(r.fault for r in res.rows[1:]))
    if len(kinds) < len(res.rows) - 1:
        summary = [("fault", "runs", "detection", "dead ok", "false dead", "sent", "lost", "unexp", "dup",
                    "redeliv", "reorder")]
        for kind in kinds:
            rs = [r for r in res.rows if r.fault == kind]
            total = lambda k: str(sum(getattr(r, k) for r in rs))  # noqa: E731
            secs = [r.seconds for r in rs if r.seconds is not None]
            span = f"{min(secs):.2f}-{max(secs):.2f}" if secs else "?"
            how = "with FALSE DEAD verdicts" if any(r.dead_false for r in rs) else SUMMARY[kind].format(span)
            summary.append((kind, str(len(rs)), how,
                            total("dead_expected"), str(sum(len(r.dead_false) for r in rs)), total("sent"),
                            total("lost"), total("unexpected"), total("duplicated"), total("redelivered"),
                            total("reordered")))
        lines.append("")
        lines.append("By fault:")
        lines += columns(summary)
    lines.append("")
    lines.append("Faults as run:")
    lines += [f"  +{f.start - t0:5.1f}s {f.kind:9} {','.join(f.targets)}: {f.note}" for f in faults]
    t = res.totals
    lines.append("")
    lines.append(f"Totals: sent {t['sent']}, acked {t['acked']}, deliveries {t['received']}, lost {t['lost']}, "
                 f"unexpected {t['unexpected']}, duplicated {t['duplicated']}, redelivered {t['redelivered']}, "
                 f"reordered {t['reordered']}, publish errors {t['publish_errors']}, "
                 f"DEAD verdicts expected {t['dead_expected']} / false {t['dead_false']}, suspected {t['suspected']}")
    if metrics:
        lines.append("Agents' counters (processes alive at the end): " + ", ".join(
            f"{k.removeprefix('echelon_agent_')} {v:g}" for k, v in metrics.items()))
    for n in res.notes:
        lines.append(f"Note: {n}")
    lines.append("")
    lines.append("Targets:")
    for name, (ok, detail) in res.targets.items():
        lines.append(f"  [{'PASS' if ok else 'FAIL'}] {name}: {detail}")
    return "\n".join(lines)


# -- the run --------------------------------------------------------------------------------------


METRICS = ("echelon_agent_destinations_lost_total", "echelon_agent_destinations_parked_total",
           "echelon_agent_destinations_unparked_total", "echelon_agent_rerouted_messages_total",
           "echelon_agent_duplicates_dropped_total", "echelon_agent_redeliveries_total")


async def drive(cfg: Config, hosts: Hosts) -> Result:
    log = cfg.log
    cluster = Cluster(hosts, cfg.out / "logs")
    observer = Observer(cluster.replicas)
    producers: list[Producer] = []
    subscribers: list[Subscriber] = []
    tasks: list[asyncio.Task] = []
    try:
        log(f"starting {len(cluster.procs)} processes ({hosts.mode}); logs in {cluster.log_dir}")
        await cluster.start()
        observer.start()
        roles = choose_roles(cluster, cfg.producers)
        log(f"roles: {json.dumps({k: v for k, v in roles.items() if k != 'tree'})}")
        agents = {p.id: p for p in cluster.agents()}
        admin = Client(agents["agent-0"].address)
        await admin.create_topic(TOPIC, SCHEMA)
        await admin.close()
        n = 0
        for i, a in enumerate(agents.values()):
            for j in range(2 if i % 2 else 1):
                subscribers.append(Subscriber(f"s{i}-{j}", a.id, a.address, FILTERS[n % len(FILTERS)]))
                n += 1
        tasks += [asyncio.create_task(s.run()) for s in subscribers]
        await wait_opened(subscribers, 30.0)
        producers = [Producer(i, agents[a].address, cfg.rate, cfg.keys) for i, a in enumerate(roles["producers"])]
        t0 = time.monotonic()
        until = t0 + cfg.minutes * 60
        tasks += [asyncio.create_task(p.run(until)) for p in producers]
        await asyncio.sleep(cfg.warmup)
        schedule = Schedule(cfg, cluster, observer, hosts, roles)
        log(f"faults ({', '.join(schedule.plan())}), until +{cfg.minutes * 60:.0f}s:")
        await schedule.run(until - cfg.settle / 2, t0)
        await asyncio.sleep(max(0.0, until - time.monotonic()))
        log("publishing stopped; draining")
        await asyncio.gather(*(p.close(20.0) for p in producers))
        await drain(producers, subscribers, schedule.faults, cfg.drain)
        metrics = cluster.metrics(METRICS)
        dump(cfg.out / "deliveries.jsonl", producers, subscribers, t0)
        plot(cfg.out / "timeline.png", schedule.faults, observer, producers, subscribers, t0)
        return build_report(cfg, hosts, schedule.faults, observer, producers, subscribers, roles, t0, metrics)
    finally:
        for s in subscribers:
            s.stopping = True
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in producers:
            await p.client.close()
        await observer.stop()


def dump(path: Path, producers: list[Producer], subscribers: list[Subscriber], t0: float) -> None:
    """What was sent and what every subscription received, one JSON line each, for a post-mortem."""
    with open(path, "w") as out:
        for p in producers:
            for seq, s in p.sent.items():
                out.write(json.dumps({"sent": p.id, "seq": seq, "t": round(s.at - t0, 4), "acked": s.acked,
                                      "failed": s.failed, "attrs": s.attrs}) + "\n")
        for sub in subscribers:
            for x in sub.log:
                out.write(json.dumps({"sub": sub.name, "agent": sub.agent, "producer": x.d.producer,
                                      "seq": x.d.sequence, "key": x.d.ordering_key, "redelivery": x.d.redelivery,
                                      "t": round(x.at - t0, 4)}) + "\n")


def plot(path: Path, faults: list[Fault], obs: Observer, producers: list[Producer],
         subscribers: list[Subscriber], t0: float) -> Path | None:
    """Delivery latency over time (by send time), fault windows shaded, verdicts marked."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sent_at = {(p.id, seq): s.at for p in producers for seq, s in p.sent.items()}
    xs, ys = [], []
    for sub in subscribers:
        for x in sub.log:
            at = sent_at.get((x.d.producer, x.d.sequence))
            if at is not None:
                xs.append(at - t0)
                ys.append(max(x.at - at, 1e-3))
    fig, ax = plt.subplots(figsize=(11, 4.2))
    ax.scatter(xs, ys, s=2, color="0.3", label="a delivery (to any subscription)")
    colours = {"netem": "tab:blue", "pause": "tab:orange", "kill": "tab:red", "partition": "tab:purple",
               "replica": "tab:green"}
    for f in faults:
        ax.axvspan(f.start - t0, f.end - t0, color=colours.get(f.kind, "0.8"), alpha=0.15)
        ax.text(f.start - t0, 1.02, f"{f.kind} {','.join(f.targets)}", transform=ax.get_xaxis_transform(),
                fontsize=7, rotation=20)
    for state, marker, colour in ((SUSPECT, "|", "orange"), (DEAD, "x", "red")):
        ts = [c.at - t0 for c in obs.changes if c.state == state and c.at >= t0]
        ax.scatter(ts, [max(ys, default=1) * 1.5] * len(ts), marker=marker, color=colour,
                   label=f"{STATE[state].upper()} on a replica")
    ax.set_yscale("log")
    ax.set_xlabel("seconds into the run (when the message was sent)")
    ax.set_ylabel("publish to delivery (s)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


async def wait_opened(subscribers: list[Subscriber], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(s.opened for s in subscribers):
        if time.monotonic() > deadline:
            raise TimeoutError(f"subscriptions not open: {[s.name for s in subscribers if not s.opened]}")
        await asyncio.sleep(0.1)


async def drain(producers, subscribers, faults, timeout: float) -> None:
    """Wait (bounded) until every subscription holds every acked message it is owed."""
    acked = {(p.id, seq): s for p in producers for seq, s in p.sent.items() if s.acked}
    deadline = time.monotonic() + timeout
    kills = [f for f in faults if f.kind == "kill"]
    owed = []
    for s in subscribers:
        gaps = [(f.start - KILL_MAYBE_BEFORE, next((t for t in s.opened if t >= f.start), 1e18))
                for f in kills if s.agent in f.targets]
        owed.append((s, {k for k, x in acked.items() if s.filter.matches(x.attrs)
                         and not any(a <= x.at <= b for a, b in gaps)}))
    while time.monotonic() < deadline:
        if all(want <= {(x.d.producer, x.d.sequence) for x in s.log} for s, want in owed):
            return
        await asyncio.sleep(1.0)


def run(cfg: Config) -> Result:
    """Start the cluster, run the schedule, check, tear everything down (also on Ctrl-C)."""
    cfg.out.mkdir(parents=True, exist_ok=True)
    hosts = make_hosts(cfg.agents, cfg.loopback)
    own = hosts.mode == "loopback" and threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, _exit) if own else None  # netns.Network handles its own
    try:
        result = asyncio.run(drive(cfg, hosts))
    finally:
        hosts.close()
        if own:
            signal.signal(signal.SIGTERM, old)
    (cfg.out / "report.txt").write_text(result.text + "\n")
    (cfg.out / "report.json").write_text(json.dumps({
        "mode": result.mode, "reason": result.reason, "rows": [r.__dict__ for r in result.rows],
        "totals": result.totals, "targets": {k: {"ok": ok, "value": v} for k, (ok, v) in result.targets.items()},
        "notes": result.notes}, indent=2))
    return result


def _exit(signum, frame) -> None:
    raise SystemExit(128 + signum)


@click.command()
@click.option("--minutes", default=5.0, type=click.FloatRange(0.5, 120), show_default=True,
              help="How long the workload runs while faults are injected.")
@click.option("--agents", default=6, type=click.IntRange(4, 20), show_default=True)
@click.option("--producers", default=3, type=click.IntRange(1, 8), show_default=True)
@click.option("--rate", default=20.0, type=click.FloatRange(1, 1000), show_default=True,
              help="Messages per second per producer.")
@click.option("--partition-seconds", default=10.0, type=click.FloatRange(1, 120), show_default=True)
@click.option("--short", is_flag=True, help="The CI schedule: one of each fault, shorter.")
@click.option("--loopback", is_flag=True, help="Run on loopback even where namespaces work (no partition, netem).")
@click.option("--out", default="out/chaos", type=click.Path(file_okay=False, path_type=Path), show_default=True)
def main(minutes, agents, producers, rate, partition_seconds, short, loopback, out) -> None:
    """Run the fault schedule against a cluster and print a table per fault."""
    kw = dict(agents=agents, producers=producers, rate=rate, loopback=loopback, out=out)
    cfg = Config.short(**kw) if short else Config(minutes=minutes, partition_seconds=partition_seconds, **kw)
    result = run(cfg)
    print(result.text)
    print(f"\nreport: {cfg.out / 'report.txt'}, {cfg.out / 'report.json'}, {cfg.out / 'timeline.png'}; "
          f"logs: {cfg.out / 'logs'}")
    sys.exit(0 if result.ok else 1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["_delay"]:  # the delayer, started by NetnsHosts._emulate: rx tx seconds
        with contextlib.suppress(KeyboardInterrupt):
            signal.signal(signal.SIGTERM, _exit)
            delay_packets(sys.argv[2], sys.argv[3], 0.1, 0.05, 0.05, float(sys.argv[4]))
    else:
        main()
