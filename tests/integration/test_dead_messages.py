"""Dead messages (client/deadlines.py) on a real cluster: a message not settled within its
ack deadline comes back; `in_progress()` holds it; `term()` ends it for good; a message
delivered `max_deliveries` times goes to the dead-letter topic with its delivery count,
and the application never sees it again."""

from __future__ import annotations

import asyncio

import pytest

from echelon.client import AckLevel, errors
from tests.harness import wait_for

pytestmark = pytest.mark.asyncio


async def client_of_t(cluster):
    c = cluster.client(1)
    await c.create_topic("t")
    return c


async def published(cluster, topic: str, events: list[dict]) -> None:
    async with cluster.client(0).publisher(ack_level=AckLevel.DELIVERED) as pub:
        await pub.publish_batch(topic, events)


async def test_past_its_ack_deadline_a_message_comes_back_and_the_late_ack_does_nothing(cluster):
    c = await client_of_t(cluster)
    async with c.subscribe("t", "", name="slow", ack_deadline=0.5) as sub:
        await published(cluster, "t", [{"n": 1}])
        first = await sub.next(timeout=10)
        assert first.redelivery_count == 0
        again = await sub.next(timeout=10)  # not settled: the deadline gave it back
        assert (again.attributes, again.redelivery_count, sub.expired) == ({"n": 1}, 1, 1)
        assert first.settled
        await first.ack()  # too late: nothing happens
        await again.ack()
        with pytest.raises(errors.Timeout):
            await sub.next(timeout=1.5)  # acked: it does not come back


async def test_in_progress_holds_the_message_past_its_deadline(cluster):
    c = await client_of_t(cluster)
    async with c.subscribe("t", "", name="long", ack_deadline=1.0) as sub:
        await published(cluster, "t", [{"n": 1}])
        m = await sub.next(timeout=10)
        for _ in range(8):  # four deadlines' worth of work, reported every half deadline
            await m.in_progress()
            await asyncio.sleep(0.5)
        assert sub.expired == 0 and not m.settled
        await m.ack()
        with pytest.raises(errors.Timeout):
            await sub.next(timeout=1.5)


async def test_term_ends_a_poison_message_for_good(cluster):
    c = await client_of_t(cluster)
    async with c.subscribe("t", "", name="poison") as sub:
        await published(cluster, "t", [{"n": 1}, {"n": 2}])
        bad = await sub.next(timeout=10)
        await bad.term()
        good = await sub.next(timeout=10)
        await good.ack()
        assert sub.terminated == 1
        with pytest.raises(errors.Timeout):
            await sub.next(timeout=1.5)


async def test_past_max_deliveries_the_message_goes_to_the_dead_letter_topic(cluster):
    c = cluster.client(1)
    await c.create_topic("jobs", ["n:int"])
    await c.create_topic("jobs.dead")  # any attributes: the event's, and the dead-letter ones
    async with c.subscribe("jobs.dead", "") as dead, \
            c.subscribe("jobs", "", name="worker", max_deliveries=2, dead_letter_topic="jobs.dead") as sub:
        await asyncio.sleep(0.3)  # the registrations reach the matcher
        await published(cluster, "jobs", [{"n": 7}])
        counts = []
        for _ in range(2):  # delivered twice, nacked twice
            m = await sub.next(timeout=10)
            counts.append(m.redelivery_count)
            await m.nack()
        assert counts == [0, 1]
        letter = await dead.next(timeout=10)
        assert letter.attributes == {"n": 7, "dead_letter_deliveries": 2, "dead_letter_subscription": "worker"}
        await letter.ack()
        with pytest.raises(errors.Timeout):
            await sub.next(timeout=1.5)  # the application never sees it a third time
        await wait_for(lambda: sub.dead_lettered == 1, what="counted")


async def test_bad_dead_message_options_are_refused(cluster):
    c = cluster.client(1)
    with pytest.raises(errors.InvalidArgument, match="dead_letter_topic"):
        c.subscribe("t", "", max_deliveries=3)
    with pytest.raises(errors.InvalidArgument, match="ack_deadline"):
        c.subscribe("t", "", ack_deadline=-1)
