"""The redelivery contract from the protos alone (raw generated stubs, no SDK): an agent
that enforces it says so in the stream's initial metadata; a delivery left unsettled
past its ack deadline comes back with redelivery_count + 1 under a new id;
`in_progress` holds one; `term` ends one; bad policies are refused with precise codes
and change nothing; a dead letter whose publish fails is kept, counted and retried
until it goes through (agent/redelivery.py)."""

from __future__ import annotations

import asyncio
import re

import grpc
import pytest

from echelon.client import errors
from echelon.runtime.auth import AuthConfig
from echelon.runtime.credentials import write_tokens_file
from echelon.contract.transport import REDELIVERY_KEY, Transport
from echelon.contract.wire import attributes_to_pb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc
from tests.harness import Cluster, wait_for

pytestmark = pytest.mark.asyncio


def counted(cluster, name: str, labels: dict | None = None) -> float:
    return sum(s.value for a in cluster.agent_nodes for m in a.registry.collect() if m.name == name
               for s in m.samples if s.name in (name, f"{name}_total")
               and all(s.labels.get(k) == v for k, v in (labels or {}).items()))


async def publish(address: str, topic: str, values: list[int], channel=None) -> None:
    requests = [ppb.PublishRequest(topic=topic, attributes=attributes_to_pb({"n": n}), producer_id="raw",
                                   sequence=n, ack_level=ppb.ACK_LEVEL_DELIVERED) for n in values]
    async with channel or grpc.aio.insecure_channel(address) as ch:
        acks = [ack async for ack in pgrpc.PubSubStub(ch).Publish(iter(requests))]
    assert [a.code for a in acks] == [0] * len(values), acks


def n_of(d: ppb.Delivery) -> int:
    return d.event.attributes["n"].int_value


