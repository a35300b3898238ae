"""Pipelined matching (agent/dispatch.py, agent/matching.py, the matcher's `Match`
stream) through real servers: several batches in flight on one stream, matched at once
and answered in order, so the events reach a subscriber in each key's order; a stream that
fails with batches outstanding sends all of them again, in order, to the next matcher.
The oracle is the publisher's sequence per ordering key, checked at the subscriber."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from echelon.contract.errors import Unavailable
from echelon.contract.wire import attributes_to_pb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc
from tests.harness import Cluster, wait_for

N = 60
KEYS = ("a", "b", "c")


class Gate:
    """In front of every matcher's entry work: holds each agent batch while `holding`,
    then lets it through or fails it (UNAVAILABLE: the agent fails over)."""

    def __init__(self, nodes):
        self.holding, self.fail = True, False
        self.held: list[asyncio.Event] = []
        self.order: list[int] = []  # the held batches in the order their matching finished
        for node in nodes:
            node.matcher._entry = self.wrap(node.matcher._entry)

    def wrap(self, real):
        async def entry(batch):
            if self.holding:
                release = asyncio.Event()
                self.held.append(release)
                await release.wait()
                if self.fail:
                    raise Unavailable("the test fails this matcher's stream")
                response = await real(batch)
                self.order.append(self.held.index(release))
                return response
            return await real(batch)
        return entry


def request(k: int) -> ppb.PublishRequest:
    key = KEYS[k % len(KEYS)]
    return ppb.PublishRequest(topic="t", attributes=attributes_to_pb({"n": k}), payload=k.to_bytes(4, "little"),
                              ordering_key=key, producer_id="p", sequence=k + 1)


async def publish_and_receive(c: Cluster, gate: Gate, held: int, release) -> None:
    """Publish N events on one stream while `gate` holds the matchers, the first `held`
    one at a time (each goes in a batch of its own once those before it are late); once
    `held` batches wait there at once, `release` them; every ack OK in order, and the
    subscriber gets every event in its key's order."""
    await c.client(0).create_topic("t")
    sub = c.client(1).subscribe("t", "", name="all", max_outstanding=10 * N)
    await sub.start()
    got: list[int] = []

    async def read():
        async for m in sub:
            got.append(int.from_bytes(m.payload, "little"))
            await m.ack()

    reader = asyncio.create_task(read())
    try:
        async def requests():  # one event per batch until `held` wait at the matcher, then the rest
            for k in range(N):
                await wait_for(lambda: len(gate.held) >= min(k, held), 10, what=f"{min(k, held)} batches held")
                yield request(k)

        async with grpc.aio.insecure_channel(c.agent_nodes[0].address) as ch:
            call = pgrpc.PubSubStub(ch).Publish(requests())
            await wait_for(lambda: len(gate.held) >= held, 10, what=f"{held} batches in flight at once")
            gate.holding = False  # later batches go straight through
            release()
            acks = [a for r in [r async for r in call] for a in (r.acks or [r])]
        assert [(a.sequence, a.code) for a in acks] == [(k + 1, 0) for k in range(N)]
        await wait_for(lambda: len(got) >= N, 10, what="every delivery")
        for i, key in enumerate(KEYS):
            assert [k for k in got if k % len(KEYS) == i] == list(range(i, N, len(KEYS))), key
        assert sorted(got) == list(range(N))  # none twice
    finally:
        reader.cancel()
        await sub.close()


@pytest.mark.timeout(60)
async def test_batches_matched_out_of_order_are_answered_and_applied_in_order(cluster):
    """Three batches wait at the matcher at once (one stream: the agent pipelines them) and
    their matching finishes last-first; the answers still go back, and are applied, in the
    order sent."""
    gate = Gate(cluster.matcher_nodes)

    def release():
        for event in reversed(gate.held):
            event.set()

    await publish_and_receive(cluster, gate, 3, release)
    assert gate.order == list(reversed(range(len(gate.held))))  # the matcher really finished them last-first


@pytest.mark.timeout(90)
async def test_a_failed_match_stream_sends_every_outstanding_batch_again_in_order():
    """Three batches outstanding when the matcher's stream fails: all are matched again on
    the next matcher, none lost, none reordered."""
    c = Cluster(agents=2, matchers=2)
    try:
        await c.start()
        gate = Gate(c.matcher_nodes)

        def fail():
            gate.fail = True
            for event in gate.held:
                event.set()

        await publish_and_receive(c, gate, 3, fail)
        assert not gate.order  # every held batch failed: each was answered after being sent again
    finally:
        await c.stop()


@pytest.mark.timeout(60)
async def test_a_full_batch_goes_while_a_large_one_waits_at_the_matcher(cluster):
    """A batch of more than AHEAD_EVENTS events held at the matcher (so no later batch may
    join it in flight for being late), then MAX_BATCH events more: they go as a second batch
    at once, without waiting for the first's answer, and every event is acked in order."""
    from echelon.agent.dispatch import AHEAD_EVENTS, MAX_BATCH

    gate = Gate(cluster.matcher_nodes)
    await cluster.client(0).create_topic("t")
    first, second = AHEAD_EVENTS + 8, MAX_BATCH
    sent = asyncio.Event()

    async def requests():
        yield ppb.PublishRequest(producer_id="p", batch=[request(k) for k in range(first)])
        await wait_for(lambda: len(gate.held) >= 1, 10, what="the first batch at the matcher")
        yield ppb.PublishRequest(producer_id="p", batch=[request(k) for k in range(first, first + second)])
        await sent.wait()

    async with grpc.aio.insecure_channel(cluster.agent_nodes[0].address) as ch:
        call = pgrpc.PubSubStub(ch).Publish(requests())
        await wait_for(lambda: len(gate.held) >= 2, 10, what="the full batch sent while the first is held")
        gate.holding = False
        for event in gate.held:
            event.set()
        acks = []
        async for r in call:
            acks += list(r.acks or [r])
            if len(acks) == first + second:
                break
        sent.set()
    assert [(a.sequence, a.code) for a in acks] == [(k + 1, 0) for k in range(first + second)]
