"""An in-process cluster for tests: real gRPC servers on loopback (port 0), real
membership, matchers and agents, all in the test's event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from echelon.agent.server import AgentNode
from echelon.client import Client
from echelon.launch import free_port
from echelon.matcher.server import MatcherNode
from echelon.membership.server import MembershipNode
from echelon.runtime.auth import AuthConfig
from echelon.runtime.certs import Authority
from echelon.runtime.node import Node, NodeConfig
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import matcher_pb2_grpc as xgrpc
from echelon.v1 import membership_pb2 as mpb


async def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    """Poll `predicate()` (sync or async) until truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def wait_registered(matcher: str, topic: str, timeout: float = 30.0) -> None:
    """Until the matcher at this address holds a subscription of `topic`, so a publish
    reaches it (for tests of processes, which cannot look inside the nodes)."""
    deadline = time.monotonic() + timeout
    while True:
        with grpc.insecure_channel(matcher) as ch:
            r = xgrpc.MatcherStub(ch).ListZones(xpb.ListZonesRequest(topic=topic), timeout=5)
        if sum(z.subscriptions for t in r.topics for z in t.zones):
            return
        assert time.monotonic() < deadline, f"no subscription of {topic!r} registered at {matcher} in {timeout}s"
        time.sleep(0.1)


def listening(port: int) -> bool:
    """Is something listening on 127.0.0.1:port? A gRPC server sets SO_REUSEPORT, so only a
    socket without it is refused there; SO_REUSEADDR lets connections in TIME_WAIT pass."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def free_layout(layouts: Sequence[Sequence[int]]) -> tuple[int, ...] | None:
    """The first of these fixed port layouts nobody listens on (another run of the same test
    holds one): below the ephemeral range, so no free port drawn elsewhere lands there."""
    for ports in layouts:
        if not any(listening(p) for p in ports):
            return tuple(ports)
    return None


@dataclass
class Cluster:
    agents: int = 3
    matchers: int = 1
    memberships: int = 1
    agent_kwargs: dict = field(default_factory=dict)
    matcher_kwargs: dict = field(default_factory=dict)
    membership_kwargs: dict = field(default_factory=dict)
    membership_nodes: list[MembershipNode] = field(default_factory=list)
    matcher_nodes: list[MatcherNode] = field(default_factory=list)
    agent_nodes: list[AgentNode] = field(default_factory=list)
    clients: list[Client] = field(default_factory=list)
    replicas: list[str] = field(default_factory=list)  # fixed at start: a crashed replica keeps its place
    crashed: list[Node] = field(default_factory=list)
    auth: AuthConfig = field(default_factory=AuthConfig)  # every node's (runtime/auth.py)
    tls: Path | None = None  # mTLS: a throw-away CA issues each node (role from its id) a directory here
    authority: Authority | None = None
    # Agent i binds agent_ports[i] when given (else a free port): the LBDD trees hang on the
    # agents' addresses (dataplane/trees.py), so fixed ports fix every tree (`free_layout`).
    agent_ports: tuple[int, ...] = ()

    def config(self, member_id: str) -> NodeConfig:
        return NodeConfig(id=member_id, membership=self.replicas, grace=0.5, tls_dir=self.tls_dir(member_id),
                          auth=self.auth)

    def tls_dir(self, name: str, role: str = "") -> str:
        """The certificate directory of `name` (`role` or its id's prefix: agent-0 -> agent), issued once."""
        if self.tls is None:
            return ""
        if self.authority is None:
            self.authority = Authority.create()
        d = Path(self.tls) / name
        if not d.exists():
            self.authority.write(d, role or name.split("-")[0], name)
        return str(d)

    async def start(self) -> "Cluster":
        # Replicas know each other from the start (--peers), so their ports are picked first.
        self.replicas = [f"127.0.0.1:{free_port()}" for _ in range(self.memberships)]
        for i in range(self.memberships):
            self.membership_nodes.append(await self._start_membership(i))
        for i in range(self.matchers):
            await self.add_matcher(i)
        for i in range(self.agents):
            await self.add_agent(i)
        await wait_for(lambda: all(len(a.membership.alive(mpb.ROLE_AGENT)) == len(self.agent_nodes) for a in self.agent_nodes),
                       what="every agent sees every agent")
        await wait_for(self.replicas_agree, what="every replica holds every member alive")
        return self

    def replicas_agree(self) -> bool:
        """Every running replica holds every running member ALIVE."""
        live = {n.config.id for n in (*self.agent_nodes, *self.matcher_nodes) if n not in self.crashed}
        return all({i for i, r in m.replica.log.snapshot().members.items() if r.state.value == "alive"} >= live
                   for m in self.membership_nodes if m not in self.crashed)

    async def _start_membership(self, i: int) -> MembershipNode:
        port = int(self.replicas[i].rsplit(":", 1)[1])
        node = MembershipNode(NodeConfig(id=f"membership-{i}", port=port, grace=0.5,
                                         tls_dir=self.tls_dir(f"membership-{i}"), auth=self.auth),
                              peers=self.replicas,
                              **self.membership_kwargs)
        await node.start()
        return node

    async def restart_membership(self, i: int) -> MembershipNode:
        """A fresh process for replica i on its old address (after `crash` or `stop`)."""
        self.membership_nodes[i] = await self._start_membership(i)
        return self.membership_nodes[i]

    async def crash(self, node: Node) -> None:
        """Stop `node` as `kill -9` would: connections cut, no Leave, no drain."""
        self.crashed.append(node)
        await node.server.grpc.stop(0)
        if node.membership:
            await node.membership.stop(leave=False)
        if node.rtt:  # its round-trip probes die with it
            await node.rtt.stop()
        await node.on_stop()  # only to release its tasks: nothing it does reaches anyone now

    async def add_matcher(self, i: int) -> MatcherNode:
        node = MatcherNode(self.config(f"matcher-{i}"), **self.matcher_kwargs)
        await node.start()
        self.matcher_nodes.append(node)
        return node

    async def add_agent(self, i: int, client_port: bool = False, **kwargs) -> AgentNode:
        """`client_port`: the agent also serves token clients on a port that asks no certificate."""
        config = self.config(f"agent-{i}")
        if i < len(self.agent_ports):
            config = dataclasses.replace(config, port=self.agent_ports[i])
        if client_port:
            config = dataclasses.replace(config, client_port=free_port())
        node = AgentNode(config, **{**self.agent_kwargs, **kwargs})
        await node.start()
        self.agent_nodes.append(node)
        return node

    def ca_only(self) -> Path:
        """A TLS directory holding the cluster's CA alone: a caller without a certificate."""
        d = Path(self.tls) / "ca-only"
        if not d.exists():
            d.mkdir()
            (d / "ca.crt").write_bytes(self.authority.pem)
        return d

    def client(self, i: int, token: str = "") -> Client:
        c = Client(self.agent_nodes[i].address, tls=self.tls_dir("client-test", "client") or None, token=token)
        self.clients.append(c)
        return c

    async def close_clients(self) -> None:
        """Every client handed out, closed. Before any node stops: a client closed after its
        agent stopped, with a publisher or subscriptions open, takes seconds to give up."""
        for c in self.clients:
            await c.close()

    async def stop(self) -> None:
        await self.close_clients()
        nodes: list[Node] = [n for n in (*self.agent_nodes, *self.matcher_nodes, *self.membership_nodes)
                             if n not in self.crashed]
        await asyncio.gather(*(n.stop(0.2) for n in nodes), return_exceptions=True)
