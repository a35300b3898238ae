"""The shape every service shares: a gRPC server, a `/metrics` endpoint, and (for all
but membership itself) a membership client. A service subclasses `Node`, adds its
servicers in `__init__`, and its own work in `on_start` / `on_stop`.

Shutdown runs in the order Kubernetes expects: not serving (health NOT_SERVING, so
readiness fails and no new traffic is sent), drain (the service's own `on_drain`, then
new calls are refused and in-flight ones finish their work, all within the grace, while
the service still runs), stop (the service's own work, then leaving membership)."""

from __future__ import annotations

import logging
import asyncio
from dataclasses import dataclass, field

from pathlib import Path

from prometheus_client import Gauge

from echelon.runtime import loop
from echelon.runtime.auth import AuthConfig, acl_cache
from echelon.runtime.crawl import CrawlServicer
from echelon.runtime.member import MemberClient
from echelon.runtime.metrics import serve_metrics
from echelon.runtime.rtt import RttProber
from echelon.runtime.server import Server
from echelon.contract.transport import TlsDir, Transport
from echelon.v1 import crawl_pb2_grpc
from echelon.v1 import membership_pb2 as mpb

log = logging.getLogger("echelon.node")


@dataclass
class NodeConfig:
    """Validated once at start (by the CLI or the test harness)."""

    id: str
    host: str = "127.0.0.1"
    port: int = 0
    advertise: str = ""  # host:port others dial; default host:bound port
    metrics_port: int | None = None  # None: no HTTP endpoint (tests); 0: pick one
    membership: list[str] = field(default_factory=list)
    region: str = "local"
    capacity: int = 1
    beat_interval: float = 0.2
    grace: float = 5.0
    auth: AuthConfig = field(default_factory=AuthConfig)
    tls_dir: str = ""  # certificates (tls.crt, tls.key, ca.crt): every port and channel is TLS
    client_port: int | None = None  # an agent's port for clients without a certificate (TLS only)
    health_port: int | None = None  # plain-text health service alone, for probes that speak no TLS

    def __post_init__(self) -> None:
        if not self.id or any(c in self.id for c in "/ \t\n"):
            raise ValueError(f"member id {self.id!r}: non-empty, without '/' or spaces")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port {self.port} out of range")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics port {self.metrics_port} out of range")
        if self.client_port is not None and not (self.tls_dir and 0 <= self.client_port <= 65535):
            raise ValueError("a client port is for TLS clusters (--tls-dir), in 0..65535")
        if self.health_port is not None and not 0 <= self.health_port <= 65535:
            raise ValueError(f"health port {self.health_port} out of range")


class Node:
    role: int = mpb.ROLE_UNSPECIFIED

    def __init__(self, config: NodeConfig):
        self.config = config
        # Every channel this node dials carries its member token (token and JWT modes).
        transport = Transport(TlsDir(Path(config.tls_dir)) if config.tls_dir else None,
                              token=config.auth.member_token)
        self.server = Server(transport=transport, auth=config.auth, receive_bytes=self.receive_limit(config))
        self.registry = self.server.registry
        self.membership: MemberClient | None = None
        self.server.add(crawl_pb2_grpc.add_CrawlServicer_to_server, CrawlServicer(lambda: self.membership),
                        "echelon.v1.Crawl")
        self._metrics_http = None
        self.rtt: RttProber | None = None
        self.view_age = Gauge("echelon_membership_view_age_seconds",
                              "Seconds since the last view arrived from membership.", registry=self.registry)
        self.view_age.set_function(lambda: self.membership.view_age() if self.membership else 0.0)
        # A membership replica points these at its own view and plan.
        self.view_version = Gauge("echelon_membership_view_version", "Version of the view this process holds.",
                                  registry=self.registry)
        self.view_version.set_function(lambda: self.membership.version if self.membership else 0)
        self.plan_version = Gauge("echelon_membership_plan_version",
                                  "Version of the routing plan this process has adopted.", registry=self.registry)
        self.plan_version.set_function(lambda: self.membership.plan_version if self.membership else 0)
        if transport.tls is not None:
            from echelon.runtime.certs import expiry_gauge

            expiry_gauge(transport, self.registry)

    def receive_limit(self, config: NodeConfig) -> int | None:
        """The largest message this node's server receives (None: `--limits
        max_message_bytes`); called before the subclass's own __init__ has run."""
        return None

    @property
    def address(self) -> str:
        return self.config.advertise or f"{self.config.host}:{self.server.port}"

    @property
    def metrics_address(self) -> str:
        return f"{self.config.host}:{self._metrics_http.server_port}" if self._metrics_http else ""

    async def start(self) -> None:
        client = None if self.config.client_port is None else f"{self.config.host}:{self.config.client_port}"
        health = None if self.config.health_port is None else f"{self.config.host}:{self.config.health_port}"
        await self.server.start(f"{self.config.host}:{self.config.port}", client, health)
        if self.config.metrics_port is not None:
            self._metrics_http = serve_metrics(self.registry, self.config.metrics_port, self.config.host)
        if self.config.membership and self.role != mpb.ROLE_MEMBERSHIP:
            me = mpb.Member(id=self.config.id, role=self.role, address=self.address, region=self.config.region,
                            capacity=self.config.capacity, metrics_address=self.metrics_address)
            self.membership = MemberClient(me, self.config.membership, self.config.beat_interval,
                                           self.server.transport)
            self.membership.on_change(self.on_view)
            member = self.membership
            # Keyed by the rules' dict too: a view from another replica numbers its versions anew.
            self.server.access.acl = acl_cache(lambda: (member.version, id(member.acls)), lambda: member.acls)
            await self.membership.start()
            self.rtt = RttProber(self.config.id, self.membership, self.registry)
            self.rtt.start()
        await self.on_start()
        log.info("started", extra={"member": self.config.id, "address": self.address,
                                   "metrics": self.metrics_address, "loop": loop.running()})

    async def stop(self, grace: float | None = None) -> None:
        grace = self.config.grace if grace is None else grace
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        await self.server.health.enter_graceful_shutdown()  # for every service and overall
        await self.on_drain(deadline)
        # Still running (and a member, unless on_drain left): what is already routed here arrives.
        await self.server.stop(max(0.0, deadline - loop.time()))
        await self.on_stop()
        if self.rtt:
            await self.rtt.stop()
        if self.membership:
            await self.membership.stop(leave=True)
        if self._metrics_http:
            self._metrics_http.shutdown()
            self._metrics_http.server_close()

    async def on_start(self) -> None:
        """Service-specific start, after the server is up and the first view arrived."""

    async def on_drain(self, deadline: float) -> None:
        """Service-specific drain after NOT_SERVING, while new calls are still taken; return
        by `deadline` (loop time)."""

    async def on_stop(self) -> None:
        """Service-specific stop, after the drain and before leaving membership."""

    def on_view(self) -> None:
        """Called after every view change."""
