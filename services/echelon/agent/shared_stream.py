"""A shared subscription stream: many subscriptions of one client on one Subscribe
stream, as NATS carries a connection's subscriptions under their sids.

Why: an event that matches several subscriptions of one client went out as one message
per subscription, and came back as one ack message each; a grpc.aio message costs far
more CPU at each end than the work it carries, so at low rates the message count is the cost. On a
shared stream one Delivery message carries whatever all the stream's subscriptions have
ready (up to MAX_DELIVERIES, each element with its `sid`), and one request carries the
acks of many (`SubscribeRequest.batch`).

Each subscription keeps its own credits, ids, acks and nacks (subscriptions.py); what
the stream adds is the sid. Opens are answered in the stream (a status Delivery: opened,
or refused with a code, the stream going on); a subscription that ends (overflow,
removal, a close asked for) ends alone with a status; the stream's end ends them all, as
a stream of its own would (unacked deliveries back to a named subscription's backlog,
an ephemeral one closed). Durable subscriptions keep a stream of their own (relayed to
their holder: rpc.py).

Opens are applied in the order they come, between the acks (an open waits for the
matcher tier's registration; meanwhile the stream's other subscriptions keep receiving).
A sliced payload goes alone, as on a stream of its own (head, chunks, last, with its
sid), holding the stream's other deliveries while it flows.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Callable

import grpc

from echelon.agent import delivery_bytes
from echelon.agent.delivery_bytes import ALONE, ENCODED, LOW
from echelon.agent.ownership import caller_name, claim
from echelon.agent.redelivery import HEADER, check_open, handle
from echelon.agent.subscriptions import Subscription
from echelon.contract.errors import (FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, status_of)
from echelon.contract.wire import varint
from echelon.v1 import pubsub_pb2 as ppb

if TYPE_CHECKING:
    from echelon.agent.metrics import AgentMetrics
    from echelon.agent.registry import Registry
    from echelon.runtime.auth import Access

log = logging.getLogger("echelon.agent")


class SharedStream:
    def __init__(self, access: Access, metrics: AgentMetrics, subscriptions: Registry, chunked: Callable,
                 max_deliveries: int):
        self.access = access  # the caller's rights, subscription count and name scope (runtime/auth.py)
        self.metrics = metrics
        self.subscriptions = subscriptions
        self.chunked = chunked  # PubSubServicer._chunked: a sliced payload's Deliveries
        self.max_deliveries = max_deliveries
        self.subs: dict[int, Subscription] = {}
        self.releases: dict[int, Callable[[], None]] = {}
        self.statuses: deque[ppb.Delivery] = deque()  # answers and ends, sent before any delivery
        self.wake = asyncio.Event()  # every subscription's `changed`, and the reader's news
        self._turn = 0  # the subscription served first, rotated for fairness
        self.encoded = False  # the client reads Delivery.encoded_event (its first open says)
        self._counted: dict = {}  # (counter family, topic) -> its series (_counter)
        self._named: dict[int, tuple] = {}  # sid -> (its name, delivery_bytes.names of it)

    async def serve(self, first: ppb.SubscribeRequest, requests, context):
        self.encoded = first.open.encoded_events
        batched = first.open.batched_deliveries  # else one delivery or status per message
        reader = asyncio.create_task(self._read(first, requests))
        reader.add_done_callback(lambda _: self.wake.set())
        try:  # every way out below runs the cleanup
            await context.send_initial_metadata((HEADER,))  # open; each open is answered in it (redelivery.py)
            while True:
                if reader.done():
                    reader.result()  # raises the reader's error, if any
                    return  # the client half-closed
                self._check_ends()
                self.wake.clear()  # whatever changes from here on (an offer, an ack, an end, an open) sets it
                out, sliced, more = self._fill()
                if len(out) > 1 and batched:
                    yield delivery_bytes.batch(out)
                else:
                    for d in out:
                        yield d
                if sliced is not None:
                    sid, (delivery_id, pending) = sliced
                    async for d in self.chunked(self.subs[sid], delivery_id, pending, reader):
                        d.sid = sid
                        yield d
                elif not more and not self.wake.is_set():
                    await self.wake.wait()  # the fill took all there was: no second pass to find nothing
        finally:  # no await here: a cancelled stream runs it to the end
            reader.cancel()
            for sid in list(self.subs):
                self._drop(sid)

    def _fill(self) -> tuple[list[bytes], tuple | None, bool]:
        """One message's worth, each delivery's bytes (delivery_bytes.py: pubsub.py sends
        them as they are): the statuses, then what the subscriptions have credit for,
        taken round-robin; a sliced payload stops it (it goes alone, after). More: there
        may be more to take now (the message is at MAX_DELIVERIES, or a subscription
        stopped at a sliced payload), else only a change (which sets `wake`) brings more."""
        out = []
        while self.statuses:
            out.append(self.statuses.popleft().SerializeToString())
        sids = list(self.subs)
        if not sids:
            return out, None, False
        self._turn = (self._turn + 1) % len(sids)
        room, encoded, subs = self.max_deliveries, self.encoded, self.subs
        metrics, add, named = self.metrics, out.append, self._named
        more, sliced = False, None
        taken: dict[str, int] = {}  # deliveries by topic: one counter call per topic and message
        for sid in sids[self._turn:] + sids[:self._turn]:
            sub = subs[sid]
            if sub.credits <= 0 or not sub.backlog:
                continue  # nothing to take (Subscription.take's test, without the call: most of them, most times)
            items = sub.take(room)
            taken[sub.topic] = taken.get(sub.topic, 0) + len(items)
            if items[0][1].stream is not None:  # taken alone (Subscription.take); never a redelivery
                sliced, more = (sid, items[0]), False
                break
            name, redelivered = sub.name, 0
            names = named.get(sid)
            if names is None or names[0] != name:
                names = named[sid] = (name, delivery_bytes.names(name, sid))
            names = names[1]
            both, high, rest = names[0] + names[1] + ENCODED, -1, b""
            for delivery_id, p in items:
                data = p.data
                if p.redeliveries:
                    redelivered += 1
                    if encoded and data:
                        add(delivery_bytes.element(delivery_id, names, p.redeliveries, data))
                        continue
                elif encoded and data:  # the common case, inline: delivery_bytes.element
                    if delivery_id >> 7 != high:  # the id's varint past its low 7 bits (delivery_bytes.LOW)
                        high = delivery_id >> 7
                        rest = varint(high) if high else b""
                    add(b"%b%b%b%b%b" % (LOW[delivery_id & 0x7F] if high else ALONE[delivery_id], rest, both,
                                         varint(len(data)), data))
                    continue
                d = ppb.Delivery(delivery_id=delivery_id, subscription=name, sid=sid,
                                 redelivery_count=p.redeliveries)
                p.into(d, encoded)
                add(d.SerializeToString())
            if redelivered:
                metrics.redeliveries.inc(redelivered)
            room -= len(items)
            if not room:
                more = True
                break
            # Stopped short of its credits at a sliced payload (taken alone): nothing will set
            # `wake` for it, so the writer must come back without waiting (b2d3caf hung here).
            more = more or (sub.credits > 0 and bool(sub.backlog))
        for topic, n in taken.items():
            self._counter(metrics.deliveries, topic).inc(n)
        return out, sliced, more

    def _counter(self, family, topic: str):
        """`family`'s series of `topic` (labels() costs more than the increment: once per topic and family)."""
        counter = self._counted.get((family, topic))
        if counter is None:
            counter = self._counted[(family, topic)] = family.labels(topic)
        return counter

    def _check_ends(self) -> None:
        """Subscriptions that ended on their own (as a stream of its own would end)."""
        for sid, sub in list(self.subs.items()):
            if sub.ended is not None:
                self._end(sid, sub.ended)
            elif sub.overflowed:
                self._end(sid, ResourceExhausted(f"subscription {sub.name!r} passed its backlog bound of "
                                                 f"{sub.max_backlog} messages and was closed"))
            elif sub.closed:
                self._end(sid, NotFound(f"subscription {sub.name!r} was removed"))

    async def _read(self, first: ppb.SubscribeRequest, requests) -> None:
        await self._open(first.open)
        async for req in requests:
            acked: dict[str, int] = {}  # by topic: one counter call per topic and request
            try:
                for r in req.batch or (req,):
                    kind = r.WhichOneof("kind")
                    if kind == "ack":
                        sub = self._sub(r.ack.sid)
                        if sub is not None:
                            acked[sub.topic] = acked.get(sub.topic, 0) + sub.ack(r.ack.delivery_ids, r.ack.credits,
                                                                                 r.ack.through)
                    elif kind == "nack":
                        sub = self._sub(r.nack.sid)
                        if sub is not None:
                            sub.nack(r.nack.delivery_ids, r.nack.delay_ms / 1000, r.nack.credits)
                    elif kind == "open":
                        await self._open(r.open)
                    elif kind in ("term", "in_progress"):  # redelivery.py
                        sub = self._sub(getattr(r, kind).sid)
                        if sub is not None:
                            handle(self.metrics, sub, r)
                    elif kind == "close":
                        if r.close.sid in self.subs:
                            self._end(r.close.sid, None)
                    else:
                        raise InvalidArgument("a request of a shared stream carries open, ack, nack, close or a batch")
            finally:
                for topic, n in acked.items():
                    self._counter(self.metrics.acks, topic).inc(n)

    def _sub(self, sid: int) -> Subscription | None:
        """The subscription of an ack or nack: None for one that ended meanwhile (what it
        settled went back with its end); a sid never opened here is a client's bug."""
        if sid in self.subs:
            return self.subs[sid]
        if not sid:
            raise InvalidArgument("an ack or nack of a shared stream names its subscription (sid)")
        return None

    async def _open(self, open_: ppb.SubscriptionOpen) -> None:
        sid = open_.sid
        if not sid or sid in self.subs:
            raise InvalidArgument(f"sid {sid}: every subscription of a shared stream has its own, not 0")
        try:
            if open_.HasField("durable") or open_.routed:
                raise FailedPrecondition("a durable subscription has a stream of its own")
            access = self.access
            release = access.open_subscription(open_.topic, lambda e: self._end(sid, e) if sid in self.subs else None)
            try:
                claim(access, open_, self.subscriptions)  # the name in its owner's scope (ownership.py)
                await check_open(self.subscriptions.topics, access, open_)  # ack deadline, dead-letter topic (redelivery.py)
                sub = await self.subscriptions.open(open_, caller_name(access))  # if cancelled or refused, closed again
            except BaseException:
                release()
                raise
        except Exception as e:  # noqa: BLE001 - a refusal is this subscription's, the stream goes on
            status = status_of(e)
            if status is None:
                raise
            self.statuses.append(ppb.Delivery(sid=sid, code=status[0].value[0], error=status[1]))
            self.wake.set()
            return
        sub.changed = self.wake
        self.subs[sid], self.releases[sid] = sub, release
        self.statuses.append(ppb.Delivery(sid=sid, opened=sub.id))
        self.wake.set()

    def _end(self, sid: int, error: Exception | None) -> None:
        """One subscription ends (error None: closed as asked), its status to the client."""
        self._drop(sid)
        code, details = (grpc.StatusCode.OK, "") if error is None else \
            status_of(error) or (grpc.StatusCode.INTERNAL, str(error))
        self.statuses.append(ppb.Delivery(sid=sid, code=code.value[0], error=details))
        self.wake.set()

    def _drop(self, sid: int) -> None:
        """As a subscription stream's cleanup: no await."""
        sub = self.subs.pop(sid)
        self._named.pop(sid, None)
        self.releases.pop(sid)()
        sub.detach()
        if not sub.named:
            self.subscriptions.close(sub)
