"""An authenticated but hostile client (docs/security.md): it may not use another user's
subscriptions, read past its ACLs, choose limits over the operator's, nor keep a stream
its credentials no longer allow. Real agents, membership and matchers, tokens auth."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import pytest
import pytest_asyncio

from echelon.client import Durable, errors
from echelon.runtime.auth import AuthConfig
from echelon.runtime.credentials import write_tokens_file
from echelon.runtime.limits import Limits
from echelon.contract.transport import Transport
from echelon.v1 import durable_pb2 as dpb
from echelon.v1 import durable_pb2_grpc as dgrpc
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc
from tests.harness import Cluster, wait_for
from tests.integration.test_auth_jwt import Keys
from tests.integration.test_auth_jwt import start as start_jwt

SCHEMA = ["Symbol:string", "Price:float:0:1000"]


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "tokens.json"
    return path, write_tokens_file(path, {"root": ["admins"], "ann": [], "bob": [], "carol": []})


async def start(tokens, limits: Limits | None = None, agents: int = 2) -> Cluster:
    path, t = tokens
    auth = AuthConfig(mode="tokens", tokens_file=str(path), member_token=t["cluster"], limits=limits or Limits())
    return await Cluster(agents=agents, memberships=1, auth=auth).start()


async def grant(c: Cluster, root, *rules: tuple[str, str, list[str]]) -> None:
    for principal, pattern, rights in rules:
        await root.grant_acl(principal, pattern, rights)
    await wait_for(lambda: all(len(a.membership.acls) >= len(rules) for a in c.agent_nodes),
                   what="the rules reach the agents")


@pytest_asyncio.fixture
async def cluster(tokens):
    c = await start(tokens, Limits(durable_max_messages=1000, durable_max_replicas=2))
    t = tokens[1]
    root = c.client(0, t["root"])
    await root.create_topic("quotes", SCHEMA)
    await root.create_topic("secret", SCHEMA)
    await grant(c, root, ("user:ann", "quotes", ["subscribe", "publish"]),
                ("user:bob", "quotes", ["subscribe", "publish"]), ("user:ann", "secret", ["subscribe"]))
    try:
        yield c, t
    finally:
        await c.stop()


@pytest.fixture
def quick_rechecks(monkeypatch):
    """The agents (in this process) look at the tokens file and re-check open streams every
    0.1 s instead of every second: the in-band tests revoke in every round and only wait
    for the revocation to arrive; what they check does not depend on how soon it does."""
    monkeypatch.setattr("echelon.runtime.credentials.RELOAD_CHECK", 0.1)
    monkeypatch.setattr("echelon.runtime.auth.RECHECK", 0.1)


async def names(client) -> list[str]:
    return [s.name for s in await client.list_subscriptions()]


async def test_durable_names_are_scoped_and_only_the_owner_or_a_topic_admin_uses_one(cluster):
    c, t = cluster
    root, ann, bob = c.client(0, t["root"]), c.client(1, t["ann"]), c.client(0, t["bob"])
    async with ann.subscribe("quotes", name="orders", durable=Durable()):
        pass
    # Bob picks the same name: his own subscription, not Ann's.
    async with bob.subscribe("quotes", name="orders", durable=Durable()):
        pass
    assert await names(ann) == ["ann/orders"]
    assert await names(bob) == ["bob/orders"]
    assert await names(root) == ["ann/orders", "bob/orders"]  # the admin of every topic sees both
    async with ann.publisher() as pub:
        await pub.publish("quotes", {"Symbol": "a", "Price": 1.0})
    await wait_for(lambda: any(s.depth for a in c.agent_nodes for n, s in a.durables.subs.items()
                               if n == "ann/orders"), what="ann's backlog holds the event")
    # Bob, by Ann's qualified name: it does not exist for him, whatever he tries.
    for attempt in (bob.get_subscription("ann/orders"), bob.seek("ann/orders", time=0),
                    bob.delete_subscription("ann/orders"), bob.unsubscribe("ann/orders")):
        with pytest.raises(errors.NotFound) as e:
            await attempt
        assert "ann/orders" in str(e.value) and "quotes" not in str(e.value)
    with pytest.raises(errors.NotFound):
        async with bob.subscribe("quotes", name="ann/orders", durable=Durable()) as sub:
            await sub.next(timeout=5)
    # Nothing changed: Ann's backlog is still owed to her, by either form of its name.
    assert (await ann.get_subscription("orders")).backlog_messages == 1
    async with ann.subscribe("quotes", name="ann/orders", durable=Durable()) as sub:
        assert (await sub.next(timeout=10)).attributes["Symbol"] == "a"
    # The topic's admin may; then it is gone for Ann too.
    await root.delete_subscription("ann/orders")
    assert await names(ann) == []
    assert await names(bob) == ["bob/orders"]


async def test_named_and_ephemeral_subscriptions_belong_to_their_opener(cluster):
    c, t = cluster
    ann, bob = c.client(0, t["ann"]), c.client(0, t["bob"])
    agent = c.agent_nodes[0]
    async with ann.subscribe("quotes", name="feed", shared=False), ann.subscribe("quotes", shared=False):
        held = {n: s.owner for n, s in agent.subscriptions.subs.items()}
        ephemeral = next(n for n in held if n.startswith("~"))
        assert held == {"ann/feed": "ann", ephemeral: "ann"}
        for name in ("ann/feed", "feed", ephemeral):
            with pytest.raises(errors.NotFound):
                await bob.unsubscribe(name)
        assert set(agent.subscriptions.subs) == set(held)


async def test_local_durable_reads_are_for_members_only(cluster):
    c, t = cluster
    ann = c.client(0, t["ann"])
    async with ann.subscribe("quotes", name="orders", durable=Durable()):
        pass
    async with Transport(token=t["bob"]).dial(c.agent_nodes[0].address) as ch:
        stub = dgrpc.DurableStub(ch)
        for call in (stub.GetSubscription(dpb.GetSubscriptionRequest(name="ann/orders", local=True), timeout=5),
                     stub.ListSubscriptions(dpb.ListSubscriptionsRequest(local=True), timeout=5)):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_topics_are_described_only_to_who_holds_a_right_on_them(cluster):
    c, t = cluster
    ann, bob, carol = c.client(0, t["ann"]), c.client(1, t["bob"]), c.client(0, t["carol"])
    assert [x.name for x in await ann.list_topics()] == ["quotes", "secret"]
    assert [x.name for x in await bob.list_topics()] == ["quotes"]
    assert await carol.list_topics() == []
    assert (await bob.get_topic("quotes")).name == "quotes"
    for who, topic in ((bob, "secret"), (carol, "quotes"), (carol, "nothing-here")):
        with pytest.raises(errors.NotFound, match=f"topic '{topic}' does not exist"):
            await who.get_topic(topic)
    # Membership's own Admin port answers the same way.
    async with Transport(token=t["bob"]).dial(c.membership_nodes[0].address) as ch:
        listed = await pgrpc.AdminStub(ch).ListTopics(ppb.ListTopicsRequest(), timeout=5)
        assert [x.name for x in listed.topics] == ["quotes"]


async def test_operator_caps_refuse_what_a_subscriber_asks_over_them(cluster):
    c, t = cluster
    root, ann = c.client(0, t["root"]), c.client(1, t["ann"])
    for options, cap in ((Durable(max_messages=10**12), "durable_max_messages=1000"),
                         (Durable(replicas=5), "durable_max_replicas=2"),
                         (Durable(idle_seconds=2**32 - 1), "durable_max_idle_seconds"),
                         (Durable(max_bytes=10**15), "durable_max_bytes")):
        with pytest.raises(errors.InvalidArgument, match=cap):
            async with ann.subscribe("quotes", name="big", durable=options):
                pass
    # Pushing back on every publisher is the topic admin's choice.
    with pytest.raises(errors.PermissionDenied, match="REJECT_PUBLISH"):
        async with ann.subscribe("quotes", name="stop", durable=Durable(policy="reject-publish", max_messages=1)):
            pass
    assert await names(root) == []
    async with root.subscribe("quotes", name="audit", durable=Durable(policy="reject-publish", max_messages=1000)):
        pass
    async with ann.subscribe("quotes", name="ok", durable=Durable(max_messages=1000, replicas=2)):
        pass
    assert await names(root) == ["ann/ok", "root/audit"]


# -- revocation reaches open streams ---------------------------------------------------------


async def subscribed_and_publishing(c: Cluster, subscriber, publisher):
    """An open subscription stream of `subscriber` that has received one event, and an open
    publish stream of `publisher` (both on quotes)."""
    sub = subscriber.subscribe("quotes", shared=False)
    await sub.start()
    pub = publisher.publisher()
    await pub.__aenter__()
    await pub.publish("quotes", {"Symbol": "before", "Price": 1.0})
    assert (await sub.next(timeout=10)).attributes["Symbol"] == "before"
    return sub, pub


async def ended_with(sub, error) -> str:
    """The error the subscription stream ended with (it must end by itself)."""
    with pytest.raises(error) as e:
        for _ in range(200):
            await sub.next(timeout=30)
    return str(e.value)


async def test_a_removed_token_ends_its_open_streams_with_unauthenticated(tokens, cluster):
    c, t = cluster
    path, _ = tokens
    ann, bob = c.client(0, t["ann"]), c.client(1, t["bob"])
    sub, pub = await subscribed_and_publishing(c, ann, ann)
    bob_sub, bob_pub = await subscribed_and_publishing(c, bob, bob)
    rows = json.loads(path.read_text())
    rows["tokens"] = [r for r in rows["tokens"] if r["name"] != "ann"]
    path.write_text(json.dumps(rows))
    assert "no longer valid" in await ended_with(sub, errors.Unauthenticated)
    with pytest.raises(errors.Unauthenticated):
        for _ in range(100):
            await pub.publish("quotes", {"Symbol": "after", "Price": 2.0})
            await asyncio.sleep(0.1)
    # Bob's streams go on.
    await bob_pub.publish("quotes", {"Symbol": "bob", "Price": 3.0})
    assert (await bob_sub.next(timeout=10)).attributes["Symbol"] == "bob"
    await bob_sub.close()
    await bob_pub.__aexit__(None, None, None)
    await pub.__aexit__(None, None, None)
    await sub.close()


async def test_a_revoked_right_ends_the_subscription_streams_that_rely_on_it(cluster):
    c, t = cluster
    root, ann = c.client(0, t["root"]), c.client(1, t["ann"])
    sub, pub = await subscribed_and_publishing(c, ann, root)
    durable = ann.subscribe("quotes", name="orders", durable=Durable())
    await durable.start()
    await root.revoke_acl("user:ann", "quotes", ["subscribe"])
    for s in (sub, durable):
        message = await ended_with(s, errors.PermissionDenied)
        assert "user:ann lacks the 'subscribe' right on topic 'quotes'" in message
    # Her publish stream holds no subscribe right: it goes on (each publish is checked itself).
    ann_pub = ann.publisher()
    async with ann_pub:
        await ann_pub.publish("quotes", {"Symbol": "x", "Price": 1.0})
    await pub.__aexit__(None, None, None)
    await sub.close()
    await durable.close()


async def test_jwt_streams_end_at_exp_and_when_their_key_leaves_the_jwks(tmp_path):
    keys = Keys()
    path = tmp_path / "jwks.json"
    path.write_text(keys.jwks())
    c, _ = await start_jwt(tmp_path, str(path))
    try:
        root = c.client(0, keys.token("root", groups=["admins"]))
        await root.create_topic("quotes", SCHEMA)
        short = c.client(0, keys.token("ann", exp=int(time.time()) + 3, groups=["admins"]))
        ec_signed = c.client(1, keys.token("bob", "ec-1", groups=["admins"]))
        a, pa = await subscribed_and_publishing(c, short, root)
        b, pb_ = await subscribed_and_publishing(c, ec_signed, root)
        assert "expired" in await ended_with(a, errors.Unauthenticated)
        await pb_.publish("quotes", {"Symbol": "still", "Price": 1.0})
        assert (await b.next(timeout=10)).attributes["Symbol"] == "still"
        path.write_text(keys.jwks("rsa-1"))  # the provider stops publishing ec-1
        assert "unknown key" in await ended_with(b, errors.Unauthenticated)
        for x in (pa, pb_):
            await x.__aexit__(None, None, None)
        await a.close()
        await b.close()
    finally:
        await c.stop()


async def test_a_refused_stream_carries_its_status_in_band_while_the_client_keeps_writing(cluster, quick_rechecks):
    """grpc/grpc#36066: an asyncio client whose write fails as the server ends the stream
    may see INTERNAL "Internal error from Core" instead of the server's status. The agent
    sends the status in-band first (the last Delivery: code and error, no delivery id),
    which the client reads whatever the call's status becomes."""
    c, t = cluster
    root = c.client(0, t["root"])
    raw_codes = []
    for round_ in range(4):
        await root.grant_acl("user:bob", "quotes", ["subscribe"])
        await wait_for(lambda: all(any("user:bob" in k and "subscribe" in r.rights for k, r in a.membership.acls.items())
                                   for a in c.agent_nodes), what="bob's right reaches the agents")
        async with Transport(token=t["bob"]).dial(c.agent_nodes[0].address) as ch:
            call = pgrpc.PubSubStub(ch).Subscribe()
            await call.write(ppb.SubscribeRequest(open=ppb.SubscriptionOpen(topic="quotes", credits=10)))
            await call.initial_metadata()

            async def hammer():  # acks all the time, as a busy consumer writes them
                try:
                    while True:
                        await call.write(ppb.SubscribeRequest(ack=ppb.SubscriberAck(credits=1)))
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                    pass
            writer = asyncio.create_task(hammer())
            await root.revoke_acl("user:bob", "quotes", ["subscribe"])
            last = None
            try:
                async for delivery in call:
                    last = delivery
            except grpc.aio.AioRpcError:
                pass
            raw_codes.append((await call.code()).name)
            writer.cancel()
            assert last is not None and last.code == grpc.StatusCode.PERMISSION_DENIED.value[0], (round_, last)
            assert "lacks the 'subscribe' right" in last.error
    print("the call's own status in each round:", raw_codes)  # PERMISSION_DENIED, or INTERNAL (the bug)
    assert set(raw_codes) <= {"PERMISSION_DENIED", "INTERNAL"}


