"""The publish half of the client API (`PubSub.Publish`): admission, dispatch, acks.

A publish is validated against the topic's schema, given its id (producer id +
sequence) and checked against this agent's window of accepted ids: the same event again
is acknowledged as a duplicate and not published again, a different event under a used
id is refused (ALREADY_EXISTS): admission.py, per request. Then it is queued for the
dispatcher (dispatch.py) and acknowledged in order, at the level the client asked for.

Batching: a request may carry a `batch` of events, admitted, dispatched and
acked as one unit (one future, one ack message). A client that sets `coalesce_acks`
(the SDK does) also takes the acks of consecutive requests in one message: when an ack
is written, the acks of the requests after it that are already settled go with it (no
wait: under load they settle together, and with DELIVERED the relays' coalesced acks,
relay.py, settle a few at once even at a low rate). A DELIVERED request that arrives
with nothing else of its stream in flight is `alone`: its publisher waits on it, so its
frames ask the relays for their acks at once (a loop of `await publish()` never waits
for an ack delay).

An empty producer id is defaulted, not refused: the stream gets an id of its own
(`<agent>:<n>:<ns>`), named in every ack so a client can retry under it; an event
without a sequence is numbered above every sequence the stream used. Either way it is
published and delivered like any other.

A sliced publish (slice_count > 1; never in a batch: a unit of its own) is cut through
(slices.py): slice 0 is validated and dispatched at once with a `PayloadStream`, the
later slices are put into that stream as they are read, and reading waits while its
window is full.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from operator import itemgetter
from typing import TYPE_CHECKING

import grpc

from echelon.agent.admission import Admission, Unit, failure, first_copy
from echelon.dataplane.slices import PayloadStream, payload_error
from echelon.contract.errors import InvalidArgument, Timeout, Unavailable, status_of
from echelon.v1 import pubsub_pb2 as ppb

if TYPE_CHECKING:
    from echelon.agent.metrics import AgentMetrics

log = logging.getLogger("echelon.agent")

MAX_EVENTS_IN_FLIGHT = 8192  # per Publish stream: past it we stop reading (HTTP/2 pushes back)
MAX_PAYLOAD = 1 << 40  # bytes of one sliced payload (a TiB: its slice count fits the wire's uint32)
SLICE_IDLE = 30.0  # seconds a sliced payload waits for its next slice before it is failed


_topic = itemgetter(0)  # of a unit's row


class Publishing:
    """The agent's publish streams; their admission and the window of message ids accepted
    here are `admission`'s (admission.py)."""

    def __init__(self, agent_id: str, metrics: AgentMetrics, admission: Admission):
        self.agent_id = agent_id  # in the ids of streams that name no producer
        self.metrics = metrics
        self._producers = 0
        self.admission = admission
        self._counters: dict[tuple[str, str], object] = {}  # (topic, result) -> its published counter
        self.slice_idle = SLICE_IDLE
        # Told (topic, 1) when a stream first publishes on a topic and (topic, -1) for each
        # of its topics when it ends: OctopiA's advertisements (dataplane/control.py AgentFeed).
        self.producing = None

    @staticmethod
    async def _wait(unit: Unit) -> None:
        """Until `unit.settled()`: its dispatch, its deliveries (DELIVERED), the first copies
        of its duplicates. A future awaited alone wakes this task once (a gather: twice);
        a failure is read from the futures by `_fill`."""
        f = unit.future
        if f is not None:
            try:
                if not f.done():
                    await f
                if unit.ack_level == ppb.ACK_LEVEL_DELIVERED:
                    for d in f.result()[1]:
                        if not d.done():
                            await d
            except Exception:  # noqa: BLE001 - reported in the ack by _fill
                pass
        for cell, _ in unit.dups:
            first = cell[0]
            if first.__class__ is not list and not first.done():
                await asyncio.wait((first,))  # the first copy's unit is not ours to cancel

    def _fill(self, unit: Unit, out: ppb.PublishAck, listed: bool) -> None:
        """The ack of a settled unit, one per element in order: in `out`'s `acks` if
        `listed` (a batch, or coalesced acks), else in `out` itself."""
        dests, error = None, failure(unit.future, unit.ack_level) if unit.future is not None else None
        if error is None and unit.future is not None:
            dests = unit.future.result()[0]
            if unit.batched and len(dests) == len(unit.rows):  # a batch all published: each ack set in one call
                add = out.acks.add
                if unit.lean:
                    for (_, seq, _), n in zip(unit.rows, dests):
                        add(sequence=seq, destinations=n)
                else:
                    producer = unit.producer
                    for (_, seq, _), n in zip(unit.rows, dests):
                        add(producer_id=producer, sequence=seq, destinations=n)
                topics = set(map(_topic, unit.rows))
                for topic, n in ((topics.pop(), len(dests)),) if len(topics) == 1 else \
                        Counter(map(_topic, unit.rows)).items():  # a Counter costs more: only for mixed topics
                    self._count(topic, "ok", n)
                return
        fresh = 0
        ok: dict[str, int] = {}
        producer = "" if listed and unit.lean else unit.producer
        for topic, seq, outcome in unit.rows:
            ack = out.acks.add() if listed else out
            ack.producer_id, ack.sequence = producer, seq
            if outcome is None:
                fresh += 1
                if error is None:
                    ack.destinations = dests[fresh - 1]
                    ok[topic] = ok.get(topic, 0) + 1
                    continue
                refusal = error
            elif isinstance(outcome, BaseException):
                refusal = outcome
            else:  # a duplicate: answered as its first copy
                refusal, first = first_copy(*outcome)
                if refusal is None:
                    ack.duplicate, ack.destinations = True, first
                    self._count(topic, "duplicate")
                    continue
            status = status_of(refusal)
            if status is None:
                log.error("publish failed", exc_info=refusal)
                status = (grpc.StatusCode.INTERNAL, f"internal error: {type(refusal).__name__}")
            ack.code, ack.error = status[0].value[0], status[1]
            self._count("", status[0].name.lower())
        for topic, n in ok.items():
            self._count(topic, "ok", n)

    def _count(self, topic: str, result: str, n: int = 1) -> None:
        """Publishes counted by topic and result (the labelled child cached: `labels()`
        costs more than the increment)."""
        child = self._counters.get((topic, result))
        if child is None:
            child = self._counters[(topic, result)] = self.metrics.published.labels(topic, result)
        child.inc(n)

    async def stream(self, request_iterator):
        """One Publish stream's acks. Each request (one event, one slice, or a `batch` of
        events) becomes one unit: admitted as a whole, dispatched as one unit, answered by
        one ack message (or a share of one, `coalesce_acks`). Reading stops while
        MAX_EVENTS_IN_FLIGHT events await their acks."""
        self._producers += 1
        default_producer = f"{self.agent_id}:{self._producers}:{time.time_ns()}"
        pending: deque[Unit | None] = deque()  # in the order of the requests; None: the last
        arrived = asyncio.Event()
        room = asyncio.Event()
        room.set()
        in_flight = 0
        streams: dict[tuple[str, int], PayloadStream] = {}  # sliced payloads being read
        due: dict[tuple[str, int], float] = {}  # of those, when each began to wait for its next slice
        watchdog: asyncio.Task | None = None
        auto_seq = 0
        topics: set[str] = set()  # this stream's, advertised while it lasts
        producing = self.producing

        def advertise(reqs) -> None:
            for r in reqs:
                if r.topic not in topics:
                    topics.add(r.topic)
                    producing(r.topic, 1)

        def next_seq(seq: int) -> int:
            # An unnumbered event takes the next number above any this stream used: its
            # (defaulted) id never collides with an explicit one (docs/guarantees.md).
            nonlocal auto_seq
            if not seq:
                auto_seq += 1
                return auto_seq
            auto_seq = max(auto_seq, seq)
            return seq

        async def read():
            nonlocal in_flight, watchdog
            async for req in request_iterator:
                producer = req.producer_id or default_producer
                sliced = req.slice_count > 1 or req.slice_index
                if sliced and req.slice_index:  # a later slice: into its payload's stream, acked with slice 0
                    await self._feed(req, (producer, next_seq(req.sequence)), streams, due)
                    continue
                if producing is not None:
                    advertise(req.batch or (req,))
                unit = Unit(bool(req.batch), req.ack_level, producer, req.coalesce_acks, alone=not in_flight)
                unit.lean = req.lean_acks
                if req.batch:
                    reqs = req.batch
                    seqs = [r.sequence for r in reqs]
                    if 0 in seqs:  # numbered here (a client that leaves it to the agent)
                        seqs = [next_seq(s) for s in seqs]
                    elif seqs:
                        next_seq(max(seqs))
                    payloads = [r.payload for r in reqs]
                    await self.admission.accept(unit, reqs, seqs, payloads)
                else:
                    seq = next_seq(req.sequence)
                    if sliced:
                        await self._open_payload(unit, req, producer, seq, streams)
                    else:
                        await self.admission.accept(unit, [req], [seq], [req.payload])
                in_flight += len(unit.rows)
                pending.append(unit)  # before slice 0's data: acks go in the order of requests
                # The ack loop woken now, to await this unit's futures itself: their completion
                # then wakes it at once (a callback setting `arrived` costs a loop iteration more).
                arrived.set()
                if sliced:
                    await self._feed(req, (producer, seq), streams, due)
                    if streams and (watchdog is None or watchdog.done()):
                        watchdog = asyncio.create_task(self._idle(streams, due))
                if in_flight >= MAX_EVENTS_IN_FLIGHT:
                    room.clear()
                    await room.wait()
            pending.append(None)
            arrived.set()

        reader = asyncio.create_task(read())
        reader.add_done_callback(lambda _: arrived.set())
        try:
            while True:
                if not pending:
                    if reader.done():
                        reader.result()  # the reader's error (it ends with None otherwise)
                    arrived.clear()
                    await arrived.wait()
                    continue
                unit = pending.popleft()
                if unit is None:
                    break
                if not unit.settled():
                    await self._wait(unit)
                acked = len(unit.rows)
                ack = ppb.PublishAck()  # filled in place: no ack built apart and copied in (upb)
                self._fill(unit, ack, unit.batched or unit.coalesce)
                if unit.coalesce:  # all in `acks`, with those of the next requests already settled
                    while pending and pending[0] is not None and pending[0].coalesce and pending[0].settled():
                        unit = pending.popleft()
                        self._fill(unit, ack, True)
                        acked += len(unit.rows)
                in_flight -= acked
                if in_flight < MAX_EVENTS_IN_FLIGHT:
                    room.set()
                yield ack
            await reader
        finally:
            reader.cancel()
            if watchdog is not None:
                watchdog.cancel()
            for t in topics:
                producing(t, -1)
            for key, stream in streams.items():
                self._abort(key, stream, Unavailable("the publish stream ended before the payload's last slice"))

    async def _open_payload(self, unit: Unit, req: ppb.PublishRequest, producer: str, seq: int,
                            streams: dict[tuple[str, int], PayloadStream]) -> None:
        """Slice 0 of a sliced publish: its payload accepted into `unit` as a stream still
        arriving (dispatched at once); a refused or duplicate payload's slices are dropped."""
        key = (producer, seq)
        old = streams.pop(key, None)
        if old is not None:
            self._abort(key, old, InvalidArgument(f"{producer}:{seq} started again before its last slice"))
        error = payload_error(req.payload_size, req.slice_count, MAX_PAYLOAD)
        if error is not None:
            unit.rows.append((req.topic, seq, error))
            return
        stream = PayloadStream(req.payload_size)
        await self.admission.accept(unit, [req], [seq], [stream])
        if unit.future is not None:
            streams[key] = stream

    async def _feed(self, req: ppb.PublishRequest, key: tuple[str, int],
                    streams: dict[tuple[str, int], PayloadStream], due: dict[tuple[str, int], float]) -> None:
        """A slice into its payload's stream, waiting while the stream's window is full
        (not idle meanwhile: `due` starts again once it is in)."""
        stream = streams.get(key)
        if stream is None:
            return  # of a refused or duplicate payload (its ack is queued already)
        due.pop(key, None)
        if req.slice_index != stream.parts:
            del streams[key]
            self._abort(key, stream, InvalidArgument(f"slice {req.slice_index} of {key[0]}:{key[1]} out of order "
                                                     f"(expected {stream.parts})"))
            return
        await stream.put(req.payload)
        if stream.parts == req.slice_count or stream.error is not None:
            if streams.get(key) is stream:
                del streams[key]
            stream.end()
        elif streams.get(key) is stream:
            due[key] = asyncio.get_running_loop().time()

    async def _idle(self, streams: dict[tuple[str, int], PayloadStream], due: dict[tuple[str, int], float]) -> None:
        """Fail the sliced payloads whose next slice has not come for `slice_idle` seconds
        (a client that stopped sending them, its stream still open): DEADLINE_EXCEEDED in
        their ack, their ids free for a retry."""
        loop = asyncio.get_running_loop()
        while streams:
            await asyncio.sleep(min(1.0, self.slice_idle / 4))
            now = loop.time()
            for key in [k for k, t in due.items() if now - t >= self.slice_idle]:
                del due[key]
                stream = streams.pop(key, None)
                if stream is not None:
                    log.warning("sliced payload %s:%d abandoned: no slice for %.0f s", key[0], key[1], self.slice_idle)
                    self._abort(key, stream, Timeout(f"payload {key[0]}:{key[1]}: slice {stream.parts} did not come "
                                                     f"within {self.slice_idle:g} s; the payload is abandoned"))

    def _abort(self, key: tuple[str, int], stream: PayloadStream, error: Exception) -> None:
        """A payload that will not be whole: ended down the trees, and its id free for a retry."""
        stream.abort(error)
        self.admission.accepted.forget(key)

