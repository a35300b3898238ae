"""The per-event pieces of `loadtest.bench_hotpath` (issue 12), each timed on identical
inputs in a child process of either tree: microseconds per event, the best of a few
repeats in CPU time. Imported by name from this directory (the child runs
bench_hotpath.py as a script): this code drives the `echelon` on PYTHONPATH, either tree's.

Pieces (the 2% and 20% workload of loadtest.bench_events: `Symbol`, `Price`):
- `deliver`: a subscribing agent's local delivery of one relay frame (dedup, filter
  check over its 17 local subscriptions, offer), for a frame of 170 events and of 1;
- `admit`: the publishing agent's per-event admission (conversion, schema check, dedup
  digest and window, the Event built);
- `match`: a matcher's CDM index, 50 subscriptions, a batch of 256 events;
- `matcher answer`: a matcher holding the 3 default zones answers a batch of 256 events
  (route to zones, CDM, the MatchResponse serialized; what each tree sends an agent);
- `matcher entry, lone event`: the entry's whole `Match` of a batch of one event (the
  request read, routing, its zones, the response built, metrics) when one matcher holds
  the 3 default zones (no peer message in either tree): the entry's own Python work;
- `client encode`: the publisher's request of one event;
- `client publish()` / `client publish_batch`: the SDK's whole publish path over a fake
  channel (the agent's acks come back coalesced, as the agent sends them): the event's
  request built, numbered, packed and serialized, its ack read and its future or batch
  settled; one event per `publish()` (all in flight at once), and batches of 256;
- `publish stream`: the publishing agent's Publish stream over a fake dispatcher (each
  unit dispatched and held at once): requests read, admitted, dispatched and acked (the
  acks built and serialized); one event per request, and a batch of 256 per request;
- `relay root`: the publishing agent's data plane sending a matched batch of 256 events
  as the root (frames built, queued on fake links, acked, the run's future done), each
  event to one of 3 agents as at 2%;
- `relay receive`: a subscribing agent's data plane taking a frame of 170 events from
  that root (the tree's own frames: decoded, keyed, handed to local delivery, acked);
  local delivery itself is the `deliver` piece;
- `subscriber agent`: a subscribing agent's whole receive path for a frame of 170 events
  (and of 1) for it alone, as the root builds it: the frame decoded, received by the data
  plane, delivered to its 17 local subscriptions, their shared stream's Delivery messages
  built and serialized (per event received);
- `subscriber SDK`: the client's side of those Delivery messages at 20%: decoded, into the
  subscriptions' inboxes, handed out as Messages, each payload read and the batch acked
  (per delivery);
- `GC pass`: one full collection with a subscribing agent's dedup window of 500k ids
  (milliseconds, not per event).
"""

from __future__ import annotations

import time
import timeit

def _events(n: int, seed: int = 3):
    import random

    from loadtest.bench_events.workload import SYMBOLS

    rnd = random.Random(seed)
    return [{"Symbol": rnd.choice(SYMBOLS), "Price": rnd.uniform(0.0, 100.0)} for _ in range(n)]


def _best(fn, per: int, number: int = 20, repeat: int = 7) -> float:
    """CPU microseconds per event: the best of `repeat` timings of `number` calls of `fn`
    (each handling `per` events), in this process's CPU time (time spent waiting for a
    core on the shared machine is not counted)."""
    return min(timeit.repeat(fn, number=number, repeat=repeat, timer=time.process_time)) / number / per * 1e6


