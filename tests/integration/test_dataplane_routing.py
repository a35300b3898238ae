"""The data plane's routing and slicing without the network: every agent's `Trees` over
one view must together deliver each copy exactly once, along the LBDD tree of each stripe;
views that disagree must still reach everyone; striping must spread the upload."""

from __future__ import annotations

import asyncio
import itertools
import random
import time

import pytest

from echelon.dataplane.slices import ChunkStream, Streams, slice_count, slice_event
from echelon.dataplane.trees import Trees, hinted, salted
from echelon.core import lbdd
from echelon.v1 import common_pb2 as pb
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import relay_pb2 as rpb

PAPER = [f"10.3.17.{x}:7100" for x in (74, 97, 234, 90, 98, 64, 61, 184, 72, 88, 44, 68)]


def view(keys, subscribers=None) -> list[mpb.Member]:
    subscribers = range(1, len(keys)) if subscribers is None else subscribers
    return [mpb.Member(id=f"a{i}", address=k, role=mpb.ROLE_AGENT, subscribes=["t"] if i in subscribers else [])
            for i, k in enumerate(keys)]


def agents(members, mode="lbdd", stripes=8, max_degree=None, direct_upto=0) -> dict[str, Trees]:
    """Every member's Trees; small topics' stars off unless asked (these tests check the trees)."""
    out = {}
    for m in members:
        out[m.id] = Trees(m.id, m.address, mode, stripes, max_degree, direct_upto)
        out[m.id].update(members)
    return out


def disseminate(nodes: dict[str, Trees], root: str, stripe: int, dests: list[str]):
    """Follow every node's own routing decisions; return (times each node received, copies sent per node)."""
    source_key = nodes[root].self_key
    received: dict[str, int] = {}
    sent: dict[str, int] = {}
    todo = [(root, dests)]
    while todo:
        at, ds = todo.pop()
        routes, lost = nodes[at].route(source_key, "t", stripe, [d for d in ds if d != at])
        assert not lost
        for target, sub in routes.items():
            sent[at] = sent.get(at, 0) + 1
            received[target] = received.get(target, 0) + 1
            todo.append((target, sub))
    return received, sent


@pytest.mark.parametrize("stripe", range(8))
def test_every_destination_gets_one_copy_along_the_stripe_tree(stripe):
    members = view(PAPER)
    nodes = agents(members)
    everyone = [m.id for m in members[1:]]
    received, sent = disseminate(nodes, "a0", stripe, everyone)
    assert received == {d: 1 for d in everyone}
    # Exactly the edges of the LBDD tree over the salted keys.
    by_key = {salted(m.address, stripe): m.id for m in members}
    tree = lbdd.build_tree(salted(PAPER[0], stripe), [salted(k, stripe) for k in PAPER[1:]])
    assert sent == {by_key[p]: len(c) for p, c in tree.children.items() if c}


@pytest.mark.parametrize("bound", [2, 3])
def test_out_degree_bound_keeps_one_copy_each_and_caps_every_sender(bound):
    keys = [f"10.9.{i // 256}.{i % 256}:7100" for i in range(120)]
    members = view(keys)
    nodes = agents(members, stripes=2, max_degree=bound)
    everyone = [m.id for m in members[1:]]
    for stripe in range(2):
        received, sent = disseminate(nodes, "a0", stripe, everyone)
        assert received == {d: 1 for d in everyone}
        assert max(sent.values()) <= bound
    # without the bound the same view has a sender above it, so the test can fail
    assert max(disseminate(agents(members, stripes=1), "a0", 0, everyone)[1].values()) > bound


def test_only_subtrees_holding_a_destination_get_a_copy():
    members = view(PAPER)
    nodes = agents(members, stripes=1)
    tree = lbdd.build_tree(PAPER[0], PAPER[1:])
    leaf = next(k for k, c in tree.children.items() if not c)
    by_key = {m.address: m.id for m in members}
    received, sent = disseminate(nodes, "a0", 0, [by_key[leaf]])
    path = []
    k = leaf
    while k != PAPER[0]:
        path.append(by_key[k])
        k = tree.parent[k]
    assert received == {n: 1 for n in path}  # the leaf and the relays above it, once each
    assert sum(sent.values()) == len(path)


