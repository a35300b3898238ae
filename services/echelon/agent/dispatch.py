"""Batching and dispatch of publishes: validated events queue here in units (a client's
batch, or one event), one future per unit; one task takes whole units until it holds
MAX_BATCH events or the queue is empty, matches them at once on the matcher tier
(attributes only: payloads stay here), delivers locally what is for this agent, hands
this region's destinations to the data plane as the root of their trees and other
regions' to the gateway plane, for a router of this region (docs/event-path.md, steps 2-4;
gateway.py). A payload still arriving (`slices.PayloadStream`) is read
by each plane that has destinations for it, both at once (each through its own reader).

Pipelined matching, used when an answer is late. Batches can be out at once on
the one Match stream (agent/matching.py; the matcher matches them at once and answers in
order), and `_apply` hands on each answer in the order its batch was sent, so FIFO per
producer and the acks are as with one round trip at a time. But a batch goes while
another is in flight only once the oldest is LATE (a stalled holder, a failover), with
fewer than DEPTH batches and AHEAD_EVENTS events out: otherwise units wait and join the
next batch. Always allowing several batches out cost more than it saved: removing the
wait for the round trip adds rounds of fewer events each, and messages every hop then
handles on cores that are already busy (docs/performance-history.md, "Measurements once in
docstrings"). LATE is a few lone round trips: rare unless something stalls. Under
saturation a batch holds AHEAD_EVENTS at once, so batches grow as before, up to
MAX_BATCH: a full batch goes at once, whatever is in flight (up to DEPTH). Waiting
would buy no fewer messages per event, and with one batch out at a time the rate
could not pass MAX_BATCH per round trip: when the cores are busy and a round trip
takes tens of milliseconds, publishes queued here for hundreds (`loadtest.trace_hops`,
"admit -> match out"; docs/performance.md).

A unit whose publisher waits on it alone (`submit(alone=True)`) makes its dispatch's
frames ask for their acks at once (`ack_may_wait` unset, relay.py)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from itertools import chain
from operator import attrgetter, itemgetter, methodcaller
from typing import Callable

from echelon.dataplane.dissemination import DataPlane
from echelon.agent.matching import MatchClient
from echelon.dataplane.holds import settled
from echelon.dataplane.root import encode_all
from echelon.dataplane.slices import PayloadStream
from echelon.contract.errors import EchelonError, Unavailable
from echelon.contract.wire import varint
from echelon.v1 import common_pb2 as pb
from echelon.v1 import matcher_pb2 as xpb

log = logging.getLogger("echelon.agent.dispatch")

MAX_BATCH = 512
DEPTH = 4  # match batches in flight at most (module doc)
LATE = 0.010  # seconds after which a batch's answer is late: the next batch need not wait for it
AHEAD_EVENTS = 32  # events in flight past which no other batch joins them, late or not


_serialize, _result_key = pb.Event.SerializeToString, xpb.MatchResult.SerializeToString  # mapped in C
_here, _far, _count = itemgetter(0), itemgetter(1), itemgetter(2)  # of a split
_ID_TAG, _TIME_TAG = varint(pb.Event.ID_FIELD_NUMBER << 3 | 2), varint(pb.Event.PUBLISH_TIME_UNIX_NANOS_FIELD_NUMBER << 3)
_ID_BYTE = _ID_TAG[0]
_publish_time = attrgetter("publish_time_unix_nanos")


def for_matching(events: list[pb.Event], encoded: list[bytes]) -> list[bytes]:
    """What the matcher reads of each event: its bytes without the id in front and the
    publish time at the end (the matcher reads the topic and the attributes alone), cut
    off the root's serialization rather than serialized again. The root writes an Event's
    fields in field-number order, so the id (field 1) is first and the publish time (field
    6, set by admission) last; bytes not laid out so go whole (docs/performance.md,
    "Bytes per useful delivery")."""
    times = set(map(_publish_time, events))
    if len(times) == 1 and (t := times.pop()):  # the common case: one admission's clock reading
        tail = _TIME_TAG + varint(t)
        if all(map(methodcaller("endswith", tail), encoded)):  # checked in C
            end = -len(tail)
            return [data[data[1] + 2:end] if data[0] == _ID_BYTE and data[1] < 0x80 else data[:end]
                    for data in encoded]
    out, tails = [], {}
    for event, data in zip(events, encoded):
        t = event.publish_time_unix_nanos
        tail = tails.get(t)
        if tail is None:
            tail = tails[t] = _TIME_TAG + varint(t) if t else b""
        start = data[1] + 2 if data[:1] == _ID_TAG and len(data) > 1 and data[1] < 0x80 else 0
        end = len(data) - len(tail) if tail and data.endswith(tail) else len(data)
        out.append(data[start:end] if start < end else data)
    return out


class Dispatcher:
    def __init__(self, me: str, matching: MatchClient, plane: DataPlane, gateway: DataPlane,
                 deliver: Callable[[list[pb.Event]], int]):
        self.me = me
        self.matching = matching
        self.plane = plane
        self.gateway = gateway
        self.deliver = deliver
        self._queue: asyncio.Queue[tuple[list[pb.Event], list[bytes | PayloadStream], asyncio.Future, bool]] = \
            asyncio.Queue()
        self._rounds: asyncio.Queue[tuple[list, list[pb.Event], list[bytes], asyncio.Future]] = asyncio.Queue()
        self._out = self._out_events = 0  # batches sent and not yet handed on, their events
        self._freed = asyncio.Event()
        self._sent: deque[float] = deque()  # when each batch in flight was sent, oldest first
        self._queued = 0  # events in `_queue`: a full batch's worth wakes the sender at once

    def submit(self, events: list[pb.Event], payloads: list[bytes | PayloadStream], alone: bool = False
               ) -> asyncio.Future:
        """Queue validated events (their payloads apart, whole or arriving) as one unit; its
        one future gives (destinations per event, the unit's delivery futures: done when
        every destination holds its events). One future per unit, not per event; a unit's
        events are one producer's. `alone`: its publisher waits on it with nothing else in
        flight (its frames' acks must not wait)."""
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((events, payloads, future, alone))
        self._queued += len(events)
        if self._queued >= MAX_BATCH and self._out:
            self._freed.set()  # a full batch need not wait for the one in flight (run)
        return future

    def _more(self, units: list, size: int) -> int:
        """Queued units into `units` while they hold fewer than MAX_BATCH events; the new size."""
        while size < MAX_BATCH and not self._queue.empty():
            units.append(unit := self._queue.get_nowait())
            size += len(unit[0])
            self._queued -= len(unit[0])
        return size

    async def run(self) -> None:
        """Take whole units into a batch and send it to be matched once nothing is in flight
        (unanswered or not yet handed on), or the oldest in flight is LATE while fewer than
        DEPTH batches and AHEAD_EVENTS events are, or at once when it is full (MAX_BATCH) and
        fewer than DEPTH are; `_apply` hands on their answers in the order sent."""
        applier = asyncio.create_task(self._apply(), name="dispatch-apply")
        loop = asyncio.get_running_loop()
        try:
            while True:
                units = [await self._queue.get()]
                size = len(units[0][0])
                self._queued -= size
                while self._out:  # units that come meanwhile join this batch
                    size = self._more(units, size)
                    if size >= MAX_BATCH and self._out < DEPTH:
                        break  # behind: a full batch waits for nothing (no more messages per event)
                    timer = None
                    if self._out < DEPTH and self._out_events < AHEAD_EVENTS:
                        if loop.time() >= (late := self._sent[0] + LATE):
                            break
                        timer = loop.call_at(late, self._freed.set)
                    self._freed.clear()
                    await self._freed.wait()
                    if timer is not None:
                        timer.cancel()
                size = self._more(units, size)
                events = list(chain.from_iterable([unit[0] for unit in units]))
                encoded = list(map(_serialize, events))  # once: down the trees (cut for the matcher)
                self._out += 1
                self._out_events += size
                self._sent.append(loop.time())
                answer = await self.matching.send(for_matching(events, encoded))
                self._rounds.put_nowait((units, events, encoded, answer))
        finally:
            applier.cancel()

    async def _apply(self) -> None:
        """Each batch's answer, in the order the batches were sent (FIFO per producer)."""
        while True:
            units, events, encoded, answer = await self._rounds.get()
            try:
                await self._fan_out(units, events, encoded, await answer)
            except EchelonError as e:
                for _, _, future, _ in units:
                    if not future.done():
                        future.set_exception(e)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - never let the dispatcher die
                log.exception("dispatch failed")
                for _, _, future, _ in units:
                    if not future.done():
                        future.set_exception(Unavailable(f"dispatch failed: {e}"))
            finally:
                self._out -= 1
                self._out_events -= len(events)
                self._sent.popleft()
                self._freed.set()

    async def _fan_out(self, units, events: list[pb.Event], encoded: list[bytes],
                       results: list[xpb.MatchResult]) -> None:
        """Local delivery here, this region's destinations to the data plane as the root,
        other regions' to the gateway."""
        me, alive, waits_for, elsewhere = self.me, self.plane.trees.alive, self.plane.trees.waits_for, \
            self.gateway.trees.elsewhere
        payloads = list(chain.from_iterable([unit[1] for unit in units]))
        rooms = ()  # of this agent's own subscriptions past their bound (lagging): waited for below
        # A batch repeats few agent sets: each split once (keyed by the result's bytes, far
        # cheaper than reading its agents), as (here, elsewhere, destination count).
        keys = list(map(_result_key, results))
        routed: dict[bytes, tuple[list[str], list[str], int]] = {}
        for key, result in dict(zip(keys, results)).items():
            agents = [a.agent for a in result.agents]
            far = elsewhere(agents)
            # A destination DEAD here, or absent from this view (one rebuilt by restarted
            # membership replicas lacks members until they rejoin), is the data plane's to
            # park until it comes back (parking.py); only one that LEFT is owed nothing.
            # Dropped here, it was acked and lost without a count (docs/guarantees.md).
            gone = set(far)
            dests = [a for a in agents if a == me or alive(a) or (a not in gone and waits_for(a))]
            routed[key] = (dests, far, len(dests) + len(far))
        splits = list(map(routed.__getitem__, keys))
        far_any = any(s[1] for s in routed.values())
        if set(map(type, payloads)) != {bytes} or any(me in s[0] for s in routed.values()):
            items, remote, local = self._split(events, payloads, splits)
            if local:
                rooms = self.deliver(local)  # in order, one filter pass (delivery.py)
        else:  # the common case: whole payloads, none for this agent, tuples made by zip
            items = list(zip(events, payloads, map(_here, splits)))
            remote = list(zip(events, payloads, map(_far, splits))) if far_any else []
        # Accepted: held here. The futures report delivery once every destination has it.
        may_wait = not any(unit[3] for unit in units)  # no publisher waits on these alone
        # One producer's events per unit (Publishing's requests): the root's fences by producer.
        producers: list[str] = []
        for unit in units:
            producers += [unit[0][0].id.producer_id] * len(unit[0])
        wholes = encode_all(encoded, payloads)  # each event with its payload: what the trees carry
        if far_any:  # at once: a payload still arriving is read by both
            delivered, handed = await asyncio.gather(self.plane.publish(items, may_wait, wholes, producers),
                                                     self.gateway.publish(remote, may_wait, wholes, producers))
        else:
            delivered, handed = await self.plane.publish(items, may_wait, wholes, producers), None
        if rooms:  # the publish waits, as a remote destination's frame would (agent/subscriptions.py)
            await settled(rooms)
        at = 0
        for unit_events, _, future, _ in units:
            end = at + len(unit_events)
            counts = list(map(_count, splits[at:end]))
            # The plane's futures are shared by a run of events: each waited on once.
            waits = dict.fromkeys(delivered[at:end])
            if handed is not None:
                waits.update(dict.fromkeys(f for f in handed[at:end] if f is not None))
            at = end
            if not future.done():
                future.set_result((counts, list(waits)))

    def _split(self, events, payloads, splits):
        """Per event (its payload, here whole or arriving): the plane's item, the gateway's,
        and the whole events for this agent's own subscriptions."""
        items, remote, local = [], [], []
        me = self.me
        for event, payload, (dests, far, _) in zip(events, payloads, splits):
            if isinstance(payload, PayloadStream):
                readers = iter(payload.split(bool(dests) + bool(far)))  # none: it is read and dropped
                here = next(readers) if dests else b""
                there = next(readers) if far else b""
                remote.append((event, there, far))
                items.append((event, here, dests))
                continue
            remote.append((event, payload, far))
            if me in dests and not self.plane.sliced(payload):
                if payload:
                    whole = pb.Event()
                    whole.CopyFrom(event)
                    whole.payload = payload
                    local.append(whole)
                else:
                    local.append(event)
            items.append((event, payload, dests))
        return items, remote, local
