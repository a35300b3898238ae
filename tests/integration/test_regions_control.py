"""The routers' `Control` stream refuses what it must, through a real router under mTLS
(router/control.py): INVALID_ARGUMENT for a malformed message, PERMISSION_DENIED when the
certificate does not name the sender with the role its kind needs, and a refused message
(or a full state whose later part is refused) changes nothing the router holds."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from echelon.contract.transport import TlsDir, Transport
from echelon.contract.wire import filter_to_pb
from echelon.contract.filters import parse
from echelon.dataplane.control import METHOD
from echelon.router.control import RouterControl, Stream
from echelon.router.server import RouterNode
from echelon.runtime.node import NodeConfig
from echelon.v1 import common_pb2 as pb
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import router_pb2 as opb
from tests.harness import Cluster, wait_for

SUB, UNSUB = opb.CONTROL_KIND_SUB, opb.CONTROL_KIND_UNSUB
CIB_SET, CIB_CLEAR = opb.CONTROL_KIND_CIB_SET, opb.CONTROL_KIND_CIB_CLEAR
OK = grpc.StatusCode.OK
INVALID, DENIED = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED


@pytest.fixture
async def router(tmp_path):
    cluster = Cluster(agents=0, matchers=0, tls=tmp_path / "tls")
    await cluster.start()
    node = RouterNode(NodeConfig(id="router-eu-0", region="eu", membership=cluster.replicas, grace=0.5,
                                 tls_dir=cluster.tls_dir("router-eu-0")), routing="snr")
    await node.start()
    node.cluster = cluster
    try:
        yield node
    finally:
        await node.stop(0.1)
        await cluster.stop()


async def send(router, cert: str, messages, role: str = "") -> grpc.StatusCode:
    """Open a Control stream with `cert`'s certificate, write `messages`, end it."""
    channel = Transport(TlsDir(Path(router.cluster.tls_dir(cert, role)))).dial(router.address)
    try:
        call = channel.stream_unary(METHOD, request_serializer=opb.ControlMessage.SerializeToString,
                                    response_deserializer=opb.ControlReply.FromString)()
        try:
            for m in messages:
                await call.write(m)
            await call.done_writing()
        except (grpc.aio.AioRpcError, Exception):  # noqa: BLE001 - refused mid-way: the status says why
            pass
        try:
            await call
        except grpc.aio.AioRpcError as e:
            return e.code()
        return OK
    finally:
        await channel.close()


def sub(agent: str, name: str, text: str = "x < 5", topic: str = "t") -> xpb.Subscription:
    return xpb.Subscription(id=f"{agent}/{name}", agent=agent, topic=topic, filter=filter_to_pb(parse(text)))


def msg(kind, sender: str, region: str = "eu", **kw) -> opb.ControlMessage:
    return opb.ControlMessage(kind=kind, sender=sender, region=region, **kw)


async def test_malformed_control_messages_are_refused_and_change_nothing(router):
    a = "agent-eu-9"
    assert await send(router, a, [msg(SUB, a, full=True, last=True, subscriptions=[sub(a, "s1")])]) == OK
    held = router.control.subgroups.groups()
    assert len(held) == 1 and router.control.subgroups.by_agent == {a: {f"{a}/s1": held[0]}}
    bad_filter = xpb.Subscription(id=f"{a}/s3", agent=a, topic="t",
                                  filter=pb.Filter(predicates=[pb.Predicate(attribute="x")]))  # no operator
    refused = {
        "no kind": [msg(opb.CONTROL_KIND_UNSPECIFIED, a)],
        "no sender": [msg(SUB, "", subscriptions=[sub(a, "s2")])],
        "another agent's subscription": [msg(SUB, a, subscriptions=[sub("agent-eu-8", "s2")])],
        "a filter without an operator": [msg(SUB, a, subscriptions=[bad_filter])],
        "no topic": [msg(SUB, a, subscriptions=[sub(a, "s2", topic="")])],
        "another region's agent": [msg(SUB, a, region="us", subscriptions=[sub(a, "s2")])],
        "an empty id to remove": [msg(UNSUB, a, ids=[""])],
        "UNSUB with subscriptions": [msg(UNSUB, a, subscriptions=[sub(a, "s1")])],
        "`last` outside a full state": [msg(SUB, a, last=True, subscriptions=[sub(a, "s2")])],
        # A full state whose second part is refused: its first part is not applied either.
        "a full state's bad part": [msg(SUB, a, full=True, subscriptions=[sub(a, "s2", "x > 50")]),
                                    msg(SUB, a, full=True, last=True, subscriptions=[bad_filter])],
        "a change inside a full state": [msg(SUB, a, full=True, subscriptions=[sub(a, "s2")]),
                                         msg(UNSUB, a, ids=[f"{a}/s1"])],
        "two senders on one stream": [msg(SUB, a, subscriptions=[sub(a, "s1", "x < 5")]),
                                      msg(SUB, "agent-eu-7", subscriptions=[sub("agent-eu-7", "s2")])],
    }
    for why, messages in refused.items():
        assert await send(router, a, messages) == INVALID, why
        assert router.control.subgroups.groups() == held, why
        assert router.control.subgroups.by_agent == {a: {f"{a}/s1": held[0]}}, why
    # A router of this router's own region sends no summary to it.
    group = opb.Subgroup(topic="t", filter=filter_to_pb(parse("x < 5")))
    assert await send(router, "router-eu-5", [msg(CIB_SET, "router-eu-5", full=True, last=True,
                                                  complete=True, subgroups=[group])]) == INVALID
    assert await send(router, "router-us-0", [msg(CIB_CLEAR, "router-us-0", region="us", full=True,
                                                  subgroups=[group])]) == INVALID
    assert not router.control.summaries.groups