async def token_valid(c: Cluster, token: str) -> None:
    """Until the agents take `token` again (the tokens file is re-read within a second)."""
    from echelon.contract.errors import Unauthenticated

    def valid() -> bool:
        try:
            return all(a.server.access.tokens.identify(token) is not None for a in c.agent_nodes)
        except Unauthenticated:
            return False
    await wait_for(valid, what="the token is valid again")


ROUNDS = 6  # of the raw publish stream below: a call left without a status showed in about one in four


async def test_a_publish_stream_ended_by_a_revoked_token_carries_its_status_in_band(tokens, cluster, quick_rechecks):
    """The same for publish streams: a publisher writes all the time, so grpc/grpc#36066
    hits it most; INTERNAL would even be retried by the SDK. The last ack carries the
    stream's status (`stream_status`), and the SDK raises that code."""
    c, t = cluster
    path, _ = tokens
    original = path.read_text()
    raw_codes = []
    for round_ in range(ROUNDS):
        path.write_text(original)
        await token_valid(c, t["bob"])
        async with Transport(token=t["bob"]).dial(c.agent_nodes[0].address) as ch:
            call = pgrpc.PubSubStub(ch).Publish()
            sequence = iter(range(1, 10**9))

            async def hammer():  # one publish after another, as a busy producer writes them
                try:
                    while True:
                        await call.write(ppb.PublishRequest(topic="quotes", producer_id=f"p{round_}",
                                                            sequence=next(sequence), attributes={}))
                        await asyncio.sleep(0.001)
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                    pass
            writer = asyncio.create_task(hammer())
            first = await anext(call.__aiter__())
            assert not first.stream_status
            rows = json.loads(original)
            rows["tokens"] = [r for r in rows["tokens"] if r["name"] != "bob"]
            path.write_text(json.dumps(rows))
            last = None

            async def read_all():
                nonlocal last
                try:
                    async for ack in call:
                        last = ack
                except grpc.aio.AioRpcError:
                    pass
            try:  # bounded: a call the agent left without a status would hang here
                await asyncio.wait_for(read_all(), 20)
            except asyncio.TimeoutError:
                open_streams = [st for a in c.agent_nodes for st in a.server.access.streams
                                if st.caller.identity.name == "bob"]
                writer.cancel()
                call.cancel()
                pytest.fail(f"round {round_}: the client's call got no status in 20 s (the agent "
                            f"{'still holds' if open_streams else 'ended'} bob's stream); last ack {last}")
            raw_codes.append((await call.code()).name)
            writer.cancel()
            assert last is not None and last.stream_status, (round_, last, raw_codes, await call.details())
            assert last.code == grpc.StatusCode.UNAUTHENTICATED.value[0] and "no longer valid" in last.error, last
    print("the call's own status in each round:", raw_codes)  # UNAUTHENTICATED, or INTERNAL (the bug)
    assert set(raw_codes) <= {"UNAUTHENTICATED", "INTERNAL"}
    # The SDK raises the in-band code (never retries it as it would INTERNAL).
    path.write_text(original)
    await token_valid(c, t["bob"])
    bob = c.client(0, t["bob"])
    async with bob.publisher() as pub:
        await pub.publish("quotes", {"Symbol": "b", "Price": 1.0})
        rows = json.loads(original)
        rows["tokens"] = [r for r in rows["tokens"] if r["name"] != "bob"]
        path.write_text(json.dumps(rows))
        with pytest.raises(errors.Unauthenticated):
            for _ in range(1000):  # the agents re-read the file and re-check within a second or two
                pub.publish_nowait("quotes", {"Symbol": "b", "Price": 1.0})
                await pub.publish("quotes", {"Symbol": "b", "Price": 1.0})
                await asyncio.sleep(0.02)
    path.write_text(original)



