"""The publisher's outbox (client/outbox.py): events encoded into the open batch, what
the writer takes when it is ready (a batch closed then, a lone event as itself, slices
alone in their place), a refused event or a publish_batch rolled back leaving exactly what
was there, and a resend reproducing the same requests."""

from __future__ import annotations

import asyncio
import gc

import pytest

from echelon.client import errors
from echelon.client.outbox import MAX_BATCH_EVENTS, SLICE_BYTES, Outbox
from echelon.v1 import pubsub_pb2 as ppb


async def take(outbox: Outbox) -> list[ppb.PublishRequest]:
    """What the writer takes now (the outbox ended so that it returns), parsed."""
    outbox.end()
    return [ppb.PublishRequest.FromString(r) async for r in outbox.requests()]


def events_of(requests: list[ppb.PublishRequest]) -> list[tuple[int, int, int]]:
    """(sequence, n, slice index) of every event request, in stream order."""
    return [(e.sequence, e.attributes["n"].int_value if "n" in e.attributes else -1, e.slice_index)
            for r in requests for e in (r.batch or [r])]


async def test_the_writer_takes_batches_closed_when_it_is_ready_a_lone_event_as_itself():
    outbox = Outbox("p", ppb.ACK_LEVEL_DELIVERED)
    outbox.add("t", {"n": 0}, b"", "", 1)
    (lone,) = await take(outbox)
    assert (lone.producer_id, lone.ack_level, lone.coalesce_acks, lone.sequence, not lone.batch) == (
        "p", ppb.ACK_LEVEL_DELIVERED, True, 1, True)
    outbox = Outbox("p", ppb.ACK_LEVEL_ACCEPTED)
    for i in range(MAX_BATCH_EVENTS + 3):
        outbox.add("t", {"n": i}, b"x", "k", i + 1)
    outbox.add("t", {"n": -5}, b"s" * (SLICE_BYTES + 1), "k", MAX_BATCH_EVENTS + 4)
    outbox.add("t", {"n": 9}, b"", "k", MAX_BATCH_EVENTS + 5)
    requests = await take(outbox)
    assert [len(r.batch) for r in requests] == [MAX_BATCH_EVENTS, 3, 0, 0, 0]  # two slices, then a lone event
    assert all(r.producer_id == "p" and r.coalesce_acks for r in requests)
    assert [(r.slice_index, r.slice_count, r.payload_size) for r in requests[2:4]] == [(0, 2, SLICE_BYTES + 1),
                                                                                      (1, 2, SLICE_BYTES + 1)]
    assert events_of(requests) == [(i + 1, i, 0) for i in range(MAX_BATCH_EVENTS + 3)] + [
        (MAX_BATCH_EVENTS + 4, -5, 0), (MAX_BATCH_EVENTS + 4, -1, 1), (MAX_BATCH_EVENTS + 5, 9, 0)]


async def test_a_refused_value_or_a_rolled_back_batch_leaves_exactly_what_was_queued():
    outbox = Outbox("p", ppb.ACK_LEVEL_DELIVERED)
    with pytest.raises(errors.InvalidArgument):
        outbox.add("t", {"n": object()}, b"", "", 1)
    assert not outbox.open
    outbox.add("t", {"n": 1}, b"", "", 1)
    mark = outbox.mark()
    for i in range(MAX_BATCH_EVENTS + 10):  # past one batch: a second one opened
        outbox.add("t", {"n": 100 + i}, b"", "", 2 + i)
    outbox.add("t", {"n": 7}, b"s" * (SLICE_BYTES + 1), "", 9999)
    with pytest.raises(errors.InvalidArgument):
        outbox.add("t", {"n": [1]}, b"", "", 10000)
    outbox.rollback(mark)
    outbox.add("t", {"n": 2}, b"", "", 2)
    assert events_of(await take(outbox)) == [(1, 1, 0), (2, 2, 0)]


async def test_a_resend_reproduces_the_requests_and_the_writer_waits_for_events():
    first = Outbox("p", ppb.ACK_LEVEL_DELIVERED)
    kept = [first.add("t", {"n": i}, b"x" * i, "k", i + 1) for i in range(3)]
    kept.append(first.add("t", {"n": 3}, b"s" * (SLICE_BYTES + 1), "k", 4))
    sent = await take(first)
    again = Outbox("p", ppb.ACK_LEVEL_DELIVERED)
    writer = again.requests()
    waiting = asyncio.ensure_future(writer.__anext__())
    await asyncio.sleep(0.01)
    assert not waiting.done()  # nothing queued: the writer waits, no request
    for requests in kept:
        again.again(requests)
    resent = [await waiting]
    again.end()
    resent = [ppb.PublishRequest.FromString(r) for r in resent + [r async for r in writer]]
    assert events_of(resent) == events_of(sent)
    assert [e.payload for r in resent for e in (r.batch or [r])] == [e.payload for r in sent for e in (r.batch or [r])]


async def test_a_writer_dropped_while_it_waits_logs_nothing_of_ours():
    """gRPC drops its request task when a call ends under it: the writer, waiting for
    events, is then collected with it. An async generator would be finalized by an aclose()
    that fails ("already running"), logged as an exception nobody retrieved."""
    loop = asyncio.get_running_loop()
    logged = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: logged.append(context))
    try:
        outbox = Outbox("p", ppb.ACK_LEVEL_ACCEPTED)
        waiting = asyncio.ensure_future(outbox.requests().__anext__())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        del outbox, waiting  # dropped while pending, as gRPC drops it
        for _ in range(3):
            gc.collect()
            await asyncio.sleep(0.01)
    finally:
        loop.set_exception_handler(previous)
    ours = [c for c in logged if "Task was destroyed" not in c.get("message", "")]
    assert ours == []
