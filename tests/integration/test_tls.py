"""mTLS between services (docs/security.md), with real servers on loopback: a TLS cluster
delivers; a forged member (a certificate from the cluster's CA naming another member or
role) cannot join, heartbeat, leave or relay, and changes nothing; plain text and
certificate-less callers are refused; a rotated certificate is served to new handshakes
while an open stream keeps flowing."""

from __future__ import annotations

import asyncio
import socket
import ssl

import grpc
import pytest
import pytest_asyncio
from cryptography import x509
from prometheus_client import generate_latest

from echelon.runtime.certs import not_after
from echelon.contract.transport import MEMBER_KEY, TlsDir, Transport, peer_certificate_identity, spiffe_id
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import matcher_pb2_grpc as xgrpc
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc
from echelon.v1 import relay_pb2 as rpb
from echelon.v1 import relay_pb2_grpc as rgrpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tests.harness import Cluster, wait_for

pytestmark = pytest.mark.timeout(60)


@pytest_asyncio.fixture
async def tls_cluster(tmp_path):
    """One membership replica, one matcher, one agent, every port mTLS."""
    c = Cluster(agents=1, tls=tmp_path / "tls")
    try:
        yield await c.start()
    finally:
        await c.stop()


def expiry(node) -> float:
    text = generate_latest(node.registry).decode()
    line = next(x for x in text.splitlines() if x.startswith("echelon_tls_certificate_expiry_timestamp_seconds "))
    return float(line.split()[1])


def view_of(c: Cluster):
    log = c.membership_nodes[0].replica.log
    return log.version, {i: (r.role, r.state.value, r.incarnation) for i, r in log.snapshot().members.items()}


def forged(c: Cluster, role: str, name: str) -> Transport:
    """A valid certificate from the cluster's CA, naming `role`/`name`."""
    return Transport(TlsDir(c.authority.write(c.tls / f"forged-{role}-{name}", role, name)))


async def expect(code: grpc.StatusCode, call, *needles: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    assert e.value.code() == code, (e.value.code(), e.value.details())
    for n in needles:
        assert n in e.value.details(), e.value.details()
    return e.value.details()


async def test_a_tls_cluster_delivers_and_names_its_members(tls_cluster):
    c = tls_cluster
    await c.add_agent(1)
    await wait_for(lambda: len(c.agent_nodes[0].membership.alive(mpb.ROLE_AGENT)) == 2, what="both agents")
    pub, sub = c.client(0), c.client(1)
    await pub.create_topic("quotes", ["Symbol:string", "High:float:0:500"])
    got = []
    async with sub.subscribe("quotes", "High > 10") as s:
        async with pub.publisher() as p:
            for high in (5.0, 50.0, 60.0):
                await p.publish("quotes", {"Symbol": "X", "High": high})
        for _ in range(2):
            got.append((await s.next(timeout=10)).attributes["High"])
    assert sorted(got) == [50.0, 60.0]
    # Every service exports when its certificate expires.
    for node in (*c.agent_nodes, *c.matcher_nodes, *c.membership_nodes):
        assert expiry(node) == not_after((c.tls / node.config.id / "tls.crt").read_bytes())


async def test_a_forged_member_cannot_join_beat_leave_or_relay(tls_cluster):
    c = tls_cluster
    replica = c.replicas[0]
    agent = c.agent_nodes[0]
    before = view_of(c)
    victim = agent.config.id  # agent-0, in the view
    member = mpb.Member(id=victim, role=mpb.ROLE_AGENT, address="127.0.0.1:1", incarnation=10**15)
    # Right role, wrong id; right id, wrong role.
    for role, name in (("agent", "intruder"), ("matcher", victim)):
        async with forged(c, role, name).dial(replica) as ch:
            stub = mgrpc.MembershipStub(ch)
            await expect(grpc.StatusCode.PERMISSION_DENIED, stub.Join(mpb.JoinRequest(member=member), timeout=5),
                         "Join", f"names {role} '{name}'", f"agent '{victim}'")

            async def beats():
                yield mpb.Beat(member_id=victim, incarnation=10**15)
                await asyncio.sleep(5)

            await expect(grpc.StatusCode.PERMISSION_DENIED, stub.Heartbeat(beats(), timeout=5).read(), "Heartbeat")
            await expect(grpc.StatusCode.PERMISSION_DENIED,
                         stub.Leave(mpb.LeaveRequest(member_id=victim, incarnation=10**15), timeout=5), "Leave")
            await expect(grpc.StatusCode.PERMISSION_DENIED,
                         mgrpc.ReplicationStub(ch).Pull(mpb.PullRequest(), timeout=5), "Replication")
        async with forged(c, role, name).dial(agent.address) as ch:
            async def frames():
                yield rpb.RelayFrame(seq=1)
                await asyncio.sleep(5)

            call = rgrpc.RelayStub(ch).Stream(frames(), metadata=((MEMBER_KEY, "agent-9"),), timeout=5)
            await expect(grpc.StatusCode.PERMISSION_DENIED, call.read(), "Relay.Stream", "'agent-9'")
        # ... nor pose as a matcher to a matcher, nor register subscriptions for another agent.
        matcher = c.matcher_nodes[0]
        async with forged(c, role, name).dial(matcher.address) as ch:
            stub = xgrpc.MatcherStub(ch)
            await expect(grpc.StatusCode.PERMISSION_DENIED,
                         stub.Sync(xpb.SyncRequest(member="matcher-0", incarnation=1, seq=1), timeout=5), "Sync")
            if role == "agent":  # an agent's certificate, another agent's subscription
                sub = xpb.Subscription(id="s1", agent=victim, topic="t")
                await expect(grpc.StatusCode.PERMISSION_DENIED,
                             stub.Register(xpb.RegisterRequest(subscriptions=[sub]), timeout=5),
                             "Register of subscription 's1'", f"agent '{victim}'")
    assert view_of(c) == before, "a refused call changed the view"
    assert len(matcher.tier.store) == 0


async def test_plain_text_and_certificate_less_callers_are_refused(tls_cluster, tmp_path):
    c = tls_cluster
    ca_only = c.ca_only()
    for address in (c.replicas[0], c.agent_nodes[0].address, c.matcher_nodes[0].address):
        async with grpc.aio.insecure_channel(address) as ch:
            await expect(grpc.StatusCode.UNAVAILABLE,
                         health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=3))
        # TLS without a client certificate: the service ports require one.
        async with Transport(TlsDir(ca_only)).dial(address) as ch:
            await expect(grpc.StatusCode.UNAVAILABLE,
                         health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=3))


