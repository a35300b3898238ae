"""Membership keeps topics, ACLs (and the caps per identity beside them) and the routing plan on disk (membership/store.py).

Real processes (`python -m echelon membership --data-dir ...` through echelon.launch):
three replicas, topics created, one deleted, ACL rules granted and one revoked, a plan
pushed; then every replica is killed at once (SIGKILL: no drain, no peer left to pull
from) and started again. Each replica must serve the same topics, rules and plan as
before, deletes included; in-process checks of the store's round trip are below.
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from echelon import launch
from echelon.core.replication import Entry, Stamp
from echelon.membership.store import StateStore
from echelon.v1 import common_pb2 as pb
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import pubsub_pb2 as ppb
from tests.harness import wait_for
from tests.integration.test_membership import admin, control, create_quotes, plan


async def state(address: str) -> tuple[list[str], list[tuple], int, mpb.RoutingPlan]:
    topics = await admin(address, "ListTopics", ppb.ListTopicsRequest())
    acls = await admin(address, "ListAcls", ppb.ListAclsRequest())
    caps = await admin(address, "ListCaps", ppb.ListAclsRequest())
    got = await control(address, "GetPlan", mpb.GetPlanRequest())
    return ([t.name for t in topics.topics], sorted((r.principal, r.pattern, tuple(r.rights)) for r in acls.rules),
            got.version, got, [(r.principal, r.caps.durable_subscriptions, r.caps.subscriptions) for r in caps.rules])


@pytest.mark.timeout(240)
async def test_a_full_restart_of_every_replica_keeps_topics_acls_and_the_plan(tmp_path):
    c = launch.Cluster(agents=1, matchers=1, memberships=3, placement=launch.Loopback(0), log_dir=tmp_path)
    try:
        await c.start()
        r = c.replicas
        for name in ("orders", "doomed"):
            await admin(r[0], "CreateTopic", ppb.CreateTopicRequest(name=name))
        await create_quotes(r[0])
        await admin(r[0], "DeleteTopic", ppb.DeleteTopicRequest(name="doomed"))
        for principal, pattern, rights in (("user:alice", "orders", ["publish"]), ("user:bob", "quotes", ["subscribe"]),
                                           ("user:carol", "*", ["admin"])):
            await admin(r[0], "GrantAcl", ppb.AclRequest(rule=pb.AclRule(principal=principal, pattern=pattern,
                                                                         rights=rights)))
        await admin(r[0], "RevokeAcl", ppb.AclRequest(rule=pb.AclRule(principal="user:carol", pattern="*",
                                                                      rights=["admin"])))
        await control(r[0], "PushPlan", plan(4))
        for principal in ("user:alice", "group:ops"):  # caps per identity, kept beside the rules
            await admin(r[0], "SetCaps", ppb.CapsRequest(principal=principal, caps=pb.IdentityCaps(
                durable_subscriptions=7, subscriptions=3)))
        await admin(r[0], "SetCaps", ppb.CapsRequest(principal="group:ops", clear=["durable_subscriptions",
                                                                                   "subscriptions"]))
        before = await state(r[0])
        assert before[4] == [("user:alice", 7, 3)]
        assert before[:3] == (["orders", "quotes"], [("user:alice", "orders", ("publish",)),
                                                     ("user:bob", "quotes", ("subscribe",))], 4)

        async def replicated() -> bool:  # pushes, or anti-entropy, reach every replica
            for p in c.by_role("membership"):
                if (await state(p.address))[:3] != before[:3] or (await state(p.address))[4] != before[4]:
                    return False
            return True

        await wait_for(replicated, 30, what="every replica holds every write")

        for p in c.by_role("membership"):
            c.signal(p.id, signal.SIGKILL)
        assert not any(p.running() for p in c.by_role("membership"))
        await asyncio.gather(*(c.launch(p) for p in c.by_role("membership")))

        for p in c.by_role("membership"):
            after = await state(p.address)
            assert after[:3] == before[:3] and after[4] == before[4], p.id
            assert after[3].zones == before[3].zones and after[3].origin == "test"
            assert (c.data_dir(p.id) / "membership.sqlite3").exists()
        # The cluster goes on: a new topic after the restart is stamped above the kept ones.
        await admin(r[1], "CreateTopic", ppb.CreateTopicRequest(name="after"))
        await admin(r[1], "CreateTopic", ppb.CreateTopicRequest(name="doomed"))
        assert (await state(r[1]))[0] == ["after", "doomed", "orders", "quotes"]
    finally:
        c.stop()


def test_the_store_round_trips_entries_tombstones_the_plan_and_meta(tmp_path):
    s = StateStore(tmp_path)
    s.save("topic", "a", Entry(Stamp(3, "m-0@1"), pb.Topic(name="a")))
    s.save("topic", "b", Entry(Stamp(5, "m-1@2"), None, deleted=True))
    s.save("acl", "k", Entry(Stamp(2, "m-0@1"), pb.AclRule(principal="p", pattern="*", rights=["publish"])))
    s.save("plan", "", Entry(Stamp(7, "m-2@3"), mpb.RoutingPlan(version=7, origin="job")))
    s.save("topic", "a", Entry(Stamp(6, "m-0@1"), pb.Topic(name="a", retention_seconds=9)))  # replaces
    s.save_meta("replan_last_success", 123.5)
    s.close()
    topics, got_plan, acls, meta = StateStore(tmp_path).load()
    assert topics == {"a": Entry(Stamp(6, "m-0@1"), pb.Topic(name="a", retention_seconds=9)),
                      "b": Entry(Stamp(5, "m-1@2"), None, deleted=True)}
    assert got_plan == Entry(Stamp(7, "m-2@3"), mpb.RoutingPlan(version=7, origin="job"))
    assert acls == {"k": Entry(Stamp(2, "m-0@1"), pb.AclRule(principal="p", pattern="*", rights=["publish"]))}
    assert meta == {"replan_last_success": 123.5}
    with pytest.raises(ValueError):
        StateStore(tmp_path).save("view", "x", Entry(Stamp(1, "o")))
