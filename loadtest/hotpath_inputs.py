"""What the pieces of `loadtest.bench_hotpath` share (hotpath_pieces.py): the workload's
events, the timer, and a relay data plane over fake links, as a root or a leaf sees it."""

from __future__ import annotations

import time
import timeit


def workload_events(n: int, seed: int = 3):
    import random

    from loadtest.bench_events.workload import SYMBOLS

    rnd = random.Random(seed)
    return [{"Symbol": rnd.choice(SYMBOLS), "Price": rnd.uniform(0.0, 100.0)} for _ in range(n)]


def best(fn, per: int, number: int = 20, repeat: int = 7) -> float:
    """CPU microseconds per event: the best of `repeat` timings of `number` calls of `fn`
    (each handling `per` events), in this process's CPU time (time spent waiting for a
    core on the shared machine is not counted)."""
    return min(timeit.repeat(fn, number=number, repeat=repeat, timer=time.process_time)) / number / per * 1e6


class QueueLink:
    """A relay link that queues frames (their futures settled by the piece)."""

    def __init__(self):
        self.frames = []

    def send(self, frame):
        import asyncio

        future = asyncio.get_running_loop().create_future()
        self.frames.append((frame, future))
        return future

    async def room(self):
        return None


def relay_plane(me: str, deliver):
    """A DataPlane over a view of 4 agents (agent-0 roots), links that queue frames."""
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from echelon.dataplane.dissemination import DataPlane
    from echelon.agent.metrics import AgentMetrics
    from echelon.dataplane.trees import Trees
    from echelon.core.dedup import DedupWindow
    from echelon.v1 import membership_pb2 as mpb

    members = [mpb.Member(id=f"agent-{i}", address=f"127.0.0.1:{7200 + i}", role=mpb.ROLE_AGENT,
                          subscribes=["bench"] if i else []) for i in range(4)]
    links: dict[str, QueueLink] = {}
    node = SimpleNamespace(id=me, address=f"127.0.0.1:{7200 + int(me[-1])}", metrics=AgentMetrics(CollectorRegistry()),
                           dedup=DedupWindow(), stopping=False, deliver_local=deliver, open_stream=lambda h, s: [],
                           link=lambda m: links.setdefault(m.id, QueueLink()),
                           local_full=list)  # no local subscription lags (trees from before it ignore it)
    trees = Trees(me, node.address)
    trees.update(members)
    return DataPlane(node, trees), links


def relay_items(n: int, first: int = 0):
    from echelon.contract.wire import attributes_to_pb
    from echelon.v1 import common_pb2 as pb

    now = time.time_ns()
    return [(pb.Event(id=pb.MessageId(producer_id="agent-0:1:1763900000000000000", sequence=first + i + 1), topic="bench",
                      attributes=attributes_to_pb(a), publish_time_unix_nanos=now), i.to_bytes(16, "little"),
             [f"agent-{1 + i % 3}"]) for i, a in enumerate(workload_events(n))]


def as_received(frame):
    """A frame a link was handed, as its receiver parses it (a tree that sends frames as
    bytes hands the link an `OutFrame`)."""
    from echelon.v1 import relay_pb2 as rpb

    return frame if isinstance(frame, rpb.RelayFrame) else rpb.RelayFrame.FromString(b"".join(frame.data(1)))


def frames_for_inner(n: int, count: int):
    """`count` frames of `n` events each (sequences following on) from agent-0 (the root),
    each event for one of the three other agents (as at 2%), as the child of the root that
    relays to the other two receives them, and that child."""
    import asyncio

    root, links = relay_plane("agent-0", lambda events, *encoded: len(events))
    loop = asyncio.new_event_loop()
    try:
        for k in range(count):
            loop.run_until_complete(root.publish(relay_items(n, k * n)))
    finally:
        loop.close()
    (child, link), = links.items()  # the tree of 4: the root has one child, which relays the rest
    return [as_received(f) for f, _ in link.frames], child


def frame_for_leaf(n: int):
    """A frame of `n` events from agent-0 (the root) for one child of it alone, and that child."""
    import asyncio

    root, links = relay_plane("agent-0", lambda events, *encoded: len(events))
    loop = asyncio.new_event_loop()
    try:
        for child in ("agent-1", "agent-2", "agent-3"):
            items = [(e, p, [child]) for e, p, _ in relay_items(n)]
            loop.run_until_complete(root.publish(items))
            if child in links:
                return as_received(links[child].frames[-1][0]), child
    finally:
        loop.close()
    raise RuntimeError("no child of the root got a frame")
