"""Durable subscriptions (docs/guarantees.md, "Durable subscriptions": a named subscription
outlives its agent): cluster objects kept on disk by their holders and resumed from any agent.

Where one lives. Its record (topic, filter, options, holders) and backlog are kept by
`replicas` agents (default 2) chosen by rendezvous hashing when it is created
(core/durability.py), each in its own on-disk log (store.py), and each registered on
the matcher tier as a subscription of its own: so every holder receives every matching
event from the data plane, independently, and logs it. The record is not stored by
membership: it must fail over with the backlog it describes, and the holders are the
agents that have both. An agent that does not hold it finds it by asking the agents of
its view (`locate`: one round of calls per open, answered from memory).

Serving. The first alive holder (in the record's order) serves the subscriber's stream;
an open reaching another agent is relayed there (rpc.py). Acks are logged there
before their credits are given back and sent on to the other holders in order (batched,
within milliseconds): a holder that takes over redelivers at most what was acked in
that moment, and the client drops a redelivery of what it acked itself
(client/subscription.py), so an application never sees a message again after acking it.

Restart. A holder loads its copies from disk, registers them again, and before serving
takes the copy of an older holder process (`sync`): what was published or acked while
it was down is there, and what this process received itself meanwhile is kept beside it
(it can be ahead of the other holder in an event's dissemination tree). For the same
reason it looks at that holder's copy again a few seconds later (copies.py `top_up`): an
event handed to it before it held the subscription matched nothing here. A holder that
lost its disk learns of its subscriptions from the other holder, which tells every
co-holder that (re)joins the view with a new process lifetime (`maintain`). A copy is adopted only from a process older than the adopter (or
by an agent with no copy at all), so a stale copy never overwrites a fresher one.

Order. A holder logs what the data plane hands it in arrival order and serves it in
that order (an adopted copy in its holder's order); redeliveries come first. Per key it
is the data plane's order (FIFO per producer while the view is stable).

Limits, said plainly. The holders are fixed when the subscription is created (a later
change of the agent set does not move it; with both holders lost for good it is lost).
Finding a subscription asks every agent of the view (one round of calls per open on an
agent that does not hold it), and does not conclude it is new while an agent seen alive
moments ago is missing from the view (peers.py `locate`). Retention keeps what the holders received for durable
subscriptions of the topic (the union of their filters), not every event published.

Seek, delete and idle expiry apply on every holder; the other agents (alive, serving,
stubs, `locate`, telling co-holders) are peers.py; acks go on to the other holders in
acks.py; retention of the log per topic and the REJECT_PUBLISH notices run in
upkeep.py, every second.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from prometheus_client import Counter, Gauge

from echelon.agent.durable.acks import AckReplicator
from echelon.agent.durable.caps import within_caps
from echelon.agent.durable.copies import copy_of, take_copy
from echelon.agent.durable.peers import Peers
from echelon.agent.durable.subscription import DurableSubscription
from echelon.agent.durable.upkeep import flush_loop, maintain_loop
from echelon.agent.redelivery import apply, policy_of, to_pb
from echelon.agent.durable.store import Key, Store
from echelon.core.durability import Policy, holders
from echelon.contract.filters import Filter
from echelon.contract.errors import (Aborted, AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, OutOfRange,
                                    ResourceExhausted, Unavailable)
from echelon.contract.wire import attributes_from_pb, filter_from_pb, filter_from_request, filter_to_pb
from echelon.v1 import common_pb2 as pb
from echelon.v1 import durable_pb2 as dpb
from echelon.v1 import pubsub_pb2 as ppb

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from echelon.agent.metrics import AgentMetrics
    from echelon.agent.registry import Registry
    from echelon.agent.topics import Topics
    from echelon.runtime.auth import Access
    from echelon.runtime.member import MemberClient
    from echelon.contract.transport import Transport


class Host(Protocol):
    """What durable subscriptions use of their agent, read when used (the membership
    client and the registry's subscriptions come and go with the agent's life)."""

    registry: CollectorRegistry
    metrics: AgentMetrics
    topics: Topics
    subscriptions: Registry
    membership: MemberClient
    fsync_batch_ms: float

log = logging.getLogger("echelon.agent.durable.durables")

FULL_NOTICE_SECONDS = 5.0  # a REJECT_PUBLISH notice lapses unless repeated (every maintain)


@dataclass
class Defaults:
    """The agent's defaults for what an open or a topic leaves at 0."""

    max_messages: int = 10_000
    max_bytes: int = 64 << 20
    idle_seconds: int = 7 * 86400
    replicas: int = 2
    retention_seconds: int = 3600
    retention_bytes: int = 256 << 20