async def test_a_topic_admin_caps_its_topic_under_the_agents_caps(cluster):
    c, t = cluster
    root, ann = c.client(0, t["root"]), c.client(1, t["ann"])
    await root.create_topic("capped", SCHEMA, durable_caps={"max_messages": 50, "replicas": 1})
    assert (await root.get_topic("capped")).durable_caps.max_messages == 50
    await grant(c, root, ("user:ann", "capped", ["subscribe"]))
    with pytest.raises(errors.InvalidArgument, match="over topic 'capped''s cap max_messages=50"):
        async with ann.subscribe("capped", name="big", durable=Durable(max_messages=51)):
            pass
    with pytest.raises(errors.InvalidArgument, match="durable_max_messages=1000"):  # the agents' cap first
        async with ann.subscribe("capped", name="big", durable=Durable(max_messages=5000)):
            pass
    async with ann.subscribe("capped", name="small", durable=Durable()):  # the defaults come under the caps
        pass
    record = await ann.get_subscription("small")
    assert (record.max_messages, record.replicas) == (50, 1)
    with pytest.raises(errors.AlreadyExists):  # the caps are part of the topic
        await root.create_topic("capped", SCHEMA, durable_caps={"max_messages": 60})
    with pytest.raises(errors.InvalidArgument, match="durable_caps"):
        await root.create_topic("other", SCHEMA, durable_caps={"nonsense": 1})