def test_p2p_sends_every_copy_from_the_root():
    members = view(PAPER)
    nodes = agents(members, mode="p2p")
    everyone = [m.id for m in members[1:]]
    received, sent = disseminate(nodes, "a0", 0, everyone)
    assert received == {d: 1 for d in everyone} and sent == {"a0": 11}


@pytest.mark.parametrize("subscribers", [1, 2, 3, 4])
def test_a_small_topics_stripe_0_is_a_star_and_its_other_stripes_stay_trees(subscribers):
    """Up to `direct_upto` subscribing agents, stripe 0 (small events, every payload's head)
    goes from the root straight to each destination, whatever the other destinations are
    (one path per destination: FIFO); the salted stripes keep LBDD's trees, so a bulk
    payload still spreads its upload; one more subscriber and stripe 0 is the tree again."""
    keys = PAPER[:subscribers + 2]  # the root, the subscribers, and one more agent
    small = view(keys, subscribers=range(1, subscribers + 1))
    nodes = agents(small, direct_upto=subscribers)
    ids = [f"a{i}" for i in range(1, subscribers + 1)]
    for k in range(1, subscribers + 1):
        for dests in itertools.combinations(ids, k):
            assert paths(nodes, "a0", 0, list(dests)) == {d: ["a0", d] for d in dests}
    received, sent = disseminate(nodes, "a0", 0, ids)
    assert received == dict.fromkeys(ids, 1) and sent == {"a0": subscribers}
    assert nodes["a0"]._loads("t", 0, ids) == {"a0": subscribers}  # what the stripe schedule weighs
    for stripe in range(1, 8):  # the salted trees, edge for edge
        by_key = {salted(m.address, stripe): m.id for m in small}
        tree = lbdd.build_tree(salted(keys[0], stripe), [salted(keys[i], stripe) for i in range(1, subscribers + 1)])
        assert disseminate(nodes, "a0", stripe, ids)[1] == {by_key[p]: len(c) for p, c in tree.children.items() if c}
    larger = agents(small, direct_upto=subscribers - 1)
    tree = lbdd.build_tree(keys[0], keys[1:subscribers + 1])
    by_key = {m.address: m.id for m in small}
    assert disseminate(larger, "a0", 0, ids)[1] == {by_key[p]: len(c) for p, c in tree.children.items() if c}


def test_the_star_keeps_the_out_degree_bound():
    members = view(PAPER[:5])  # four subscribers
    assert agents(members, direct_upto=4)["a0"].star("t", 0)
    bounded = agents(members, max_degree=2, direct_upto=4)
    assert not bounded["a0"].star("t", 0)
    received, sent = disseminate(bounded, "a0", 0, ["a1", "a2", "a3", "a4"])
    assert received == dict.fromkeys(["a1", "a2", "a3", "a4"], 1) and max(sent.values()) <= 2


def test_disagreeing_views_still_reach_every_destination():
    rng = random.Random(7)
    keys = [f"198.18.0.{i}:7100" for i in range(2, 30)]
    members = view(keys)
    nodes = agents(members)
    # Half the relays have not yet seen five of the subscribers in their peer tables.
    late = set(rng.sample([m.id for m in members[1:]], 5))
    for m in members[1:]:
        if rng.random() < 0.5:
            nodes[m.id].update(view(keys, [i for i in range(1, len(keys)) if f"a{i}" not in late]))
    everyone = [m.id for m in members[1:]]
    for stripe in range(8):
        received, _ = disseminate(nodes, "a0", stripe, everyone)
        assert set(received) == set(everyone)


def paths(nodes: dict[str, Trees], root: str, stripe: int, dests: list[str]) -> dict[str, list[str]]:
    """Every destination's path (the nodes its copy passes through), following each node's own routes."""
    source_key = nodes[root].self_key
    out: dict[str, list[str]] = {}
    todo = [(root, dests, [root])]
    while todo:
        at, ds, path = todo.pop()
        routes, _ = nodes[at].route(source_key, "t", stripe, [d for d in ds if d != at])
        for target, sub in routes.items():
            if target in sub:
                out[target] = path + [target]
            todo.append((target, [d for d in sub if d != target], path + [target]))
    return out