async def test_a_certificate_without_the_senders_role_or_id_is_refused(router):
    group = opb.Subgroup(topic="t", filter=filter_to_pb(parse("x < 5")))
    summary = msg(CIB_SET, "router-us-0", region="us", full=True, last=True, complete=True, subgroups=[group])
    denied = {
        "an agent's certificate sending a summary": ("agent-eu-9", "", [msg(CIB_SET, "agent-eu-9", region="us",
                                                                          subgroups=[group])]),
        "an agent's certificate, another router's id": ("agent-eu-9", "", [summary]),
        "a router's certificate, another router's id": ("router-us-1", "", [summary]),
        "a router's certificate sending an agent's subscriptions": (
            "router-us-0", "", [msg(SUB, "router-us-0", subscriptions=[sub("router-us-0", "s1")])]),
        "an agent's certificate, another agent's id": ("agent-eu-9", "", [msg(SUB, "agent-eu-8", subscriptions=[
            sub("agent-eu-8", "s1")])]),
        "a client's certificate": ("client-test", "client", [msg(SUB, "agent-eu-9", subscriptions=[
            sub("agent-eu-9", "s1")])]),
        # Another region's ADV is a host router's: an agent's certificate may not send it.
        "an agent's certificate advertising as another region's router": ("agent-eu-9", "", [msg(
            opb.CONTROL_KIND_ADV, "agent-eu-9", region="us", advertisements=[opb.Advertisement(topic="t")])]),
        "a client's certificate advertising": ("client-test", "client", [msg(
            opb.CONTROL_KIND_ADV, "agent-eu-9", advertisements=[opb.Advertisement(topic="t")])]),
    }
    for why, (cert, role, messages) in denied.items():
        assert await send(router, cert, messages, role) == DENIED, why
        assert not router.control.subgroups.groups() and not router.control.summaries.groups, why
        assert not router.control.advertised.count and not router.control.srt, why
    # The router's own certificate for its id is accepted (and the summary dropped when its stream ends).
    assert await send(router, "router-us-0", [summary]) == OK
    assert not router.control.summaries.groups


class _View:
    """A membership view with the given live agents (the router's barrier reads nothing else)."""

    def __init__(self, agents):
        self.members = {a: mpb.Member(id=a, role=mpb.ROLE_AGENT, region="eu", state=mpb.MEMBER_STATE_ALIVE)
                        for a in agents}

    def alive(self, role):
        return [m for m in self.members.values() if m.role == role]


class _PlainText:
    """A call's context without TLS: nobody is named, nothing checked (transport.require_member)."""

    def auth_context(self):
        return {}


