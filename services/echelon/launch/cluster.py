"""The one cluster launcher: plan the processes, start them in waves, wait until they
serve, list them, signal and restart one, stop them all.

Services are `python -m echelon <role>` with `--id --host --port --metrics-port
--region`, the membership replicas' addresses (`--peers` for a replica, `--membership`
for the rest), flags every service gets (`common`) and flags per role (`extra`). Ports
and sites come from the placement before anything starts, so `processes` (role, id,
region, gRPC and metrics address) can be read to configure what starts next to the
cluster: an auxiliary process (`add_aux`: e.g. Prometheus with a scrape config of every
metrics address, or a periodic job with `every=`) starts after the services and stops
before them.

With `tls`, every process runs with mTLS: a throw-away CA (in `<log dir>/tls/ca`) issues
each service a certificate naming its role and id (`<log dir>/tls/<id>`, given as
`--tls-dir`), the routing job one as `replan`, and the launcher and local clients one as
`client/local` (`client_tls`).

With `auth`, every service runs `--auth tokens` with a throw-away tokens file
(`<log dir>/auth/tokens.json`, mode 0600): a member token the services share (given in
their environment, not argv), an `admin` token (group `admins`: the cluster admin, for
the user and the launcher) and a `replan` token for the routing job. With TLS too, the
local client certificate's user (`local`) is a superuser, since a certificate wins over
a token (runtime/auth.py).

Ready means: every service answers the gRPC health check with SERVING, every member is
ALIVE in membership's view, every auxiliary process with a `ready_url` answers it. A
process that exits before that fails the start with the tail of its log; the start then
stops whatever it had started.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from echelon.launch.placement import Loopback, Placement, Site, stop_processes
from echelon.runtime.server import PARENT_ENV
from echelon.contract.transport import PLAIN, TlsDir, Transport
from echelon.v1 import membership_pb2 as mpb

# Start order; stop goes the other way. Auxiliary processes come last (wave 3).
WAVES = {"membership": 0, "matcher": 1, "router": 1, "agent": 2}
AUX_WAVE = 3
LOG_TAIL = 2000  # characters of a log shown when its process exits early


@dataclass
class Process:
    """One child: a service (gRPC health at `address`) or an auxiliary process."""

    role: str
    id: str
    site: Site
    argv: list[str]
    log: Path
    address: str = ""  # gRPC for a service; what an auxiliary process serves, if anything
    metrics: str = ""  # host:port of /metrics
    region: str = "local"
    service: bool = True
    ready_url: str = ""  # auxiliary: ready when a GET answers 2xx
    popen: subprocess.Popen | None = None
    starts: int = 0

    @property
    def wave(self) -> int:
        return WAVES[self.role] if self.service else AUX_WAVE

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-LOG_TAIL:] if self.log.exists() else ""

    def as_dict(self) -> dict:
        return {"role": self.role, "id": self.id, "region": self.region, "address": self.address,
                "metrics": self.metrics, "pid": self.pid, "log": str(self.log)}

    def scrape(self, names: tuple[str, ...], timeout: float = 3.0) -> dict[str, float]:
        """Samples of /metrics named `names`, each summed over its labels ({} unreachable)."""
        out = dict.fromkeys(names, 0.0)
        try:
            with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=timeout) as r:
                text = r.read().decode()
        except OSError:
            return {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in out:
                    out[s.name] += s.value
        return out


@dataclass
class Cluster:
    agents: int = 3
    matchers: int = 1
    memberships: int = 3
    routers: int = 0  # per region
    regions: int = 1  # > 1: regions region-0.. (OctopiA SCOT): `routers` routers router-<c>-<a> in
    # each, agents dealt round robin over them
    regional_matchers: bool = False  # `matchers` matchers in EACH region (its own tier), not one tier in "local"
    placement: Placement = field(default_factory=Loopback)
    log_dir: Path = field(default_factory=lambda: Path("out") / "logs" / time.strftime("%Y%m%d-%H%M%S"))
    common: list[str] = field(default_factory=list)  # flags for every service
    extra: dict[str, list[str]] = field(default_factory=dict)  # role -> flags
    processes: list[Process] = field(default_factory=list)
    tls: bool = False  # mTLS everywhere, certificates from a throw-away CA (see the module doc)
    auth: bool = False  # --auth tokens everywhere, a throw-away tokens file (see the module doc)
    _authority: object = field(default=None, repr=False)
    _tokens: dict[str, str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name, n, low in (("agents", self.agents, 1), ("matchers", self.matchers, 1),
                             ("memberships", self.memberships, 1), ("routers", self.routers * self.regions, 0),
                             ("regions", self.regions, 1)):
            if not low <= n <= 40:
                raise ValueError(f"{name}: {n} is not in [{low}, 40]")
        if self.regions > 1 and not self.routers:
            raise ValueError("regions are joined by routers: give at least one router per region")
        self.log_dir = Path(self.log_dir)
        regional = self.regional_matchers and self.regions > 1
        for role, n in (("membership", self.memberships), ("matcher", 0 if regional else self.matchers)):
            for _ in range(n):
                self.plan(role)
        for c in range(self.regions if regional else 0):
            for i in range(self.matchers):
                self.plan("matcher", region=f"region-{c}", id=f"matcher-{c}-{i}")
        if self.regions == 1:
            for _ in range(self.routers):
                self.plan("router")
        for c in range(self.regions if self.regions > 1 else 0):
            for a in range(self.routers):
                self.plan("router", region=f"region-{c}", id=f"router-{c}-{a}")
        for i in range(self.agents):
            self.plan("agent", region=f"region-{i % self.regions}" if self.regions > 1 else "local")

    # -- the plan ------------------------------------------------------------------------

    def plan(self, role: str, region: str = "local", id: str | None = None, extra: Sequence[str] = ()) -> Process:
        """Add a service process (before `start`, or later and `launch` it). The
        membership replicas must all be planned before any other role."""
        if role not in WAVES:
            raise ValueError(f"role {role!r}: one of {sorted(WAVES)}")
        if role == "membership" and any(p.role != "membership" for p in self.processes):
            raise ValueError("plan every membership replica before the other services")
        index = len(self.by_role(role))
        site = self.placement.site(role, index)
        port, metrics = self.placement.ports(role, index)
        pid = id or f"{role}-{index}"
        if any(p.id == pid for p in self.processes):
            raise ValueError(f"{pid}: planned twice")
        argv = [sys.executable, "-m", "echelon", role, "--id", pid, "--host", site.ip, "--port", str(port),
                "--metrics-port", str(metrics), "--region", region, *self.common, *self.extra.get(role, []),
                *extra]
        if role in ("agent", "membership"):  # durable subscriptions' log; topics, ACLs, plans: kept across restarts
            argv += ["--data-dir", str(self.data_dir(pid))]
        p = Process(role, pid, site, argv, self.log_dir / f"{pid}.log", f"{site.ip}:{port}",
                    f"{site.ip}:{metrics}", region)
        self.processes.append(p)
        return p

    def data_dir(self, pid: str) -> Path:
        """An agent's or a membership replica's data directory (wipe it to simulate the loss
        of the node's disk)."""
        return self.log_dir / "data" / pid

    def add_aux(self, role: str, argv: list[str], id: str | None = None, address: str = "", metrics: str = "",
                ready_url: str = "", every: float | None = None) -> Process:
        """Add an auxiliary process, started after the services on the root site (where
        membership runs) and stopped before them. `every`: run argv every so many
        seconds instead (never overlapping; `echelon.launch.every`)."""
        if every is not None:
            argv = [sys.executable, "-m", "echelon.launch.every", str(every), "--", *argv]
        pid = id or role
        if any(p.id == pid for p in self.processes):
            raise ValueError(f"{pid}: planned twice")
        p = Process(role, pid, self.placement.site(role, 0), list(argv), self.log_dir / f"{pid}.log", address,
                    metrics, service=False, ready_url=ready_url)
        self.processes.append(p)
        return p

    def by_role(self, role: str) -> list[Process]:
        return [p for p in self.processes if p.role == role]

    def process(self, pid: str) -> Process:
        return next(p for p in self.processes if p.id == pid)

    @property
    def replicas(self) -> list[str]:
        """The membership replicas' addresses."""
        return [p.address for p in self.by_role("membership")]

    @property
    def client_tls(self) -> Path | None:
        """The certificate directory for clients of this cluster (None without TLS)."""
        return self._certificates("client", "local", ("localhost", "127.0.0.1")) if self.tls else None

    @property
    def transport(self) -> Transport:
        """How the launcher and its callers reach the services (as the cluster admin)."""
        if not (self.tls or self.auth):
            return PLAIN
        return Transport(TlsDir(self.client_tls) if self.tls else None, token=self.admin_token)

    @property
    def tokens_file(self) -> Path:
        return self.log_dir / "auth" / "tokens.json"

    @property
    def tokens(self) -> dict[str, str]:
        """name -> token of the cluster's tokens file (written on first use); {} without auth."""
        if not self.auth:
            return {}
        if self._tokens is None:
            from echelon.runtime.credentials import write_tokens_file

            self._tokens = write_tokens_file(self.tokens_file, {"admin": ["admins"], "replan": ["admins"]})
        return self._tokens

    @property
    def admin_token(self) -> str:
        """The cluster admin's token ("" without auth)."""
        return self.tokens.get("admin", "")

    def _certificates(self, role: str, name: str, hosts: tuple[str, ...]) -> Path:
        """`<log dir>/tls/<name>` (issued on first use; the CA too)."""
        from echelon.runtime.certs import Authority

        root = self.log_dir / "tls"
        if self._authority is None:
            self._authority = Authority.create()
            self._authority.save(root / "ca")
        d = root / name
        if not (d / "tls.crt").exists():
            self._authority.write(d, role, name, hosts=hosts)
        return d

    def agent_addresses(self) -> list[str]:
        return [p.address for p in self.by_role("agent")]

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes if p.pid]

    def exited(self) -> list[str]:
        """Ids of the processes started and no longer running."""
        return [p.id for p in self.processes if p.popen is not None and not p.running()]

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, timeout: float = 90.0) -> None:
        """Start wave by wave; return when the cluster is ready (see the module doc)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for wave in sorted({p.wave for p in self.processes if p.service}):
                await self._start_wave(wave, timeout)
            await self.wait_members(timeout)
            await self._start_wave(AUX_WAVE, timeout)
        except BaseException:
            self.stop()
            raise

    async def _start_wave(self, wave: int, timeout: float) -> None:
        procs = [p for p in self.processes if p.wave == wave]
        for p in procs:
            self.spawn(p)
        await asyncio.gather(*(self.wait_ready(p, timeout) for p in procs))

    async def launch(self, p: Process, timeout: float = 60.0) -> None:
        """Start one process (a planned one, or again after it exited) and wait until it is ready."""
        self.spawn(p)
        await self.wait_ready(p, timeout)

    def command(self, p: Process) -> list[str]:
        """p's argv; a service's with the replicas' addresses (known once all are planned)."""
        if not p.service:
            return p.argv
        tls = ["--tls-dir", str(self._certificates(p.role, p.id, ("localhost", "127.0.0.1", p.site.ip)))] \
            if self.tls else []
        auth = ["--auth", "tokens", "--tokens-file", str(self.tokens_file), *(["--superusers", "local"] * self.tls)] \
            if self.tokens else []
        return [*p.argv, *tls, *auth, "--peers" if p.role == "membership" else "--membership",
                ",".join(self.replicas)]

    def spawn(self, p: Process) -> None:
        p.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if p.service:  # it stops when this process dies (runtime/server.py `follow_parent`)
            env[PARENT_ENV] = str(os.getpid())
        if self.tls and not p.service:  # the routing job (and any auxiliary gRPC caller) as `replan`
            env["ECHELON_TLS_DIR"] = str(self._certificates("replan", "replan", ("localhost",)))
        if self.tokens:  # secrets in the environment, not in argv (ps shows argv)
            env["ECHELON_MEMBER_TOKEN" if p.service else "ECHELON_TOKEN"] = \
                self.tokens["cluster" if p.service else "replan"]
        argv = self.command(p)
        if not p.service and shutil.which("setpriv"):  # the same for a program that knows nothing of it
            argv = ["setpriv", "--pdeathsig", "TERM", "--", *argv]
        with open(p.log, "ab") as log:
            log.write(f"=== start {p.starts} at {time.strftime('%H:%M:%S')}: {' '.join(argv)}\n".encode())
            log.flush()
            p.popen = self.placement.popen(p.site, argv, stdout=log, stderr=subprocess.STDOUT, env=env)

    async def wait_ready(self, p: Process, timeout: float) -> None:
        """Until `p` is ready: a service's gRPC health says SERVING, an auxiliary's
        ready_url answers (at once without one)."""
        if p.service:
            async with self.transport.dial(p.address) as ch:
                await self._poll(p, timeout, lambda: _serving(ch))
        else:
            await self._poll(p, timeout, lambda: _answers(p.ready_url))

    async def _poll(self, p: Process, timeout: float, ready) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not p.running():
                raise RuntimeError(f"{p.id} exited with {p.popen.returncode}; log {p.log}:\n{p.tail()}")
            if await ready():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{p.id} not ready at {p.address or p.ready_url} after {timeout:.0f}s "
                                   f"(log {p.log})")
            await asyncio.sleep(0.1)

    async def wait_members(self, timeout: float) -> None:
        """Until a membership replica's view holds every running member ALIVE."""
        from echelon.runtime.member import fetch_view

        want = {p.id for p in self.processes if p.service and p.role != "membership" and p.running()}
        deadline = time.monotonic() + timeout
        alive: set[str] = set()
        while True:
            for address in self.replicas:
                try:
                    view = await asyncio.wait_for(fetch_view(address, self.transport), 5.0)
                except Exception:  # noqa: BLE001 - this replica does not answer yet: ask the next
                    continue
                alive = {m.id for m in view.members if m.state == mpb.MEMBER_STATE_ALIVE}
                if want <= alive:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ALIVE in membership's view after {timeout:.0f}s: {sorted(want - alive)}")
            await asyncio.sleep(0.2)

    def signal(self, pid: str, sig: int) -> None:
        """Send `sig` to one process we started (by its pid); after SIGKILL, reap it."""
        p = self.process(pid)
        if p.running():
            os.kill(p.popen.pid, sig)
            if sig == signal.SIGKILL:
                p.popen.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every child, last wave first (auxiliary, agents, ..., membership), wait
        until one deadline, SIGKILL what is left."""
        order = sorted((p for p in self.processes if p.popen), key=lambda p: -p.wave)
        stop_processes([p.popen for p in order], timeout)


async def _serving(ch: grpc.aio.Channel) -> bool:
    try:
        r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
    except (grpc.aio.AioRpcError, asyncio.TimeoutError):
        return False
    return r.status == health_pb2.HealthCheckResponse.SERVING


async def _answers(url: str) -> bool:
    """True without a URL; else whether a GET answers 2xx."""
    if not url:
        return True

    def get() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as r:
                return 200 <= r.status < 300
        except OSError:
            return False

    return await asyncio.to_thread(get)