async def test_a_revoked_right_ends_only_its_subscription_of_a_shared_stream(cluster):
    c, t = cluster
    root, ann = c.client(0, t["root"]), c.client(1, t["ann"])
    quotes, secret = ann.subscribe("quotes"), ann.subscribe("secret")  # one shared stream
    await quotes.start()
    await secret.start()
    await root.revoke_acl("user:ann", "secret", ["subscribe"])
    assert "lacks the 'subscribe' right on topic 'secret'" in await ended_with(secret, errors.PermissionDenied)
    async with root.publisher() as pub:
        await pub.publish("quotes", {"Symbol": "still", "Price": 1.0})
    assert (await quotes.next(timeout=10)).attributes["Symbol"] == "still"
    await quotes.close()
    await secret.close()


# -- caps per identity -----------------------------------------------------------------------


async def test_caps_per_identity_set_by_the_admin_bound_what_one_identity_holds_and_asks(cluster):
    c, t = cluster
    root, ann, bob = c.client(0, t["root"]), c.client(1, t["ann"]), c.client(0, t["bob"])
    with pytest.raises(errors.PermissionDenied):  # the cluster admin's
        await ann.set_caps("user:ann", {"durable_subscriptions": 100})
    with pytest.raises(errors.InvalidArgument, match="nonsense"):
        await root.set_caps("user:ann", {"nonsense": 1})
    with pytest.raises(errors.InvalidArgument, match="principal"):
        await root.set_caps("ann", {"subscriptions": 1})
    assert await root.set_caps("*", {"durable_max_messages": 500}) == {"durable_max_messages": 500}
    assert await root.set_caps("user:ann", {"durable_subscriptions": 2, "durable_max_messages": 50,
                                            "subscriptions": 3}) == \
        {"subscriptions": 3, "durable_subscriptions": 2, "durable_max_messages": 50}
    assert await root.set_caps("user:ann", clear=["durable_max_messages"]) == \
        {"subscriptions": 3, "durable_subscriptions": 2}
    await root.set_caps("user:ann", {"durable_max_messages": 50})
    assert (await root.list_caps())["*"] == {"durable_max_messages": 500}
    assert [r.pattern for r in await root.list_acls()] == ["quotes", "secret", "quotes"]  # caps are not rules
    await wait_for(lambda: all(len(a.membership.acls) == 5 for a in c.agent_nodes), what="the caps reach the agents")

    # What one durable subscription asks: over Ann's cap refused naming it; left at 0, set to it.
    with pytest.raises(errors.InvalidArgument, match="durable_max_messages=50 for user:ann"):
        async with ann.subscribe("quotes", name="big", durable=Durable(max_messages=51)):
            pass
    async with ann.subscribe("quotes", name="d1", durable=Durable()):
        pass
    assert (await ann.get_subscription("d1")).max_messages == 50
    async with bob.subscribe("quotes", name="d1", durable=Durable()):  # Bob has '*''s cap: 500
        pass
    assert (await bob.get_subscription("d1")).max_messages == 500
    with pytest.raises(errors.InvalidArgument, match="durable_max_messages=500 for user:bob"):
        async with bob.subscribe("quotes", name="big", durable=Durable(max_messages=501)):
            pass

    # How many durable subscriptions Ann owns in the cluster (created through either agent).
    async with c.client(0, t["ann"]).subscribe("quotes", name="d2", durable=Durable()):
        pass
    with pytest.raises(errors.ResourceExhausted, match="owns 2 durable subscriptions.*durable_subscriptions=2"):
        async with ann.subscribe("quotes", name="d3", durable=Durable()):
            pass
    async with ann.subscribe("quotes", name="d1", durable=Durable()):  # resuming one is never refused
        pass
    await ann.delete_subscription("d2")
    async with ann.subscribe("quotes", name="d3", durable=Durable()):
        pass
    assert await names(ann) == ["ann/d1", "ann/d3"]

    # Named subscriptions outlive their stream: they count until unsubscribed.
    for n in ("n1", "n2", "n3"):
        async with ann.subscribe("quotes", name=n, shared=False):
            pass
    with pytest.raises(errors.ResourceExhausted, match="subscriptions=3"):
        async with ann.subscribe("quotes", name="n4", shared=False):
            pass
    async with ann.subscribe("quotes", name="n1", shared=False):  # resuming one
        pass
    async with bob.subscribe("quotes", name="n4", shared=False):  # Bob is not Ann
        pass
