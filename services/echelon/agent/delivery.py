"""Local delivery: an event is offered once per message id (the dedup window) to every
local subscription of its topic whose filter it matches and that is owed it; a
subscription past its bound lags (its `room` hold is handed to the data plane, whose
frame acks wait for it: subscriptions.py) or, if it chose eviction, is closed (counted). A sliced payload is offered as
a `slices.ChunkStream` per subscription, and only to subscriptions with a stream
attached: nothing here holds it for one that comes back later (slices.py).

The filter check: a frame's events are matched together, against the
topic's local subscriptions compiled into one function (core/filter_code.py: cheaper than
checking each filter, and than the counting index for a lone event). A topic with more
than COMPILED_SUBS subscriptions here, or more than COMPILED_PREDICATES predicates over
their filters' terms (contract/filters.py), is matched with the CDM counting index instead
(core/cdm.py, the matcher's own, exact as `Filter.matches`): compiling costs several times
the index's build per subscription, paid again whenever the topic's subscriptions or
their filters change, and the index's cost per event grows with the matches rather
than with the subscriptions.

Per frame, not per event: the compiled function reads the frame's attribute
maps in place and answers per subscription, and each subscription takes its events of
the frame in one call (`Subscription.offer_many`: one bound check, one wakeup).
"""

from __future__ import annotations

import logging
import time
from itertools import compress
from operator import attrgetter
from typing import Callable, Mapping, Sequence

from echelon.dataplane.frames import key_of
from echelon.agent.metrics import AgentMetrics
from echelon.dataplane.slices import ChunkStream
from echelon.agent.subscriptions import Subscription
from echelon.core.cdm import CountingIndex
from echelon.core.cdm import Entry
from echelon.core.dedup import DedupWindow
from echelon.core.filter_code import compile_filters
from echelon.contract.wire import attributes_from_pb
from echelon.v1 import common_pb2 as pb

log = logging.getLogger("echelon.agent.delivery")

COMPILED_SUBS = 128  # a topic's local subscriptions up to which they are compiled (past it: the index)
COMPILED_PREDICATES = 2048  # and their predicates over all terms (past it, compiling is the slower build)
_filter = attrgetter("filter")


class _TopicIndex:
    """A topic's local subscriptions, compiled or in a counting index, with what they were built from."""

    __slots__ = ("built_from", "subs", "compiled", "index", "terms")

    def __init__(self, built_from: tuple):
        self.built_from = built_from
        self.subs = [s for s, _ in built_from]
        filters = [f for _, f in built_from]
        small = len(filters) <= COMPILED_SUBS and \
            sum(len(t.predicates) for f in filters for t in f.terms) <= COMPILED_PREDICATES
        self.compiled = compile_filters(filters, wire=True) if small else None
        self.terms = any(len(f.terms) > 1 for f in filters)  # some disjunction: answers deduplicated
        self.index = None if self.compiled else CountingIndex(  # each term of a disjunction its own entry
            Entry(f"{i}/{k}" if k else str(i), "", t) for i, f in enumerate(filters) for k, t in enumerate(f.terms))

    def match(self, events: Sequence[pb.Event]) -> list[list[int]]:
        """For each of `subs`, the positions in `events` (a frame's) of those it matches, in order."""
        if self.compiled is not None:
            return self.compiled([e.attributes for e in events])  # read in place
        found: list[list[int]] = [[] for _ in self.subs]
        for j, ids in enumerate(self.index.match_batch([attributes_from_pb(e.attributes) for e in events])):
            if self.terms:  # once per subscription, whatever its terms
                ids = {i.partition("/")[0] for i in ids}
            for i in ids:
                found[int(i)].append(j)
        return found


