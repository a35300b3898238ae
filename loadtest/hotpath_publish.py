"""The publishing side's pieces of `loadtest.bench_hotpath` (listed in hotpath_pieces.py):
the SDK's publish paths, the agent's Publish stream and admission, the relay root."""

from __future__ import annotations

import time

from hotpath_inputs import best, relay_items, relay_plane, workload_events


def admit_piece() -> float:
    """The publishing agent's admission of a batch of 256 events (conversion, schema check,
    dedup digest and window, the Events built, dispatched as one unit to a stub dispatcher
    that settles it at once, the settle callbacks run) with a stub node: the schema cache,
    no durable subscription, no rights to check (what the per-event path touches)."""
    import asyncio

    from echelon.core.dedup import DedupWindow

    loop, admission, batch = _admission(256)

    async def once():
        admission.accepted = DedupWindow(capacity=200_000)
        await batch(1)
        await asyncio.sleep(0)  # the settle callbacks

    try:
        return best(lambda: loop.run_until_complete(once()), 256)
    finally:
        loop.close()


def admit_full_piece() -> float:
    """The admission as at saturation: its window full (as many ids accepted before as it
    holds, so each new one makes an old one go), the services' GC settings
    (runtime/loop.started, before the window fills), and the CPU of a whole window's worth of
    batches of 256 in one timing: eviction and GC passes included, not the best of repeats."""
    import asyncio
    import gc

    loop, admission, batch = _admission(256)
    capacity = admission.accepted.capacity
    rounds = capacity // 256

    async def fill(first: int, n: int):
        for k in range(first, first + n):
            await batch(k * 256 + 1)
            await asyncio.sleep(0)  # the settle callbacks

    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()  # what a service built before it runs (its window fills after)
    gc.set_threshold(10_000, 10, 10)
    try:
        loop.run_until_complete(fill(0, rounds + rounds // 2))  # past one generation of the window, full
        start = time.process_time()
        loop.run_until_complete(fill(rounds + rounds // 2, rounds))
        return (time.process_time() - start) / (rounds * 256) * 1e6
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        loop.close()


def _admission(size: int):
    """An event loop, an Admission with a stub node (the schema cache, no durable
    subscription, no rights to check, a dispatcher that settles each unit at once), and
    `batch(first)`: a batch of `size` events as parsed off the wire, sequences from `first`."""
    import asyncio
    from types import SimpleNamespace

    from echelon.agent.topics import Topics
    from echelon.contract.schema import Schema, parse_attribute
    from echelon.contract.wire import attributes_to_pb, schema_to_pb
    from echelon.v1 import common_pb2 as pb
    from echelon.v1 import pubsub_pb2 as ppb
    from loadtest.bench_events.workload import SCHEMA

    topic = pb.Topic(name="bench", created_unix_ms=1,
                     schema=schema_to_pb(Schema(tuple(parse_attribute(a) for a in SCHEMA))))
    loop = asyncio.new_event_loop()

    def submit(events, payloads, alone=False):
        future = loop.create_future()
        future.set_result(([1] * len(events), []))
        return future

    node = SimpleNamespace(topics=Topics(lambda: SimpleNamespace(topics={"bench": topic}), None),
                           durables=SimpleNamespace(refusing={}, refuse=lambda t, a: None),
                           dispatcher=SimpleNamespace(submit=submit), config=SimpleNamespace(id="agent-0"),
                           server=SimpleNamespace(access=SimpleNamespace(publish_checker=_unchecked)))
    outer = ppb.PublishRequest(batch=[ppb.PublishRequest(topic="bench", attributes=attributes_to_pb(a),
                                                         payload=i.to_bytes(16, "little"), sequence=i + 1)
                                      for i, a in enumerate(workload_events(size))])
    reqs = ppb.PublishRequest.FromString(outer.SerializeToString()).batch  # as parsed off the wire
    payloads = [r.payload for r in reqs]
    level = ppb.ACK_LEVEL_ACCEPTED
    # One admission for every round (its caches warm, as in an agent).
    try:  # this tree: admission.py
        from echelon.agent.admission import Admission, Unit

        admission = _built(Admission, node)

        def batch(first: int):
            return admission.accept(Unit(True, level, "p"), reqs, list(range(first, first + size)), payloads)
    except ImportError:  # the publish half's own _accept
        from echelon.agent.publishing import Publishing, _Unit

        admission = Publishing(node)

        def batch(first: int):
            return admission._accept(_Unit(True, level), reqs, "p", list(range(first, first + size)), payloads)

    return loop, admission, batch


def _built(cls, node):
    """`cls` (Admission or Publishing) on a stub `node`: a tree's before narrow collaborators
    took the node itself; this tree's take its parts (agent/pubsub.py)."""
    import inspect

    from echelon.agent.admission import Admission

    if "node" in inspect.signature(cls).parameters:
        return cls(node)
    access = node.server.access
    if cls is Admission:
        return Admission(access, node.topics, node)
    return cls(node.config.id, node.metrics, Admission(access, node.topics, node))


def _unchecked(now, n=None):
    """A stub of `Access.publish_checker` for a caller with nothing to check: this tree's
    (with the request's size: the check and its end), or a tree's before (the check)."""
    def check(topic):
        return None

    return check if n is None else (check, lambda: None)


def encode_piece() -> float:
    from echelon.client.publisher import Publisher

    events = workload_events(256)
    payload = bytes(16)
    if hasattr(Publisher, "_requests"):  # a tree that builds each event's request apart
        return best(lambda: [Publisher._requests(None, "bench", a, payload, "") for a in events], len(events))
    from echelon.client.outbox import Outbox  # a tree that builds (or encodes) it into the open batch

    def once():
        outbox = Outbox("p", 2)
        for i, a in enumerate(events):
            outbox.add("bench", a, payload, "", i + 1)

    return best(once, len(events))


class _FakeCall:
    """A Publish call over no network: each request serialized as gRPC would (unless the
    tree writes it serialized), parsed, and answered by one coalesced PublishAck per
    request (parsed, as off the wire)."""

    def __init__(self, requests, serialize):
        self._requests, self._serialize = requests, serialize

    def __aiter__(self):
        return self._replies()

    async def _replies(self):
        from echelon.v1 import pubsub_pb2 as ppb

        async for req in self._requests:
            req = ppb.PublishRequest.FromString(self._serialize(req) if self._serialize else req)  # as the agent reads it
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


def client_piece(batched: bool) -> float:
    """The SDK's publish path, `publish_nowait` per event or `publish_batch` of 256,
    through a fake channel: CPU per event of the whole round (the fake call's own work,
    a serialization and an ack per request, included on both sides)."""
    import asyncio

    from echelon.client.publisher import AckLevel, Publisher

    channel = _FakeChannel()
    client = type("C", (), {"_channel": lambda self, i=0: channel, "_forget": lambda self, p: None})()
    events = workload_events(256)
    payload = bytes(16)
    loop = asyncio.new_event_loop()
    pub = Publisher(client, "p", AckLevel.DELIVERED)

    async def once():
        if batched:
            await pub.publish_batch("bench", [(a, payload) for a in events])
        else:
            await asyncio.gather(*[pub.publish_nowait("bench", a, payload) for a in events])

    try:
        return best(lambda: loop.run_until_complete(once()), len(events), number=10)
    finally:
        loop.run_until_complete(pub.close(5))
        loop.close()


def stub_publishing(topic_name: str, access=None):
    """The agent's Publishing (None in a tree without publishing.py) on a stub node: topic
    `topic_name` with bench_events' schema, a dispatcher that holds every unit at once
    (settled, delivered to one agent: no data plane behind it), `access` or a caller with
    nothing to check. Also grpc_floor's `agent stream` server."""
    import asyncio
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from echelon.agent.metrics import AgentMetrics
    from echelon.agent.topics import Topics
    from echelon.contract.schema import Schema, parse_attribute
    from echelon.contract.wire import schema_to_pb
    from echelon.v1 import common_pb2 as pb
    from loadtest.bench_events.workload import SCHEMA

    try:  # where the publish half lives in this tree
        from echelon.agent.publishing import Publishing
    except ImportError:
        return None
    topic = pb.Topic(name=topic_name, created_unix_ms=1,
                     schema=schema_to_pb(Schema(tuple(parse_attribute(a) for a in SCHEMA))))

    def submit(events, payloads, alone=False):
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        done.set_result(None)
        future = loop.create_future()
        future.set_result(([1] * len(events), [done]))
        return future

    membership = SimpleNamespace(topics={topic_name: topic})
    node = SimpleNamespace(topics=Topics(lambda: membership, None),
                           durables=SimpleNamespace(refusing={}, refuse=lambda t, a: None),
                           config=SimpleNamespace(id="agent-0"), dispatcher=SimpleNamespace(submit=submit),
                           server=SimpleNamespace(access=access or SimpleNamespace(publish_checker=_unchecked)),
                           metrics=AgentMetrics(CollectorRegistry()))
    return _built(Publishing, node)


def stream_piece(batched: bool, handler: bool = False, coalesce: bool = True, access=None) -> float:
    """The publishing agent's Publish stream (read, admission, dispatch, acks) with a stub
    node whose dispatcher holds every unit at once: 256 events, one per request (each
    request as the SDK sends a lone event) or all in one batch request; the acks serialized.
    `handler`: through what PubSub.Publish puts before it (this tree: the reader that takes
    single-event requests in runs, agent/publish_reader.py; all 256 queued at once, as a
    pipelining client's are, gRPC's own cost per message not counted); `coalesce`: the
    requests' `coalesce_acks` (unset: one ack message per request). `access`: the node's
    Access (runtime/auth.py) instead of a caller with nothing to check (loadtest.bench_auth)."""
    import asyncio

    from echelon.contract.wire import attributes_to_pb
    from echelon.v1 import pubsub_pb2 as ppb

    publishing = stub_publishing("bench", access)  # for every round (its caches warm, as in an agent)
    if publishing is None:
        return float("nan")
    loop = asyncio.new_event_loop()
    elements = [ppb.PublishRequest(topic="bench", attributes=attributes_to_pb(a), payload=i.to_bytes(16, "little"))
                for i, a in enumerate(workload_events(256))]
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
                r.producer_id, r.ack_level, r.coalesce_acks = "p", level, coalesce
                out.append(r)
        return [ppb.PublishRequest.FromString(r.SerializeToString()) for r in out]

    stream = publishing.stream
    if handler:
        try:
            from echelon.agent.publish_reader import coalesce as runs

            def stream(requests):
                return runs(publishing.stream, requests)
        except ImportError:  # a tree whose handler hands the requests on as they come
            pass

    async def once(reqs):
        async def feed():
            for r in reqs:
                yield r
        acked = 0
        async for ack in stream(feed()):
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


def relay_root_piece() -> float:
    import asyncio

    plane, links = relay_plane("agent-0", lambda events, *encoded: len(events))
    items = relay_items(256)
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
        return best(lambda: loop.run_until_complete(publish()), len(items))
    finally:
        loop.close()


def relay_inner_piece() -> float:
    """An inner relay's data plane taking frames of 170 events from the root, each event for
    it or one of its two children (as at 2%): a third decoded and handed to local delivery
    (a stub), the rest keyed and forwarded (frames built, queued on fake links, acked). Its
    table of holds starts full of settled ones, as under load: each new hold has an old one
    forgotten (every frame's events are new ones). Each timing spans 40 frames (4,520 new
    holds): past any table's slack (dataplane.MAX_HOLDS / 16), so a bulk forgetting is
    in every one of them."""
    import asyncio

    from hotpath_inputs import frames_for_inner

    from echelon.dataplane import dissemination as dataplane
    from echelon.dataplane.holds import Hold

    number, repeat = 40, 3
    frames, child = frames_for_inner(170, number * repeat)
    plane, links = relay_plane(child, lambda events, *encoded: len(events))
    for i in range(dataplane.MAX_HOLDS):
        plane.holds["settled", i] = Hold()
    loop = asyncio.new_event_loop()
    rounds = iter(frames)

    async def once():
        plane.receive(next(rounds), lambda: None)
        for link in links.values():
            for _, f in link.frames:
                f.set_result(True)
            link.frames.clear()
        await asyncio.sleep(0)

    try:
        return best(lambda: loop.run_until_complete(once()), len(frames[0].messages), number, repeat)
    finally:
        loop.close()


def dispatch_piece() -> float:
    """The publishing agent from a dispatched unit of 256 admitted events to its frames: the
    events serialized once, the Match request built and written (MatchClient.send, on a
    stream that answers at once: the answer parsed as off the wire, each event for one of
    3 agents as at 2%), the answer fanned out, the root's frames built and queued on fake
    links, acked, the unit's futures done."""
    import asyncio
    from types import SimpleNamespace

    from echelon.dataplane.dissemination import DataPlane
    from echelon.agent.dispatch import Dispatcher
    from echelon.dataplane.gateway import Gateway
    from echelon.agent.matching import MatchClient
    from echelon.v1 import matcher_pb2 as xpb

    plane, links = relay_plane("agent-0", lambda events, *encoded: len(events))
    gateway = DataPlane(plane.node, Gateway("agent-0", "r"), plane.slice_bytes)
    items = relay_items(256)
    events, payloads = [e for e, _, _ in items], [p for _, p, _ in items]
    answer = xpb.MatchResponse(results=[xpb.MatchResult(agents=[xpb.AgentMatches(agent=d) for d in ds])
                                        for _, _, ds in items]).SerializeToString()
    loop = asyncio.new_event_loop()
    matching = MatchClient(SimpleNamespace())

    class Stream:  # the matcher's answer, read as MatchClient._read reads it
        async def write(self, request):
            r = matching._out.popleft()
            r.future.set_result(list(xpb.MatchResponse.FromString(answer).results))

    async def start():
        matching._server, matching._stream = loop.create_future(), Stream()  # a stream open, its reader busy
        return Dispatcher("agent-0", matching, plane, gateway, lambda events: len(events))

    dispatcher = loop.run_until_complete(start())
    runner = loop.create_task(dispatcher.run())

    async def once():
        counts, delivered = await dispatcher.submit(events, payloads)
        for link in links.values():
            for _, f in link.frames:
                f.set_result(True)
            link.frames.clear()
        await asyncio.wait(delivered)

    try:
        return best(lambda: loop.run_until_complete(once()), len(events))
    finally:
        runner.cancel()
        loop.run_until_complete(asyncio.gather(runner, return_exceptions=True))
        loop.close()
