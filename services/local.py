"""A local cluster of real processes on loopback: what `echelon up` and `echelon demo` run.

Each service is `python -m echelon <role>` with its own ports; the cluster is ready
when every process answers the gRPC health check with SERVING. `stop()` sends SIGTERM
to every child (they drain and exit), waits, and kills what is left, so nothing stays
behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# Port layout above the base port; metrics ports sit 1000 above their gRPC port.
OFFSETS = {"membership": 0, "matcher": 20, "router": 60, "agent": 100}
METRICS_OFFSET = 1000


@dataclass
class Process:
    role: str
    id: str
    port: int
    metrics_port: int
    args: list[str]
    log: Path
    popen: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def as_dict(self) -> dict:
        return {"role": self.role, "id": self.id, "address": self.address,
                "metrics": f"127.0.0.1:{self.metrics_port}", "pid": self.popen.pid if self.popen else None,
                "log": str(self.log)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalCluster:
    agents: int = 3
    matchers: int = 1
    memberships: int = 1
    routers: int = 0  # per region
    regions: int = 1  # > 1: agents spread over regions region-0.., `routers` routers in each
    base_port: int = 7100  # 0: pick free ports
    log_dir: Path = field(default_factory=lambda: Path("out") / "logs" / time.strftime("%Y%m%d-%H%M%S"))
    extra: dict[str, list[str]] = field(default_factory=dict)  # role -> extra CLI args
    processes: list[Process] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name, n, low in (("agents", self.agents, 1), ("matchers", self.matchers, 1),
                             ("memberships", self.memberships, 1), ("routers", self.routers * self.regions, 0),
                             ("regions", self.regions, 1)):
            if not low <= n <= 40:
                raise ValueError(f"{name}: {n} is not in [{low}, 40]")
        if self.regions > 1 and not self.routers:
            raise ValueError("regions need routers: give at least one router per region")
        self.log_dir = Path(self.log_dir)
        counts = {"membership": self.memberships, "matcher": self.matchers, "router": self.routers * self.regions,
                  "agent": self.agents}
        for role, n in counts.items():
            for i in range(n):
                self.processes.append(self._plan(role, i))
        replicas = ",".join(p.address for p in self.by_role("membership"))
        for p in self.processes:
            p.args += ["--membership", replicas] if role_needs_membership(p.role) else ["--peers", replicas]

    def _plan(self, role: str, i: int) -> Process:
        if self.base_port:
            port = self.base_port + OFFSETS[role] + i
            metrics = port + METRICS_OFFSET
        else:
            port, metrics = free_port(), free_port()
        pid = f"{role}-{i}"
        region = []
        if self.regions > 1 and role in ("router", "agent"):
            # routers: `routers` per region, in order; agents: round robin over the regions
            c = i // self.routers if role == "router" else i % self.regions
            pid = f"{role}-{c}-{i % self.routers}" if role == "router" else pid
            region = ["--region", f"region-{c}"]
        args = [sys.executable, "-m", "echelon", role, "--id", pid, "--host", "127.0.0.1", "--port", str(port),
                "--metrics-port", str(metrics), *region, *self.extra.get(role, [])]
        return Process(role, pid, port, metrics, args, self.log_dir / f"{pid}.log")

    def by_role(self, role: str) -> list[Process]:
        return [p for p in self.processes if p.role == role]

    def agent_addresses(self) -> list[str]:
        return [p.address for p in self.by_role("agent")]

    async def start(self, timeout: float = 60.0) -> None:
        """Start membership first, then the rest; return when every process is SERVING."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for wave in (["membership"], ["matcher", "router"], ["agent"]):
                procs = [p for p in self.processes if p.role in wave]
                for p in procs:
                    self.spawn(p)
                await asyncio.gather(*(self.wait_serving(p, timeout) for p in procs))
        except BaseException:
            self.stop()
            raise

    def spawn(self, p: Process) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(p.log, "ab") as log:
            # A new session, so a Ctrl-C at the terminal reaches `echelon up` only, which
            # then stops the children in order.
            p.popen = subprocess.Popen(p.args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)

    async def wait_serving(self, p: Process, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        async with grpc.aio.insecure_channel(p.address) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while True:
                if p.popen and p.popen.poll() is not None:
                    tail = p.log.read_text(errors="replace")[-2000:] if p.log.exists() else ""
                    raise RuntimeError(f"{p.id} exited with {p.popen.returncode}; log {p.log}:\n{tail}")
                try:
                    r = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                    if r.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{p.id} not serving on {p.address} after {timeout:.0f}s (log {p.log})")
                await asyncio.sleep(0.1)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every child (agents first, membership last), wait, SIGKILL leftovers."""
        order = ["agent", "router", "matcher", "membership"]
        for role in order:
            for p in self.by_role(role):
                if p.popen and p.popen.poll() is None:
                    p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.processes:
            if p.popen is None:
                continue
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()

    def pids(self) -> list[int]:
        return [p.popen.pid for p in self.processes if p.popen]


def role_needs_membership(role: str) -> bool:
    return role != "membership"
