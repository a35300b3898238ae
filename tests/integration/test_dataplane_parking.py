"""Parking: a destination whose member is DEAD in the relay's view is held, not dropped
(the upstream ack does not wait for it); it is sent when the same member is ALIVE again,
and dropped (counted lost) when the park time ends or the member leaves."""

from __future__ import annotations

import asyncio
import time

from echelon.agent.dispatch import Dispatcher
from echelon.dataplane.dissemination import HOLD_SECONDS, DataPlane, event_of
from echelon.dataplane.gateway import Gateway
from echelon.agent.subscriptions import CLOCK_SKEW_NS, Subscription
from echelon.contract.filters import parse
from echelon.v1 import common_pb2 as pb
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import relay_pb2 as rpb
from tests.integration.test_dataplane_routing import PAPER, FakeNode, relay_with_grandchildren, view


def setup():
    members = view(PAPER)
    relay, tree, by_key = relay_with_grandchildren(members)
    node = FakeNode(relay, members)
    plane = DataPlane(node, node.trees, park_seconds=30.0)
    child = by_key[next(c for c in tree.children[relay.address] if tree.children[c])]
    return members, node, plane, child


def receive(plane, seq: int, dests: list[str], acks: list) -> None:
    event = pb.Event(id=pb.MessageId(producer_id="p", sequence=seq), topic="t")
    msg = rpb.RelayMessage(encoded_event=event.SerializeToString(), destinations=dests)
    plane.receive(rpb.RelayFrame(source="a0", source_key=PAPER[0], messages=[msg]), lambda: acks.append(seq))


def sent_to(node, member_id: str) -> list[tuple[int, list[str]]]:
    link = node.links.get(member_id)
    return [(event_of(m).id.sequence, list(m.destinations)) for f, _ in (link.frames if link else [])
            for m in f.messages]


def settle_all(node) -> None:
    for link in node.links.values():
        link.settle(True)


def mark_dead(node, plane, members, child) -> None:
    node.trees.update([m for m in members if m.id != child.id], dead=[child.id])
    plane.on_view()


async def test_a_dead_members_messages_wait_for_it_and_go_out_when_it_is_back():
    members, node, plane, child = setup()
    mark_dead(node, plane, members, child)
    acks: list = []
    for seq in (1, 2):
        receive(plane, seq, [child.id], acks)
    assert sent_to(node, child.id) == [] and plane.parked_count == 2
    assert acks == [1, 2]  # every destination in the view holds them: the parked one is ours to keep
    node.trees.update(members)  # the same member id, ALIVE again (it rejoined)
    plane.on_view()
    assert sent_to(node, child.id) == [(1, [child.id]), (2, [child.id])]  # in arrival order
    assert plane.parked_count == 0 and plane.parked_bytes == 0
    settle_all(node)
    await asyncio.sleep(0)
    m = node.metrics
    assert (m.parked._value.get(), m.unparked._value.get(), m.lost._value.get()) == (2, 2, 0)


async def test_orphans_of_a_dead_relay_are_rerouted_while_the_relay_itself_is_parked():
    members, node, plane, child = setup()
    below = [m.id for m in members if m.id not in ("a0", node.id)]
    mark_dead(node, plane, members, child)
    acks: list = []
    receive(plane, 1, below, acks)
    reached = {d for link in node.links.values() for f, _ in link.frames for m in f.messages for d in m.destinations}
    assert child.id not in reached and plane.parked_count == 1
    assert acks == []  # the orphans' copies are in flight
    settle_all(node)
    await asyncio.sleep(0)
    assert acks == [1]


async def test_parked_messages_expire_and_a_member_that_left_is_not_waited_for():
    members, node, plane, child = setup()
    mark_dead(node, plane, members, child)
    acks: list = []
    receive(plane, 1, [child.id], acks)
    plane.expire(time.monotonic() + 10)
    assert plane.parked_count == 1
    plane.expire(time.monotonic() + 31)
    assert plane.parked_count == 0 and node.metrics.lost._value.get() == 1
    receive(plane, 2, [child.id], acks)
    node.trees.update([m for m in members if m.id != child.id])  # absent from the view: still waited for
    plane.on_view()
    assert plane.parked_count == 1 and acks == [1, 2] and node.metrics.lost._value.get() == 1
    node.trees.update([m for m in members if m.id != child.id], left=[child.id])  # LEFT: not waited for
    plane.on_view()
    assert plane.parked_count == 0 and acks == [1, 2] and node.metrics.lost._value.get() == 2
    receive(plane, 3, [child.id], acks)  # LEFT: nothing to wait for
    assert acks == [1, 2, 3] and node.metrics.lost._value.get() == 3


