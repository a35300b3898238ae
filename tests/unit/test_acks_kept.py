"""What a named subscription keeps upstream (agent/subscriptions.py, module doc): the hold a
frame's events get is released exactly when the last of them is settled (acked, shed,
nacked), or at once when the stream detaches or the subscription closes; an ephemeral
one, a detached one and the publishing agent's own delivery keep nothing. The oracle
is a count of the events still owed per frame, kept beside the subscription."""

from __future__ import annotations

import random

import pytest

from echelon.agent.subscriptions import Subscription
from echelon.contract.filters import parse
from echelon.v1 import common_pb2 as pb


def _events(first: int, n: int) -> list[pb.Event]:
    return [pb.Event(id=pb.MessageId(producer_id="p", sequence=first + i), topic="t") for i in range(n)]


def test_a_frame_is_kept_until_its_last_event_is_acked():
    rnd = random.Random(3)
    for _ in range(40):
        sub = Subscription("a/n", "n", "t", parse(""), 10**6)
        sub.attach(10**6)
        holds, owed, seq = [], {}, 1  # owed: hold index -> sequences not yet settled
        for f in range(rnd.randint(1, 8)):
            keep: list = []
            n = rnd.randint(1, 6)
            sub.offer_many(_events(seq, n), [b""] * n, keep)
            assert len(keep) == 1
            owed[len(holds)] = set(range(seq, seq + n))
            holds.append(keep[0])
            seq += n
        taken = sub.take(10**6)
        rnd.shuffle(taken)
        for delivery_id, pending in taken:
            sub.ack([delivery_id], 1)
            for i, left in owed.items():
                left.discard(pending.event.id.sequence)
            for i, hold in enumerate(holds):
                assert (hold.pending == 0) == (not owed[i]), (i, hold.pending, owed[i])
        assert sub.kept == 0


@pytest.mark.parametrize("how", ["detach", "close", "nack"])
def test_a_subscription_that_stops_consuming_keeps_nothing(how):
    sub = Subscription("a/n", "n", "t", parse(""), 10**6)
    sub.attach(3)
    keep: list = []
    sub.offer_many(_events(1, 5), [b""] * 5, keep)
    ids = [i for i, _ in sub.take(3)]
    if how == "detach":
        sub.detach()
    elif how == "close":
        sub.unkeep()  # what Registry.close does
    else:
        sub.nack(ids, 0, 5)
        assert keep[0].pending == 2  # the two still queued keep it
        sub.ack([i for i, _ in sub.take(5)], 0)
    assert keep[0].pending == 0 and sub.kept == 0
    more: list = []
    sub.offer_many(_events(6, 2), [b""] * 2, more)
    assert (more == []) == (how in ("detach",))  # detached: nothing kept for a client not there


def test_ephemeral_and_root_deliveries_keep_nothing():
    eph = Subscription("a/~1", "~1", "t", parse(""), 10**6)
    eph.attach(10)
    keep: list = []
    eph.offer_many(_events(1, 3), [b""] * 3, keep)
    named = Subscription("a/n", "n", "t", parse(""), 10**6)
    named.attach(10)
    named.offer_many(_events(1, 3), [b""] * 3, None)  # the publishing agent's own delivery
    assert keep == [] and eph.kept == 0 and named.kept == 0


def test_shedding_settles_what_it_drops():
    sub = Subscription("a/n", "n", "t", parse(""), 4)
    sub.attach(0)
    keep: list = []
    sub.offer_many(_events(1, 6), [b""] * 6, keep)
    sub.shedding = True
    sub._shed()  # noqa: SLF001 - what a stalled subscription does past its bound
    assert keep[0].pending == len(sub.backlog) == sub.kept == 3
