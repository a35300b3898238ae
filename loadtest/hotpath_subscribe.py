"""The subscribing side's pieces of `loadtest.bench_hotpath` (listed in hotpath_pieces.py):
a relay frame received, local delivery, the shared stream, a subscription's queue, the SDK's
receive path, the GC."""

from __future__ import annotations

import time

from hotpath_inputs import best, frame_for_leaf, relay_plane, workload_events


def deliver_piece(sel: int, frame: int) -> float:
    from prometheus_client import CollectorRegistry

    from echelon.agent.delivery import LocalDelivery
    from echelon.agent.metrics import AgentMetrics
    from echelon.agent.subscriptions import Subscription
    from echelon.core.dedup import DedupWindow
    from echelon.contract.filters import parse
    from echelon.contract.wire import attributes_to_pb
    from echelon.v1 import common_pb2 as pb
    from loadtest.bench_events.workload import subscriptions

    subs = {}
    for s in subscriptions(sel, 50):
        if s.index % 3 == 0:  # one subscribing agent's share of the 50
            sub = Subscription(f"a/{s.index}", f"~{s.index}", "bench", parse(s.echelon_filter()), 1 << 30)
            sub.attach(1 << 30)
            subs[sub.name] = sub
    d = LocalDelivery(lambda: subs, AgentMetrics(CollectorRegistry()), lambda s: None)
    now = time.time_ns()
    encoded = [pb.Event(id=pb.MessageId(producer_id="p", sequence=i + 1), topic="bench", attributes=attributes_to_pb(a),
                        publish_time_unix_nanos=now).SerializeToString() for i, a in enumerate(workload_events(frame))]
    events = list(map(pb.Event.FromString, encoded))
    many = getattr(d, "deliver_many", None)

    def once():
        d.dedup = DedupWindow()
        if many is not None:
            many(events, encoded)  # as a relay frame's events come: with the bytes they came in
        else:
            for e in events:
                d.deliver(e)
        for sub in subs.values():
            sub.backlog.clear()

    return best(once, frame, number=max(5, 2000 // frame))


def relay_receive_piece() -> float:
    """A frame of 170 events for a child of the root alone (a leaf's work), as this
    tree's root builds it."""
    frame, child = frame_for_leaf(170)
    leaf, _ = relay_plane(child, lambda events, *encoded: len(events))  # holds none: the frame is all for it
    acks = []

    def once():
        leaf.receive(frame, lambda: acks.append(1))

    return best(once, len(frame.messages))


def _subscriber_agent(sel: int, n: int):
    """A subscribing agent's data plane and local delivery (17 subscriptions of the 50, all on
    one shared stream of a client that reads encoded events), and `once()`: one frame of `n`
    events through it, returning the Delivery messages serialized."""
    from collections import deque
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from echelon.agent.delivery import LocalDelivery
    from echelon.agent.metrics import AgentMetrics
    from echelon.agent.shared_stream import SharedStream
    from echelon.agent.subscriptions import Subscription
    from echelon.core.dedup import DedupWindow
    from echelon.contract.filters import parse
    from echelon.contract.wire import varint
    from echelon.v1 import relay_pb2 as rpb
    from loadtest.bench_events.workload import subscriptions

    frame, child = frame_for_leaf(n)
    wire = frame.SerializeToString()
    subs = {}
    for s in subscriptions(sel, 50):
        if s.index % 3 == int(child[-1]) % 3:
            sub = Subscription(f"{child}/{s.index}", f"~{s.index}", "bench", parse(s.echelon_filter()), 1 << 30)
            sub.attach(1 << 30)
            subs[sub.name] = sub
    metrics = AgentMetrics(CollectorRegistry())
    delivery = LocalDelivery(lambda: subs, metrics, lambda s: None)
    leaf, _ = relay_plane(child, delivery.deliver_many)
    stream = SharedStream.__new__(SharedStream)  # its writer's part alone: no gRPC stream under it
    stream.node, stream.max_deliveries, stream.statuses, stream._turn = SimpleNamespace(metrics=metrics), 256, deque(), 0
    stream.metrics = metrics  # where this tree reads it (an older one: node.metrics)
    stream.encoded, stream._counted, stream._named = True, {}, {}  # a tree without them ignores them
    stream.subs = {i + 1: s for i, s in enumerate(subs.values())}

    def once() -> list[bytes]:
        delivery.dedup = leaf.node.dedup = DedupWindow()
        leaf.receive(rpb.RelayFrame.FromString(wire), lambda: None)
        out = []
        while True:  # as each tree's serve: this one stops at a message not full, an older one at an empty one
            filled = stream._fill()
            message = filled[0]
            if isinstance(message, list):  # each delivery's bytes, as this tree's serve sends them
                n = len(message)
                if n:
                    out.append(message[0] if n == 1 else b"".join(
                        [b"\xa2\x01" + varint(len(e)) + e for e in message]))  # Delivery.batch
            else:
                n = len(message.batch)
                if n:
                    out.append(message.SerializeToString())
            if not n or (len(filled) == 3 and not filled[2]):
                for sub in subs.values():
                    sub.unacked.clear()  # as if acked: the next round starts alike
                return out

    return once, len(frame.messages)


def subscriber_agent_piece(sel: int, n: int) -> float:
    once, events = _subscriber_agent(sel, n)
    return best(once, events, number=max(5, 2000 // events))


def subscriber_sdk_piece(sel: int) -> float:
    """The Delivery messages of `_subscriber_agent` (this tree's agent made them) through this
    tree's client: each subscription's part into its inbox, handed out, payload read, acked."""
    import asyncio

    from echelon.client.client import Client
    from echelon.client.subscription import Subscription
    from echelon.v1 import pubsub_pb2 as ppb

    once, _ = _subscriber_agent(sel, 170)
    wires = once()
    loop = asyncio.new_event_loop()

    async def written(requests):
        return None

    async def setup():
        client = Client("127.0.0.1:1")  # never dialled
        subs = {}
        for sid in range(1, 18):
            sub = subs[sid] = Subscription(client, "bench", "", "", 1 << 20, None)
            sub._state = "open"
            sub.settlements.flusher._write = written
        return subs

    subs = loop.run_until_complete(setup())
    read = getattr(ppb, "DeliveryRead", ppb.Delivery).FromString  # as this tree's client reads them
    deliveries = sum(len(read(w).batch) or 1 for w in wires)

    async def receive():
        for w in wires:
            message = read(w)
            by_sub: dict[int, list] = {}
            for d in message.batch or (message,):
                by_sub.setdefault(d.sid, []).append(d)
            for sid, ds in by_sub.items():
                subs[sid]._receive(ds)
        for sub in subs.values():
            while sub._inbox:
                batch = sub._hand(256)
                for m in batch:
                    m.payload
                await sub.ack(batch)
        for sub in subs.values():
            sub.settlements.cancel()

    try:
        return best(lambda: loop.run_until_complete(receive()), deliveries)
    finally:
        loop.close()


def queue_piece() -> float:
    """One subscription's queue per delivery: 256 relayed events offered, taken in one go
    and acked cumulatively by a client that keeps 768 out (the settled ids and the credits
    back in one ack, as client/acks.py sends them)."""
    from echelon.agent.subscriptions import Subscription
    from echelon.contract.filters import parse
    from echelon.v1 import common_pb2 as pb

    sub = Subscription("a/s", "~s", "bench", parse(""), 1 << 30)
    sub.attach(1024)
    event = pb.Event(id=pb.MessageId(producer_id="p", sequence=1), topic="bench")
    data = event.SerializeToString()

    many = getattr(sub, "offer_many", None)  # a frame's events in one call, where the tree has it

    def once():
        if many is not None:
            many([event] * 256, [data] * 256)
        else:
            for e in [event] * 256:
                sub.offer(e, data=data)
        taken = sub.take(256)
        if len(sub.unacked) > 768:
            sub.ack((), 256, taken[0][0] - 768)

    for _ in range(4):
        once()
    return best(once, 256)


def subscriber_tasks_piece(sel: int) -> float:
    """The client's whole receive path as an application runs it: the Delivery messages of
    `_subscriber_agent` (a frame of 170 events) read by the shared stream's reader task,
    which hands each subscription its part; 17 tasks each in `async for batch in
    sub.batches()` (as loadtest.bench_events), woken, reading every payload and acking the
    batch; the settlements written to a stream that takes them (per delivery)."""
    import asyncio

    from echelon.client.acks import Flusher
    from echelon.client.client import Client
    from echelon.client.shared import SharedStream
    from echelon.client.subscription import Subscription
    from echelon.v1 import pubsub_pb2 as ppb

    once, _ = _subscriber_agent(sel, 170)
    wires = once()
    read = getattr(ppb, "DeliveryRead", ppb.Delivery).FromString
    deliveries = sum(len(read(w).batch) or 1 for w in wires)
    loop = asyncio.new_event_loop()
    state = {"left": 0, "done": None, "feed": None}

    class Call:  # the Subscribe call: each round's messages, parsed as gRPC parses them
        def __aiter__(self):
            return self._messages()

        async def _messages(self):
            while True:
                state["feed"] = loop.create_future()
                for w in await state["feed"]:
                    yield read(w)

    async def written(requests):
        return None

    async def drain(sub):
        async for batch in sub.batches():
            for m in batch:
                m.payload
            await sub.ack(batch)
            state["left"] -= len(batch)
            if state["left"] <= 0:
                state["done"].set_result(None)

    async def setup():
        client = Client("127.0.0.1:1")  # never dialled
        stream = SharedStream.__new__(SharedStream)
        stream.conn, stream.call, stream.subs, stream.opening, stream.messages = client._conn, Call(), {}, {}, 0
        stream._closing, stream._lock, stream.flusher = False, asyncio.Lock(), Flusher(written)
        client._shared_stream = stream
        tasks = []
        for sid in range(1, 18):
            sub = stream.subs[sid] = Subscription(client._conn, "bench", "", "", 1 << 20, None)
            sub._state, sub._shared = "open", stream
            sub.settlements.flusher._write = written
            tasks.append(asyncio.create_task(drain(sub)))
        tasks.append(asyncio.create_task(stream._read()))
        await asyncio.sleep(0)
        return tasks

    tasks = loop.run_until_complete(setup())

    async def receive():
        state["left"], state["done"] = deliveries, loop.create_future()
        state["feed"].set_result(wires)
        await state["done"]

    try:
        return best(lambda: loop.run_until_complete(receive()), deliveries)
    finally:
        for t in tasks:
            t.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.close()


def gc_piece() -> float:
    """CPU ms of one full pass of the cyclic GC while a subscribing agent's delivery
    window holds 500,000 message ids (not per event: the pause every such pass adds)."""
    import gc

    from echelon.core.dedup import DedupWindow

    w = DedupWindow()
    for i in range(500_000):
        w.first_time(("agent-0:1:1763900000000000000", i), 1.0)
    return best(gc.collect, 1, number=1) / 1000