def test_a_subscription_is_owed_only_what_was_published_after_it_existed():
    sub = Subscription("a/s", "s", "t", parse(""), 10)
    at = lambda ns: pb.Event(publish_time_unix_nanos=ns)  # noqa: E731
    assert sub.owes(at(time.time_ns()))
    assert sub.owes(at(sub.created_ns - CLOCK_SKEW_NS // 2))  # the publisher's clock is a bit behind
    assert not sub.owes(at(sub.created_ns - 3 * CLOCK_SKEW_NS))  # before a restart: for the old process
    assert sub.owes(pb.Event())  # no publish time: no opinion


async def test_the_root_parks_a_dead_destinations_messages_too():
    members = view(PAPER)
    node = FakeNode(members[0], members)
    plane = DataPlane(node, node.trees, park_seconds=30.0)
    dead = members[-1]
    node.trees.update(members[:-1], dead=[dead.id])
    plane.on_view()
    event = pb.Event(id=pb.MessageId(producer_id="p", sequence=1), topic="t")
    (future,) = await plane.publish([(event, b"x", [dead.id])])
    assert future.done() and plane.parked_count == 1  # delivered to everyone in the view: none
    node.trees.update(members)
    plane.on_view()
    sent = [(event_of(m).payload, list(m.destinations)) for link in node.links.values() for f, _ in link.frames
            for m in f.messages]
    assert sent == [(b"x", [dead.id])] and plane.parked_count == 0  # down its tree, as the root sends


class _Matched:
    """The matcher's answer for every batch: each event matches `agents` (agent/matching.py's `send`)."""

    def __init__(self, agents: list[str]):
        self.agents = agents

    async def send(self, encoded):
        future = asyncio.get_running_loop().create_future()
        future.set_result([xpb.MatchResult(agents=[xpb.AgentMatches(agent=a) for a in self.agents])
                           for _ in encoded])
        return future


async def _dispatch(dispatcher: Dispatcher, seq: int):
    event = pb.Event(id=pb.MessageId(producer_id="p", sequence=seq), topic="t")
    counts, waits = await asyncio.wait_for(dispatcher.submit([event], [b"x"]), 5)
    return counts, waits


async def test_the_publishing_agent_parks_a_destination_absent_from_its_view_and_drops_one_that_left():
    """A view rebuilt by membership replicas that all restarted lacks members until they
    rejoin: a destination the matcher names but the view does not is the data plane's to park
    (it was dropped before the data plane saw it: the chaos run's `members` row lost acked
    events); one that LEFT is owed nothing."""
    members = view(PAPER)
    node = FakeNode(members[0], members)
    plane = DataPlane(node, node.trees, park_seconds=30.0)
    gateway = DataPlane(node, Gateway(members[0].id, ""))
    absent, left = members[-1], members[-2]
    node.trees.update(members[:-2], left=[left.id])
    plane.on_view()
    dispatcher = Dispatcher(members[0].id, _Matched([absent.id, left.id]), plane, gateway, lambda events: [])
    task = asyncio.create_task(dispatcher.run())
    try:
        counts, waits = await _dispatch(dispatcher, 1)
        assert counts == [1] and all(w.done() for w in waits)  # acked: held here, for the absent one
        assert plane.parked_count == 1 and not node.links
        node.trees.update(members[:-2] + [absent], left=[left.id])  # it rejoined
        plane.on_view()
        sent = [(event_of(m).id.sequence, list(m.destinations)) for link in node.links.values()
                for f, _ in link.frames for m in f.messages]
        assert sent == [(1, [absent.id])] and plane.parked_count == 0
        assert node.metrics.lost._value.get() == 0  # the one that left was never a destination
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_relays_ack_waits_for_a_destination_absent_from_its_view_until_it_is_sent_on():
    """The root's view holds the destination, the relay's does not yet (or no more): the
    frame's ack upstream waits until the relay sends it on, so the root's fence across a
    view change keeps waiting and a later message cannot overtake it on another path
    (without the wait, a reorder of the chaos run's `members` row); a DEAD one is not waited
    for, and past HOLD_SECONDS the ack goes while the message stays parked."""
    members, node, plane, child = setup()
    node.trees.update([m for m in members if m.id != child.id])  # absent here, not DEAD
    plane.on_view()
    acks = []
    receive(plane, 1, [child.id], acks)
    await asyncio.sleep(0)
    assert acks == [] and plane.parked_count == 1
    node.trees.update(members)  # it is back in this view
    plane.on_view()
    assert sent_to(node, child.id) == [(1, [child.id])] and acks == []
    settle_all(node)
    await asyncio.sleep(0)
    assert acks == [1]

    node.trees.update([m for m in members if m.id != child.id])  # gone for good: bounded wait
    plane.on_view()
    receive(plane, 2, [child.id], acks)
    plane.expire(time.monotonic() + HOLD_SECONDS + 0.1)
    await asyncio.sleep(0)
    assert acks == [1, 2] and plane.parked_count == 1  # acked, still parked for it

    mark_dead(node, plane, members, child)
    receive(plane, 3, [child.id], acks)
    await asyncio.sleep(0)
    assert acks == [1, 2, 3]  # DEAD: never waited for


async def test_a_relay_fences_its_new_routes_until_what_it_relayed_on_the_old_view_is_acknowledged():
    """The relay's route to a grandchild changes while its first message is still on the
    old path (here a bucket hint makes the child a leaf): the next message waits until the
    first is acknowledged, so it cannot overtake it on the new path (without the fence, the
    chaos run's reorders after a partition healed: docs/guarantees.md, "Order")."""
    members, node, plane, child = setup()
    grandchild = next(m.id for m in members if m.id != child.id
                      and node.trees.route(PAPER[0], "t", 0, [m.id])[0].get(child.id) == [m.id])
    acks = []
    receive(plane, 1, [grandchild], acks)
    assert sent_to(node, child.id) == [(1, [grandchild])]
    node.trees.update(members, hinted=[child.id])  # the child relays nothing any more
    plane.on_view()
    receive(plane, 2, [grandchild], acks)
    await asyncio.sleep(0)
    (target,) = node.trees.route(PAPER[0], "t", 0, [grandchild])[0]  # its new path
    assert target != child.id and sent_to(node, target) == []  # fenced: 1 is still on its way through the child
    node.links[child.id].settle(True)
    await asyncio.sleep(0.01)
    assert sent_to(node, target) == [(2, [grandchild])] and acks == [1]
    settle_all(node)
    await asyncio.sleep(0)
    assert acks == [1, 2]


async def test_a_relays_fence_holds_only_its_roots_first_stripe_so_no_two_fences_wait_on_each_other():
    """The fence of one root's first stripe (what sets the order) holds nothing of another
    root's, nor another stripe's slices: two relays re-routing toward each other after a
    crash (each a parent of the other in some root's or stripe's tree) no longer wait on
    each other's fences until FENCE_SECONDS runs out (test_dataplane.py's inner-relay kill
    with 8 stripes). Without the per-root, first-stripe fence, both frames below waited."""
    members, node, plane, child = setup()
    grandchild = next(m.id for m in members if m.id != child.id
                      and node.trees.route(PAPER[0], "t", 0, [m.id])[0].get(child.id) == [m.id])
    acks: list = []
    receive(plane, 1, [grandchild], acks)
    node.trees.update(members, hinted=[child.id])
    plane.on_view()  # fenced: a0's message 1 is still on its way through the child
    frames = lambda: sum(len(link.frames) for link in node.links.values())  # noqa: E731
    before = frames()
    # Another root's message: its own tree, its own fence (none here).
    other = next(m for m in members if m.id not in ("a0", node.id, grandchild, child.id))
    event = pb.Event(id=pb.MessageId(producer_id="q", sequence=1), topic="t")
    plane.receive(rpb.RelayFrame(source=other.id, source_key=other.address, messages=[
        rpb.RelayMessage(encoded_event=event.SerializeToString(), destinations=[grandchild])]), lambda: acks.append("q"))
    assert frames() == before + 1
    # a0's own slice on another stripe: it joins a stream its head opened, in any order.
    head = pb.Event(id=pb.MessageId(producer_id="p", sequence=9), topic="t", payload=b"x")
    plane.receive(rpb.RelayFrame(source="a0", source_key=PAPER[0], messages=[
        rpb.RelayMessage(event=head, destinations=[grandchild], slice_index=1, slice_count=2, payload_size=2,
                         stripe=3)]), lambda: acks.append("s"))
    assert frames() == before + 2
    receive(plane, 2, [grandchild], acks)  # a0's first stripe: waits behind message 1
    await asyncio.sleep(0)
    assert frames() == before + 2
    node.links[child.id].settle(True)
    await asyncio.sleep(0.01)
    assert frames() == before + 3 and plane.fence_timeouts == 0