@pytest.mark.parametrize("stripe", [0, 5])
def test_the_path_to_a_subscriber_does_not_depend_on_the_other_destinations(stripe):
    """Agents alive but not yet advertised as subscribers (a restarted agent's subscriptions
    are registered on the matchers a heartbeat before its `subscribes` reaches the views)
    get direct copies and never reshape the tree: a producer's next message, with or
    without them among its destinations, takes the same path to every other subscriber,
    so it cannot overtake its predecessor at a relay (FIFO per key: docs/guarantees.md, "Order"). Here four
    of twelve agents are unadvertised: every subset of them rides along in turn."""
    members = view(PAPER, subscribers=range(1, 8))
    nodes = agents(members)
    advertised = [m.id for m in members[1:8]]
    fresh = [m.id for m in members[8:]]
    alone = paths(nodes, "a0", stripe, advertised)
    assert set(alone) == set(advertised)
    for k in range(1, len(fresh) + 1):
        for extra in itertools.combinations(fresh, k):
            both = paths(nodes, "a0", stripe, advertised + list(extra))
            assert {d: both[d] for d in advertised} == alone, extra
            assert all(both[d] == ["a0", d] for d in extra)  # one direct copy each, from the root


def test_a_failed_relay_is_routed_around_and_reported_lost():
    members = view(PAPER)
    nodes = agents(members, stripes=1)
    tree = lbdd.build_tree(PAPER[0], PAPER[1:])
    by_key = {m.address: m.id for m in members}
    relay = next(k for k in tree.children[PAPER[0]] if tree.children[k])
    dead = by_key[relay]
    alive = [m for m in members if m.id != dead]
    for n in nodes.values():
        n.update(alive)
    routes, lost = nodes["a0"].route(PAPER[0], "t", 0, [m.id for m in members[1:]])
    assert lost == [dead] and dead not in routes
    received, _ = disseminate({k: v for k, v in nodes.items() if k != dead}, "a0", 0,
                              [m.id for m in alive[1:]])
    assert received == {m.id: 1 for m in alive[1:]}


@pytest.mark.parametrize("keys", [PAPER, [f"198.18.0.{x}:7100" for x in (74, 97, 234, 90, 98, 64, 61, 184, 72,
                                                                           88, 44, 68)]])
def test_striping_spreads_the_upload(keys):
    """One tree's busiest node sends 3-5 copies of the payload; 8 stripes bring it near 1.5."""
    members = view(keys)
    everyone = [m.id for m in members[1:]]

    def busiest(stripes: int, slices: int = 1024) -> float:
        nodes = agents(members, stripes=stripes)
        schedule = nodes["a0"].schedule("t", everyone)
        load: dict[str, int] = {}
        for i in range(slices):
            _, sent = disseminate(nodes, "a0", schedule[i % len(schedule)], everyone)
            for n, c in sent.items():
                load[n] = load.get(n, 0) + c
        assert sum(load.values()) == 11 * slices  # one copy per subscriber and slice, whoever sends it
        return max(load.values()) / slices

    plain, striped = busiest(1), busiest(8)
    assert plain >= 3
    assert striped <= 1.5  # 11 / 1.5 = 7.3x over point-to-point where equal uploads are the limit


def slices_of(event: pb.Event, payload: bytes, size: int) -> list[rpb.RelayMessage]:
    n = slice_count(len(payload), size)
    return [rpb.RelayMessage(event=slice_event(event, payload[i * size:(i + 1) * size], i), slice_index=i,
                             slice_count=n, payload_size=len(payload)) for i in range(n)]


def drain(stream: ChunkStream) -> bytes:
    """What a Subscribe stream does: take each chunk, write it, release its hold."""
    out = []
    while (item := stream.take()) is not None:
        out.append(item[0])
        item[1].release()
    return b"".join(out)


