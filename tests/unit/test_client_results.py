"""A publisher's acks to results (client/results.py): each ack lands on its event by its
sequence's offset in its run, whatever the order, repeats or strays among the acks, as an
independent oracle (a dict from sequence to outcome) says; a run is settled once all its
events are, unacknowledged events are resent in order, and a failure settles the rest."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from echelon.client import errors
from echelon.client.results import Pending, PublishResult, Run
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
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=6), data=st.data())
def test_acks_in_any_order_with_repeats_and_strays_land_on_their_events(sizes, data):
    async def run():
        pending = Pending("p")
        runs, seq = [], 1
        for n in sizes:  # a publish() is a run of one, a publish_batch a run of n
            runs.append(Run(seq, [f"req{s}" for s in range(seq, seq + n)], single=n == 1))
            pending.add(runs[-1])
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
        for r in runs:
            events = range(r.first, r.first + len(r.requests))
            assert r.future.done() == all(s in oracle for s in events)
            if r.future.done():
                if r.single:
                    got = [seen(r.future.exception() or r.future.result())]
                else:
                    got = [seen(x) for x in r.future.result()]
                assert got == [oracle[s] for s in events]
        assert list(pending.unacked()) == [f"req{s}" for s in range(1, total + 1) if s not in oracle]
        pending.fail(errors.Unavailable("gone 0"))
        assert all(r.future.done() for r in runs) and not pending
        for r in runs:
            got = [r.future.exception() or r.future.result()] if r.single else r.future.result()
            assert [seen(x) for x in got] == [oracle.get(s, ("error", 0)) for s in range(r.first, r.first + len(got))]
        assert list(pending.unacked()) == []

    asyncio.run(run())


async def test_a_failure_keeps_what_was_acked_and_settles_the_rest_with_it():
    pending = Pending("p")
    batch = Run(1, ["a", "b", "c"], single=False)
    lone = Run(4, ["d"], single=True)
    pending.add(batch)
    pending.add(lone)
    pending.acked([ack(1)])
    assert pending.futures() == [batch.future, lone.future] and not batch.future.done()
    gone = errors.Unavailable("gone")
    pending.fail(gone)
    assert batch.future.result() == [PublishResult("p", 1, 1, False), gone, gone]
    assert lone.future.exception() is gone
