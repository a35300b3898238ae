"""Subscriptions held by an agent: backlog, client credits, unacknowledged deliveries.

A subscription never has more deliveries in flight than the client granted credits.
Named subscriptions outlive their stream: on detach the unacknowledged deliveries go
back to the head of the backlog (redelivery count + 1) for the next stream. Past
`max_backlog` messages the subscription overflows: its stream ends with
RESOURCE_EXHAUSTED and the agent counts it. A nacked delivery comes back to the head of
the backlog after the client's delay (redelivery count + 1), counting against the bound
while it waits.

A subscription is owed the events published from its creation on (docs/guarantees.md: "every
subscription that matched at publish time"). `owes` refuses older ones, allowing
`CLOCK_SKEW` between the publishing agent's clock and ours: so a process restarted after
a crash does not hand its new subscriptions what the dead process may already have
delivered (messages parked for it, or resent by a peer's link, while it was down).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from itertools import islice, repeat
from operator import attrgetter

from echelon.dataplane.slices import ChunkStream
from echelon.core.filters import Filter
from echelon.runtime.errors import InvalidArgument
from echelon.v1 import common_pb2 as pb
from echelon.v1 import pubsub_pb2 as ppb

CLOCK_SKEW_NS = 500_000_000
MAX_NACK_DELAY = 600.0  # seconds, as Google Pub/Sub's longest retry backoff
_stream = attrgetter("stream")


class Pending:
    """A delivery owed: its event, or (relayed) the bytes the root serialized it in alone
    (`data`: sent on as they are, and the payload is not held twice in the backlog)."""

    __slots__ = ("_event", "redeliveries", "stream", "data")

    def __init__(self, event: pb.Event, redeliveries: int = 0, stream: ChunkStream | None = None, data: bytes = b""):
        self._event = None if data else event
        self.redeliveries = redeliveries
        self.stream = stream  # a sliced payload, handed out as it arrives (slices.py)
        self.data = data

    @property
    def event(self) -> pb.Event:
        return self._event if self._event is not None else pb.Event.FromString(self.data)

    def into(self, d: ppb.Delivery, encoded: bool) -> None:
        """Set the event of Delivery `d`: the bytes it came in, to a client that reads them
        (`encoded`), else as a message (building it was much of the agent's cost per delivery)."""
        if encoded and self.data:
            d.encoded_event = self.data
        elif self.data:
            d.event.MergeFromString(self.data)
        else:
            d.event.CopyFrom(self._event)  # in place: a fifth of the cost of event= (upb)


class Subscription:
    durable = False  # durable_sub.DurableSubscription: kept on disk and by a replica agent
    owner = ""  # the identity that opened it (agent/ownership.py)

    def __init__(self, sid: str, name: str, topic: str, flt: Filter, max_backlog: int):
        self.id = sid  # cluster-wide: "<agent>/<name>"
        self.name = name
        self.topic = topic
        self.filter = flt
        self.max_backlog = max_backlog
        self.named = not name.startswith("~")
        self.backlog: deque[Pending] = deque()
        self.unacked: dict[int, Pending] = {}
        self.credits = 0
        self.delayed = 0  # nacked, waiting for their delay
        self.attached = False
        self.overflowed = False
        self.closed = False
        self.ended: Exception | None = None  # set: the attached stream ends with this error (a durable seek)
        self.changed = asyncio.Event()
        self.created_ns = time.time_ns()
        self._next_id = 1
        self._unsettled = 1  # no id below it is in `unacked` (cumulative acks start here)

    def owes(self, event: pb.Event) -> bool:
        """Was `event` published after this subscription existed (give or take the skew)?"""
        t = event.publish_time_unix_nanos
        return not t or t >= self.created_ns - CLOCK_SKEW_NS

    def offer(self, event: pb.Event, stream: ChunkStream | None = None, data: bytes = b"") -> bool:
        """Queue an event for delivery (a sliced payload: its head and chunk stream; `data`:
        its bytes as received, if it came so); False (and overflowed) past the backlog bound."""
        if self.closed:
            return False
        if self.depth >= self.max_backlog:
            self.overflowed = True
            self.changed.set()
            return False
        self.backlog.append(Pending(event, 0, stream, data))
        self.changed.set()
        return True

    def offer_many(self, events: list[pb.Event], data: list[bytes]) -> int | None:
        """`offer` for a frame's events matched here, in order (each with its bytes as
        received, b"": none): those owed are queued, one wakeup for all; how many, or None
        past the backlog bound (overflowed, those below it queued). A durable subscription
        logs each (its own `offer`)."""
        if self.durable:
            return sum(self.offer(e, data=d) for e, d in zip(events, data) if self.owes(e))
        if self.closed:
            return None
        floor = self.created_ns - CLOCK_SKEW_NS  # as `owes`
        owed = [Pending(e, 0, None, d) for e, d in zip(events, data)
                if not (t := e.publish_time_unix_nanos) or t >= floor]
        room = self.max_backlog - self.depth
        if len(owed) > room:
            self.backlog.extend(owed[:max(room, 0)])
            self.overflowed = True
            self.changed.set()
            return None
        if owed:
            self.backlog.extend(owed)
            self.changed.set()
        return len(owed)

    def take(self, most: int = 1) -> list[tuple[int, Pending]]:
        """The next deliveries the client has credit for (at most `most`), ids increasing.
        A sliced payload is taken alone: it goes out as a head and its chunks, not in a batch."""
        n = min(self.credits, len(self.backlog), most)
        if n <= 0:
            return []
        backlog = self.backlog
        if n == 1 or backlog[0].stream is not None:  # one: a lone event, or a sliced payload alone
            pending = backlog.popleft()
            delivery_id = self._next_id
            self._next_id += 1
            self.credits -= 1
            self.unacked[delivery_id] = pending
            return [(delivery_id, pending)]
        taken = list(islice(backlog, n))
        streams = list(map(_stream, taken))
        if streams.count(None) != n:  # a sliced payload among them: what comes before it
            del taken[next(i for i, stream in enumerate(streams) if stream is not None):]
            n = len(taken)
        popleft = backlog.popleft
        for _ in range(n):
            popleft()
        ids = range(self._next_id, self._next_id + n)
        self._next_id += n
        self.credits -= n
        self.unacked.update(zip(ids, taken))
        return list(zip(ids, taken))

    def ack(self, delivery_ids, credits: int, through: int = 0) -> int:
        """Forget acked deliveries (`settle`) and take the credits back."""
        acked = len(self.settle(delivery_ids, through))
        self.credits += credits
        self.changed.set()
        return acked

    def settle(self, delivery_ids, through: int = 0) -> list[Pending]:
        """Take acked deliveries out of `unacked`: every one up to `through`, cumulatively,
        then the ids listed (ids are given consecutively, and a redelivery gets a new id: each
        id is looked up once, by the first `through` past it)."""
        pop, done = self.unacked.pop, []
        if through >= self._unsettled:
            through = min(through, self._next_id - 1)
            done = [p for p in map(pop, range(self._unsettled, through + 1), repeat(None)) if p is not None]
            self._unsettled = through + 1
        done += [p for p in map(pop, delivery_ids, repeat(None)) if p is not None]
        return done

    def nack(self, delivery_ids, delay: float, credits: int) -> int:
        """Give deliveries back unprocessed: redelivered after `delay` seconds."""
        if not 0 <= delay <= MAX_NACK_DELAY:
            raise InvalidArgument(f"nack delay {delay:g}s: 0 to {MAX_NACK_DELAY:g}s")
        nacked = self._unstreamed([self.unacked.pop(i) for i in delivery_ids if i in self.unacked],
                                  "nacked: a sliced payload is not redelivered")
        for pending in nacked:
            pending.redeliveries += 1
        if delay and nacked:
            self.delayed += len(nacked)
            asyncio.get_running_loop().call_later(delay, self._requeue, nacked, True)
        else:
            self._requeue(nacked, False)
        self.credits += credits
        self.changed.set()
        return len(nacked)

    def _requeue(self, nacked: list[Pending], delayed: bool) -> None:
        if delayed:
            self.delayed -= len(nacked)
        if not self.closed:  # a removed subscription drops them with the rest of its backlog
            self.backlog.extendleft(reversed(nacked))
            self.changed.set()

    def headers(self) -> tuple[tuple[str, str], ...]:
        """More initial metadata for the stream (durable_sub.py)."""
        return ()

    def attach(self, credits: int) -> None:
        self.attached = True
        self.credits = credits

    def detach(self) -> None:
        """The stream ended: unacknowledged deliveries go back to the head of the backlog;
        sliced payloads are lost to this subscription (nothing holds them to redeliver)."""
        for delivery_id in sorted(self.unacked, reverse=True):
            pending = self.unacked.pop(delivery_id)
            pending.redeliveries += 1
            self.backlog.appendleft(pending)
        self.backlog = deque(self._unstreamed(self.backlog, "the subscription stream ended"))
        self.attached = False
        self.credits = 0

    @staticmethod
    def _unstreamed(pendings, reason: str) -> list[Pending]:
        """`pendings` without the sliced payloads, whose streams are aborted."""
        kept = []
        for pending in pendings:
            if pending.stream is None:
                kept.append(pending)
            else:
                pending.stream.abort(reason)
        return kept

    @property
    def depth(self) -> int:
        return len(self.backlog) + len(self.unacked) + self.delayed