def test_slices_are_handed_out_in_order_as_they_arrive_and_duplicates_are_dropped():
    from echelon.dataplane.dissemination import Hold
    from echelon.core.dedup import DedupWindow

    payload = bytes(range(256)) * 1000
    event = pb.Event(id=pb.MessageId(producer_id="p", sequence=3), topic="t", ordering_key="k")
    event.attributes["x"].int_value = 1
    msgs = slices_of(event, payload, 4096)
    n = len(msgs)
    assert b"".join(m.event.payload for m in msgs) == payload
    assert not msgs[1].event.attributes and msgs[0].event.attributes["x"].int_value == 1
    dedup = DedupWindow()
    heads, sinks = [], []

    def open_(head, size):
        assert dedup.first_time((head.id.producer_id, head.id.sequence), 0.0)
        heads.append((head, size))
        sinks.append(ChunkStream(size))
        return sinks[-1:]

    streams = Streams(open_, lambda key: key in dedup, dedup.forget)
    order = list(range(n))
    random.Random(1).shuffle(order)
    got, holds = b"", {}
    for i in order:
        holds[i] = Hold()
        streams.add(msgs[i], holds[i])
        streams.add(msgs[order[0]], Hold())  # a duplicate slice: dropped
        # Handed out the moment every slice before it is here, never held back longer.
        handed = next((j for j in range(n) if j not in holds), n)
        got += drain(sinks[0]) if sinks else b""
        assert got == payload[:handed * 4096]
        assert all(not holds[j].pending for j in range(handed))  # written: their frames may be acked
        assert all(holds[j].pending for j in holds if j >= handed)  # waiting: not acked
    assert got == payload and len(heads) == 1 and sinks[0].done and len(streams) == 0
    head, size = heads[0]
    assert size == len(payload) and not head.payload and head.ordering_key == "k"
    assert head.attributes["x"].int_value == 1
    streams.add(msgs[2], Hold())  # after the end: the message id is known, nothing opens again
    assert len(heads) == 1 and len(streams) == 0


def test_a_payload_whose_slices_stop_is_dropped_and_a_stalled_subscriber_loses_it_alone():
    from echelon.dataplane.dissemination import Hold

    event = pb.Event(id=pb.MessageId(producer_id="p", sequence=1), topic="t")
    msgs = slices_of(event, bytes(40_000), 4096)
    fast, slow = ChunkStream(40_000), ChunkStream(40_000)
    forgotten = []
    streams = Streams(lambda head, size: [fast, slow], lambda key: False, forgotten.append, idle=100, stall=10)
    holds = [Hold() for _ in msgs]
    for m, h in zip(msgs[:5], holds):
        streams.add(m, h)
    drain(fast)
    assert all(h.pending == 1 for h in holds[:5])  # the slow one has not written them yet
    streams.sweep(time.monotonic() + 11)  # the slow subscriber took nothing for `stall` seconds
    assert slow.aborted and not fast.aborted and all(not h.pending for h in holds[:5])
    streams.add(msgs[5], holds[5])
    assert drain(fast) == bytes(4096)
    streams.sweep(time.monotonic() + 101)  # the root died: no slice for `idle` seconds
    assert fast.aborted and len(streams) == 0
    assert forgotten == [("p", 1)]  # a retry of the publish is delivered afresh


# --- one relay's data plane against fake links: cut-through, aggregated acks, path update ---


class FakeLink:
    def __init__(self, peer: str):
        self.peer = peer
        self.frames: list[tuple[rpb.RelayFrame, asyncio.Future]] = []

    def send(self, frame):
        future = asyncio.get_running_loop().create_future()
        self.frames.append((frame, future))
        return future

    async def room(self):
        return None

    def settle(self, ok: bool = True) -> None:
        for _, f in self.frames:
            if not f.done():
                f.set_result(ok)


class FakeNode:
    def __init__(self, member: mpb.Member, members):
        from prometheus_client import CollectorRegistry

        from echelon.agent.metrics import AgentMetrics
        from echelon.core.dedup import DedupWindow

        self.id = member.id
        self.address = member.address
        self.metrics = AgentMetrics(CollectorRegistry())
        self.dedup = DedupWindow()
        self.stopping = False
        self.links: dict[str, FakeLink] = {}
        self.delivered: list[pb.Event] = []
        self.trees = Trees(member.id, member.address, "lbdd", 1)
        self.trees.update(members)

    def link(self, member):
        return self.links.setdefault(member.id, FakeLink(member.id))

    def deliver_local(self, events, encoded=None):
        for event, data in zip(events, encoded or [b""] * len(events)):
            assert not data or pb.Event.FromString(data) == event  # a whole event's bytes, as the root made them
            if self.dedup.first_time(event.id.SerializeToString(), 0.0):  # the agent's key (delivery.py)
                self.delivered.append(event)

    def local_full(self):
        return []  # no subscription here lags

    def open_stream(self, head, size):
        if not self.dedup.first_time(head.id.SerializeToString(), 0.0):
            return []
        self.delivered.append(ChunkStream(size))
        return self.delivered[-1:]


