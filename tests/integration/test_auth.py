"""Client identity, per-topic ACLs and limits on real servers (runtime/auth.py, core/acl.py).

Bearer tokens without TLS, and a TLS cluster whose clients hold certificates or tokens."""

from __future__ import annotations

import asyncio
import importlib
import pkgutil

import grpc
import pytest
import pytest_asyncio

import echelon.v1
from echelon.client import Client, errors
from echelon.router.server import RouterNode
from echelon.runtime.auth import POLICY, AuthConfig
from echelon.runtime.credentials import write_tokens_file
from echelon.contract.transport import TlsDir, Transport
from echelon.runtime.limits import Limits
from echelon.v1 import common_pb2 as pb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc
from tests.harness import Cluster, wait_for

SCHEMA = ["Symbol:string", "Price:float:0:1000"]


def channel(address: str, token: str) -> grpc.aio.Channel:
    return Transport(token=token).dial(address)


def every_rpc() -> list[tuple[str, str, bool, bool]]:
    """(service, method, client streaming, server streaming) of every RPC the contract
    defines, read from the generated descriptors: a new RPC is in this list by itself."""
    out = []
    for info in pkgutil.iter_modules(echelon.v1.__path__):
        if info.name.endswith("_pb2"):
            module = importlib.import_module(f"echelon.v1.{info.name}")
            for service in module.DESCRIPTOR.services_by_name.values():
                out += [(service.full_name, m.name, m.client_streaming, m.server_streaming) for m in service.methods]
    return out


async def refuse_every_rpc(ch: grpc.aio.Channel, services, rpcs) -> int:
    """Call every RPC of `services` on `ch` with an empty request: each must end in
    UNAUTHENTICATED. Returns how many were called."""
    calls = 0
    for service, method, client_streaming, server_streaming in rpcs:
        if service not in services:
            continue
        path = f"/{service}/{method}"
        kind = {(False, False): ch.unary_unary, (False, True): ch.unary_stream,
                (True, False): ch.stream_unary, (True, True): ch.stream_stream}
        call = kind[(client_streaming, server_streaming)](path)
        # No message on a client stream: a write failing as the refused RPC ends would show as
        # INTERNAL, not the server's status (grpcio bug grpc/grpc#36066).
        request = iter([]) if client_streaming else b""
        with pytest.raises(grpc.aio.AioRpcError) as e:
            response = call(request, timeout=5)
            if server_streaming:
                async for _ in response:
                    pass
            else:
                await response
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, (path, e.value.details())
        calls += 1
    return calls


def refused_count(node, reason: str) -> float:
    return sum(s.value for m in node.registry.collect() if m.name == "echelon_refused_calls"
               for s in m.samples if s.name.endswith("_total") and s.labels["reason"] == reason)


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "tokens.json"
    t = write_tokens_file(path, {"root": ["admins"], "ann": [], "bob": ["traders"]})
    return path, t


async def start(tokens, limits: Limits | None = None, memberships: int = 1, agents: int = 2) -> Cluster:
    path, t = tokens
    auth = AuthConfig(mode="tokens", tokens_file=str(path), member_token=t["cluster"], limits=limits or Limits())
    return await Cluster(agents=agents, memberships=memberships, auth=auth).start()


@pytest_asyncio.fixture
async def secured(tokens):
    c = await start(tokens)
    try:
        yield c, tokens[1]
    finally:
        await c.stop()


def test_every_rpc_has_an_access_rule():
    rpcs = every_rpc()
    assert len(rpcs) >= 30
    missing = [f"{s}/{m}" for s, m, _, _ in rpcs if f"{s}/{m}" not in POLICY]
    assert missing == []


async def test_every_rpc_of_every_service_refuses_a_call_without_credentials(secured):
    """Each service as it runs (agent, membership, matcher, router), each RPC of it called
    with an empty request and no token (then a wrong one): UNAUTHENTICATED, before the
    handler, so nothing changes (the view keeps its members, no topic appears)."""
    c, t = secured
    router = RouterNode(c.config("router-0"))
    await router.start()
    try:
        nodes = [*c.membership_nodes, *c.matcher_nodes, c.agent_nodes[0], router]
        served = {name for n in nodes for name in n.server.service_names}
        rpcs = every_rpc()
        assert {s for s, *_ in rpcs} <= served  # every service of the contract is tried below
        before = (dict(c.membership_nodes[0].replica.log.snapshot().members),
                  c.membership_nodes[0].replica.topics.state())
        calls = 0
        for node in nodes:
            for token in ("", "not-a-token"):
                async with channel(node.address, token=token) as ch:
                    calls += await refuse_every_rpc(ch, node.server.service_names, rpcs)
        assert calls >= 2 * len(rpcs)
        assert refused_count(c.agent_nodes[0], "unauthenticated") > 0
        after = (dict(c.membership_nodes[0].replica.log.snapshot().members),
                 c.membership_nodes[0].replica.topics.state())
        assert after == before
    finally:
        await router.stop(0)


