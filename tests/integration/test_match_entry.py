"""The Match path between matchers and the agent's choice of entry (services/echelon/matcher/
fanout.py, peers.py; services/echelon/agent/matching.py), on real gRPC servers in one process.

- An agent follows the entry a matcher suggests: on a schemaless topic (one zone, an
  owner and a replica) it ends up at a member of the zone, after which no event needs a
  matcher-to-matcher message (the holders' counter stops), and every delivery equals
  brute force.
- Zones promised empty (services/echelon/matcher/empty.py): on a topic whose subscriptions all
  live in the top zone, while every event also meets the two empty zones below it, the
  agent moves to the top zone's holder and no event needs a matcher-to-matcher message;
  the first subscription of an empty zone, once acknowledged, gets every event sent
  after (its holder revoked the promises over real gRPC).
- Holder mode on a live stream: a layout not held is answered `stale` and the same
  stream answers the next request; positions out of range or not increasing are
  INVALID_ARGUMENT.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import grpc
import pytest

from echelon.contract.filters import parse
from echelon.matcher.layout import default_zones
from echelon.core.space import Space
from echelon.contract.schema import Schema
from echelon.contract.wire import attributes_to_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import matcher_pb2_grpc as xgrpc
from tests.harness import Cluster, wait_for

FILTERS = ["x = 1", "x >= 2", 'y prefix "a"', "x < 0", ""]


def holder_events(c: Cluster) -> float:
    return sum(m.metrics.held_events._value.get() for m in c.matcher_nodes)


class _Receivers:
    """Subscriptions of one client to a topic, each read into `got[i]` (the payloads' numbers)."""

    def __init__(self, client, topic: str):
        self.client, self.topic = client, topic
        self.got: dict[int, list[int]] = defaultdict(list)
        self.subs, self.readers = [], []

    async def subscribe(self, i: int, text: str) -> None:
        sub = self.client.subscribe(self.topic, text, name=f"s{i}", max_outstanding=1000)
        await sub.start()

        async def read():
            async for m in sub:
                self.got[i].append(int.from_bytes(m.payload, "little"))
                await m.ack()

        self.subs.append(sub)
        self.readers.append(asyncio.create_task(read()))

    async def close(self) -> None:
        for t in self.readers:
            t.cancel()
        for s in self.subs:
            await s.close()


@pytest.mark.timeout(90)
async def test_the_agent_moves_to_the_suggested_entry_and_no_peer_message_follows():
    c = Cluster(agents=2, matchers=3)
    try:
        await c.start()
        ids = sorted(m.config.id for m in c.matcher_nodes)
        topic = next(t for t in (f"free{i}" for i in range(100))  # the agent's first entry holds no zone of it
                     if ids[0] not in default_zones(t, Space.of(Schema()), ids)[0][0].members)
        members = default_zones(topic, Space.of(Schema()), ids)[0][0].members
        publisher, subscriber = c.client(0), c.client(1)
        await publisher.create_topic(topic)
        receivers = _Receivers(subscriber, topic)
        got = receivers.got
        for i, text in enumerate(FILTERS):
            await receivers.subscribe(i, text)
        matching = c.agent_nodes[0].matching
        matching._rr = [m.id for m in matching.matchers()].index(ids[0])  # start at a matcher outside the zone
        events = [{"x": k % 5 - 1, "y": "ab" if k % 3 else "b"} for k in range(60)]
        pub = publisher.publisher()
        for k, e in enumerate(events[:20]):
            await pub.publish(topic, e, payload=k.to_bytes(4, "little"))
        await wait_for(lambda: matching._stream_matcher in members, 10, what="the agent at a member of the zone")
        held = holder_events(c)
        assert held > 0  # the first entry asked a member
        for k, e in enumerate(events[20:], 20):
            await pub.publish(topic, e, payload=k.to_bytes(4, "little"))
        want = {i: [k for k, e in enumerate(events) if parse(text).matches(e)] for i, text in enumerate(FILTERS)}
        await wait_for(lambda: all(len(got[i]) >= len(w) for i, w in want.items()), 10, what="every delivery")
        assert {i: sorted(v) for i, v in got.items() if v} == {i: w for i, w in want.items() if w}
        assert holder_events(c) == held  # answered at the member alone
        await pub.close()
        await receivers.close()
    finally:
        await c.stop()


@pytest.mark.timeout(90)
async def test_zones_promised_empty_need_no_peer_message_until_their_first_subscription():
    c = Cluster(agents=2, matchers=3)
    try:
        await c.start()
        publisher, subscriber = c.client(0), c.client(1)
        await publisher.create_topic("spans", ["x:int:0:99"])  # default zones d0 d1 d2 along x
        receivers = _Receivers(subscriber, "spans")
        got, subscribe = receivers.got, receivers.subscribe

        filters = ["x >= 70", "x between 80 and 90", "x <= 5"]  # the last one's zone is d0
        for i, text in enumerate(filters[:2]):
            await subscribe(i, text)
        layout = c.matcher_nodes[0].tier.layouts.topics["spans"].active
        top = next(m for m in c.matcher_nodes if m.config.id == layout.members["d2"][0])

        def ready():  # the agent at d2's holder, which holds promises for d0 and d1
            L = top.tier.layouts.topics["spans"].active
            return matching._stream_matcher == top.config.id and {"d0", "d1"} - set(L.index) <= set(L.promised)

        matching = c.agent_nodes[0].matching
        pub = publisher.publisher()
        events = [{"x": k * 7 % 100} for k in range(150)]
        sent = 0
        for _ in range(100):
            if ready():
                break
            await pub.publish("spans", events[sent], payload=sent.to_bytes(4, "little"))
            sent += 1
            await asyncio.sleep(0.1)
        assert ready()
        held = holder_events(c)
        for k in range(sent, 100):
            await pub.publish("spans", events[k], payload=k.to_bytes(4, "little"))
        want = {i: [k for k, e in enumerate(events[:100]) if parse(t).matches(e)] for i, t in enumerate(filters[:2])}
        await wait_for(lambda: all(len(got[i]) >= len(w) for i, w in want.items()), 10, what="every delivery")
        assert holder_events(c) == held  # d0, d1 promised empty, d2 local: no peer message
        await subscribe(2, filters[2])  # acknowledged: d0's holder revoked its promises
        for k in range(100, 150):
            await pub.publish("spans", events[k], payload=k.to_bytes(4, "little"))
        want = {i: [k for k, e in enumerate(events) if parse(t).matches(e) and (i < 2 or k >= 100)]
                for i, t in enumerate(filters)}
        assert want[2]
        await wait_for(lambda: all(len(got[i]) >= len(w) for i, w in want.items()), 10, what="every delivery")
        assert {i: sorted(v) for i, v in got.items()} == want
        assert sum(m.tier.empty.revocations for m in c.matcher_nodes) > 0
        await pub.close()
        await receivers.close()
    finally:
        await c.stop()


async def test_holder_mode_answers_stale_on_a_live_stream_and_refuses_bad_positions():
    c = Cluster(agents=1, matchers=2)
    try:
        await c.start()
        client = c.client(0)
        await client.create_topic("free")
        async with client.subscribe("free", "x = 1", name="s"):
            def holder():  # the copy reaches its zone's holder after the entry's acknowledgement
                return next((m for m in c.matcher_nodes if (t := m.tier.layouts.topics.get("free"))
                             and t.active and t.active.index), None)

            node = await wait_for(holder, 10, what="a matcher indexing the subscription")
            layout = node.tier.layouts.topics["free"].active
            event = pb.Event(attributes=attributes_to_pb({"x": 1}))
            async with grpc.aio.insecure_channel(node.address) as ch:
                call = xgrpc.MatcherStub(ch).Match()
                await call.write(xpb.MatchRequest(topic="free", layout="nope", events=[event],
                                                  zones=[xpb.ZoneEvents(zone="all", events=[0])]))
                r = await call.read()
                assert "holds no layout nope" in r.stale and not r.results
                await call.write(xpb.MatchRequest(topic="free", layout=layout.key, agents_only=True, events=[event],
                                                  zones=[xpb.ZoneEvents(zone="all", events=[0])]))
                r = await call.read()
                assert not r.stale and [[a.agent for a in x.agents] for x in r.results] == [["agent-0"]]
                await call.write(xpb.MatchRequest(topic="free", layout=layout.key, events=[event],
                                                  zones=[xpb.ZoneEvents(zone="all", events=[3])]))
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call.read()
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                call = xgrpc.MatcherStub(ch).Match()  # positions repeated: refused as well
                await call.write(xpb.MatchRequest(topic="free", layout=layout.key, events=[event, event],
                                                  zones=[xpb.ZoneEvents(zone="all", events=[0, 0])]))
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call.read()
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not increasing" in err.value.details()
    finally:
        await c.stop()
