"""The per-event pieces of `loadtest.bench_hotpath`, each timed on identical
inputs in a child process of either tree: microseconds per event, the best of a few
repeats in CPU time. Imported by name from this directory (the child runs
bench_hotpath.py as a script): this code drives the `echelon` on PYTHONPATH, either tree's.
The matcher's pieces and the list are here; the publishing side's in hotpath_publish.py,
the subscribing side's in hotpath_subscribe.py, what they share in hotpath_inputs.py.

Pieces (the 2% and 20% workload of loadtest.bench_events: `Symbol`, `Price`):
- `deliver`: a subscribing agent's local delivery of one relay frame (dedup, filter
  check over its 17 local subscriptions, offer), for a frame of 170 events and of 1;
- `admit`: the publishing agent's admission of a batch of 256 events (conversion, schema
  check, dedup digest and window, the Events built, the unit handed to a stub dispatcher
  and settled);
- `match`: a matcher's CDM index, 50 subscriptions, a batch of 256 events;
- `matcher answer`: a matcher holding the 3 default zones answers a batch of 256 events
  (route to zones, CDM, the MatchResponse serialized, or its bytes built where the tree
  has matcher/answer.py; what each tree sends an agent);
- `matcher entry, lone event` / `batch of 512`: the entry's whole `Match` of a batch of
  one event, and of 512 (the agents' batches at saturation) (the request read, routing,
  its zones, the response built and serialized, metrics, the routing job's sample) when
  one matcher holds the 3 default zones (no peer message in either tree): the entry's
  own Python work; `parsed batch of 470`: the same, each request parsed from its bytes
  first (as gRPC hands it over; the publishing agent's batches at saturation);
- `client encode`: the publisher's request of one event;
- `client publish()` / `client publish_batch`: the SDK's whole publish path over a fake
  channel (the agent's acks come back coalesced, as the agent sends them): the event's
  request built, numbered, packed and serialized, its ack read and its future or batch
  settled; one event per `publish()` (all in flight at once), and batches of 256;
- `publish stream`: the publishing agent's Publish stream over a fake dispatcher (each
  unit dispatched and held at once): requests read, admitted, dispatched and acked (the
  acks built and serialized); one event per request, and a batch of 256 per request;
- `dispatch`: the publishing agent from a dispatched unit of 256 events to its frames:
  serialized, the Match request written (answered at once, each event for one of 3
  agents), the answer fanned out, the root's frames queued, acked, the unit done;
- `relay root`: the publishing agent's data plane sending a matched batch of 256 events
  as the root (frames built, queued on fake links, acked, the run's future done), each
  event to one of 3 agents as at 2%;
- `relay inner`: the root's child that relays to the other two agents taking a frame of
  170 events, each for it or one of them: keyed, forwarded, a third delivered here;
- `relay receive`: a subscribing agent's data plane taking a frame of 170 events from
  that root (the tree's own frames: decoded, keyed, handed to local delivery, acked);
  local delivery itself is the `deliver` piece;
- `subscriber agent`: a subscribing agent's whole receive path for a frame of 170 events
  (and of 1) for it alone, as the root builds it: the frame decoded, received by the data
  plane, delivered to its 17 local subscriptions, their shared stream's Delivery messages
  built and serialized (per event received);
- `subscription queue`: one subscription's backlog per delivery: 256 relayed events
  offered, taken in one go, acked cumulatively by a client keeping 768 out;
- `subscriber SDK`: the client's side of those Delivery messages at 20%: decoded, into the
  subscriptions' inboxes, handed out as Messages, each payload read and the batch acked
  (per delivery);
- `subscriber SDK, batches() tasks`: the same Delivery messages (2% and 20%) through the
  client as an application takes them: the shared stream's reader task routing them, a
  task per subscription in `async for batch in sub.batches()` woken, payloads read, each
  batch acked (per delivery: what each wakeup costs, spread over what it hands out);
- `GC pass`: one full collection with a subscribing agent's dedup window of 500k ids
  (milliseconds, not per event).
"""

from __future__ import annotations

from hotpath_inputs import best, workload_events
from hotpath_publish import (admit_full_piece, admit_piece, client_piece, dispatch_piece, encode_piece,
                             relay_inner_piece, relay_root_piece, stream_piece)
from hotpath_subscribe import (deliver_piece, gc_piece, queue_piece, relay_receive_piece, subscriber_agent_piece,
                               subscriber_sdk_piece, subscriber_tasks_piece)


def _match_piece(sel: int) -> float:
    from echelon.core.cdm import CountingIndex
    try:
        from echelon.core.cdm import Entry
    except ImportError:  # a base tree from before the name
        from echelon.core.cdm import Subscription as Entry
    from echelon.contract.filters import parse
    from loadtest.bench_events.workload import subscriptions

    index = CountingIndex(Entry(str(s.index), f"agent-{s.index % 3}", parse(s.echelon_filter()))
                          for s in subscriptions(sel, 50))
    events = workload_events(256)
    return best(lambda: index.match_agents(events), len(events))