async def test_over_tls_every_agent_rpc_on_the_client_port_refuses_a_call_without_a_token(tokens, tmp_path):
    """The agent's client port (TLS, no client certificate asked): with no token or a wrong
    one every RPC of every service the agent serves is UNAUTHENTICATED. (Its service port
    and the other services' ports refuse the handshake itself: test_tls.py.)"""
    path, t = tokens
    c = Cluster(agents=0, tls=tmp_path / "tls",
                auth=AuthConfig(mode="tokens", tokens_file=str(path), member_token=t["cluster"]))
    try:
        await c.start()
        agent = await c.add_agent(0, client_port=True)
        ca_only = c.ca_only()
        rpcs = every_rpc()
        calls = 0
        for token in ("", "not-a-token"):
            async with Transport(TlsDir(ca_only, server_name=None), token=token).dial(
                    f"127.0.0.1:{agent.server.client_port}") as ch:
                calls += await refuse_every_rpc(ch, agent.server.service_names, rpcs)
        served = {s for s, *_ in rpcs if s in agent.server.service_names}
        assert served == {f"echelon.v1.{s}" for s in ("PubSub", "Admin", "Relay", "Durable")}
        assert calls == 2 * sum(1 for s, *_ in rpcs if s in served) == refused_count(agent, "unauthenticated")
    finally:
        await c.stop()


async def test_a_publisher_on_quotes_may_not_subscribe_to_it(secured):
    c, t = secured
    root, ann = c.client(0, t["root"]), c.client(1, t["ann"])
    await root.create_topic("quotes", SCHEMA)
    await root.create_topic("news", ["Symbol:string"])
    await root._admin("GrantAcl", ppb.AclRequest(rule=pb.AclRule(principal="user:ann", pattern="quotes",
                                                                 rights=["publish"])), None)
    await wait_for(lambda: all(len(a.membership.acls) == 1 for a in c.agent_nodes), what="the rule reaches agents")
    async with root.subscribe("quotes") as watcher:
        async with ann.publisher() as pub:
            await pub.publish("quotes", {"Symbol": "aapl", "Price": 10.0})
            with pytest.raises(errors.PermissionDenied) as denied:
                await pub.publish("news", {"Symbol": "aapl"})
            assert "'publish'" in str(denied.value) and "'news'" in str(denied.value)
            await pub.publish("quotes", {"Symbol": "msft", "Price": 11.0})  # the stream stayed open
        got = [(await watcher.next(timeout=10)).attributes["Symbol"] for _ in range(2)]
        assert got == ["aapl", "msft"]
    with pytest.raises(errors.PermissionDenied) as denied:
        async with ann.subscribe("quotes"):
            pass
    assert "user:ann" in str(denied.value) and "'subscribe'" in str(denied.value) and "'quotes'" in str(denied.value)
    assert refused_count(c.agent_nodes[1], "permission_denied") == 2
    # A client may not administer topics nor touch the members' RPCs.
    with pytest.raises(errors.PermissionDenied, match="'admin' right on topic 'quotes'"):
        await ann.delete_topic("quotes")
    with pytest.raises(errors.PermissionDenied, match="'admin' right on every topic"):
        await ann._admin("GrantAcl", ppb.AclRequest(rule=pb.AclRule(principal="user:ann", pattern="*",
                                                                    rights=["admin"])), None)
    assert [t.name for t in await root.list_topics()] == ["news", "quotes"]
    assert len(c.membership_nodes[0].replica.acls.live()) == 1