def reader(call) -> asyncio.Queue:
    """The call's Deliveries, into a queue (cancelling a pending read would cancel the RPC)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def read():
        async for d in call:
            queue.put_nowait(d)
    queue.task = asyncio.create_task(read())
    return queue


async def test_a_raw_client_sees_deadlines_in_progress_and_term(cluster):
    await cluster.client(0).create_topic("t")
    agent = cluster.agent_nodes[1].address
    async with grpc.aio.insecure_channel(agent) as ch:
        call = pgrpc.PubSubStub(ch).Subscribe()
        policy = ppb.RedeliveryPolicy(ack_deadline_ms=400)
        await call.write(ppb.SubscribeRequest(open=ppb.SubscriptionOpen(topic="t", subscription="raw", credits=10,
                                                                        redelivery=policy)))
        assert dict(await call.initial_metadata())[REDELIVERY_KEY] == "1"
        await publish(agent, "t", [1, 2, 3])
        got = reader(call)
        first = {n_of(d): d for d in [await asyncio.wait_for(got.get(), 10) for _ in range(3)]}
        assert sorted(first) == [1, 2, 3] and all(d.redelivery_count == 0 for d in first.values())
        await call.write(ppb.SubscribeRequest(term=ppb.SubscriberTerm(delivery_ids=[first[3].delivery_id],
                                                                      credits=1)))

        async def progress():  # keeps 2 alive over many deadlines
            while True:
                await call.write(ppb.SubscribeRequest(in_progress=ppb.SubscriberProgress(
                    delivery_ids=[first[2].delivery_id])))
                await asyncio.sleep(0.15)

        reporter = asyncio.create_task(progress())
        try:
            again = await asyncio.wait_for(got.get(), 10)  # 1, left alone, comes back
            assert (n_of(again), again.redelivery_count) == (1, 1)
            assert again.delivery_id not in {d.delivery_id for d in first.values()}
            # A late ack of the first copy settles nothing: the copy out now is still owed.
            await call.write(ppb.SubscribeRequest(ack=ppb.SubscriberAck(delivery_ids=[first[1].delivery_id],
                                                                        credits=1)))
            third = await asyncio.wait_for(got.get(), 10)
            assert (n_of(third), third.redelivery_count) == (1, 2)
            await call.write(ppb.SubscribeRequest(ack=ppb.SubscriberAck(delivery_ids=[again.delivery_id,
                                                                                      third.delivery_id], credits=2)))
            with pytest.raises(asyncio.TimeoutError):  # 2 held by in_progress, 3 termed, 1 acked
                await asyncio.wait_for(got.get(), 1.5)
        finally:
            reporter.cancel()
        await call.write(ppb.SubscribeRequest(ack=ppb.SubscriberAck(delivery_ids=[first[2].delivery_id], credits=1)))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(got.get(), 1.0)
        call.cancel()
    assert counted(cluster, "echelon_agent_ack_deadline_expired", {"topic": "t"}) == 2
    assert counted(cluster, "echelon_agent_terminated", {"topic": "t"}) == 1


BAD = [
    (ppb.RedeliveryPolicy(ack_deadline_ms=-5), "t", grpc.StatusCode.INVALID_ARGUMENT, "negative"),
    (ppb.RedeliveryPolicy(ack_deadline_ms=10), "t", grpc.StatusCode.INVALID_ARGUMENT, "100 to 600000"),
    (ppb.RedeliveryPolicy(ack_deadline_ms=500, no_ack_deadline=True), "t", grpc.StatusCode.INVALID_ARGUMENT,
     "one or the other"),
    (ppb.RedeliveryPolicy(max_deliveries=3), "t", grpc.StatusCode.INVALID_ARGUMENT, "needs a dead_letter_topic"),
    (ppb.RedeliveryPolicy(dead_letter_topic="t.dead"), "t", grpc.StatusCode.INVALID_ARGUMENT, "needs max_deliveries"),
    (ppb.RedeliveryPolicy(max_deliveries=5000, dead_letter_topic="t.dead"), "t", grpc.StatusCode.INVALID_ARGUMENT,
     "0 \\(no bound\\) to 1000"),
    (ppb.RedeliveryPolicy(max_deliveries=3, dead_letter_topic="t"), "t", grpc.StatusCode.INVALID_ARGUMENT,
     "own topic"),
    (ppb.RedeliveryPolicy(max_deliveries=3, dead_letter_topic="nowhere"), "t", grpc.StatusCode.NOT_FOUND,
     "'nowhere' does not exist"),
    (ppb.RedeliveryPolicy(max_deliveries=3, dead_letter_topic="narrow.dead"), "typed",
     grpc.StatusCode.INVALID_ARGUMENT, "no attribute 'dead_letter_deliveries'"),
]


@pytest.mark.parametrize("shared", [False, True])
async def test_bad_policies_are_refused_with_precise_codes_and_change_nothing(cluster, shared):
    c = cluster.client(0)
    await c.create_topic("t")
    await c.create_topic("t.dead")
    await c.create_topic("typed", ["n:int"])
    await c.create_topic("narrow.dead", ["n:int"])
    agent = cluster.agent_nodes[0]
    before = dict(agent.subs)
    for policy, topic, code, says in BAD:
        for durable in ([False] if shared else [False, True]):
            async with grpc.aio.insecure_channel(agent.address) as ch:
                call = pgrpc.PubSubStub(ch).Subscribe()
                open_ = ppb.SubscriptionOpen(topic=topic, subscription="bad", credits=1, redelivery=policy,
                                             sid=7 if shared else 0,
                                             durable=ppb.DurableOptions() if durable else None)
                await call.write(ppb.SubscribeRequest(open=open_))
                if shared:  # refused in-band, the stream goes on
                    status = await asyncio.wait_for(call.read(), 10)
                    assert (status.sid, status.code, status.opened) == (7, code.value[0], ""), status
                    assert re.search(says, status.error), status.error
                    call.cancel()
                else:
                    with pytest.raises(grpc.aio.AioRpcError) as e:
                        async for _ in call:
                            pass
                    assert e.value.code() == code, (policy, e.value.details())
                    assert re.search(says, e.value.details()), e.value.details()
    assert dict(agent.subs) == before  # nothing opened, nothing left behind
    assert not any(d.subs for d in [a.durables for a in cluster.agent_nodes])
    with pytest.raises(errors.NotFound):
        await c.get_subscription("bad")


async def test_no_publish_right_on_the_dead_letter_topic_is_permission_denied(tmp_path):
    tokens = write_tokens_file(tmp_path / "tokens.json", {"root": ["admins"], "ann": []})
    auth = AuthConfig(mode="tokens", tokens_file=str(tmp_path / "tokens.json"), member_token=tokens["cluster"])
    c = await Cluster(agents=1, auth=auth).start()
    try:
        root = c.client(0, tokens["root"])
        await root.create_topic("jobs")
        await root.create_topic("jobs.dead")
        await root.grant_acl("user:ann", "jobs", ["subscribe"])
        await wait_for(lambda: c.agent_nodes[0].membership.acls, what="the agent holds the rule")
        policy = ppb.RedeliveryPolicy(max_deliveries=3, dead_letter_topic="jobs.dead")
        before = dict(c.agent_nodes[0].subs)
        for durable in (None, ppb.DurableOptions()):
            async with Transport(token=tokens["ann"]).dial(c.agent_nodes[0].address) as ch:
                call = pgrpc.PubSubStub(ch).Subscribe()
                await call.write(ppb.SubscribeRequest(open=ppb.SubscriptionOpen(
                    topic="jobs", subscription="w", credits=1, redelivery=policy, durable=durable)))
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    async for _ in call:
                        pass
                assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value.details()
                assert "publish" in e.value.details() and "jobs.dead" in e.value.details()
        assert dict(c.agent_nodes[0].subs) == before and not c.agent_nodes[0].durables.subs
        await root.grant_acl("user:ann", "jobs.dead", ["publish"])  # with the right, the same open works
        await wait_for(lambda: len(c.agent_nodes[0].membership.acls) == 2, what="the agent holds both rules")
        ann = c.client(0, tokens["ann"])
        async with ann.subscribe("jobs", "", name="w", max_deliveries=3, dead_letter_topic="jobs.dead") as sub:
            assert sub.id
    finally:
        await c.stop()


async def test_a_failed_dead_letter_publish_is_kept_counted_and_retried(cluster):
    """The dead-letter topic is deleted after the open: publishing there fails, the
    message stays held (and counted) until the topic exists again, then goes."""
    c = cluster.client(0)
    await c.create_topic("jobs")
    await c.create_topic("jobs.dead")
    agent = cluster.agent_nodes[0]
    async with c.subscribe("jobs", "", name="w", max_deliveries=1, dead_letter_topic="jobs.dead") as sub:
        await asyncio.sleep(0.3)
        await c.delete_topic("jobs.dead")
        await wait_for(lambda: all("jobs.dead" not in a.membership.topics for a in cluster.agent_nodes),
                       what="every agent sees the topic gone")
        await publish(agent.address, "jobs", [5])
        m = await sub.next(timeout=10)
        await m.nack()  # its one delivery is spent: a dead letter, which cannot be published now
        await wait_for(lambda: counted(cluster, "echelon_agent_dead_letter_failures", {"topic": "jobs.dead"}) >= 2,
                       what="failed attempts, counted")
        assert counted(cluster, "echelon_agent_dead_letters_pending") == 1
        held = next(s for s in agent.subs.values() if s.topic == "jobs")
        assert held.depth == 1  # held within the backlog bound until it is published
        await c.create_topic("jobs.dead")
        async with c.subscribe("jobs.dead", "") as dead:
            await asyncio.sleep(0.3)
            letter = await dead.next(timeout=30)  # the next retry goes through
            assert letter.attributes == {"n": 5, "dead_letter_deliveries": 1, "dead_letter_subscription": "w"}
        assert counted(cluster, "echelon_agent_dead_letters_pending") == 0
        assert counted(cluster, "echelon_agent_dead_lettered", {"topic": "jobs"}) == 1
        with pytest.raises(errors.Timeout):
            await sub.next(timeout=1.0)


async def test_a_raw_client_past_max_deliveries_reaches_the_dead_letter_topic(cluster):
    c = cluster.client(0)
    await c.create_topic("jobs")
    await c.create_topic("jobs.dead")
    agent = cluster.agent_nodes[2].address
    async with grpc.aio.insecure_channel(agent) as ch:
        dead_call = pgrpc.PubSubStub(ch).Subscribe()
        await dead_call.write(ppb.SubscribeRequest(open=ppb.SubscriptionOpen(topic="jobs.dead", credits=10)))
        await dead_call.initial_metadata()
        call = pgrpc.PubSubStub(ch).Subscribe()
        policy = ppb.RedeliveryPolicy(max_deliveries=2, dead_letter_topic="jobs.dead")
        await call.write(ppb.SubscribeRequest(open=ppb.SubscriptionOpen(topic="jobs", subscription="rw", credits=10,
                                                                        redelivery=policy)))
        await call.initial_metadata()
        await asyncio.sleep(0.3)  # the registrations reach the matcher
        await publish(agent, "jobs", [9])
        got, letters = reader(call), reader(dead_call)
        for count in (0, 1):  # delivered twice, nacked twice
            d = await asyncio.wait_for(got.get(), 10)
            assert (n_of(d), d.redelivery_count) == (9, count)
            await call.write(ppb.SubscribeRequest(nack=ppb.SubscriberNack(delivery_ids=[d.delivery_id], credits=1)))
        letter = await asyncio.wait_for(letters.get(), 10)
        attrs = letter.event.attributes
        assert (attrs["n"].int_value, attrs["dead_letter_deliveries"].int_value,
                attrs["dead_letter_subscription"].string_value) == (9, 2, "rw")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(got.get(), 1.0)  # not a third time
        call.cancel()
        dead_call.cancel()
    assert counted(cluster, "echelon_agent_dead_lettered", {"topic": "jobs"}) == 1