def relay_with_grandchildren(members):
    """A relay (not the root) whose children have children of their own, in stripe 0."""
    tree = lbdd.build_tree(PAPER[0], PAPER[1:])
    by_key = {m.address: m for m in members}
    key = next(k for k in tree.parent if any(tree.children[c] for c in tree.children[k]))
    return by_key[key], tree, by_key


async def test_a_relay_forwards_each_slice_on_arrival_and_acks_after_its_subtree():
    from echelon.dataplane.dissemination import DataPlane

    members = view(PAPER)
    relay, tree, by_key = relay_with_grandchildren(members)
    node = FakeNode(relay, members)
    plane = DataPlane(node, node.trees)
    below = [by_key[k].id for k in tree.subtree(relay.address)]  # the relay itself included
    payload = bytes(range(256)) * 64
    event = pb.Event(id=pb.MessageId(producer_id="p", sequence=1), topic="t")
    n = slice_count(len(payload), 4096)
    acks = []
    got = b""
    for i, msg in enumerate(slices_of(event, payload, 4096)):
        msg.destinations.extend(below)
        plane.receive(rpb.RelayFrame(source="a0", source_key=PAPER[0], messages=[msg]), lambda i=i: acks.append(i))
        # Cut-through: slice i is already on its way to every child, and handed to the local
        # subscriber, before slice i + 1 exists.
        assert {p: len(link.frames) for p, link in node.links.items()} == \
            {by_key[c].id: i + 1 for c in tree.children[relay.address]}
        got += drain(node.delivered[0])
        assert got == payload[:(i + 1) * 4096]
    assert acks == []  # nothing is acknowledged before the subtree has it
    # A child fails with every slice unacknowledged: the relay re-routes them to its grandchildren.
    dead_key = next(c for c in tree.children[relay.address] if tree.children[c])
    dead = by_key[dead_key]
    node.trees.update([m for m in members if m.id != dead.id], left=[dead.id])  # gone for good: not waited for
    sent_before = {p: len(link.frames) for p, link in node.links.items()}
    node.links.pop(dead.id).settle(False)
    await asyncio.sleep(0)
    assert acks == []
    rerouted: dict[int, set[str]] = {}
    for p, link in node.links.items():
        for frame, _ in link.frames[sent_before.get(p, 0):]:
            for m in frame.messages:
                rerouted.setdefault(m.slice_index, set()).update(m.destinations)
    orphans = {by_key[k].id for k in tree.subtree(dead_key)} - {dead.id}
    assert rerouted == {i: orphans for i in range(n)}  # every slice, to every orphan, over the new view
    for link in node.links.values():
        link.settle(True)
    await asyncio.sleep(0)
    assert sorted(acks) == list(range(n))
    assert node.metrics.rerouted._value.get() == n and node.metrics.lost._value.get() == n
    # A duplicate (the grandparent's path update after this relay's parent died): nothing is
    # forwarded again, nothing delivered twice, and it is acknowledged at once.
    before = {p: len(link.frames) for p, link in node.links.items()}
    msg = rpb.RelayMessage(event=slice_event(event, payload[:4096], 0), destinations=below, slice_count=n,
                           payload_size=len(payload))
    plane.receive(rpb.RelayFrame(source="a0", source_key=PAPER[0], messages=[msg]), lambda: acks.append("dup"))
    assert {p: len(link.frames) for p, link in node.links.items()} == before
    assert acks[-1] == "dup" and len(node.delivered) == 1


@pytest.mark.parametrize("stripe", [0, 3])
def test_bucket_hints_make_the_hinted_agents_leaves_and_still_reach_everyone(stripe):
    """A plan's bucket hints: every agent routes with them, the hinted relays send nothing,
    every destination still gets exactly one copy, and the other agents relay instead."""
    members = view(PAPER)
    nodes = agents(members)
    everyone = [m.id for m in members[1:]]
    _, plain = disseminate(nodes, "a0", stripe, everyone)
    relays = sorted(k for k in plain if k != "a0")
    plan = mpb.RoutingPlan(version=1, bucket_hints=[mpb.BucketHint(member_id=r, weight=1.0) for r in relays[:2]])
    leaves = hinted(plan)
    assert leaves == set(relays[:2])
    for t in nodes.values():
        assert t.update(members, (), leaves)  # the hints alone change the routes
    received, sent = disseminate(nodes, "a0", stripe, everyone)
    assert received == {d: 1 for d in everyone}
    assert not set(sent) & leaves
    by_key = {salted(m.address, stripe): m.id for m in members}
    tree = lbdd.build_tree(salted(PAPER[0], stripe), [salted(k, stripe) for k in PAPER[1:]],
                           [salted(members[int(h[1:])].address, stripe) for h in leaves])
    assert sent == {by_key[p]: len(c) for p, c in tree.children.items() if c}