class LocalDelivery:
    """`dedup` knows a message by its id's bytes (frames.key_of, frames.id_key)."""

    def __init__(self, subs: Callable[[], Mapping[str, Subscription]], metrics: AgentMetrics,
                 close: Callable[[Subscription], object]):
        self.subs = subs
        self.metrics = metrics
        self.close = close
        self.dedup = DedupWindow()  # message ids delivered here
        self._indexes: dict[str, _TopicIndex] = {}  # by topic, built from `_built`
        self._built: tuple = ((), ())  # the subscriptions and their filters the indexes are of
        self.full: list = []  # rooms of lagging subscriptions that took events (`take_full`)

    def take_full(self) -> list:
        """The `room` holds of the lagging subscriptions the events delivered since the last
        call went to, and the holds of what named ones keep (subscriptions.py): the frame
        that brought them is acknowledged once they are released."""
        full, self.full = self.full, []
        return full

    def deliver_root(self, events: Sequence[pb.Event], encoded: Sequence[bytes] | None = None) -> list:
        """`deliver_many` for the publishing agent's own subscriptions: the rooms of those
        lagging, which the dispatcher waits for before it settles the publish. Nothing is
        kept for a named subscription here: its publish is this process's, which a crash
        ends before any other destination holds it (subscriptions.py)."""
        self.deliver_many(events, encoded, keep=False)
        return self.take_full()

    def deliver_many(self, events: Sequence[pb.Event], encoded: Sequence[bytes] | None = None,
                     keep: bool = True) -> int:
        """Offer each event (a frame's, in order) to every matching local subscription, once
        per message id: one filter pass per topic, and each subscription takes its events
        of the frame in one call. `encoded`: each event's bytes as received (b"": none),
        kept to be sent as they are (subscriptions.Pending). `keep`: the frame's ack waits
        for what named subscriptions with a stream attached settle (`take_full`,
        subscriptions.py). The latency histogram gets one
        sample per frame (its first event delivered: the others came with it)."""
        data = encoded if encoded is not None else [b""] * len(events)
        firsts = self.dedup.first_times(list(map(key_of, data, events)), time.monotonic())
        fresh = events
        if not all(firsts):  # copies (a re-route's): dropped, counted
            self.metrics.duplicates.inc(firsts.count(False))
            fresh, data = list(compress(events, firsts)), list(compress(data, firsts))
            if not fresh:
                return 0
        indexes = self._topic_indexes()
        kept = self.full if keep else None
        topics = [e.topic for e in fresh]
        if topics.count(topics[0]) == len(topics):  # one topic: the common case, no regrouping
            groups = [(topics[0], fresh, data)]
        else:
            positions: dict[str, list[int]] = {}
            for i, topic in enumerate(topics):
                positions.setdefault(topic, []).append(i)
            groups = [(t, [fresh[i] for i in p], [data[i] for i in p]) for t, p in positions.items()]
        offered, sample = 0, None
        for topic, evs, raws in groups:
            index = indexes.get(topic)
            if index is None:
                continue
            found = index.match(evs)
            # The frame's oldest publish time, read once: a subscription older than it owes
            # every event without reading each one's (Subscription.offer_many).
            oldest = min([e.publish_time_unix_nanos for e in evs]) if len(index.subs) > 1 else 0
            for sub, js in zip(index.subs, found):
                if not js:
                    continue
                n = sub.offer_many([evs[j] for j in js], [raws[j] for j in js], kept, oldest)
                if n is None:
                    self._overflow(sub)
                    continue
                if sub.room is not None:
                    self.full.append(sub.room)
                if n:
                    offered += n
                    if sample is None:
                        sample = evs[js[0]]
        if sample is not None:
            self.metrics.latency.observe(max(0.0, time.time() - sample.publish_time_unix_nanos / 1e9))
        return offered

    def _topic_indexes(self) -> dict[str, _TopicIndex]:
        """Each topic's index, built again when its subscriptions or their filters changed
        (checked per frame in two C-level passes: a lone event pays little for it)."""
        subs = tuple(self.subs().values())
        built = (subs, tuple(map(_filter, subs)))
        if built != self._built:  # identical objects compare by identity: cheap when nothing changed
            by_topic: dict[str, list[tuple]] = {}
            for sub, flt in zip(*built):
                by_topic.setdefault(sub.topic, []).append((sub, flt))
            old, self._indexes = self._indexes, {}
            for topic, pairs in by_topic.items():
                index = old.get(topic)
                self._indexes[topic] = index if index is not None and index.built_from == tuple(pairs) else \
                    _TopicIndex(tuple(pairs))
            self._built = built
        return self._indexes

    def open_stream(self, head: pb.Event, size: int) -> list[ChunkStream]:
        """Offer a sliced payload (its head: no payload, `size` bytes to come); the chunk
        streams of the subscriptions that take it. A matching subscription with no stream
        attached does not get it (counted as aborted)."""
        if not self.dedup.first_time(head.id.SerializeToString(), time.monotonic()):
            self.metrics.duplicates.inc()
            return []
        attrs = attributes_from_pb(head.attributes)
        streams = []
        for sub in list(self.subs().values()):
            if sub.topic != head.topic or not sub.filter.matches(attrs) or not sub.owes(head):
                continue
            if not sub.attached:
                self.metrics.bulk_aborted.inc()
                log.warning("subscription %s has no stream attached: it misses the %d-byte payload %s:%d",
                            sub.id, size, head.id.producer_id, head.id.sequence)
                continue
            stream = ChunkStream(size, lambda reason, sid=sub.id: self._aborted(sid, head, reason))
            if sub.offer(head, stream):
                streams.append(stream)
            else:
                self._overflow(sub)
        if streams:
            self.metrics.latency.observe(max(0.0, time.time() - head.publish_time_unix_nanos / 1e9))
        return streams

    def _aborted(self, sid: str, head: pb.Event, reason: str) -> None:
        self.metrics.bulk_aborted.inc()
        log.warning("subscription %s lost the payload %s:%d mid-way: %s", sid, head.id.producer_id,
                    head.id.sequence, reason)

    def _overflow(self, sub: Subscription) -> None:
        if sub.closed:
            return
        self.metrics.overflows.inc()
        log.warning("subscription %s overflowed its bound of %d messages or %d bytes (eviction chosen)", sub.id,
                    sub.max_backlog, sub.max_bytes)
        self.close(sub)
