"""Admission of one publish request, with the publishing agent's CPU per event in mind.

A request's events are admitted as a whole, with one clock reading: the caller's right
and rate per event (runtime/auth.py), the topic's schema compiled once per topic version
(runtime/schema_code.py) to check the attributes and fill the Event's map in one pass,
the Event's digest and id offered to the window of accepted ids (core/dedup.py). The
fresh events are dispatched as one unit.

The digest of an event checked by the compiled schema is Python's hash of its topic,
ordering key, attributes' values as the schema lists them (schema_code.py) and payload:
no serialization (the costliest step of admission before). A retry is offered to the same
version of the topic, so its digest is the same; a retry after the topic was made again
with another schema is told from its first copy (ALREADY_EXISTS). -0.0 and 0.0 are one
value here, as for every filter.

What a duplicate needs of its first copy is in the first copy's record in the window:
its unit's number and its index in the unit; the number leads to the unit's `cell`,
which holds the unit's dispatch future, then (once the dispatch succeeded) the
destinations of its events: no object and no callback per event. The records hold only
numbers, so the cyclic GC stops tracking them (a record holding the cell was two tracked
objects per id, 400,000 in a full window, promoted and scanned by the older passes). A
cell is let go two generations of the window after its unit (core/dedup.py: its ids are
all forgotten by then).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from typing import TYPE_CHECKING, Protocol

from echelon.dataplane.slices import PayloadStream
from echelon.core.dedup import DedupWindow, Seen
from echelon.contract.schema import Schema
from echelon.contract.errors import AlreadyExists, InvalidArgument, Unavailable
from echelon.runtime.schema_code import Fill, compile_schema
from echelon.contract.wire import attributes_from_pb, attributes_into_pb, event_digest
from echelon.v1 import common_pb2 as pb
from echelon.v1 import pubsub_pb2 as ppb

if TYPE_CHECKING:
    from echelon.agent.dispatch import Dispatcher
    from echelon.agent.durable import Durables
    from echelon.agent.topics import Topics
    from echelon.runtime.auth import Access

_DELIVERED = ppb.ACK_LEVEL_DELIVERED
_SAME, _DIFFERENT = Seen.SAME, Seen.DIFFERENT


class Unit:
    """One request's events on their way to its ack: per element, the event's topic,
    sequence and what became of it (None for an event dispatched in `future`'s unit, an
    exception for a refusal, its first copy's `(cell, index)` for a duplicate)."""

    __slots__ = ("batched", "ack_level", "coalesce", "alone", "producer", "rows", "dups", "future", "lean")

    def __init__(self, batched: bool, ack_level: int, producer: str, coalesce: bool = False, alone: bool = False):
        self.batched = batched
        self.ack_level = ack_level
        self.producer = producer
        self.coalesce = coalesce  # its ack may share a message with the acks before it
        # Its publisher waits on its DELIVERED ack with nothing else in flight: the relays
        # ack its frames at once (relay.py), as for `await publish()` in a loop.
        self.alone = alone and ack_level == _DELIVERED
        self.rows: list[tuple[str, int, object]] = []
        self.dups: list[tuple[list, int]] = []  # the first copies of its duplicates
        self.future: asyncio.Future | None = None
        self.lean = False  # its listed acks leave out the producer id (PublishRequest.lean_acks)

    def settled(self) -> bool:
        """Is its ack ready without waiting (`Publishing._ack` would not block)?"""
        f = self.future
        if f is not None:
            if not f.done():
                return False
            if self.ack_level == _DELIVERED and not f.cancelled() and f.exception() is None:
                for d in f.result()[1]:
                    if not d.done():
                        return False
        for cell, _ in self.dups:  # a duplicate answered as its first copy, once that settled
            first = cell[0]
            if first.__class__ is not list and not first.done():
                return False
        return True


def failure(future: asyncio.Future, ack_level: int) -> BaseException | None:
    """Why a settled unit's events are not held at `ack_level` (None: they are)."""
    if future.cancelled():
        return Unavailable("the publish was cancelled")
    error = future.exception()
    if error is None and ack_level == _DELIVERED:
        for d in future.result()[1]:
            error = Unavailable("a delivery was cancelled") if d.cancelled() else d.exception()
            if error is not None:
                break
    return error


def first_copy(cell: list, index: int) -> tuple[BaseException | None, int]:
    """A settled first copy: (why it was not published, or None; its destinations)."""
    first = cell[0]
    if first.__class__ is list:
        return None, first[index]
    error = failure(first, ppb.ACK_LEVEL_ACCEPTED)
    return error, (first.result()[0][index] if error is None else 0)


class Dispatching(Protocol):
    """The parts admission hands events to, made once the agent has a membership view
    (server.py's `on_start`): read per request, never before one comes."""

    durables: Durables  # `refusing` and `refuse`: a full REJECT_PUBLISH durable subscription
    dispatcher: Dispatcher  # `submit`: a unit's fresh events


class Admission:
    """The window of message ids accepted here (with their digests) and the admission of
    each request into it."""

    def __init__(self, access: Access, topics: Topics, parts: Dispatching):
        self.access = access  # the caller's rights and rate (runtime/auth.py)
        self.topics = topics
        self.parts = parts
        self.accepted = DedupWindow(capacity=100_000)  # at most 200,000 ids held, as before generations
        self._cells: dict[int, list] = {}  # unit number -> its cell
        self._made: deque[tuple[int, int]] = deque()  # (window generation at its end, unit number), in order
        self._units = itertools.count()
        self._fills: dict[str, tuple[Schema, Fill | None]] = {}  # topic -> its schema, compiled

    async def accept(self, unit: Unit, reqs, seqs: list[int], payloads) -> None:
        """Admit a request's events into `unit` and dispatch the fresh ones as one unit.
        A bad event is refused in its row (nothing recorded), the others go on."""
        events: list[pb.Event] = []
        kept: list = []
        cell: list = [None]  # the unit's future, then its destinations
        number = next(self._units)
        self._cells[number] = cell
        now = time.monotonic()
        # The caller's rights once a topic, the rate's tokens once (runtime/auth.py).
        check_publish, end_checks = self.access.publish_checker(now, len(seqs))
        try:
            await self._admit(unit, reqs, seqs, payloads, check_publish, now, number, events, kept)
        finally:
            end_checks()  # the tokens of events refused before the rate given back
            self._let_go(number)
        if events:
            self._dispatch(unit, events, kept, cell)

    def _let_go(self, number: int) -> None:
        """Unit `number` admitted: the cells of units whose ids the window forgot let go."""
        made, generation = self._made, self.accepted.generation
        made.append((generation, number))
        while made[0][0] + 2 <= generation:
            del self._cells[made.popleft()[1]]

    async def _admit(self, unit: Unit, reqs, seqs: list[int], payloads, check_publish, now: float, number: int,
                     events: list[pb.Event], kept: list) -> None:
        """Each event into `unit.rows`; the fresh ones into `events` (payloads in `kept`),
        recorded in the window under unit `number`."""
        producer, rows, dups, cells = unit.producer, unit.rows, unit.dups, self._cells
        cell = cells[number]
        topics: dict[str, tuple[Schema, Fill | None]] = {}
        wall = time.time_ns()
        window = self.accepted
        window.expire(now)
        offer, durables, batched, Event = window.offer, self.parts.durables, unit.batched, pb.Event
        for req, seq, payload in zip(reqs, seqs, payloads):
            name = req.topic
            try:
                if batched and (req.slice_count > 1 or req.batch):
                    raise InvalidArgument(f"batch element {producer}:{seq}: a whole event (no slices, no batch)")
                check_publish(name)
                known = topics.get(name)
                if known is None:
                    if events and cell[0] is None:  # ids recorded: their duplicates may come while we wait
                        cell[0] = asyncio.get_running_loop().create_future()
                    try:
                        known = topics[name] = await self._schema(name)
                    except asyncio.CancelledError:  # nothing dispatched: the ids recorded are free again
                        self._forget(unit)
                        if cell[0] is not None:
                            cell[0].cancel()
                        raise
                attributes, ordering_key = req.attributes, req.ordering_key
                event = Event(topic=name, ordering_key=ordering_key)
                items = None if known[1] is None else known[1](attributes, event.attributes)
                if items is None:
                    event = _checked(name, req, known[0])  # raises the precise error
                if durables.refusing:  # a full REJECT_PUBLISH durable subscription
                    durables.refuse(name, attributes_from_pb(attributes))
                content = payload if payload.__class__ is bytes else b"%d:%b" % (len(payload), req.payload)
                digest = event_digest(event, content) if items is None else hash((name, ordering_key, items, content))
                key = (producer, seq)
                seen = offer(key, now, digest, (number, len(events)), False)
                if seen is _SAME:  # a duplicate: answered as the first copy, not published again
                    first_unit, index = window.outcome(key)
                    first = (cells[first_unit], index)
                    rows.append((name, seq, first))
                    dups.append(first)
                    continue
                if seen is _DIFFERENT:
                    raise AlreadyExists(f"message id {producer}:{seq} was already used for a different event "
                                        f"(within the dedup window): publish it under a new sequence")
                event.publish_time_unix_nanos = wall
                mid = event.id
                mid.producer_id, mid.sequence = producer, seq
                events.append(event)
                kept.append(payload)
                rows.append((name, seq, None))
            except Exception as e:  # noqa: BLE001 - answered in order, in the ack
                rows.append((name, seq, e))

    def _dispatch(self, unit: Unit, events: list[pb.Event], kept: list, cell: list) -> None:
        waiting = cell[0]  # duplicates may wait on it already
        try:
            future = self.parts.dispatcher.submit(events, kept, unit.alone)
        except BaseException as e:
            self._forget(unit)
            if waiting is not None:
                waiting.set_exception(e)
            raise
        stream = kept[0] if kept[0].__class__ is PayloadStream else None  # a sliced publish: a unit alone
        if stream is not None:
            future = _failing_with(future, stream)
        unit.future = cell[0] = future
        if waiting is not None:
            _chain(future, waiting)

        def settled(f: asyncio.Future) -> None:
            if f.cancelled() or f.exception() is not None:
                self._forget(unit)  # not published: a retry may publish it
                if stream is not None:
                    stream.abort(Unavailable("the payload was not published"))  # its reader must not wait
            else:
                cell[0] = f.result()[0]  # the destinations, for duplicates to come

        future.add_done_callback(settled)

    def _forget(self, unit: Unit) -> None:
        producer, forget = unit.producer, self.accepted.forget
        for _, seq, outcome in unit.rows:
            if outcome is None:
                forget((producer, seq))

    async def _schema(self, name: str) -> tuple[Schema, Fill | None]:
        """The topic's schema and its compiled fill (None for a schemaless topic)."""
        topics = self.topics
        schema = topics.schema(await topics.get(name))  # parsed once per topic version
        cached = self._fills.get(name)
        if cached is None or cached[0] is not schema:
            cached = self._fills[name] = (schema, None if schema.empty else compile_schema(schema))
        return cached


def _checked(name: str, req: ppb.PublishRequest, schema: Schema) -> pb.Event:
    """The Event of a schemaless topic's publish, or of one the compiled check did not
    pass: converted and checked apart, raising what is wrong."""
    attrs = attributes_from_pb(req.attributes)
    schema.validate_event(attrs)
    event = pb.Event(topic=name, ordering_key=req.ordering_key)
    attributes_into_pb(attrs, event.attributes)
    return event


def _chain(source: asyncio.Future, into: asyncio.Future, stream: PayloadStream | None = None) -> None:
    """`into` settled as `source` settles (failed if `stream` did not arrive whole)."""

    def done(f: asyncio.Future) -> None:
        if into.done():
            return
        if f.cancelled():
            into.cancel()
        elif f.exception() is not None or (stream is not None and stream.error is not None):
            into.set_exception(f.exception() or stream.error)  # type: ignore[union-attr]
        else:
            into.set_result(f.result())

    source.add_done_callback(done)


def _failing_with(dispatched: asyncio.Future, stream: PayloadStream) -> asyncio.Future:
    """The dispatch of a payload still arriving, failed if the payload did not arrive whole
    (it is dispatched before its last slice is read: even an ACCEPTED ack must say so)."""
    out = asyncio.get_running_loop().create_future()
    _chain(dispatched, out, stream)
    return out
