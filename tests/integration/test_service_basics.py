"""Every service answers health and reflection, counts RPCs, and exposes valid metrics."""

from __future__ import annotations

import shutil
import subprocess
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from echelon.agent.server import AgentNode
from echelon.client import errors
from echelon.runtime import schema_code
from echelon.runtime.node import NodeConfig
from echelon.v1 import pubsub_pb2, pubsub_pb2_grpc
from tests.harness import wait_for

EXPECTED = {
    "agent": {"echelon.v1.PubSub", "echelon.v1.Admin", "echelon.v1.Relay"},
    "matcher": {"echelon.v1.Matcher"},
    "membership": {"echelon.v1.Membership", "echelon.v1.Control", "echelon.v1.Admin"},
}


async def list_services(address: str) -> set[str]:
    async with grpc.aio.insecure_channel(address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)

        async def one():
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        async for r in stub.ServerReflectionInfo(one()):
            return {s.name for s in r.list_services_response.service}


async def health(address: str, service: str = "") -> int:
    async with grpc.aio.insecure_channel(address) as ch:
        r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service))
        return r.status


async def test_health_and_reflection_on_every_service(cluster):
    nodes = {"agent": cluster.agent_nodes[0], "matcher": cluster.matcher_nodes[0],
             "membership": cluster.membership_nodes[0]}
    for role, node in nodes.items():
        services = await list_services(node.address)
        assert EXPECTED[role] <= services, role
        assert {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= services
        for name in ["", *EXPECTED[role]]:
            assert await health(node.address, name) == health_pb2.HealthCheckResponse.SERVING


async def test_graceful_stop_reports_not_serving(cluster):
    node = cluster.agent_nodes[2]
    await node.server.health.enter_graceful_shutdown()
    assert await health(node.address) == health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed")
async def test_metrics_exposition_passes_promtool(cluster):
    agent = AgentNode(NodeConfig(id="agent-metrics", membership=cluster.replicas, metrics_port=0, grace=0.2))
    await agent.start()
    try:
        client = cluster.client(0)
        await client.create_topic("m", ["x:int:0:10"])
        with pytest.raises(errors.InvalidArgument):
            await client.publisher().publish("m", {"x": 11})
        with pytest.raises(errors.NotFound):
            await client.get_topic("absent")
        async with grpc.aio.insecure_channel(agent.address) as ch:  # one RPC on the metered agent itself
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await pubsub_pb2_grpc.AdminStub(ch).GetTopic(pubsub_pb2.GetTopicRequest(name="absent"))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
        want = ('grpc_server_handled_total{grpc_code="NOT_FOUND",grpc_method="GetTopic",'
                'grpc_service="echelon.v1.Admin",grpc_type="unary"} 1.0')

        def scrape() -> bytes | None:
            # The server counts a call after its status is sent: the client may be first.
            body = urllib.request.urlopen(f"http://{agent.metrics_address}/metrics", timeout=5).read()
            return body if want in body.decode() else None

        body = await wait_for(scrape, what="the NOT_FOUND call to be counted")
        check = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
        assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
        text = body.decode()
        assert "echelon_membership_view_age_seconds" in text
        # Which schema check this agent runs (runtime/schema_code.py): compiled where it was built.
        compiled = 1.0 if schema_code.COMPILED == "compiled" else 0.0
        assert f"echelon_agent_compiled_hot_path {compiled}" in text
    finally:
        await agent.stop(0.2)

