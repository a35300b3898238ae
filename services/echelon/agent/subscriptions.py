"""Subscriptions held by an agent: backlog, client credits, unacknowledged deliveries.

A subscription never has more deliveries in flight than the client granted credits.
Named subscriptions outlive their stream: on detach the unacknowledged deliveries go
back to the head of the backlog (redelivery count + 1) for the next stream. A nacked
delivery comes back to the head of the backlog after the client's delay (redelivery
count + 1), counting against the bound while it waits.

The bound is `max_backlog` messages and `max_bytes` bytes held (queued, in flight,
waiting to be redelivered). Past it, by the subscription's policy (docs/guarantees.md):
- lag (the default): nothing is dropped. The subscription holds `room`, a data-plane
  hold (dataplane/holds.py) the frames that brought it events wait for before they are
  acknowledged upstream; it is released once the client's acks bring it below the
  bound. So the publishing agents' link windows fill, their roots wait for room, and
  the publish streams slow down (flow control from the subscriber's credits back to the
  publisher). A consumer that keeps up loses nothing; one that does not slows its
  publishers rather than lose.
- evict (an ephemeral subscription that asked for it, `SubscriptionOpen.evict`): it
  overflows, its stream ends with RESOURCE_EXHAUSTED and the agent counts it (as NATS
  core drops a slow consumer): the publishers never wait for it.

Lagging is for consumers that make progress. One that acknowledges nothing for
`stall_seconds` while it holds its publishers back (a client that never grants credits,
a named subscription left detached) would otherwise stop every publisher whose frames
pass through this agent: it is stalled, and stops holding them back. An ephemeral one is
closed with RESOURCE_EXHAUSTED; a named one sheds, dropping its oldest queued messages
to stay within its bound, until an ack shows progress again. Both are counted
(`on_stall`; docs/guarantees.md, "Flow control"). A topic admin who wants publishers
held whatever the consumer does chooses a durable subscription with REJECT_PUBLISH.

Ack deadlines, `term`, and max deliveries with a dead-letter topic are agent/redelivery.py's:
the hooks here are `deadlines` (told of each take), `dead` (given what comes back, it
keeps what is to be redelivered) and `forget` (a message settled other than by an ack).

A subscription is owed the events published from its creation on (docs/guarantees.md: "every
subscription that matched at publish time"). `owes` refuses older ones, allowing
`CLOCK_SKEW` between the publishing agent's clock and ours: so a process restarted after
a crash does not hand its new subscriptions what the dead process may already have
delivered (messages parked for it, or resent by a peer's link, while it was down).

A named subscription with a stream attached outlives a crash of its agent (kill -9): it
is kept on the agent's disk (named.py) and restored, detached, by the restarted process
with its creation time, and what it was sent is *kept* upstream meanwhile: each frame that
brought it events gets a `Hold` (`offer_many(keep=...)`) that is released only when the
client settles them (ack, term, dead letter), so the frame is acknowledged upstream only
then and a relay or the root still holds it, re-routes it when this agent dies, and parks
it until the restarted process is back (dataplane/parking.py). The restored subscription
marks what was published before the restart as a redelivery (`restored_ns`): the dead
process may have delivered it. Detached (its client gone, this process alive) or stalled
(settling nothing for `stall_seconds` while it keeps frames), it keeps nothing: its
backlog is this process's memory only, and the publishers never wait for a consumer that
is not there.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from itertools import islice, repeat
from operator import attrgetter
from typing import Callable

from echelon.dataplane.holds import Hold
from echelon.dataplane.slices import ChunkStream
from echelon.contract.filters import Filter
from echelon.contract.errors import InvalidArgument
from echelon.core.redelivery import DEFAULT as DEFAULT_POLICY
from echelon.agent.redelivery import HEADER as REDELIVERY_HEADER
from echelon.v1 import common_pb2 as pb
from echelon.v1 import pubsub_pb2 as ppb

CLOCK_SKEW_NS = 500_000_000
MAX_BYTES = 64 << 20  # bytes a subscription holds before it lags (or is evicted)
STALL_SECONDS = 30.0  # a lagging subscription that acknowledges nothing this long is stalled (above)
MAX_NACK_DELAY = 600.0  # seconds, as Google Pub/Sub's longest retry backoff
_stream = attrgetter("stream")
_size = attrgetter("size")


class Pending:
    """A delivery owed: its event, or (relayed) the bytes the root serialized it in alone
    (`data`: sent on as they are, and the payload is not held twice in the backlog)."""

    __slots__ = ("_event", "redeliveries", "stream", "data", "size", "hold")

    def __init__(self, event: pb.Event, redeliveries: int = 0, stream: ChunkStream | None = None, data: bytes = b""):
        self.hold: Hold | None = None  # the frame it came in, kept upstream until this is settled (module doc)
        self._event = None if data else event
        self.redeliveries = redeliveries
        self.stream = stream  # a sliced payload, handed out as it arrives (slices.py)
        self.data = data
        self.size = len(data) if data else event.ByteSize()  # what it holds here (a sliced payload: its head)

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
    stall_seconds = STALL_SECONDS
    on_stall: Callable[["Subscription", int], None] | None = None  # (it, messages shed): the registry counts
    on_shed: Callable[[int], None] | None = None  # messages dropped while shedding, each time
    policy = DEFAULT_POLICY  # ack deadline, max deliveries, dead-letter topic (agent/redelivery.py)
    deadlines = None  # redelivery.Deadlines: told of what each take sends (None: no deadline)
    dead = None  # redelivery.DeadLetters, with max deliveries: what comes back past it goes there

    def __init__(self, sid: str, name: str, topic: str, flt: Filter, max_backlog: int, max_bytes: int = MAX_BYTES,
                 evict: bool = False):
        self.id = sid  # cluster-wide: "<agent>/<name>"
        self.name = name
        self.topic = topic
        self.filter = flt
        self.max_backlog = max_backlog
        self.max_bytes = max_bytes
        self.evict = evict  # past the bound: overflow (evicted), else lag (the module doc)
        self.held_bytes = 0
        self.room: Hold | None = None  # while past the bound and lagging: what frames wait for
        self.shedding = False  # stalled (named): past the bound it drops its oldest instead of lagging
        self.shed = 0  # messages dropped while shedding
        self._progress = 0.0  # monotonic time of the last ack that settled something
        self._watch: asyncio.TimerHandle | None = None  # the stall check while `room` is held
        self.named = not name.startswith("~")
        self.backlog: deque[Pending] = deque()
        self.unacked: dict[int, Pending] = {}
        self.credits = 0
        self.delayed = 0  # held apart: nacked, waiting for their delay; on their way to the dead-letter topic
        self.attached = False
        self.overflowed = False
        self.closed = False
        self.ended: Exception | None = None  # set: the attached stream ends with this error (a durable seek)
        self.changed = asyncio.Event()
        self.created_ns = time.time_ns()
        self.restored_ns = 0  # restored after a crash (named.py): older events may have been delivered
        self.kept = 0  # deliveries whose frame is kept upstream until they are settled (module doc)
        self._kept_since = 0.0  # monotonic time `kept` last went above 0
        self._keep_watch: asyncio.TimerHandle | None = None
        self.keep_off = False  # stalled while keeping: keeps nothing until an ack shows progress
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
        if self.evict and self.full():
            self.overflowed = True
            self.changed.set()
            return False
        pending = Pending(event, 0, stream, data)
        self.backlog.append(pending)
        self.held_bytes += pending.size
        self._lag()
        self.changed.set()
        return True

    def offer_many(self, events: list[pb.Event], data: list[bytes], keep: list | None = None,
                   oldest: int = 0) -> int | None:
        """`offer` for a frame's events matched here, in order (each with its bytes as
        received, b"": none): those owed are queued, one wakeup for all; how many, or None
        past the backlog bound (overflowed, those below it queued). A durable subscription
        logs each (its own `offer`). `keep`: the incoming frame's holds, to which a named
        subscription with a stream attached adds one its events release once settled (module doc).
        `oldest`: a publish time no later than any of `events`' (0: not known); when this
        subscription owes events that old, no event's time is read (the common case)."""
        if self.durable:
            return sum(self.offer(e, data=d) for e, d in zip(events, data) if self.owes(e))
        if self.closed:
            return None
        floor = self.created_ns - CLOCK_SKEW_NS  # as `owes`
        # Restored after a crash: the dead process may have delivered what was published
        # before the restart, so it comes as a redelivery (0 when not restored: none is older).
        restored = self.restored_ns
        if oldest >= floor and not restored:  # each owed, none a redelivery
            owed = list(map(Pending, events, repeat(0), repeat(None), data))
        else:
            owed = [Pending(e, int(t < restored), None, d) for e, d in zip(events, data)
                    if not (t := e.publish_time_unix_nanos) or t >= floor]
        if keep is not None and owed and self.named and self.attached and not self.keep_off and not self.evict:
            self._keep(owed, keep)
        if self.evict:
            room = self.max_backlog - self.depth
            if len(owed) > room or self.held_bytes >= self.max_bytes:
                self.backlog.extend(owed[:max(room, 0)])
                self.overflowed = True
                self.changed.set()
                return None
        if owed:
            self.backlog.extend(owed)
            self.held_bytes += sum(map(_size, owed))
            self._lag()
            self.changed.set()
        return len(owed)

    def full(self) -> bool:
        return self.depth >= self.max_backlog or self.held_bytes >= self.max_bytes

    def _keep(self, owed: list[Pending], keep: list) -> None:
        """One hold for a frame's events here, released as each is settled (module doc)."""
        hold = Hold()
        hold.pending = len(owed)
        for p in owed:
            p.hold = hold
        keep.append(hold)
        if not self.kept:
            self._kept_since = time.monotonic()
            if self._keep_watch is None:
                try:
                    self._keep_watch = asyncio.get_running_loop().call_later(self.stall_seconds, self._check_kept)
                except RuntimeError:  # no loop (a unit test of the bookkeeping)
                    pass
        self.kept += len(owed)

    def _check_kept(self) -> None:
        """Settling nothing for `stall_seconds` while keeping frames: stop keeping them."""
        self._keep_watch = None
        if not self.kept or self.closed:
            return
        idle = time.monotonic() - max(self._progress, self._kept_since)
        if idle < self.stall_seconds:
            self._keep_watch = asyncio.get_running_loop().call_later(self.stall_seconds - idle, self._check_kept)
            return
        self.keep_off = True
        self.unkeep()

    def unkeep(self) -> None:
        """Every frame kept for this subscription is acknowledged upstream now: detached,
        stalled or closed, it keeps its backlog in this process's memory only."""
        if not self.kept:
            return
        for p in (*self.backlog, *self.unacked.values()):
            if p.hold is not None:
                p.hold.release()
                p.hold = None
        self.kept = 0  # the rest (dead letters on their way, nacks waiting for their delay) settle alone

    @staticmethod
    def _settled(done) -> int:
        n = 0
        for p in done:
            if p.hold is not None:
                p.hold.release()
                p.hold = None
                n += 1
        return n

    def _lag(self) -> None:
        """Past the bound (lagging): hold `room` until the client's acks bring it below;
        stalled (shedding): drop the oldest queued instead."""
        if self.room is not None or self.evict or not self.full():
            return
        if self.shedding:
            self._shed()
            return
        self.room = Hold()
        self.room.pending = 1
        self._progress = time.monotonic()
        try:
            self._watch = asyncio.get_running_loop().call_later(self.stall_seconds, self._check_stall)
        except RuntimeError:  # no loop (a unit test of the bookkeeping): nothing to watch with
            self._watch = None

    def _check_stall(self) -> None:
        self._watch = None
        if self.room is None or self.closed:
            return
        idle = time.monotonic() - self._progress
        if idle < self.stall_seconds:
            self._watch = asyncio.get_running_loop().call_later(self.stall_seconds - idle, self._check_stall)
            return
        if self.named:
            self.shedding = True
            shed = self._shed()
        else:
            self.overflowed, shed = True, 0  # its stream ends RESOURCE_EXHAUSTED, closing it
        self.release()
        self.changed.set()
        if self.on_stall is not None:
            self.on_stall(self, shed)

    def _shed(self) -> int:
        """Drop the oldest queued messages (never those in flight) until within the bound."""
        n = 0
        while self.backlog and self.full() and self.backlog[0].stream is None:
            p = self.backlog.popleft()
            self.held_bytes -= p.size
            if p.hold is not None:
                self.kept -= self._settled((p,))
            n += 1
        self.shed += n
        if n and self.on_shed is not None:
            self.on_shed(n)
        return n

    def release(self) -> None:
        """Below the bound again, or closed: the frames waiting for room are acknowledged."""
        room, self.room = self.room, None
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if room is not None:
            room.release()

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
            if self.deadlines is not None:
                self.deadlines.sent(delivery_id)
            return [(delivery_id, pending)]
        taken = list(islice(backlog, n))
        streams = list(map(_stream, taken))
        if streams.count(None) != n:  # a sliced payload among them: what comes before it
            del taken[next(i for i, stream in enumerate(streams) if stream is not None):]
            n = len(taken)
        if n == len(backlog):  # all of it: the common case
            backlog.clear()
        else:
            popleft = backlog.popleft
            for _ in range(n):
                popleft()
        ids = range(self._next_id, self._next_id + n)
        self._next_id += n
        self.credits -= n
        self.unacked.update(zip(ids, taken))
        if self.deadlines is not None:
            self.deadlines.sent(self._next_id - 1)
        return list(zip(ids, taken))

    def ack(self, delivery_ids, credits: int, through: int = 0) -> int:
        """Forget acked deliveries (`settle`) and take the credits back."""
        done = self.settle(delivery_ids, through)
        self.forget(done)
        self.credits += credits
        self.changed.set()
        return len(done)

    def forget(self, done: list[Pending]) -> None:
        """Settled for good (acked, termed, dead-lettered): no longer held."""
        if done:
            self.held_bytes -= sum(map(_size, done))
            if self.kept:
                self.kept = max(0, self.kept - self._settled(done))
            self._progress = time.monotonic()
            self.shedding = False  # progress: it may lag again
            self.keep_off = False  # and keep again
            if self.room is not None and not self.full():
                self.release()

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
        if self.kept:  # given back: nothing waits upstream on a redelivery its client delays
            self.kept = max(0, self.kept - self._settled(nacked))
        if self.dead is not None:
            nacked = self.dead.divert(self, nacked)
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
        """More initial metadata for the stream: the redelivery policy is enforced here
        (agent/redelivery.py); a durable subscription adds its own (durable/subscription.py)."""
        return (REDELIVERY_HEADER,)

    def attach(self, credits: int) -> None:
        self.attached = True
        self.credits = credits

    def detach(self) -> None:
        """The stream ended: unacknowledged deliveries go back to the head of the backlog;
        sliced payloads are lost to this subscription (nothing holds them to redeliver).
        Nothing is kept upstream for it any more (module doc)."""
        self.unkeep()
        back = [self.unacked.pop(i) for i in sorted(self.unacked)]
        for pending in back:
            pending.redeliveries += 1
        if self.dead is not None:
            back = self.dead.divert(self, back)
        self.backlog.extendleft(reversed(back))
        self.backlog = deque(self._unstreamed(self.backlog, "the subscription stream ended"))
        self.attached = False
        self.credits = 0

    def _unstreamed(self, pendings, reason: str) -> list[Pending]:
        """`pendings` without the sliced payloads, whose streams are aborted."""
        kept = []
        for pending in pendings:
            if pending.stream is None:
                kept.append(pending)
            else:
                self.held_bytes -= pending.size
                pending.stream.abort(reason)
        return kept

    @property
    def depth(self) -> int:
        return len(self.backlog) + len(self.unacked) + self.delayed