async def test_rules_replicate_to_every_membership_replica_and_wildcards_apply(tokens):
    c = await start(tokens, memberships=3)
    try:
        t = tokens[1]
        root, bob = c.client(0, t["root"]), c.client(1, t["bob"])
        await root.create_topic("quotes.us", SCHEMA)
        rule = pb.AclRule(principal="group:traders", pattern="quotes.*", rights=["subscribe", "publish"])
        granted = await root._admin("GrantAcl", ppb.AclRequest(rule=rule), None)
        assert list(granted.rights) == ["publish", "subscribe"]
        await wait_for(lambda: len({m.replica.digest() for m in c.membership_nodes}) == 1
                       and all(m.replica.acls.live() for m in c.membership_nodes), what="every replica holds the rule")
        for m in c.membership_nodes:  # each replica answers with the rule itself
            async with channel(m.address, token=t["root"]) as ch:
                listed = await pgrpc.AdminStub(ch).ListAcls(ppb.ListAclsRequest(), timeout=5)
                assert [(r.principal, r.pattern, list(r.rights)) for r in listed.rules] == \
                    [("group:traders", "quotes.*", ["publish", "subscribe"])]
        await wait_for(lambda: all(a.membership.acls for a in c.agent_nodes), what="agents hold the rule")
        async with bob.subscribe("quotes.us") as sub:
            async with bob.publisher() as pub:
                await pub.publish("quotes.us", {"Symbol": "x", "Price": 1.0})
            assert (await sub.next(timeout=10)).attributes["Symbol"] == "x"
        rule.rights[:] = ["subscribe"]
        left = await root._admin("RevokeAcl", ppb.AclRequest(rule=rule), None)
        assert list(left.rights) == ["publish"]
        await wait_for(lambda: all(list(a.membership.acls.values())[0].rights == ["publish"] for a in c.agent_nodes),
                       what="the revoke reaches agents")
        with pytest.raises(errors.PermissionDenied):
            async with bob.subscribe("quotes.us"):
                pass
        with pytest.raises(errors.InvalidArgument, match="pattern"):
            await root._admin("GrantAcl", ppb.AclRequest(rule=pb.AclRule(principal="user:x", pattern="a*b",
                                                                         rights=["publish"])), None)
    finally:
        await c.stop()


async def test_limits_refuse_with_resource_exhausted_and_count(tokens):
    c = await start(tokens, Limits(publish_rate=0.5, publish_burst=3, subscriptions=2), agents=1)
    try:
        t = tokens[1]
        root = c.client(0, t["root"])
        await root.create_topic("quotes", SCHEMA)
        async with root.publisher() as pub:
            for i in range(3):
                await pub.publish("quotes", {"Symbol": "s", "Price": float(i)})
            with pytest.raises(errors.ResourceExhausted, match="publish rate"):
                await pub.publish("quotes", {"Symbol": "s", "Price": 4.0})
        async with root.subscribe("quotes"), root.subscribe("quotes"):
            with pytest.raises(errors.ResourceExhausted, match="subscriptions"):
                async with root.subscribe("quotes"):
                    pass
        async with root.subscribe("quotes"):  # the closed ones were given back
            pass
        agent = c.agent_nodes[0]
        assert refused_count(agent, "publish_rate") == 1 and refused_count(agent, "subscriptions") == 1
        assert agent.server.access.quotas.subscriptions == {}
    finally:
        await c.stop()