async def test_after_a_view_change_the_root_holds_a_producer_back_until_its_old_messages_are_acked():
    """A message in flight on the old view may be stuck behind a relay that has not seen
    the change; the next message of its producer leaves only once it is acknowledged
    (another producer's does not wait)."""
    from echelon.dataplane.dissemination import DataPlane

    members = view(PAPER)
    node = FakeNode(members[0], members)
    plane = DataPlane(node, node.trees)
    everyone = [m.id for m in members[1:]]
    ev = lambda producer, seq: pb.Event(id=pb.MessageId(producer_id=producer, sequence=seq), topic="t")  # noqa: E731
    (old,) = await plane.publish([(ev("p", 1), b"", everyone)])
    node.trees.update(members[:-1])  # a leaf left: the routes change
    plane.on_view()
    other = await asyncio.wait_for(plane.publish([(ev("q", 1), b"", everyone[:-1])]), 5)  # not held back
    sent = sum(len(link.frames) for link in node.links.values())
    held = asyncio.create_task(plane.publish([(ev("p", 2), b"", everyone[:-1])]))
    for _ in range(20):  # unfenced, it would be done after a turn or two of the loop
        await asyncio.sleep(0)
    assert not held.done() and sum(len(link.frames) for link in node.links.values()) == sent
    for link in node.links.values():
        link.settle(True)  # p:1 (and q:1) acknowledged
    (new,) = await asyncio.wait_for(held, 5)
    assert old.done() and other[0].done() and not new.done()
    assert sum(len(link.frames) for link in node.links.values()) > sent  # p:2 went out after p:1 was held


async def test_the_roots_fence_waits_only_for_a_view_that_changed_the_trees_and_at_most_fence_seconds(
        monkeypatch):
    """A view that changes no tree fences nothing; after one that does, a producer's old
    message that is never acknowledged (a named subscription's consumer holding it, a
    stalled link) holds the next one back for FENCE_SECONDS, counted, not for ever."""
    from echelon.dataplane import root as root_module
    from echelon.dataplane.dissemination import DataPlane

    monkeypatch.setattr(root_module, "FENCE_SECONDS", 0.2)
    members = view(PAPER)
    node = FakeNode(members[0], members)
    plane = DataPlane(node, node.trees)
    plane.on_view()  # the first view: the trees as they are
    everyone = [m.id for m in members[1:]]
    ev = lambda seq: pb.Event(id=pb.MessageId(producer_id="p", sequence=seq), topic="t")  # noqa: E731
    (old,) = await plane.publish([(ev(1), b"", everyone)])
    assert not node.trees.update(members)  # the same members: no tree changed
    plane.on_view()
    (second,) = await asyncio.wait_for(plane.publish([(ev(2), b"", everyone)]), 0.1)  # not fenced
    node.trees.update(members[:-1])  # a leaf left: the routes change
    plane.on_view()
    started = asyncio.get_running_loop().time()
    (third,) = await asyncio.wait_for(plane.publish([(ev(3), b"", everyone[:-1])]), 5)
    assert asyncio.get_running_loop().time() - started >= 0.2
    assert not old.done() and not second.done() and plane.fence_timeouts == 1


