"""A restarted holder taking its co-holder's copy (agent/durable/copies.py), on two real
stores and subscriptions; the co-holder's Fetch is its real `copy_of` answer, handed over
in process instead of over gRPC. The oracle: every event either holder received and no
one acked is owed by the restarted holder after the copy, whatever order the two
received them in."""

from __future__ import annotations

import time
from types import SimpleNamespace

from echelon.agent.durable.copies import copy_of, take_copy
from echelon.agent.durable.store import Store
from echelon.agent.durable.subscription import DurableSubscription
from echelon.contract.filters import parse
from echelon.contract.wire import filter_to_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import durable_pb2 as dpb
from echelon.v1 import pubsub_pb2 as ppb

NAME = "d"


def event(seq: int) -> pb.Event:
    return pb.Event(id=pb.MessageId(producer_id="p", sequence=seq), topic="t", publish_time_unix_nanos=seq)


def holder(me: str, store: Store, started_ns: int, peers: dict) -> SimpleNamespace:
    record = dpb.DurableSubscription(name=NAME, topic="t", filter=filter_to_pb(parse("")), holders=["a", "b"],
                                     options=ppb.DurableOptions(max_messages=1000, max_bytes=1 << 20))
    acks: list = []
    sub = DurableSubscription(me, record, parse(""), store, lambda s, keys: acks.extend(keys), lambda n: None)
    d = SimpleNamespace(me=me, store=store, started_ns=started_ns, subs={NAME: sub}, acks=acks)

    class Stub:
        def __init__(self, other):
            self.other = other

        async def Fetch(self, req, timeout):  # noqa: N802 - the gRPC method's name
            return copy_of(self.other, req.name)

    d.peers = SimpleNamespace(alive=lambda: {h: None for h in peers}, stub=lambda h: Stub(peers[h]))

    async def register(_sub):
        return None
    d.register = register
    return d


async def test_a_restarted_holder_keeps_what_it_received_before_its_co_holder_did(tmp_path):
    peers: dict = {}
    b = holder("b", Store(tmp_path / "b"), time.time_ns(), peers)
    peers["b"] = b
    a_store = Store(tmp_path / "a")
    old = DurableSubscription("a", b.subs[NAME].record, parse(""), a_store, lambda s, k: None, lambda n: None)
    for seq in (1, 2, 3):  # the process before the kill received 1-3; its subscriber acked 1 there
        old.offer(event(seq))
        b.subs[NAME].offer(event(seq))
    a_store.ack(NAME, "t", [("p", 1)])
    b.subs[NAME].apply_acks([("p", 1)])
    for seq in (4, 5):  # while a was down: b received them, b's subscriber acked 2 and 4
        b.subs[NAME].offer(event(seq))
    served = b.subs[NAME]
    served.attach(credits=2)
    served.take(2)
    served.ack([i for i, p in served.unacked.items() if p.event.id.sequence == 2], credits=0)
    b.subs[NAME].apply_acks([("p", 4)])

    # The restarted process: its disk, then what it receives before it syncs. It is ahead
    # of b in the tree of 6 and 7 (b has not got them when it answers); 5 came late to it
    # (parked while it was down); 3 it holds from before the kill.
    a = holder("a", a_store, time.time_ns(), peers)
    sub = a.subs[NAME]
    sub.load(a_store.backlog(NAME))
    sub.synced = False
    for seq in (6, 5, 7):
        sub.offer(event(seq))
    await take_copy(a, sub)

    assert sub.synced and not sub.arrived
    # b's order first (3 out for delivery there, then 5), then what only a had, in its order.
    assert [e.id.sequence for e in sub.owed()] == [3, 5, 6, 7]
    assert [e.id.sequence for e in a_store.backlog(NAME)] == [3, 5, 6, 7]
    for seq in (6, 7, 8):  # b receives them now; a gets 8 after the sync: owed once
        sub.offer(event(seq))
    assert [e.id.sequence for e in sub.owed()] == [3, 5, 6, 7, 8]


async def test_an_adopted_copy_is_topped_up_with_what_its_holder_received_after_it(tmp_path, monkeypatch):
    from echelon.agent.durable import copies

    monkeypatch.setattr(copies, "TOP_UP_AFTER", (0.0,))
    peers: dict = {}
    b = holder("b", Store(tmp_path / "b"), time.time_ns(), peers)
    peers["b"] = b
    for seq in (1, 2):
        b.subs[NAME].offer(event(seq))
    # a lost its disk: it adopts b's copy. 3 reached a before it held the subscription
    # (nothing here owed it) and reaches b only after the copy was taken.
    a = holder("a", Store(tmp_path / "a"), time.time_ns(), peers)
    sub = a.subs[NAME]
    sub.synced, sub.empty = False, True
    await take_copy(a, sub)
    assert [e.id.sequence for e in sub.owed()] == [1, 2]
    sub.attach(credits=1)
    [(delivery_id, _)] = sub.take(1)
    sub.ack([delivery_id], credits=0)  # a's subscriber acks 1 before b hears of it
    for seq in (3, 4):
        b.subs[NAME].offer(event(seq))
    b.subs[NAME].apply_acks([("p", 2)])  # acked while b served: a gets it with the top-up
    await sub.top_up
    assert [e.id.sequence for e in sub.owed()] == [3, 4]
    assert [e.id.sequence for e in a.store.backlog(NAME)] == [3, 4]
