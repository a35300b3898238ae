"""A publisher's acks to results (client/results.py): each ack lands on its event by its
sequence's offset in its run, whatever the order, repeats or strays among the acks, as an
independent oracle (a dict from sequence to outcome) says; a run is settled once all its
events are, unacknowledged events are resent in order, and a failure settles the rest."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from echelon.client import errors
from echelon.client.results import Pending, PublishResult
from echelon.v1 import pubsub_pb2 as ppb


def ack(seq: int, code: int = 0) -> ppb.PublishAck:
    return ppb.PublishAck(producer_id="p", sequence=seq, destinations=seq % 3, duplicate=seq % 5 == 0, code=code,
                          error=f"refused {seq}" if code else "")


def outcome_of(a: ppb.PublishAck):
    """The oracle's outcome of one ack."""
    return ("error", a.sequence) if a.code else PublishResult("p", a.sequence, a.destinations, a.duplicate)


def seen(x):
    return ("error", int(str(x).rsplit(" ", 1)[-1])) if isinstance(x, errors.EchelonError) else x


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 6), min_size=1, max_size=8), data=st.data())
def test_acks_in_any_order_with_repeats_and_strays_land_on_their_events(sizes, data):
    async def run():
        pending = Pending("p")
        calls, seq, lone = [], 1, set()  # (first sequence, events, future); lone: the first sequences of publish()es
        for n in sizes:  # 0: a lone publish() (runs of them share a run), else a publish_batch of n
            if n == 0:
                calls.append((seq, 1, pending.one(seq, f"req{seq}")))
                lone.add(seq)
                seq += 1
            else:
                calls.append((seq, n, pending.batch(seq, [f"req{s}" for s in range(seq, seq + n)])))
                seq += n
        total = seq - 1
        order = data.draw(st.lists(st.integers(0, total + 2), max_size=3 * total))  # 0 and past the end: strays
        refused = data.draw(st.sets(st.integers(1, total)))
        oracle: dict[int, object] = {}
        for chunk_start in range(0, len(order), 4):  # replies of up to 4 acks
            reply = [ack(s, 3 if s in refused else 0) for s in order[chunk_start:chunk_start + 4]]
            for a in reply:
                if 1 <= a.sequence <= total and a.sequence not in oracle:
                    oracle[a.sequence] = outcome_of(a)
            pending.acked([ppb.PublishAck.FromString(a.SerializeToString()) for a in reply])
        for first, n, future in calls:
            events = range(first, first + n)
            if first in lone:  # settled at its own ack
                assert future.done() == (first in oracle)
                if future.done():
                    assert seen(future.exception() or future.result()) == oracle[first]
            else:
                assert future.done() == all(s in oracle for s in events)
                if future.done():
                    assert [seen(x) for x in future.result()] == [oracle[s] for s in events]
        assert list(pending.unacked()) == [f"req{s}" for s in range(1, total + 1) if s not in oracle]
        pending.fail(errors.Unavailable("gone 0"))
        assert all(future.done() for _, _, future in calls) and not pending
        assert list(pending.unacked()) == []
        for first, n, future in calls:
            got = [future.exception() or future.result()] if first in lone else future.result()
            assert [seen(x) for x in got] == [oracle.get(s, ("error", 0)) for s in range(first, first + n)]

    asyncio.run(run())


async def test_a_failure_keeps_what_was_acked_and_settles_the_rest_with_it():
    pending = Pending("p")
    batch = pending.batch(1, ["a", "b", "c"])
    lone = [pending.one(4, "d"), pending.one(5, "e")]
    pending.acked([ack(1), ack(5)])
    assert pending.futures() == [batch, *lone] and not batch.done() and lone[1].result().sequence == 5
    gone = errors.Unavailable("gone")
    pending.fail(gone)
    assert batch.result() == [PublishResult("p", 1, 1, False), gone, gone]
    assert lone[0].exception() is gone and lone[1].result() == PublishResult("p", 5, 2, True)
