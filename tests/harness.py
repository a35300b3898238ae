"""An in-process cluster for tests: real gRPC servers on loopback (port 0), real
membership, matchers and agents, all in the test's event loop."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from echelon.agent.server import AgentNode
from echelon.client import Client
from echelon.matcher.server import MatcherNode
from echelon.membership.server import MembershipNode
from echelon.runtime.node import Node, NodeConfig
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


@dataclass
class Cluster:
    agents: int = 3
    matchers: int = 1
    memberships: int = 1
    agent_kwargs: dict = field(default_factory=dict)
    membership_nodes: list[MembershipNode] = field(default_factory=list)
    matcher_nodes: list[MatcherNode] = field(default_factory=list)
    agent_nodes: list[AgentNode] = field(default_factory=list)
    clients: list[Client] = field(default_factory=list)

    @property
    def replicas(self) -> list[str]:
        return [n.address for n in self.membership_nodes]

    def config(self, member_id: str) -> NodeConfig:
        return NodeConfig(id=member_id, membership=self.replicas, grace=0.5)

    async def start(self) -> "Cluster":
        for i in range(self.memberships):
            node = MembershipNode(NodeConfig(id=f"membership-{i}", grace=0.5))
            await node.start()
            self.membership_nodes.append(node)
        for i in range(self.matchers):
            await self.add_matcher(i)
        for i in range(self.agents):
            await self.add_agent(i)
        await wait_for(lambda: all(len(a.membership.alive(mpb.ROLE_AGENT)) == len(self.agent_nodes) for a in self.agent_nodes),
                       what="every agent sees every agent")
        return self

    async def add_matcher(self, i: int) -> MatcherNode:
        node = MatcherNode(self.config(f"matcher-{i}"))
        await node.start()
        self.matcher_nodes.append(node)
        return node

    async def add_agent(self, i: int, **kwargs) -> AgentNode:
        node = AgentNode(self.config(f"agent-{i}"), **{**self.agent_kwargs, **kwargs})
        await node.start()
        self.agent_nodes.append(node)
        return node

    def client(self, i: int) -> Client:
        c = Client(self.agent_nodes[i].address)
        self.clients.append(c)
        return c

    async def stop(self) -> None:
        for c in self.clients:
            await c.close()
        nodes: list[Node] = [*self.agent_nodes, *self.matcher_nodes, *self.membership_nodes]
        await asyncio.gather(*(n.stop(0.2) for n in nodes), return_exceptions=True)