def _deliver_piece(sel: int, frame: int) -> float:
    from prometheus_client import CollectorRegistry

    from echelon.agent.delivery import LocalDelivery
    from echelon.agent.metrics import AgentMetrics
    from echelon.agent.subscriptions import Subscription
    from echelon.core.dedup import DedupWindow
    from echelon.core.filters import parse
    from echelon.runtime.wire import attributes_to_pb
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
    events = [pb.Event.FromString(pb.Event(id=pb.MessageId(producer_id="p", sequence=i + 1), topic="bench",
                                     attributes=attributes_to_pb(a), publish_time_unix_nanos=now).SerializeToString())
              for i, a in enumerate(_events(frame))]
    many = getattr(d, "deliver_many", None)

    def once():
        d.dedup = DedupWindow()
        if many is not None:
            many(events)
        else:
            for e in events:
                d.deliver(e)
        for sub in subs.values():
            sub.backlog.clear()

    return _best(once, frame, number=max(5, 2000 // frame))


def _admit_piece() -> float:
    """The publishing agent's `_admit` with a stub node: the schema cache and no durable
    subscription (what the per-event path touches)."""
    import inspect
    from types import SimpleNamespace

    from echelon.agent.topics import Topics
    from echelon.core.dedup import DedupWindow
    from echelon.core.schema import Schema, parse_attribute
    from echelon.runtime.wire import attributes_to_pb, schema_to_pb
    from echelon.v1 import common_pb2 as pb
    from echelon.v1 import pubsub_pb2 as ppb
    from loadtest.bench_events.workload import SCHEMA

    topic = pb.Topic(name="bench", created_unix_ms=1,
                     schema=schema_to_pb(Schema(tuple(parse_attribute(a) for a in SCHEMA))))
    node = SimpleNamespace(topics=Topics(lambda: None, None), durables=SimpleNamespace(refuse=lambda t, a: None))
    try:  # where the publish half lives in this tree
        from echelon.agent.publishing import Publishing as PubSubServicer
    except ImportError:
        from echelon.agent.pubsub import PubSubServicer
    servicer = PubSubServicer.__new__(PubSubServicer)
    servicer.node = node
    outer = ppb.PublishRequest(batch=[ppb.PublishRequest(topic="bench", attributes=attributes_to_pb(a),
                                                         payload=i.to_bytes(16, "little"), sequence=i + 1)
                                      for i, a in enumerate(_events(256))])
    reqs = ppb.PublishRequest.FromString(outer.SerializeToString()).batch  # as parsed off the wire
    # This tree's admission takes the schema and the clocks once per request.
    per_request = "schema" in inspect.signature(PubSubServicer._admit).parameters

    def once():
        servicer.accepted = DedupWindow(capacity=200_000)
        if per_request:
            now, wall = time.monotonic(), time.time_ns()
            schema = node.topics.schema(topic)
            for r in reqs:
                servicer._admit(topic, r, "p", r.sequence, r.payload, schema, now, wall)
        else:
            for r in reqs:
                servicer._admit(topic, r, "p", r.sequence, r.payload)

    return _best(once, len(reqs))


def _match_piece(sel: int) -> float:
    from echelon.core.cdm import CountingIndex, Subscription
    from echelon.core.filters import parse
    from loadtest.bench_events.workload import subscriptions

    index = CountingIndex(Subscription(str(s.index), f"agent-{s.index % 3}", parse(s.echelon_filter()))
                          for s in subscriptions(sel, 50))
    events = _events(256)
    return _best(lambda: index.match_agents(events), len(events))


def _answer_piece(sel: int) -> float:
    import inspect
    from types import SimpleNamespace

    from echelon.core.can import Zone
    from echelon.core.filters import parse
    from echelon.core.schema import Schema, parse_attribute
    from echelon.core.space import Space
    from echelon.matcher.layout import Copy, Layout, default_zones
    from echelon.matcher.server import results_to_pb
    from echelon.matcher.store import CopyStore
    from echelon.matcher.zones import Zones
    from echelon.v1 import matcher_pb2 as xpb
    from loadtest.bench_events.workload import SCHEMA, subscriptions

    schema = Schema(tuple(parse_attribute(a) for a in SCHEMA))
    zones = [Zone(z.id, z.low, z.high, "m0") for z in default_zones("bench", Space.of(schema), ["m0", "m1", "m2"])[0]]
    layout = Layout("bench", schema, zones, "m0", {"m0": 1, "m1": 1, "m2": 1}, "default")
    store = CopyStore(lambda topic: [layout])
    store.install([Copy(str(s.index), f"agent-{s.index % 3 + 1}", "bench", 1, parse(s.echelon_filter()))
                   for s in subscriptions(sel, 50)], lambda held, new: None)
    layout.ready = True
    matcher = Zones("m0", SimpleNamespace(topics={"bench": SimpleNamespace(find=lambda key: layout)}), store)
    agents_only = "agents_only" in inspect.signature(Zones.match).parameters  # this tree answers agents only
    events = _events(256)

    def once():
        routed = layout.route(events)
        response = xpb.MatchResponse()
        if agents_only:
            results_to_pb(matcher.match("bench", layout.key, events, routed, True), response.results, True)
        else:
            results_to_pb(matcher.match("bench", layout.key, events, routed), response.results)
        response.SerializeToString()

    return _best(once, len(events))


def _entry_piece() -> float:
    import asyncio
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from echelon.core.can import Zone
    from echelon.core.filters import parse
    from echelon.core.schema import Schema, parse_attribute
    from echelon.core.space import Space
    from echelon.matcher.layout import Copy, default_zones
    from echelon.matcher.peers import TierView
    from echelon.matcher.sample import EventSampler
    from echelon.matcher.server import MatcherMetrics, MatcherServicer
    from echelon.matcher.tier import Tier
    from echelon.runtime.wire import attributes_to_pb
    from echelon.v1 import common_pb2 as pb
    from echelon.v1 import matcher_pb2 as xpb
    from loadtest.bench_events.workload import SCHEMA, subscriptions

    class Alone:  # no peer: the plan gives every zone to m0, the layout is switched to by hand
        async def sync(self, *args):
            raise ConnectionError

        async def store(self, *args):
            return None

    schema = Schema(tuple(parse_attribute(a) for a in SCHEMA))
    ids = ["m0", "m1", "m2"]
    zones = [Zone(z.id, z.low, z.high, "m0") for z in default_zones("bench", Space.of(schema), ids)[0]]
    batches = [xpb.MatchRequest(batch_id=i, agents_only=True, events=[pb.Event(topic="bench",
                                                                                attributes=attributes_to_pb(e))])
               for i, e in enumerate(_events(200))]
    loop = asyncio.new_event_loop()

    async def setup():
        tier = Tier("m0", Alone(), lambda: 1)
        tier.update_view(TierView({m: 1 for m in ids}, {"bench": schema}, {"bench": zones}, 1))
        ts = tier.layouts.topics["bench"]
        while not ts.pending.ready:
            await asyncio.sleep(0.01)
        ts.active, ts.pending = ts.pending, None
        tier.store.install([Copy(str(s.index), f"agent-{s.index % 3 + 1}", "bench", 1, parse(s.echelon_filter()))
                            for s in subscriptions(2, 50)], lambda held, new: None)
        node = SimpleNamespace(tier=tier, events=EventSampler())
        node.metrics = MatcherMetrics(CollectorRegistry(), tier)
        return MatcherServicer(node)

    entry = loop.run_until_complete(setup())

    async def run():
        for b in batches:
            await entry._entry(b)

    return _best(lambda: loop.run_until_complete(run()), len(batches))


class _Link:
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


def _relay_plane(me: str, deliver):
    """A DataPlane over a view of 4 agents (agent-0 roots), links that queue frames."""
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from echelon.agent.dataplane import DataPlane
    from echelon.agent.metrics import AgentMetrics
    from echelon.agent.trees import Trees
    from echelon.core.dedup import DedupWindow
    from echelon.v1 import membership_pb2 as mpb

    members = [mpb.Member(id=f"agent-{i}", address=f"127.0.0.1:{7200 + i}", role=mpb.ROLE_AGENT,
                          subscribes=["bench"] if i else []) for i in range(4)]
    links: dict[str, _Link] = {}
    node = SimpleNamespace(id=me, address=f"127.0.0.1:{7200 + int(me[-1])}", metrics=AgentMetrics(CollectorRegistry()),
                           dedup=DedupWindow(), stopping=False, deliver_local=deliver, open_stream=lambda h, s: [],
                           link=lambda m: links.setdefault(m.id, _Link()))
    trees = Trees(me, node.address)
    trees.update(members)
    return DataPlane(node, trees), links


def _relay_items(n: int):
    from echelon.runtime.wire import attributes_to_pb
    from echelon.v1 import common_pb2 as pb

    now = time.time_ns()
    return [(pb.Event(id=pb.MessageId(producer_id="agent-0:1:1763900000000000000", sequence=i + 1), topic="bench",
                      attributes=attributes_to_pb(a), publish_time_unix_nanos=now), i.to_bytes(16, "little"),
             [f"agent-{1 + i % 3}"]) for i, a in enumerate(_events(n))]


def _relay_root_piece() -> float:
    import asyncio

    plane, links = _relay_plane("agent-0", lambda events, *encoded: len(events))
    items = _relay_items(256)
    loop = asyncio.new_event_loop()

    async def publish():
        futures = await plane.publish(items)
        for link in links.values():
            for _, f in link.frames:
                f.set_result(True)
            link.frames.clear()
        await asyncio.sleep(0)  # the acks' callbacks: holds released, the run's future done
        assert all(f.done() for f in futures)

    try:
        return _best(lambda: loop.run_until_complete(publish()), len(items))
    finally:
        loop.close()


def _relay_receive_piece() -> float:
    """A frame of 170 events for a child of the root alone (a leaf's work), as this
    tree's root builds it."""
    frame, child = _frame_for_leaf(170)
    leaf, _ = _relay_plane(child, lambda events, *encoded: len(events))  # holds none: the frame is all for it
    acks = []

    def once():
        leaf.receive(frame, lambda: acks.append(1))

    return _best(once, len(frame.messages))


def _frame_for_leaf(n: int):
    """A frame of `n` events from agent-0 (the root) for one child of it alone, and that child."""
    import asyncio

    root, links = _relay_plane("agent-0", lambda events, *encoded: len(events))
    loop = asyncio.new_event_loop()
    try:
        for child in ("agent-1", "agent-2", "agent-3"):
            items = [(e, p, [child]) for e, p, _ in _relay_items(n)]
            loop.run_until_complete(root.publish(items))
            if child in links:
                return links[child].frames[-1][0], child
    finally:
        loop.close()
    raise RuntimeError("no child of the root got a frame")


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
    from echelon.core.filters import parse
    from echelon.v1 import relay_pb2 as rpb
    from loadtest.bench_events.workload import subscriptions

    frame, child = _frame_for_leaf(n)
    wire = frame.SerializeToString()
    subs = {}
    for s in subscriptions(sel, 50):
        if s.index % 3 == int(child[-1]) % 3:
            sub = Subscription(f"{child}/{s.index}", f"~{s.index}", "bench", parse(s.echelon_filter()), 1 << 30)
            sub.attach(1 << 30)
            subs[sub.name] = sub
    metrics = AgentMetrics(CollectorRegistry())
    delivery = LocalDelivery(lambda: subs, metrics, lambda s: None)
    leaf, _ = _relay_plane(child, delivery.deliver_many)
    stream = SharedStream.__new__(SharedStream)  # its writer's part alone: no gRPC stream under it
    stream.node, stream.max_deliveries, stream.statuses, stream._turn = SimpleNamespace(metrics=metrics), 256, deque(), 0
    stream.encoded, stream._counted = True, {}  # a tree without them ignores them
    stream.subs = {i + 1: s for i, s in enumerate(subs.values())}

    def once() -> list[bytes]:
        delivery.dedup = leaf.node.dedup = DedupWindow()
        leaf.receive(rpb.RelayFrame.FromString(wire), lambda: None)
        out = []
        while True:  # as each tree's serve: this one stops at a message not full, an older one at an empty one
            filled = stream._fill()
            if len(filled[0].batch):
                out.append(filled[0].SerializeToString())
            if not len(filled[0].batch) or (len(filled) == 3 and not filled[2]):
                for sub in subs.values():
                    sub.unacked.clear()  # as if acked: the next round starts alike
                return out

    return once, len(frame.messages)


def _subscriber_agent_piece(sel: int, n: int) -> float:
    once, events = _subscriber_agent(sel, n)
    return _best(once, events, number=max(5, 2000 // events))


def _subscriber_sdk_piece(sel: int) -> float:
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
        return _best(lambda: loop.run_until_complete(receive()), deliveries)
    finally:
        loop.close()


def _encode_piece() -> float:
    from echelon.client.publisher import Publisher

    events = _events(256)
    payload = bytes(16)
    if hasattr(Publisher, "_requests"):  # a tree that builds each event's request apart
        return _best(lambda: [Publisher._requests(None, "bench", a, payload, "") for a in events], len(events))
    from echelon.client.outbox import Outbox  # this tree: built in place in the open batch

    def once():
        outbox = Outbox("p", 2)
        for i, a in enumerate(events):
            outbox.add("bench", a, payload, "", i + 1)

    return _best(once, len(events))


class _FakeCall:
    """A Publish call over no network: each request serialized as gRPC would, answered
    by one coalesced PublishAck per request read (parsed, as off the wire)."""

    def __init__(self, requests, serialize):
        self._requests, self._serialize = requests, serialize

    def __aiter__(self):
        return self._replies()

    async def _replies(self):
        from echelon.v1 import pubsub_pb2 as ppb

        async for req in self._requests:
            self._serialize(req)
            reply = ppb.PublishAck()
            for r in req.batch or (req,):
                reply.acks.add(producer_id=req.producer_id, sequence=r.sequence, destinations=1)
            yield ppb.PublishAck.FromString(reply.SerializeToString())


class _FakeChannel:
    def stream_stream(self, method, request_serializer=None, response_deserializer=None, **kw):
        return lambda requests, **kw: _FakeCall(requests, request_serializer)

    def unary_unary(self, *a, **kw):
        return None

    unary_stream = stream_unary = unary_unary


def _client_piece(batched: bool) -> float:
    """The SDK's publish path, `publish_nowait` per event or `publish_batch` of 256,
    through a fake channel: CPU per event of the whole round (the fake call's own work,
    a serialization and an ack per request, included on both sides)."""
    import asyncio

    from echelon.client.publisher import AckLevel, Publisher

    channel = _FakeChannel()
    client = type("C", (), {"_channel": lambda self, i=0: channel, "_forget": lambda self, p: None})()
    events = _events(256)
    payload = bytes(16)
    loop = asyncio.new_event_loop()
    pub = Publisher(client, "p", AckLevel.DELIVERED)

    async def once():
        if batched:
            await pub.publish_batch("bench", [(a, payload) for a in events])
        else:
            await asyncio.gather(*[pub.publish_nowait("bench", a, payload) for a in events])

    try:
        return _best(lambda: loop.run_until_complete(once()), len(events), number=10)
    finally:
        loop.run_until_complete(pub.close(5))
        loop.close()


def _stream_piece(batched: bool) -> float:
    """The publishing agent's Publish stream (read, admission, dispatch, acks) with a stub
    node whose dispatcher holds every unit at once: 256 events, one per request (each
    request as the SDK sends a lone event) or all in one batch request; the acks serialized."""
    import asyncio
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from echelon.agent.metrics import AgentMetrics
    from echelon.agent.topics import Topics
    from echelon.core.schema import Schema, parse_attribute
    from echelon.runtime.wire import attributes_to_pb, schema_to_pb
    from echelon.v1 import common_pb2 as pb
    from echelon.v1 import pubsub_pb2 as ppb
    from loadtest.bench_events.workload import SCHEMA

    try:  # where the publish half lives in this tree
        from echelon.agent.publishing import Publishing
    except ImportError:
        return float("nan")
    topic = pb.Topic(name="bench", created_unix_ms=1,
                     schema=schema_to_pb(Schema(tuple(parse_attribute(a) for a in SCHEMA))))
    loop = asyncio.new_event_loop()

    def submit(events, payloads, alone=False):
        done = loop.create_future()
        done.set_result(None)
        future = loop.create_future()
        future.set_result(([1] * len(events), [done]))
        return future

    membership = SimpleNamespace(topics={"bench": topic})
    node = SimpleNamespace(topics=Topics(lambda: membership, None), durables=SimpleNamespace(refuse=lambda t, a: None),
                           config=SimpleNamespace(id="agent-0"), dispatcher=SimpleNamespace(submit=submit),
                           server=SimpleNamespace(access=SimpleNamespace(check_publish=lambda t: None,
                                                                         publish_checker=lambda now: lambda t: None)),
                           metrics=AgentMetrics(CollectorRegistry()))
    elements = [ppb.PublishRequest(topic="bench", attributes=attributes_to_pb(a), payload=i.to_bytes(16, "little"))
                for i, a in enumerate(_events(256))]
    level = ppb.ACK_LEVEL_DELIVERED
    seq = [0]

    def requests():
        """The requests as parsed off the wire, fresh sequences each round (no duplicates)."""
        out = []
        for e in elements:
            seq[0] += 1
            e.sequence = seq[0]
        if batched:
            out.append(ppb.PublishRequest(producer_id="p", ack_level=level, coalesce_acks=True, batch=elements))
        else:
            for e in elements:
                r = ppb.PublishRequest()
                r.CopyFrom(e)
                r.producer_id, r.ack_level, r.coalesce_acks = "p", level, True
                out.append(r)
        return [ppb.PublishRequest.FromString(r.SerializeToString()) for r in out]

    async def once(reqs):
        async def feed():
            for r in reqs:
                yield r
        acked = 0
        async for ack in Publishing(node).stream(feed()):
            ack.SerializeToString()
            acked += len(ack.acks) or 1
        assert acked == len(elements), acked

    def timed(number: int = 10, repeat: int = 7) -> float:
        best = float("inf")
        for _ in range(repeat):
            rounds = [requests() for _ in range(number)]  # parsing is gRPC's, not timed
            t0 = time.process_time()
            for reqs in rounds:
                loop.run_until_complete(once(reqs))
            best = min(best, (time.process_time() - t0) / number / len(elements) * 1e6)
        return best

    try:
        return timed()
    finally:
        loop.close()


def _gc_piece() -> float:
    """CPU ms of one full pass of the cyclic GC while a subscribing agent's delivery
    window holds 500,000 message ids (not per event: the pause every such pass adds)."""
    import gc

    from echelon.core.dedup import DedupWindow

    w = DedupWindow()
    for i in range(500_000):
        w.first_time(("agent-0:1:1763900000000000000", i), 1.0)
    return _best(gc.collect, 1, number=1) / 1000


PIECES = {
    "deliver 2%, frame of 170": lambda: _deliver_piece(2, 170),
    "deliver 20%, frame of 170": lambda: _deliver_piece(20, 170),
    "deliver 2%, frame of 1": lambda: _deliver_piece(2, 1),
    "admit (publishing agent)": _admit_piece,
    "match 2% (matcher CDM)": lambda: _match_piece(2),
    "match 20% (matcher CDM)": lambda: _match_piece(20),
    "matcher answer 2%": lambda: _answer_piece(2),
    "matcher answer 20%": lambda: _answer_piece(20),
    "matcher entry, lone event": _entry_piece,
    "client encode (publish)": _encode_piece,
    "client publish(), one event each": lambda: _client_piece(False),
    "client publish_batch, 256 events": lambda: _client_piece(True),
    "publish stream, one event a request": lambda: _stream_piece(False),
    "publish stream, batch of 256": lambda: _stream_piece(True),
    "relay root, 256 events": _relay_root_piece,
    "relay receive, frame of 170": _relay_receive_piece,
    "subscriber agent 2%, frame of 170": lambda: _subscriber_agent_piece(2, 170),
    "subscriber agent 20%, frame of 170": lambda: _subscriber_agent_piece(20, 170),
    "subscriber agent 20%, frame of 1": lambda: _subscriber_agent_piece(20, 1),
    "subscriber SDK 20% (per delivery)": lambda: _subscriber_sdk_piece(20),
    "GC pass, 500k delivered ids (ms)": _gc_piece,
}