class Durables:
    def __init__(self, me: str, host: Host, access: Access, transport: Transport, store: Store,
                 defaults: Defaults):
        self.host, self.access, self.transport = host, access, transport
        self.me = me
        self.store = store
        self.defaults = defaults
        self.started_ns = time.time_ns()
        self.subs: dict[str, DurableSubscription] = {}
        self.refusing: dict[str, tuple[str, Filter, float]] = {}  # name -> (topic, filter, until: monotonic)
        self.acks = AckReplicator(self)
        self.peers = Peers(self)
        self._syncing: dict[str, asyncio.Task] = {}
        r = host.registry
        self.dropped = Counter("echelon_durable_dropped_total", "Messages a durable subscription's backlog policy "
                               "dropped (a counted loss).", registry=r)
        self.refused = Counter("echelon_durable_publishes_refused_total", "Publishes refused because a matching "
                               "REJECT_PUBLISH durable subscription is full.", registry=r)
        self.retention_expired = Counter("echelon_durable_retention_expired_total", "Logged events let go by "
                                         "their topic's retention.", registry=r)
        self.idle_expired = Counter("echelon_durable_idle_expired_total", "Durable subscriptions deleted after "
                                    "their idle time.", registry=r)
        self.replication_failures = Counter("echelon_durable_replication_failures_total", "Changes a co-holder "
                                            "did not take (it syncs when it comes back).", registry=r)
        self.flushes = Counter("echelon_durable_fsyncs_total", "Periodic fsyncs of the log (batch policy).",
                               registry=r)
        Gauge("echelon_durable_subscriptions", "Durable subscriptions held here.", registry=r
              ).set_function(lambda: len(self.subs))
        Gauge("echelon_durable_backlog_messages", "Messages owed by the durable subscriptions held here "
              "(queued and out for delivery).", registry=r).set_function(
            lambda: sum(s.depth for s in list(self.subs.values())))
        Gauge("echelon_durable_backlog_bytes", "Bytes owed by the durable subscriptions held here.", registry=r
              ).set_function(lambda: sum(s.nbytes for s in list(self.subs.values())))
        Gauge("echelon_durable_backlog_oldest_age_seconds", "Age of the oldest message a durable subscription "
              "held here owes (0: none).", registry=r).set_function(self._oldest_age)

    def _oldest_age(self) -> float:
        oldest = [t for t in (s.oldest_ns() for s in list(self.subs.values())) if t]
        return max(0.0, (time.time_ns() - min(oldest)) / 1e9) if oldest else 0.0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> list[asyncio.Task]:
        for name, blob in self.store.records().items():
            sub = self._hold(dpb.DurableSubscription.FromString(blob))
            sub.load(self.store.backlog(name))
            sub.synced = False
        return [asyncio.create_task(self.acks.run(), name="durable-acks"),
                asyncio.create_task(maintain_loop(self), name="durable-maintain"),
                *([asyncio.create_task(flush_loop(self, self.host.fsync_batch_ms / 1000), name="durable-fsync")]
                  if self.store.fsync == "batch" else [])]

    def _hold(self, record: dpb.DurableSubscription) -> DurableSubscription:
        """Keep `record` here: in memory, in the registry (local delivery), on the tier."""
        sub = DurableSubscription(self.me, record, filter_from_pb(record.filter), self.store, self._acked,
                                  self.dropped.inc)
        self.subs[record.name] = sub
        registry = self.host.subscriptions
        sub.on_stall, sub.stall_seconds = registry._stalled, registry.stall_seconds  # lagging: subscription.py
        apply(sub, policy_of(record.redelivery, record.topic), registry.dead_letters, self.host.metrics)
        registry.subs[record.name] = sub
        registry._changed()
        asyncio.create_task(self.register(sub), name=f"durable-register {record.name}")
        return sub

    async def register(self, sub: DurableSubscription) -> None:
        """On the tier until it answers (matchers may still be starting)."""
        delay = 0.1
        while not sub.closed:
            try:
                await self.host.subscriptions._register(sub)
                return
            except Exception as e:  # noqa: BLE001 - retried; reconciliation is the net under it
                log.info("registering durable %s: %s (retrying)", sub.name, e)
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)

    def forget(self, name: str) -> None:
        sub = self.subs.pop(name, None)
        self.store.delete(name, time.time_ns())
        self.acks.forget(name)
        if sub is not None:
            self.host.subscriptions.close(sub)

    # -- opening a stream ------------------------------------------------------------------

    async def route(self, open_: ppb.SubscriptionOpen) -> str | None:
        """The agent that serves this open, None for this one. A relayed open is served here
        if this agent holds it (or nobody does yet: it is created here); otherwise it goes
        on to the serving holder, which serves it (at most two hops)."""
        check_name(open_.subscription)
        record = await self.peers.locate(open_.subscription)
        if record is None:
            agents = sorted({*self.peers.alive(), self.me})
            target = self.me if open_.routed else holders(open_.subscription, agents, self._replicas(open_.durable))[0]
        elif open_.routed and self.me in record.holders:
            target = self.me
        else:
            target = self.peers.serving(record)
        return None if target == self.me else target

    def _replicas(self, o: ppb.DurableOptions) -> int:
        return o.replicas or self.defaults.replicas

    async def open(self, open_: ppb.SubscriptionOpen) -> DurableSubscription:
        """Create or resume, attached to the caller's stream (this agent serves it)."""
        name = open_.subscription
        topic = await self.host.topics.get(open_.topic)
        limits = self.host.subscriptions.filter_limits  # the registry's, for every kind of subscription
        flt = filter_from_request(open_.filter, open_.filter_text, limits).validate(self.host.topics.schema(topic),
                                                                                     limits)
        sub = self.subs.get(name)
        if sub is None:
            record = await self.peers.locate(name)
            if record is not None and self.me not in record.holders:
                raise Unavailable(f"durable subscription {name!r} is held by {', '.join(record.holders)}: try again")
            if record is not None:
                sub = await self.adopt(record)
            else:
                sub = await self._create(name, topic, flt, open_.durable, open_.redelivery)
        elif not sub.synced:
            await self.sync(sub)
        if name not in self.subs:
            raise NotFound(f"durable subscription {name!r} was deleted")
        if not sub.synced:
            raise Unavailable(f"durable subscription {name!r}: this agent's copy waits for its other holders "
                              f"({', '.join(sub.holders)}); try again")
        if sub.topic != topic.name:
            raise FailedPrecondition(f"durable subscription {name!r} is on topic {sub.topic!r}")
        if sub.filter != flt:
            raise FailedPrecondition(f"durable subscription {name!r} exists with another filter")
        if sub.attached:
            raise AlreadyExists(f"durable subscription {name!r} is attached to another stream")
        sub.attach(open_.credits)
        sub.ended = None
        self.touch(sub)
        log.info("durable %s: a stream attached here (%d owed)", name, sub.depth)
        return sub

    def detached(self, sub: DurableSubscription) -> None:
        self.touch(sub)
        log.info("durable %s: its stream detached (%d owed)", sub.name, sub.depth)

    async def _create(self, name: str, topic: pb.Topic, flt: Filter, o: ppb.DurableOptions,
                      redelivery: ppb.RedeliveryPolicy) -> DurableSubscription:
        d = self.defaults
        if o.policy and o.policy not in Policy._value2member_map_:
            raise InvalidArgument(f"backlog policy {o.policy}: unknown")
        if o.start not in (ppb.START_POSITION_UNSPECIFIED, ppb.START_POSITION_NOW, ppb.START_POSITION_EARLIEST):
            raise InvalidArgument(f"start position {o.start}: unknown")
        if o.replicas > 5:
            raise InvalidArgument(f"replicas {o.replicas}: 1 to 5")
        limits = self.access.config.limits  # the caps apply to defaults too (caps.py)

        def default(field: str, value: int) -> int:
            return within_caps(field, value, limits, topic)
        options = ppb.DurableOptions(start=o.start or ppb.START_POSITION_NOW,
                                     max_messages=o.max_messages or default("max_messages", d.max_messages),
                                     max_bytes=o.max_bytes or default("max_bytes", d.max_bytes),
                                     policy=o.policy,  # unspecified: lag (core/durability.py)
                                     idle_seconds=o.idle_seconds or default("idle_seconds", d.idle_seconds),
                                     replicas=o.replicas or default("replicas", d.replicas))
        agents = sorted({*self.peers.alive(), self.me})
        chosen = holders(name, agents, options.replicas)
        if self.me not in chosen:  # another agent's view routed it here: this one serves it
            chosen = [self.me, *chosen[:-1]]
        now = time.time_ns()
        record = dpb.DurableSubscription(name=name, topic=topic.name, filter=filter_to_pb(flt), options=options,
                                         holders=chosen, created_unix_nanos=now, last_active_unix_nanos=now,
                                         redelivery=to_pb(policy_of(redelivery, topic.name)))
        sub = self._create_local(record)
        await self.register(sub)  # matched from the moment the open returns ("now")
        await self._tell_holders(sub, dpb.DurableChange(name=name, create=record))
        return sub

    def _create_local(self, record: dpb.DurableSubscription) -> DurableSubscription:
        self.store.put_record(record.name, record.SerializeToString())
        sub = self._hold(record)
        if record.options.start == ppb.START_POSITION_EARLIEST:
            sub.load(self.store.seek(sub.name, sub.topic, self._matcher(sub), time_ns=0) or [])
        return sub

    # -- holders' copies -------------------------------------------------------------------

    async def adopt(self, record: dpb.DurableSubscription) -> DurableSubscription:
        """Hold a copy of an existing subscription (this agent had none): register, then take
        an older holder's backlog."""
        sub = self._hold(record)
        self.store.put_record(record.name, record.SerializeToString())
        sub.synced, sub.empty = False, True
        await self.sync(sub)
        return sub

    async def sync(self, sub: DurableSubscription) -> None:
        task = self._syncing.get(sub.name)
        if task is None:
            task = self._syncing[sub.name] = asyncio.create_task(take_copy(self, sub))
            task.add_done_callback(lambda _: self._syncing.pop(sub.name, None))
        await asyncio.shield(task)

    def fetch(self, name: str) -> dpb.DurableState:
        return copy_of(self, name)

    async def _tell_holders(self, sub: DurableSubscription, change: dpb.DurableChange) -> None:
        """One change to every other alive holder (those down sync when they come back)."""
        await self.peers.tell([h for h in sub.holders if h != self.me and h in self.peers.alive()], change)

    def syncing(self, name: str) -> bool:
        return name in self._syncing

    async def apply(self, change: dpb.DurableChange) -> None:
        """A change from another holder (or an agent passing on a command), to this copy."""
        kind = change.WhichOneof("change")
        if kind == "full":
            if change.full.full:
                self.refusing[change.name] = (change.full.topic, filter_from_pb(change.full.filter),
                                              time.monotonic() + FULL_NOTICE_SECONDS)
            else:
                self.refusing.pop(change.name, None)
            return
        sub = self.subs.get(change.name)
        if kind == "create":
            if sub is None:
                await self.adopt(change.create)
            elif not sub.synced:
                await self.sync(sub)
            return
        if sub is None:
            if kind == "delete":
                return
            raise NotFound(f"durable subscription {change.name!r} is not held here")
        if kind == "acks":  # activity, kept in memory: written with the record's next change
            sub.apply_acks([(m.producer_id, m.sequence) for m in change.acks.ids])
            sub.touch()
        elif kind == "seek":
            self.seek_local(sub, change.seek)
        elif kind == "delete":
            self.apply_delete(change.name)
        elif kind == "touch":
            self._save_touch(sub, change.touch_unix_nanos)

    # -- acks, activity --------------------------------------------------------------------

    def _acked(self, sub: DurableSubscription, keys: list[Key]) -> None:
        sub.touch()
        self.acks.add(sub.name, keys)

    def touch(self, sub: DurableSubscription) -> None:
        """A stream attached or detached: activity, on every holder (idle expiry)."""
        now = self._save_touch(sub, time.time_ns())
        asyncio.create_task(self._tell_holders(sub, dpb.DurableChange(name=sub.name, touch_unix_nanos=now)))

    def _save_touch(self, sub: DurableSubscription, now_ns: int) -> int:
        sub.touch(max(now_ns, sub.record.last_active_unix_nanos))
        self.store.put_record(sub.name, sub.record.SerializeToString())
        return sub.record.last_active_unix_nanos

    # -- seek, delete, describe ------------------------------------------------------------

    def _matcher(self, sub: DurableSubscription):
        return lambda e: sub.filter.matches(attributes_from_pb(e.attributes))

    def seek_local(self, sub: DurableSubscription, req: dpb.SeekRequest) -> int:
        target = req.WhichOneof("target")
        if target == "message":
            events = self.store.seek(sub.name, sub.topic, self._matcher(sub),
                                     key=(req.message.producer_id, req.message.sequence))
            if events is None:
                raise OutOfRange(f"message {req.message.producer_id}:{req.message.sequence} is not retained "
                                 f"for topic {sub.topic!r} here")
        elif target == "time_unix_nanos":
            events = self.store.seek(sub.name, sub.topic, self._matcher(sub), time_ns=req.time_unix_nanos)
        else:
            raise InvalidArgument("seek needs a time or a message id")
        sub.load(events)
        sub.record.seeks += 1
        self.store.put_record(sub.name, sub.record.SerializeToString())
        if sub.attached:  # what it owes changed under the stream: the subscriber reopens
            sub.ended = Aborted(f"durable subscription {sub.name!r} was sought: open it again")
        return sub.depth

    async def delete(self, record: dpb.DurableSubscription) -> None:
        """Gone from every alive holder (one that is down finds out when it syncs)."""
        self.apply_delete(record.name)
        await self.peers.tell([h for h in record.holders if h != self.me and h in self.peers.alive()],
                        dpb.DurableChange(name=record.name, delete=True))

    def apply_delete(self, name: str) -> None:
        if name in self.subs:
            self.forget(name)

    def refuse(self, topic: str, attrs) -> None:
        """Publishing side: RESOURCE_EXHAUSTED if a full REJECT_PUBLISH subscription wants it."""
        if not self.refusing:
            return
        now = time.monotonic()
        for name, (t, flt, until) in list(self.refusing.items()):
            if until < now:
                del self.refusing[name]
            elif t == topic and flt.matches(attrs):
                self.refused.inc()
                raise ResourceExhausted(f"durable subscription {name!r} is full (REJECT_PUBLISH): publish later")

def check_name(name: str) -> None:
    """A cluster-wide name: the client's part (after the last '/', ownership.py) 1-200
    characters with no leading '~'; the owner's part as long as an identity's name."""
    short = name.rpartition("/")[2]
    if not short or short.startswith("~") or len(short) > 200 or len(name) > 456:
        raise InvalidArgument(f"durable subscription name {name[:60]!r}: 1-200 characters, no leading '~', no '/'")