async def test_the_client_port_asks_no_certificate_and_refuses_service_rpcs(tmp_path):
    c = Cluster(agents=0, tls=tmp_path / "tls")
    try:
        await c.start()
        agent = await c.add_agent(0, client_port=True)
        ca_only = c.ca_only()
        address = f"127.0.0.1:{agent.server.client_port}"
        async with Transport(TlsDir(ca_only)).dial(address) as ch:
            r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert r.status == health_pb2.HealthCheckResponse.SERVING

            async def frames():
                yield rpb.RelayFrame(seq=1)
                await asyncio.sleep(5)

            call = rgrpc.RelayStub(ch).Stream(frames(), metadata=((MEMBER_KEY, "agent-1"),), timeout=5)
            await expect(grpc.StatusCode.UNAUTHENTICATED, call.read(), "Relay.Stream needs a member certificate")
    finally:
        await c.stop()


def served_serial(address: str, tls_dir) -> int:
    """The serial of the certificate a fresh TLS handshake with `address` is shown (the
    Python ssl module, since grpc does not show a client the server's certificate)."""
    ctx = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
    ctx.check_hostname = False
    ctx.load_cert_chain(tls_dir / "tls.crt", tls_dir / "tls.key")
    ctx.set_alpn_protocols(["h2"])
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as raw, ctx.wrap_socket(raw) as s:
        return x509.load_der_x509_certificate(s.getpeercert(binary_form=True)).serial_number


async def test_a_rotated_certificate_is_served_to_new_handshakes_and_open_streams_flow(tls_cluster):
    c = tls_cluster
    agent = c.agent_nodes[0]
    agent_dir, client_dir = c.tls / "agent-0", c.tls / "client-test"
    client = c.client(0)
    await client.create_topic("quotes", ["High:float:0:500"])
    old = await asyncio.to_thread(served_serial, agent.address, client_dir)
    assert old == x509.load_pem_x509_certificate((agent_dir / "tls.crt").read_bytes()).serial_number
    async with client.subscribe("quotes", "High > 10") as s, client.publisher() as p:
        await p.publish("quotes", {"High": 20.0})
        assert (await s.next(timeout=10)).attributes["High"] == 20.0
        c.authority.write(agent_dir, "agent", "agent-0", days=3)  # cert-manager renews: same name, new key
        new = x509.load_pem_x509_certificate((agent_dir / "tls.crt").read_bytes())
        assert new.serial_number != old
        assert await asyncio.to_thread(served_serial, agent.address, client_dir) == new.serial_number
        # The stream opened before the rotation still flows, and a new client connects.
        await p.publish("quotes", {"High": 30.0})
        assert (await s.next(timeout=10)).attributes["High"] == 30.0
        other = c.client(0)
        assert [t.name for t in await other.list_topics()] == ["quotes"]
    assert expiry(agent) == new.not_valid_after_utc.timestamp()


def test_the_naming_scheme_round_trips():
    assert spiffe_id("agent", "a b/c") == "spiffe://echelon/agent/a%20b%2Fc"

    class Ctx:
        def __init__(self, uris):
            self.uris = uris

        def auth_context(self):
            return {"peer_uri": [u.encode() for u in self.uris]}

    assert peer_certificate_identity(Ctx([spiffe_id("matcher", "m/1")])) == ("matcher", "m/1")
    assert peer_certificate_identity(Ctx([])) is None
    assert peer_certificate_identity(Ctx(["spiffe://other/agent/a"])) is None
    assert peer_certificate_identity(Ctx([spiffe_id("agent", "a"), spiffe_id("agent", "b")])) is None
    assert peer_certificate_identity(Ctx(["spiffe://echelon/wizard/a"])) is None


async def test_the_routing_job_reads_the_cluster_over_mtls(tls_cluster):
    """spark/cluster.py's blocking calls (no Spark here) with the job's `replan` certificate."""
    from echelon.replan import cluster as job

    c = tls_cluster
    replica, matcher = c.replicas[0], c.matcher_nodes[0].address
    try:
        job.configure(c.authority.write(c.tls / "replan", "replan", "replan"))
        view = await asyncio.to_thread(job.view, replica)
        assert {m.id for m in view.members} >= {"agent-0", "matcher-0"}
        assert (await asyncio.to_thread(job.list_zones, matcher)).member == "matcher-0"
        job.configure(None)  # plain text to a TLS cluster: refused
        with pytest.raises(grpc.RpcError) as e:
            await asyncio.to_thread(job.current_plan, replica)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        job.configure(None)
