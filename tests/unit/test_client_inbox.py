"""A subscription's inbox (client/inbox.py) against brute force: whatever deliveries come,
whatever batches are handed out, settled in whatever order, or changed by the application
after it got them, the oldest unsettled message (what bounds the cumulative ack) and the
count of deliveries held are what a scan of every message handed out says."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from echelon.client.client import Client
from echelon.client.subscription import Subscription
from echelon.v1 import pubsub_pb2 as ppb

steps = st.lists(st.one_of(
    st.tuples(st.just("receive"), st.integers(1, 40)),
    st.tuples(st.just("hand"), st.integers(1, 30)),
    st.tuples(st.just("settle"), st.lists(st.integers(0, 10_000), max_size=25)),  # picks among handed ones
    st.tuples(st.just("mangle"), st.integers(0, 10_000)),  # the application clears one of its batches
), max_size=60)


@settings(max_examples=50, deadline=None)
@given(steps=steps)
def test_the_oldest_unsettled_and_what_is_held_match_a_scan_of_everything_handed_out(steps):
    async def run():
        client = Client("127.0.0.1:1")  # never dialled
        sub = Subscription(client._conn, "t", "", "", 1 << 20, None)
        sub._state = "open"
        sub.settlements.flusher._write = _written
        next_id, received, batches, everything = 1, 0, [], []
        for op, arg in steps:
            if op == "receive":
                sub._receive([ppb.DeliveryRead(delivery_id=i) for i in range(next_id, next_id + arg)])
                next_id += arg
                received += arg
            elif op == "hand" and sub._inbox:
                batch = sub._hand(arg)
                batches.append(batch)
                everything.extend(batch)
            elif op == "settle" and everything:
                picked = [everything[i % len(everything)] for i in arg]
                await sub.ack(picked)
            elif op == "mangle" and batches:
                batches[arg % len(batches)].clear()
            unsettled = [m.delivery_id for m in everything if not m.settled]
            assert sub._oldest() == (min(unsettled) if unsettled else None)
            assert sub._held() == received - len(everything) + len(unsettled)
        sub.settlements.cancel()
        sub.settlements.flusher.cancel()

    asyncio.run(run())


async def _written(requests):
    return None