async def test_a_summary_is_complete_only_while_every_live_agent_of_the_region_has_sent_its_full_state():
    """What the receivers route by (core/cib.py) must never miss a subscription a live agent
    holds: a router that has not heard an agent's full state says its summary is incomplete."""
    view = _View(["agent-eu-1", "agent-eu-2"])
    control = RouterControl("router-eu-0", "eu", lambda: view, lambda address: None)
    control.on_view()
    assert not control.complete
    one = msg(SUB, "agent-eu-1", full=True, last=True, subscriptions=[sub("agent-eu-1", "s")])
    control.receive(Stream(), one, _PlainText())
    assert not control.complete
    control.receive(Stream(), msg(SUB, "agent-eu-2", full=True, last=True), _PlainText())
    assert control.complete
    view.members["agent-eu-3"] = mpb.Member(id="agent-eu-3", role=mpb.ROLE_AGENT, region="eu",
                                            state=mpb.MEMBER_STATE_ALIVE)
    control.on_view()  # an agent joined: incomplete until it has sent its own
    assert not control.complete
    del view.members["agent-eu-3"]
    control.on_view()
    assert control.complete
    # An agent's advertisements go when it is DEAD (its producers with it); its subscriptions
    # stay until it has LEFT.
    ad = msg(opb.CONTROL_KIND_ADV, "agent-eu-1", full=True, last=True, advertisements=[opb.Advertisement(topic="t")])
    stream = Stream()
    control.receive(stream, one, _PlainText())
    control.receive(stream, ad, _PlainText())
    assert list(control.advertised.count) == [("t", b"")]
    view.members["agent-eu-1"].state = mpb.MEMBER_STATE_DEAD
    control.on_view()
    assert not control.advertised.count and control.subgroups.by_agent["agent-eu-1"]
    await control.close()


async def test_malformed_advertisements_are_refused_and_change_nothing(router):
    ADV, UNADV = opb.CONTROL_KIND_ADV, opb.CONTROL_KIND_UNADV
    a, r = "agent-eu-9", "router-us-0"
    ad = opb.Advertisement(topic="t")
    assert await send(router, a, [msg(ADV, a, full=True, last=True, advertisements=[ad])]) == OK
    assert await send(router, r, [msg(ADV, r, region="us", full=True, last=True, advertisements=[ad])]) == OK
    held = dict(router.control.advertised.by_agent)
    assert list(router.control.advertised.count) == [("t", b"")]
    # The far router's stream ended: its advertisements went with it (they may go stale).
    assert r not in router.control.srt
    bad_bounds = opb.Advertisement(topic="t", bounds=pb.Filter(predicates=[pb.Predicate(attribute="x")]))
    refused = {
        "no topic": (a, [msg(ADV, a, advertisements=[opb.Advertisement()])]),
        "bounds without an operator": (a, [msg(ADV, a, advertisements=[bad_bounds])]),
        "ADV with ids": (a, [msg(ADV, a, ids=["x"], advertisements=[ad])]),
        "ADV with `complete`": (a, [msg(ADV, a, full=True, last=True, complete=True)]),
        "UNADV as a full state": (a, [msg(UNADV, a, full=True, last=True, advertisements=[ad])]),
        "a full state's bad part": (a, [msg(ADV, a, full=True, advertisements=[opb.Advertisement(topic="u")]),
                                        msg(ADV, a, full=True, last=True, advertisements=[bad_bounds])]),
        "a router's UNADV inside its full state": (r, [msg(ADV, r, region="us", full=True, advertisements=[]),
                                                       msg(UNADV, r, region="us", advertisements=[ad])]),
        "SUB carrying advertisements": (a, [msg(SUB, a, advertisements=[ad])]),
    }
    for why, (cert, messages) in refused.items():
        assert await send(router, cert, messages) == INVALID, why
        assert router.control.advertised.by_agent == held, why
    # A router of this region may not advertise to it as a host of another (an agent's role).
    assert await send(router, "router-eu-5", [msg(ADV, "router-eu-5", full=True, last=True,
                                                  advertisements=[ad])]) == DENIED
    assert router.control.advertised.by_agent == held


async def test_a_refused_first_message_does_not_drop_what_the_senders_live_stream_holds(router):
    # The newest stream of a sender is its current one, and its end drops a router's
    # summary; a stream whose first message is refused must not become it.
    group = opb.Subgroup(topic="t", filter=filter_to_pb(parse("x < 5")))
    channel = Transport(TlsDir(Path(router.cluster.tls_dir("router-us-0", "")))).dial(router.address)
    live = channel.stream_unary(METHOD, request_serializer=opb.ControlMessage.SerializeToString,
                                response_deserializer=opb.ControlReply.FromString)()
    try:
        await live.write(msg(CIB_SET, "router-us-0", region="us", full=True, last=True, complete=True,
                             subgroups=[group]))
        await wait_for(lambda: router.control.summaries.groups, what="the live stream's summary")
        held = dict(router.control.summaries.groups)
        bad = msg(CIB_SET, "router-us-0", region="us", subgroups=[opb.Subgroup(topic="")])  # no topic
        assert await send(router, "router-us-0", [bad]) == INVALID
        assert router.control.summaries.groups == held
    finally:
        live.cancel()
        await channel.close()