async def test_a_whole_message_travels_as_the_roots_bytes_and_the_older_form_is_still_read():
    """The root serializes a small event once (`encoded_event`, payload included); a relay
    forwards those bytes unchanged and delivers the same event locally. A message in the
    older form (`event` set) is delivered and forwarded alike (an agent not yet upgraded)."""
    from echelon.dataplane.dissemination import DataPlane, event_of

    members = view(PAPER)
    relay, tree, by_key = relay_with_grandchildren(members)
    below = [by_key[k].id for k in tree.subtree(relay.address)]
    root = FakeNode(members[0], members)
    event = pb.Event(id=pb.MessageId(producer_id="p", sequence=1), topic="t", publish_time_unix_nanos=7)
    event.attributes["x"].int_value = 3
    await DataPlane(root, root.trees).publish([(event, b"the payload", below)])
    whole = pb.Event()
    whole.CopyFrom(event)
    whole.payload = b"the payload"
    (frame, _), = root.links[relay.id].frames
    (msg,) = frame.messages
    assert not msg.HasField("event") and event_of(msg) == whole and sorted(msg.destinations) == sorted(below)
    for form in (msg, rpb.RelayMessage(event=whole, destinations=below)):
        node = FakeNode(relay, members)
        plane = DataPlane(node, node.trees)
        plane.receive(rpb.RelayFrame(source="a0", source_key=PAPER[0], messages=[form]), lambda: None)
        assert node.delivered == [whole]
        forwarded = [m for link in node.links.values() for f, _ in link.frames for m in f.messages]
        assert sorted(d for m in forwarded for d in m.destinations) == sorted(set(below) - {relay.id})
        assert all(m.encoded_event == msg.encoded_event if form is msg else event_of(m) == whole for m in forwarded)


@pytest.mark.parametrize("producer", ["p", "p" * 200])  # keyed off the bytes' front, or decoded (frames.peek)
async def test_a_relay_forwards_a_whole_message_once_and_reroutes_it_when_a_child_leaves(producer):
    """An inner relay takes the root's bytes for itself and its subtree: delivered here,
    forwarded unchanged to its children; a second copy (a path update upstream) is neither
    forwarded nor delivered again, and its ack waits for the first copy's subtree. A child
    that leaves with the frame unacknowledged: the message re-routed to its orphans."""
    from echelon.dataplane.dissemination import DataPlane

    members = view(PAPER)
    relay, tree, by_key = relay_with_grandchildren(members)
    below = [by_key[k].id for k in tree.subtree(relay.address)]
    root = FakeNode(members[0], members)
    event = pb.Event(id=pb.MessageId(producer_id=producer, sequence=1), topic="t", publish_time_unix_nanos=7)
    event.attributes["x"].int_value = 3
    await DataPlane(root, root.trees).publish([(event, b"", below)])
    (frame, _), = root.links[relay.id].frames
    received = rpb.RelayFrame.FromString(b"".join(frame.data(1)))  # as the relay's stream parses it
    node = FakeNode(relay, members)
    plane = DataPlane(node, node.trees)
    acks = []
    plane.receive(received, lambda: acks.append(1))
    plane.receive(received, lambda: acks.append(2))
    assert node.delivered == [event]
    children = {by_key[c].id for c in tree.children[relay.address]}
    assert {p: len(link.frames) for p, link in node.links.items()} == {c: 1 for c in children}
    forwarded = [m for link in node.links.values() for f, _ in link.frames for m in f.messages]
    assert {m.encoded_event for m in forwarded} == {received.messages[0].encoded_event}
    assert sorted(d for m in forwarded for d in m.destinations) == sorted(set(below) - {relay.id})
    dead_key = next(c for c in tree.children[relay.address] if tree.children[c])
    dead = by_key[dead_key]
    node.trees.update([m for m in members if m.id != dead.id], dead=[dead.id])  # DEAD: parked, not waited for
    node.links.pop(dead.id).settle(False)
    await asyncio.sleep(0)
    rerouted = {d for link in node.links.values() for f, _ in link.frames[1:] for m in f.messages
                for d in m.destinations}
    assert rerouted == {by_key[k].id for k in tree.subtree(dead_key)} - {dead.id}
    assert acks == []  # the subtree does not hold it yet
    for link in node.links.values():
        link.settle(True)
    await asyncio.sleep(0)
    assert sorted(acks) == [1, 2]


