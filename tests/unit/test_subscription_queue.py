"""A subscription's queue (agent/subscriptions.py) in bulk: a frame's events offered in one
call, deliveries taken many at a time, acks cumulative by id range. Random offers, takes
and acks against a plain model of the rules (owed from the subscription's creation on, the
backlog bound, credits, consecutive ids, a sliced payload taken alone, `through` up to the
ids given), one step at a time."""

from __future__ import annotations

import random

from echelon.dataplane.slices import ChunkStream
from echelon.agent.subscriptions import CLOCK_SKEW_NS, Subscription
from echelon.contract.filters import parse
from echelon.v1 import common_pb2 as pb


def _event(seq: int, t: int) -> pb.Event:
    return pb.Event(id=pb.MessageId(producer_id="p", sequence=seq), topic="t", publish_time_unix_nanos=t)


def test_offers_takes_and_acks_follow_the_model():
    rnd = random.Random(7)
    for trial in range(60):
        bound = rnd.choice([5, 40, 10**6])
        sub = Subscription("a/s", "s", "t", parse(""), bound, evict=True)  # lagging: test_backpressure.py
        sub.attach(rnd.randint(0, 20))
        floor = sub.created_ns - CLOCK_SKEW_NS
        backlog: list[tuple[int, bool]] = []  # the model: (sequence, sliced)
        unacked: dict[int, int] = {}
        credits, next_id, seq = sub.credits, 1, 0
        for step in range(80):
            op = rnd.random()
            if op < 0.4 and not sub.overflowed:
                frame = []
                for _ in range(rnd.choice([1, 3, 30])):
                    seq += 1
                    frame.append(_event(seq, rnd.choice([0, floor - 1, floor, floor + 5])))
                n = sub.offer_many(frame, [b""] * len(frame))
                owed = [e.id.sequence for e in frame if not e.publish_time_unix_nanos or
                        e.publish_time_unix_nanos >= floor]
                room = bound - len(backlog) - len(unacked)
                backlog += [(s, False) for s in owed[:max(room, 0)]]
                assert n == (None if len(owed) > room else len(owed)) and sub.overflowed == (len(owed) > room)
            elif op < 0.5 and not sub.overflowed and len(backlog) + len(unacked) < bound:
                seq += 1
                assert sub.offer(_event(seq, 0), ChunkStream(10, lambda reason: None))
                backlog.append((seq, True))
            elif op < 0.8:
                most = rnd.choice([1, 2, 7, 256])
                taken = sub.take(most)
                want = []
                while credits and backlog and len(want) < most:
                    if want and (want[0][1] or backlog[0][1]):
                        break
                    want.append(backlog.pop(0))
                    credits -= 1
                assert [p.event.id.sequence for _, p in taken] == [s for s, _ in want], (trial, step)
                assert [i for i, _ in taken] == list(range(next_id, next_id + len(want)))
                unacked.update(zip(range(next_id, next_id + len(want)), (s for s, _ in want)))
                next_id += len(want)
            else:
                ids = rnd.sample(sorted(unacked), min(len(unacked), rnd.randint(0, 3)))
                through = rnd.choice([0, 0, rnd.randint(0, next_id + 2), 2**63])
                gone = {i for i in unacked if i <= through} | set(ids)
                assert sub.ack(ids, 2, through) == len(gone)
                unacked = {i: s for i, s in unacked.items() if i not in gone}
                credits += 2
            assert [p.event.id.sequence for p in sub.backlog] == [s for s, _ in backlog], (trial, step)
            assert {i: p.event.id.sequence for i, p in sub.unacked.items()} == unacked
            assert sub.credits == credits


def test_a_cumulative_ack_covers_each_id_once():
    """Ids acked through `through` are forgotten for good: a later `through` starts above
    them, a redelivered event has a new id, and a `through` past every id given stops there."""
    sub = Subscription("a/s", "s", "t", parse(""), 100)
    sub.attach(10)
    sub.offer_many([_event(i, 0) for i in range(1, 6)], [b""] * 5)
    assert [i for i, _ in sub.take(3)] == [1, 2, 3]
    assert sub.ack([], 0, through=2) == 2 and list(sub.unacked) == [3]
    assert sub.ack([], 0, through=2**63) == 1 and not sub.unacked
    assert [i for i, _ in sub.take(5)] == [4, 5]  # ids above the huge `through`: still owed
    sub.detach()
    sub.attach(10)
    assert [(i, p.redeliveries) for i, p in sub.take(5)] == [(6, 1), (7, 1)]
    assert sub.ack([], 0, through=5) == 0 and sub.ack([], 0, through=7) == 2


def test_the_frames_oldest_time_changes_nothing_offered():
    """`offer_many(..., oldest)` (the frame's earliest publish time, read once for all its
    subscriptions: agent/delivery.py) queues exactly what reading each event's time does:
    the same events owed, the same redeliveries after a restore, the same sizes."""
    rnd = random.Random(11)
    for trial in range(300):
        subs = [Subscription("a/s", "s", "t", parse(""), 10**6) for _ in range(2)]
        floor = subs[0].created_ns - CLOCK_SKEW_NS
        restored = rnd.choice([0, 0, floor + 3])
        for sub in subs:
            sub.created_ns = subs[0].created_ns
            sub.restored_ns = restored
            sub.attach(10**6)
        times = rnd.choice([[floor, floor + 5, floor + 9], [0, floor + 5], [floor - 1, floor + 2, floor + 4],
                            [floor + 1, floor + 1]])
        frame = [_event(i + 1, rnd.choice(times)) for i in range(rnd.randint(1, 20))]
        data = [rnd.choice([b"", e.SerializeToString()]) for e in frame]
        oldest = min(e.publish_time_unix_nanos for e in frame)
        assert subs[0].offer_many(frame, data) == subs[1].offer_many(frame, data, None, oldest), trial
        got = [[(p.event.id.sequence, p.redeliveries, p.size, p.data) for p in s.backlog] for s in subs]
        assert got[0] == got[1], trial
        assert subs[0].held_bytes == subs[1].held_bytes