async def test_bad_tokens_are_refused(secured):
    c, t = secured
    address = c.agent_nodes[0].address
    for metadata, why in (((("authorization", "Basic abc"),), "Bearer"), ((("authorization", "Bearer nope"),),
                                                                        "unknown token")):
        async with grpc.aio.insecure_channel(address) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await pgrpc.AdminStub(ch).ListTopics(ppb.ListTopicsRequest(), metadata=metadata, timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and why in e.value.details()
    # A client token is not a member's: it cannot join.
    async with channel(c.membership_nodes[0].address, token=t["ann"]) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await ch.unary_unary("/echelon.v1.Membership/Join")(b"", timeout=5)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED and "members only" in e.value.details()


async def test_a_revoked_token_is_refused_after_the_file_changes(secured, tokens):
    c, t = secured
    path, _ = tokens
    ann = c.client(0, t["ann"])
    await ann.list_topics()
    path.write_text(path.read_text().replace(t["ann"], "rotated-" + t["ann"]))

    async def refused():
        try:
            await ann.list_topics()
        except errors.Unauthenticated:
            return True
        return False

    await wait_for(refused, timeout=10, interval=0.2, what="the token file is re-read")
    await asyncio.sleep(0)


async def test_a_client_certificate_names_the_caller_and_wins_over_a_token(tokens, tmp_path):
    """TLS and tokens together: a `client` certificate is `user:<id>` for the ACLs; a token
    sent on the same call is not looked at (the certificate wins); token clients use the
    agent's client port, which asks no certificate."""
    path, t = tokens
    c = Cluster(agents=0, tls=tmp_path / "tls",
                auth=AuthConfig(mode="tokens", tokens_file=str(path), member_token=t["cluster"]))
    try:
        await c.start()
        agent = await c.add_agent(0, client_port=True)
        ca_only = c.ca_only()
        client_port = f"127.0.0.1:{agent.server.client_port}"
        root = Client(client_port, tls=ca_only, token=t["root"])
        c.clients.append(root)
        await root.create_topic("quotes", SCHEMA)
        await root._admin("GrantAcl", ppb.AclRequest(rule=pb.AclRule(principal="user:ann", pattern="quotes",
                                                                     rights=["publish"])), None)
        await wait_for(lambda: agent.membership.acls, what="the rule reaches the agent")
        # ann's certificate, with root's token on top: ann it is.
        ann = Client(agent.address, tls=c.tls_dir("ann", "client"), token=t["root"])
        c.clients.append(ann)
        async with ann.publisher() as pub:
            await pub.publish("quotes", {"Symbol": "aapl", "Price": 1.0})
        with pytest.raises(errors.PermissionDenied, match="user:ann lacks the 'subscribe' right on topic 'quotes'"):
            async with ann.subscribe("quotes"):
                pass
        with pytest.raises(errors.PermissionDenied, match="'admin' right on every topic"):
            await ann._admin("ListAcls", ppb.ListAclsRequest(), None)
        # On the client port a wrong token is refused; no token at all too.
        for token in ("wrong", ""):
            stranger = Client(client_port, tls=ca_only, token=token)
            c.clients.append(stranger)
            with pytest.raises(errors.Unauthenticated):
                await stranger.list_topics()
        assert refused_count(agent, "unauthenticated") == 2 and refused_count(agent, "permission_denied") == 2
    finally:
        await c.stop()


async def test_the_routing_job_sends_its_token(secured):
    """spark/cluster.py's blocking channels (no Spark here) carry the job's token: the
    view, the plan and a matcher's zones need the cluster admin."""
    from echelon.replan import cluster as job

    c, t = secured
    replica, matcher = c.replicas[0], c.matcher_nodes[0].address
    try:
        job.configure(None, t["root"])
        view = await asyncio.to_thread(job.view, replica)
        assert {m.id for m in view.members} >= {"agent-0", "matcher-0"}
        assert (await asyncio.to_thread(job.list_zones, matcher)).member == "matcher-0"
        for token, code in (("", grpc.StatusCode.UNAUTHENTICATED), (t["ann"], grpc.StatusCode.PERMISSION_DENIED)):
            job.configure(None, token)
            with pytest.raises(grpc.RpcError) as e:
                await asyncio.to_thread(job.current_plan, replica)
            assert e.value.code() == code
    finally:
        job.configure(None)


async def test_a_batch_is_checked_event_by_event_rights_per_topic_and_the_rate_in_order(tokens):
    """One publish_batch over two topics, the caller holding the publish right on one only,
    with a rate of burst 3: each event of the unpermitted topic is PERMISSION_DENIED (it
    takes no token), the permitted ones take the tokens in order until the burst is spent,
    then RESOURCE_EXHAUSTED; each refusal counted, only the accepted ones delivered."""
    c = await start(tokens, Limits(publish_rate=0.001, publish_burst=3), agents=1)
    try:
        t = tokens[1]
        root = c.client(0, t["root"])
        await root.create_topic("quotes", SCHEMA)
        await root.create_topic("news", ["Symbol:string"])
        await root._admin("GrantAcl", ppb.AclRequest(rule=pb.AclRule(principal="user:ann", pattern="quotes",
                                                                     rights=["publish"])), None)
        agent = c.agent_nodes[0]
        await wait_for(lambda: len(agent.membership.acls) == 1, what="the rule reaches the agent")
        async with root.subscribe("quotes") as watcher:
            batch = [ppb.PublishRequest(topic=topic, attributes={"Symbol": pb.Value(string_value=s)}, sequence=i + 1)
                     for i, (topic, s) in enumerate([("quotes", "a"), ("news", "b"), ("quotes", "c"), ("news", "d"),
                                                     ("quotes", "e"), ("quotes", "f")])]
            async with channel(agent.address, t["ann"]) as ch:
                call = pgrpc.PubSubStub(ch).Publish(iter([ppb.PublishRequest(producer_id="ann-1", batch=batch)]))
                (reply,) = [r async for r in call]
            denied, over = grpc.StatusCode.PERMISSION_DENIED.value[0], grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
            assert [a.code for a in reply.acks] == [0, denied, 0, denied, 0, over]
            assert "'news'" in reply.acks[1].error and "publish rate" in reply.acks[5].error
            got = [(await watcher.next(timeout=10)).attributes["Symbol"] for _ in range(3)]
            assert got == ["a", "c", "e"]
        assert refused_count(agent, "permission_denied") == 2 and refused_count(agent, "publish_rate") == 1
    finally:
        await c.stop()
