"""Subscription names in their owner's scope, who may use one (agent/ownership.py), the
operator's caps on durable options (agent/durable/caps.py), the re-check of open streams
(Access.recheck) and the refusal log's rate (Access.note), on a real Access with real ACLs."""

import json
import logging
import os

import pytest
from prometheus_client import CollectorRegistry

from echelon.agent.durable.caps import check_options
from echelon.agent.ownership import claim, may_use, scoped
from echelon.core.acl import Acl, Identity, Rule
from echelon.runtime.auth import CALLER, Access, AuthConfig, Caller, OpenStream
from echelon.contract.errors import InvalidArgument, NotFound, PermissionDenied, Unauthenticated
from echelon.runtime.limits import Limits, parse_limits
from echelon.v1 import pubsub_pb2 as ppb

RULES = Acl([Rule("user:ann", "quotes", frozenset({"subscribe"})), Rule("user:bob", "quotes", frozenset({"admin"}))])


@pytest.fixture
def access(tmp_path):
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [{"token": "t-ann", "name": "ann"}, {"token": "t-bob", "name": "bob"}]}))
    a = Access(AuthConfig(mode="tokens", tokens_file=str(path),
                          limits=Limits(durable_max_messages=10, durable_max_replicas=2)), CollectorRegistry())
    a.acl = lambda: RULES
    return a


def as_(name: str, token: str = ""):
    return CALLER.set(Caller(Identity(name), f"user:{name}", "ipv4:1.2.3.4:5", True, token))


def test_names_are_scoped_to_their_caller_and_used_by_the_owner_or_a_topic_admin(access):
    token = as_("ann")
    try:
        assert scoped(access, "orders") == "ann/orders"
        assert scoped(access, "ann/orders") == "ann/orders"
        assert scoped(access, "") == ""
        for bad in ("~1", "x/", "a" * 201):
            with pytest.raises(InvalidArgument):
                scoped(access, bad)
        assert may_use(access, "ann/orders", "quotes")
        assert not may_use(access, "bob/orders", "quotes")
        open_ = ppb.SubscriptionOpen(topic="quotes", subscription="bob/orders")
        with pytest.raises(NotFound, match="'bob/orders' does not exist"):
            claim(access, open_)
        assert open_.subscription == "bob/orders"  # unchanged by a refused claim
    finally:
        CALLER.reset(token)
    token = as_("bob")  # the topic's admin
    try:
        assert may_use(access, "ann/orders", "quotes") and not may_use(access, "ann/orders", "news")
    finally:
        CALLER.reset(token)
    # Members (an agent relaying) and auth off: names as they are.
    token = CALLER.set(Caller(Identity("agent-1", member=True), "m", "p", False))
    try:
        assert scoped(access, "ann/orders") == "ann/orders" and may_use(access, "x/y", "news")
    finally:
        CALLER.reset(token)
    off = Access(AuthConfig(), CollectorRegistry())
    token = as_("anonymous")
    try:
        assert scoped(off, "orders") == "orders"
        with pytest.raises(InvalidArgument):
            scoped(off, "a/b")
    finally:
        CALLER.reset(token)


def test_caps_refuse_over_the_operator_and_reject_publish_needs_topic_admin(access):
    def open_(**o):
        return ppb.SubscriptionOpen(topic="quotes", subscription="s", durable=ppb.DurableOptions(**o))

    token = as_("ann")
    try:
        check_options(access, open_(max_messages=10, replicas=2))
        with pytest.raises(InvalidArgument, match="max_messages=11 is over the cap durable_max_messages=10 for user:ann"):
            check_options(access, open_(max_messages=11))
        with pytest.raises(InvalidArgument, match="durable_max_replicas=2"):
            check_options(access, open_(replicas=3))
        with pytest.raises(PermissionDenied, match="REJECT_PUBLISH"):
            check_options(access, open_(policy=ppb.BACKLOG_POLICY_REJECT_PUBLISH))
    finally:
        CALLER.reset(token)
    token = as_("bob")
    try:
        check_options(access, open_(policy=ppb.BACKLOG_POLICY_REJECT_PUBLISH))
    finally:
        CALLER.reset(token)
    assert parse_limits("durable_max_bytes=5").durable_max_bytes == 5
    with pytest.raises(ValueError):
        Limits(durable_max_idle_seconds=0)