async def test_a_later_copy_for_more_destinations_goes_only_to_them_and_its_ack_waits_for_every_copy():
    """Messages of one frame share a hold per destination set (holds.py). A second copy of
    one of them naming more destinations (a path update upstream) is forwarded only to
    those the first did not cover; its ack, and a third copy's, waits for the first copy's
    frames and the second's; the other messages of the first frame are not forwarded again."""
    from echelon.dataplane.dissemination import DataPlane

    members = view(PAPER)
    relay, tree, by_key = relay_with_grandchildren(members)
    children = [c for c in tree.children[relay.address]]
    first_part = [by_key[k].id for k in tree.subtree(children[0])]
    every = [by_key[k].id for k in tree.subtree(relay.address) if k != relay.address]
    events = [pb.Event(id=pb.MessageId(producer_id="p", sequence=i), topic="t", publish_time_unix_nanos=7)
              for i in (1, 2)]

    def frame(dests, events):
        return rpb.RelayFrame(source=members[0].id, source_key=members[0].address, messages=[
            rpb.RelayMessage(encoded_event=e.SerializeToString(), destinations=dests) for e in events])

    node = FakeNode(relay, members)
    plane = DataPlane(node, node.trees)
    acks = []
    plane.receive(frame(first_part, events), lambda: acks.append(1))
    sent = {p: len(link.frames) for p, link in node.links.items()}
    assert sum(sent.values()) == 1  # both messages in one frame to the first child
    plane.receive(frame(every, events[:1]), lambda: acks.append(2))
    plane.receive(frame(every, events[:1]), lambda: acks.append(3))  # nothing left to forward
    later = [(p, f) for p, link in node.links.items() for f, _ in link.frames[sent.get(p, 0):]]
    assert sorted(d for _, f in later for m in f.messages for d in m.destinations) == \
        sorted(set(every) - set(first_part))
    assert {m.encoded_event for _, f in later for m in f.messages} == {events[0].SerializeToString()}
    for p, link in node.links.items():  # the later copies' frames acknowledged first
        for f, future in link.frames[sent.get(p, 0):]:
            future.set_result(True)
    await asyncio.sleep(0)
    assert acks == []  # the first copy's subtree does not hold it yet
    for link in node.links.values():
        link.settle(True)
    await asyncio.sleep(0)
    assert sorted(acks) == [1, 2, 3]


def test_a_relay_forgets_its_oldest_settled_holds_past_the_bound_and_keeps_those_in_flight(monkeypatch):
    """Past MAX_HOLDS (and a sixteenth more) the oldest settled holds go, down to the bound;
    a hold still in flight is never forgotten, nor anything after it."""
    from echelon.dataplane import dissemination as dataplane

    monkeypatch.setattr(dataplane, "MAX_HOLDS", 64)
    members = view(PAPER)
    node = FakeNode(members[1], members)
    plane = dataplane.DataPlane(node, node.trees)
    holds = [plane._hold(("a0", i)) for i in range(68)]
    assert len(plane.holds) == 68  # within the slack: nothing forgotten yet
    holds.append(plane._hold(("a0", 68)))
    assert list(plane.holds) == [("a0", i) for i in range(5, 69)]  # the oldest 5 gone, down to 64
    assert plane._hold(("a0", 5)) is holds[5] and plane._hold(("a0", 0)) is not holds[0]  # remembered, forgotten
    holds[10].pending = 1  # in flight
    for i in range(69, 100):
        plane._hold(("a0", i))
    # 5..9 went; 10 stays, and so does everything after it (past the slack: bounded by the windows)
    assert list(plane.holds) == [("a0", i) for i in range(10, 69)] + [("a0", 0)] + [("a0", i) for i in range(69, 100)]
    assert plane.holds[("a0", 10)] is holds[10]


async def test_a_copy_for_its_receiver_alone_names_it_and_one_naming_none_is_delivered_there():
    """The last hop of a whole message still names its one destination, the receiver
    (agents of earlier releases drop a message that names none: relay.proto); a receiver
    reads a message naming none as its own, delivers it and forwards nothing."""
    from echelon.dataplane.dissemination import DataPlane

    members = view(PAPER)
    tree = lbdd.build_tree(PAPER[0], PAPER[1:])
    by_key = {m.address: m for m in members}
    child = by_key[tree.children[PAPER[0]][0]]
    root = FakeNode(members[0], members)
    event = pb.Event(id=pb.MessageId(producer_id="p", sequence=1), topic="t", publish_time_unix_nanos=7)
    event.attributes["x"].int_value = 3
    await DataPlane(root, root.trees).publish([(event, b"", [child.id])])
    (frame, _), = root.links[child.id].frames
    wire = rpb.RelayFrame.FromString(b"".join(frame.data(1)))  # as the child's stream parses it
    (msg,) = wire.messages
    assert msg.encoded_event and list(msg.destinations) == [child.id]
    del msg.destinations[:]  # as a later release may send it
    node = FakeNode(child, members)
    acks = []
    DataPlane(node, node.trees).receive(wire, lambda: acks.append(1))
    await asyncio.sleep(0)
    assert node.delivered == [event] and not node.links and acks == [1]
