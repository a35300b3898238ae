"""One durable subscription as its holder keeps it: the in-memory `Subscription` (credits,
deliveries out, nacks) over this agent's on-disk log (store.py).

Every change reaches the log before it takes effect in memory, or in the same call:
an offered event is logged as owed before it can be delivered; an ack is logged as gone
(and queued for the other holders) before its credits let anything new out. So a crash
at any step costs at most a redelivery of something not yet acknowledged in the log
(at-least-once), never a message.

Backlog bound: core/durability.py (`admit`); the size counted is the event's encoded
size. Under LAG (the default policy) a subscription past its bound lags as a named one
does (agent/subscriptions.py): it keeps every message and holds `room`, so the frames that
bring more are acknowledged upstream only once its subscriber's acks (or, for another
holder's copy, the serving holder's) bring it below the bound, and its publishers slow
down. One that makes no progress for the stall bound stops holding them and sheds its
oldest down to the bound (DROP_OLDEST, counted in `drops`).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections import OrderedDict, deque
from typing import Callable, Iterable

from echelon.agent.durable.store import Key, Store, key_of
from echelon.agent.subscriptions import Pending, Subscription
from echelon.core.durability import Admission, Bound, Policy, admit
from echelon.contract.filters import Filter
from echelon.v1 import common_pb2 as pb
from echelon.v1 import durable_pb2 as dpb

STALE_REBUILD = 4096  # acked messages left inside a replica's backlog before it is rebuilt
RECENT_ACKS = 100_000  # acked message ids remembered per subscription (late copies are dropped)
CRASH_ENV = "ECHELON_DURABLE_CRASH_AT"  # fault injection for the tests: the process exits at this step


_KEEP = Admission(True, 0)


def crash_point(step: str) -> None:
    """Exit at once (as kill -9 would: no flush, no goodbye) when the tests ask for `step`."""
    if os.environ.get(CRASH_ENV) == step:
        os._exit(137)


class DurableSubscription(Subscription):
    durable = True

    def __init__(self, me: str, record: dpb.DurableSubscription, flt: Filter, store: Store,
                 acked: Callable[["DurableSubscription", list[Key]], None], drops: Callable[[int], None]):
        o = record.options
        super().__init__(f"{me}/{record.name}", record.name, record.topic, flt, int(o.max_messages))
        self.record = record
        self.store = store
        self.bound = Bound(int(o.max_messages), int(o.max_bytes), Policy(o.policy))
        self.created_ns = record.created_unix_nanos
        self.acked = acked  # logged acks, for the other holders
        self.drops = drops  # a counted loss (the backlog policy)
        self.sizes: dict[Key, int] = {}
        self.nbytes = 0
        self.dropped = 0
        self.synced = True  # False: loaded from disk, not yet compared with an older holder's copy
        self.empty = False  # True: adopted with no copy of its own yet (only another holder's will do)
        self.arrived: set[Key] = set()  # received by this process while not synced: kept beside a copy
        self.top_up: asyncio.Task | None = None  # copies.py `top_up`, after a copy was taken
        self.recent: OrderedDict[Key, None] = OrderedDict()  # acked lately: a late copy is not owed again
        self.stale: set[Key] = set()  # acked by the serving holder, still in `backlog` (skipped)

    @property
    def holders(self) -> list[str]:
        return list(self.record.holders)

    def headers(self) -> tuple[tuple[str, str], ...]:
        return (*super().headers(), ("x-echelon-seeks", str(self.record.seeks)))

    def full(self) -> bool:
        return self.bound.full(self.depth, self.nbytes)

    def oldest_ns(self) -> int:
        return min((e.publish_time_unix_nanos for e in self.owed()), default=0)

    # -- the log first ---------------------------------------------------------------------

    def offer(self, event: pb.Event, data: bytes = b"") -> bool:
        """Log and queue; past the bound the policy drops (counted). Always True: a durable
        subscription is never closed for its backlog. (`data`, the event's bytes as
        received, is not kept: what is sent comes from the log.)"""
        if self.closed:
            return True
        key = key_of(event)
        if not self.synced and key not in self.recent:
            self.arrived.add(key)
        if key in self.sizes or key in self.recent:
            return True  # already owed (a copy adopted from the other holder), or acked
        size = event.ByteSize()
        bound = self._bound()
        if bound.policy is Policy.LAG:
            decision = _KEEP  # past the bound it lags (`_lag`, below)
        else:
            if self.stale and bound.full(self.depth + 1, self.nbytes + size):
                self._rebuild()  # the policy counts and evicts only what is really owed
            decision = admit(bound, (self.sizes[key_of(p.event)] for p in self.backlog), self.depth, self.nbytes,
                             size)
        evicted = list(itertools.islice(self.backlog, decision.evict))
        if not decision.keep:
            self.dropped += 1
            self.drops(1)
            return True
        self.store.append(event, [self.name], [(self.name, key_of(p.event)) for p in evicted])
        for p in evicted:
            self.backlog.popleft()
            self._gone(key_of(p.event))
        if evicted:
            self.dropped += len(evicted)
            self.drops(len(evicted))
        self.sizes[key] = size
        self.nbytes += size
        self.backlog.append(Pending(event))
        self._lag()
        self.changed.set()
        return True

    def _bound(self) -> Bound:
        """The bound in force: a stalled LAG subscription sheds its oldest (the module doc)."""
        if self.bound.policy is Policy.LAG and self.shedding:
            return Bound(self.bound.max_messages, self.bound.max_bytes, Policy.DROP_OLDEST)
        return self.bound

    def _lag(self) -> None:
        if self.bound.policy is Policy.LAG and not self.closed:
            super()._lag()

    def _shed(self) -> int:
        """Stalled: drop the oldest queued (logged as gone, counted) until within the bound."""
        if self.stale:
            self._rebuild()
        n = 0
        while self.backlog and self.full():
            key = key_of(self.backlog.popleft().event)
            self.store.ack(self.name, self.topic, [key])
            self._gone(key)
            n += 1
        if n:
            self.dropped += n
            self.drops(n)
        return n

    def _progressed(self) -> None:
        """Acks settled something: it may lag again, and has room once below the bound."""
        self._progress = time.monotonic()
        self.shedding = False
        if self.room is not None and not self.full():
            self.release()

    def ack(self, delivery_ids, credits: int, through: int = 0) -> int:
        """As Subscription.ack (listed ids and, cumulatively, every one up to `through`), the
        log first: the credits come back once the acks are committed."""
        crash_point("ack-received")
        done = self.settle(delivery_ids, through)
        self.forget(done)
        self.credits += credits
        self.changed.set()
        return len(done)

    def forget(self, done: list[Pending]) -> None:
        """Settled for good (acked, termed, dead-lettered): logged as gone, for every holder."""
        keys = [key_of(p.event) for p in done]
        if keys:
            self.store.ack(self.name, self.topic, keys)
            crash_point("ack-logged")
            for k in keys:
                self._gone(k)
            self.remember(keys)
            self.acked(self, keys)
            self._progressed()

    def remember(self, keys: Iterable[Key]) -> None:
        for k in keys:
            self.recent[k] = None
        while len(self.recent) > RECENT_ACKS:
            self.recent.popitem(last=False)

    def _gone(self, key: Key) -> None:
        self.nbytes -= self.sizes.pop(key, 0)

    # -- changes from elsewhere ------------------------------------------------------------

    def apply_acks(self, keys: Iterable[Key]) -> None:
        """The serving holder's acks (this is another holder's copy). Acks come mostly for
        the oldest messages: those leave the head at once, others are skipped when they
        reach it (`stale`; the backlog is rebuilt past STALE_REBUILD of them)."""
        keys = list(keys)
        self.remember(keys)
        gone = {k for k in keys if k in self.sizes}
        if not gone:
            return
        self.store.ack(self.name, self.topic, gone)
        for i in [i for i, p in self.unacked.items() if key_of(p.event) in gone]:
            del self.unacked[i]
        for k in gone:
            self._gone(k)
        self.stale |= gone
        self._drop_stale_head()
        if len(self.stale) > STALE_REBUILD:
            self._rebuild()
        self._progressed()
        self.changed.set()

    def _rebuild(self) -> None:
        self.backlog = deque(p for p in self.backlog if key_of(p.event) not in self.stale)
        self.stale.clear()

    def owed(self) -> list[pb.Event]:
        """Everything owed, out for delivery first (in delivery order), then the backlog."""
        return [p.event for _, p in sorted(self.unacked.items())] + \
            [p.event for p in self.backlog if key_of(p.event) not in self.stale]

    def _drop_stale_head(self) -> None:
        while self.backlog and key_of(self.backlog[0].event) in self.stale:
            self.stale.discard(key_of(self.backlog.popleft().event))

    def take(self, most: int = 1):
        """As Subscription.take, skipping what the serving holder acked meanwhile."""
        taken = []
        while len(taken) < most:
            self._drop_stale_head()
            one = super().take(1)
            if not one:
                break
            taken += one
        return taken

    @property
    def depth(self) -> int:
        return len(self.backlog) - len(self.stale) + len(self.unacked) + self.delayed

    def load(self, events: Iterable[pb.Event]) -> None:
        """Owe exactly `events` (from the log, a seek, or an adopted copy); what was out for
        delivery is forgotten (its acks find nothing)."""
        self.backlog = deque(Pending(e) for e in events)
        self.stale.clear()
        self.unacked.clear()
        self.sizes = {key_of(p.event): p.event.ByteSize() for p in self.backlog}
        self.nbytes = sum(self.sizes.values())
        if self.room is not None and not self.full():
            self.release()
        self.changed.set()

    def touch(self, now_ns: int | None = None) -> int:
        self.record.last_active_unix_nanos = now_ns or time.time_ns()
        return self.record.last_active_unix_nanos

    def describe(self, me: str) -> dpb.DurableSubscription:
        out = dpb.DurableSubscription()
        out.CopyFrom(self.record)
        out.backlog_messages, out.backlog_bytes = self.depth, self.nbytes
        out.oldest_unacked_unix_nanos, out.dropped = self.oldest_ns(), self.dropped
        out.attached, out.answered_by = self.attached, me
        return out