async def test_recheck_ends_the_streams_whose_token_or_right_is_gone(access, tmp_path, monkeypatch):
    monkeypatch.setattr("echelon.runtime.credentials.RELOAD_CHECK", 0.0)

    class Task:
        cancelled = False

        def cancel(self):
            self.cancelled = True

    ann = OpenStream(Caller(Identity("ann"), "user:ann", "p", True, "t-ann"), "echelon.v1.PubSub", Task(),
                     [("subscribe", "quotes", None)])
    bob = OpenStream(Caller(Identity("bob"), "user:bob", "p", True, "t-bob"), "echelon.v1.PubSub", Task(),
                     [("subscribe", "quotes", None)])
    access.streams |= {ann, bob}
    assert access.recheck() == 0
    rules = Acl([Rule("user:bob", "quotes", frozenset({"admin"}))])  # ann's right revoked
    access.acl = lambda: rules
    assert access.recheck() == 1
    assert isinstance(ann.revoked, PermissionDenied) and ann.task.cancelled and not bob.task.cancelled
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [{"token": "t-ann", "name": "ann"}]}))  # bob's token removed
    os.utime(path, ns=(1, 1))
    assert access.recheck() == 1
    assert isinstance(bob.revoked, Unauthenticated) and bob.task.cancelled


def test_refusals_are_logged_once_per_host_and_reason_per_interval(access, caplog):
    caplog.set_level(logging.WARNING, "echelon.auth")
    for port in range(50):  # one host, many connections
        access.note(f"ipv4:10.0.0.1:{port}", "unauthenticated", "no credentials", now=100.0 + port / 10)
    access.note("ipv4:10.0.0.1:9", "malformed", "not a valid request", now=101.0)
    access.note("ipv4:10.0.0.2:9", "unauthenticated", "no credentials", now=101.0)
    access.note("ipv4:10.0.0.1:9", "unauthenticated", "no credentials", now=161.0)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4 and all("Traceback" not in x and r.exc_info is None for x, r in zip(lines, caplog.records))


def test_caps_per_identity_resolve_user_then_highest_group_then_everyone_then_the_agent(access):
    from echelon.core.acl import AclError, caps_for, make_caps
    from echelon.runtime.auth import acl_cache
    from echelon.runtime.limits import parse_identity_caps
    from echelon.v1 import common_pb2 as pb

    caps = {"*": {"subscriptions": 5, "durable_subscriptions": 9}, "group:a": {"subscriptions": 7},
            "group:b": {"subscriptions": 8, "durable_max_messages": 3}, "user:ann": {"subscriptions": 2}}
    assert caps_for(caps, Identity("ann", frozenset({"a", "b"}))) == \
        {"subscriptions": 2, "durable_subscriptions": 9, "durable_max_messages": 3}
    assert caps_for(caps, Identity("bob", frozenset({"a", "b"}))) == \
        {"subscriptions": 8, "durable_subscriptions": 9, "durable_max_messages": 3}
    assert caps_for(caps, Identity("carol")) == {"subscriptions": 5, "durable_subscriptions": 9}
    assert caps_for({}, Identity("carol")) == {}
    for principal, bad in (("ann", {"subscriptions": 1}), ("user:ann", {"nope": 1}),
                           ("user:ann", {"subscriptions": -1}), ("user:ann", {"subscriptions": "1"})):
        with pytest.raises(AclError):
            make_caps(principal, bad)
    assert make_caps("user:ann", {"subscriptions": 0, "durable_subscriptions": 4}) == {"durable_subscriptions": 4}
    assert parse_identity_caps('{"user:ann": {"durable_max_messages": 1e6}}') == \
        {"user:ann": {"durable_max_messages": 1000000}}
    for text in ('[1]', '{"user:ann": 3}', '{"user:ann": {"x": 1}}', "{"):
        with pytest.raises(ValueError, match="identity caps"):
            parse_identity_caps(text)

    # The view's entries: the caps entry is not a rule; the admin's caps win over the
    # configuration's per principal and field; unset, the agent's --limits.
    entries = {"r": pb.AclRule(principal="user:ann", pattern="quotes", rights=["subscribe"]),
               "c": pb.AclRule(principal="user:ann", pattern="+caps", caps=pb.IdentityCaps(durable_max_messages=4))}
    access.acl = acl_cache(lambda: 1, lambda: entries)
    assert [r.pattern for r in access.acl().rules] == ["quotes"]
    access.config.identity_caps.update({"user:ann": {"durable_max_messages": 6, "durable_max_replicas": 1}})
    ann = Identity("ann")
    assert [access.limit(ann, f) for f in ("durable_max_messages", "durable_max_replicas", "durable_max_bytes")] == \
        [4, 1, access.config.limits.durable_max_bytes]
    assert access.limit(Identity("bob"), "durable_max_messages") == 10
    # An option left at 0 whose default is over the identity's cap is set to it (the holder
    # that creates it sees an agent); over the cap refused naming it.
    token = as_("ann")
    try:
        from echelon.agent.durable.durables import Defaults
        o = ppb.SubscriptionOpen(topic="quotes", subscription="s", durable=ppb.DurableOptions())
        check_options(access, o, None, Defaults())
        assert (o.durable.max_messages, o.durable.replicas, o.durable.max_bytes) == (4, 1, 0)
        with pytest.raises(InvalidArgument, match="durable_max_messages=4 for user:ann"):
            check_options(access, ppb.SubscriptionOpen(topic="quotes", durable=ppb.DurableOptions(max_messages=5)))
    finally:
        CALLER.reset(token)
