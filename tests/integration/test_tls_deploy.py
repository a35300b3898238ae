"""What the chart's TLS needs from the services, with real servers on loopback: a
component-wide certificate (`spiffe://echelon/<role>/*`, the identity of a Secret all of a
component's pods mount) speaks for any member of its role and no other role; and the
plain-text health port answers Kubernetes' gRPC probes, which speak no TLS, while the
service port stays mTLS."""

from __future__ import annotations

import dataclasses

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from echelon.agent.server import AgentNode
from echelon.launch import free_port
from echelon.contract.transport import ANY_MEMBER, TlsDir, Transport
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc
from tests.harness import Cluster, wait_for

pytestmark = pytest.mark.timeout(60)


@pytest_asyncio.fixture
async def tls_cluster(tmp_path):
    c = Cluster(agents=1, tls=tmp_path / "tls")
    try:
        yield await c.start()
    finally:
        await c.stop()


def component_transport(c: Cluster, role: str) -> Transport:
    return Transport(TlsDir(c.authority.write(c.tls / f"component-{role}", role, ANY_MEMBER)))


async def test_a_component_certificate_joins_as_any_member_of_its_role_only(tls_cluster):
    c = tls_cluster
    replica = c.replicas[0]
    async with component_transport(c, "agent").dial(replica) as ch:
        stub = mgrpc.MembershipStub(ch)
        joined = await stub.Join(mpb.JoinRequest(member=mpb.Member(
            id="agent-from-secret", role=mpb.ROLE_AGENT, address="127.0.0.1:1")), timeout=10)
        assert joined.view.version > 0
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.Join(mpb.JoinRequest(member=mpb.Member(
                id="matcher-from-secret", role=mpb.ROLE_MATCHER, address="127.0.0.1:2")), timeout=10)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "names agent '*'" in e.value.details()
    members = c.membership_nodes[0].replica.log.snapshot().members
    assert "agent-from-secret" in members and "matcher-from-secret" not in members


async def test_the_health_port_is_plain_text_and_the_service_port_is_not(tls_cluster):
    c = tls_cluster
    base = c.agent_nodes[0]
    health_port = free_port()
    node = AgentNode(dataclasses.replace(c.config("agent-probed"), health_port=health_port))
    await node.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{health_port}") as ch:
            r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert r.status == health_pb2.HealthCheckResponse.SERVING
            # The health port carries the health service alone.
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await mgrpc.MembershipStub(ch).Join(mpb.JoinRequest(), timeout=5)
            assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        async with grpc.aio.insecure_channel(f"127.0.0.1:{node.server.port}") as ch:
            with pytest.raises(grpc.aio.AioRpcError):
                await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=3)
        await wait_for(lambda: len(base.membership.alive(mpb.ROLE_AGENT)) == 2, what="the probed agent joined")
    finally:
        await node.stop(0.5)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{health_port}") as ch:
            with pytest.raises(grpc.aio.AioRpcError):
                await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=2)


async def test_agent_to_agent_durable_calls_need_an_agent_certificate(tls_cluster):
    """A client certificate (or none, on the token port) cannot rewrite a durable
    subscription's acks or read its backlog."""
    from echelon.v1 import durable_pb2 as dpb
    from echelon.v1 import durable_pb2_grpc as dgrpc

    c = tls_cluster
    client = Transport(TlsDir(c.authority.write(c.tls / "a-client", "client", "alice")))
    async with client.dial(c.agent_nodes[0].address) as ch:
        stub = dgrpc.DurableStub(ch)
        for call, what in ((stub.Apply(dpb.DurableChange(name="s", delete=True), timeout=5), "Durable.Apply"),
                           (stub.Fetch(dpb.FetchRequest(name="s"), timeout=5), "Durable.Fetch")):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED and what in e.value.details()