def _answer_piece(sel: int) -> float:
    import inspect
    from types import SimpleNamespace

    from echelon.core.can import Zone
    from echelon.contract.filters import parse
    from echelon.contract.schema import Schema, parse_attribute
    from echelon.core.space import Space
    from echelon.matcher.layout import Copy, Layout, default_zones
    from echelon.matcher import server
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
    events = workload_events(256)

    answers = server.Answers() if hasattr(server, "Answers") else None  # this tree builds the answer's bytes

    def once():
        routed = layout.route(events)
        if answers is not None:
            answers.response(0, matcher.match("bench", layout.key, events, routed, True), True)
            return
        response = xpb.MatchResponse()
        if agents_only:
            server.results_to_pb(matcher.match("bench", layout.key, events, routed, True), response.results, True)
        else:
            server.results_to_pb(matcher.match("bench", layout.key, events, routed), response.results)
        response.SerializeToString()

    return best(once, len(events))


def _entry_piece(size: int = 1, parsed: bool = False) -> float:
    import asyncio
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry

    from echelon.core.can import Zone
    from echelon.contract.filters import parse
    from echelon.contract.schema import Schema, parse_attribute
    from echelon.core.space import Space
    from echelon.matcher.layout import Copy, default_zones
    from echelon.matcher.peers import TierView
    from echelon.matcher.sample import EventSampler
    from echelon.matcher.server import MatcherMetrics, MatcherServicer
    from echelon.matcher.tier import Tier
    from echelon.contract.wire import attributes_to_pb
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
    events = workload_events(200 if size == 1 else 4 * size)
    batches = [xpb.MatchRequest(batch_id=i, agents_only=True, events=[
        pb.Event(id=pb.MessageId(producer_id="pub-0", sequence=j), topic="bench", attributes=attributes_to_pb(e),
                 publish_time_unix_nanos=1_700_000_000_000_000_000 + j) for j, e in enumerate(events[k:k + size])])
        for i, k in enumerate(range(0, len(events), size))]
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

    if parsed:  # as gRPC hands them over: parsed from the wire each time (upb reads them lazily)
        batches = [b.SerializeToString() for b in batches]

    async def run():
        for b in batches:
            answer = await entry._entry(xpb.MatchRequest.FromString(b) if parsed else b)
            if not isinstance(answer, bytes):  # a tree whose answer gRPC serializes
                answer.SerializeToString()

    return best(lambda: loop.run_until_complete(run()), len(events))


PIECES = {
    "deliver 2%, frame of 170": lambda: deliver_piece(2, 170),
    "deliver 20%, frame of 170": lambda: deliver_piece(20, 170),
    "deliver 2%, frame of 1": lambda: deliver_piece(2, 1),
    "admit (publishing agent)": admit_piece,
    "admit, full window (publishing agent)": admit_full_piece,
    "match 2% (matcher CDM)": lambda: _match_piece(2),
    "match 20% (matcher CDM)": lambda: _match_piece(20),
    "matcher answer 2%": lambda: _answer_piece(2),
    "matcher answer 20%": lambda: _answer_piece(20),
    "matcher entry, lone event": _entry_piece,
    "matcher entry, batch of 512": lambda: _entry_piece(512),
    "matcher entry, parsed batch of 470": lambda: _entry_piece(470, parsed=True),
    "client encode (publish)": encode_piece,
    "client publish(), one event each": lambda: client_piece(False),
    "client publish_batch, 256 events": lambda: client_piece(True),
    "publish stream, one event a request": lambda: stream_piece(False),
    "publish stream, batch of 256": lambda: stream_piece(True),
    "Publish handler, singles, coalesce_acks": lambda: stream_piece(False, handler=True),
    "Publish handler, singles, an ack each": lambda: stream_piece(False, handler=True, coalesce=False),
    "dispatch, 256 events": dispatch_piece,
    "relay root, 256 events": relay_root_piece,
    "relay inner, 170 events": relay_inner_piece,
    "relay receive, frame of 170": relay_receive_piece,
    "subscriber agent 2%, frame of 170": lambda: subscriber_agent_piece(2, 170),
    "subscriber agent 20%, frame of 170": lambda: subscriber_agent_piece(20, 170),
    "subscriber agent 20%, frame of 1": lambda: subscriber_agent_piece(20, 1),
    "subscription queue (per delivery)": queue_piece,
    "subscriber SDK 20% (per delivery)": lambda: subscriber_sdk_piece(20),
    "subscriber SDK 2%, batches() tasks": lambda: subscriber_tasks_piece(2),
    "subscriber SDK 20%, batches() tasks": lambda: subscriber_tasks_piece(20),
    "GC pass, 500k delivered ids (ms)": gc_piece,
}
