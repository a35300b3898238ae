"""The subscriptions this agent holds, and their registration on the matcher tier.

A subscription is opened attached to the stream that asked for it and registered on
the tier (matching.py); from the moment it is held here every way out of the open (a
refusal, the tier unreachable, the client gone meanwhile) closes it again, and closing
never awaits: it is removed here at once and its removal from the tier is queued (and
retried). So neither this agent nor the tier keeps a ghost; what is left over anyway is
found by reconciliation (reconcile.py), which also closes ephemeral subscriptions no
stream holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

import grpc

from echelon.agent.matching import MatchClient
from echelon.agent.metrics import AgentMetrics
from echelon.agent.named import NamedFile
from echelon.agent.redelivery import DeadLetters, apply, policy_of
from echelon.agent.subscriptions import MAX_BYTES, STALL_SECONDS, Subscription
from echelon.agent.topics import Topics
from echelon.contract.filters import DEFAULT_LIMITS, term_ids
from echelon.contract.errors import AlreadyExists, FailedPrecondition, InvalidArgument, Unavailable
from echelon.contract.wire import filter_from_request, filter_to_pb
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import pubsub_pb2 as ppb

log = logging.getLogger("echelon.agent.registry")


class Registry:
    def __init__(self, me: str, topics: Topics, matching: MatchClient, metrics: AgentMetrics,
                 advertise: Callable[[set[str]], None], max_backlog: int):
        self.me = me
        self.topics = topics
        self.matching = matching
        self.metrics = metrics
        self.advertise = advertise  # the topics subscribed here, for the LBDD peer table
        self.max_backlog = max_backlog
        self.max_bytes = MAX_BYTES
        self.stall_seconds = STALL_SECONDS
        self.subs: dict[str, Subscription] = {}  # by name
        self._terms: dict[str, int] = {}  # subscription id -> its entries on the tier (contract/filters.py term_ids)
        self.filter_limits = DEFAULT_LIMITS  # what one filter may cost (an operator's settings go here)
        self._ephemeral = 0
        self.dead_letters: DeadLetters | None = None  # set by the agent once it can publish (server.py)
        self._tasks: set[asyncio.Task] = set()
        self.saved = NamedFile(None)  # the named subscriptions kept on disk (named.py; the agent's --data-dir)

    async def open(self, open_: ppb.SubscriptionOpen, owner: str = "") -> Subscription:
        """Open (or resume) a subscription attached to the caller's stream, registered on the
        tier; if this is cancelled or fails, the subscription is closed again."""
        topic = await self.topics.get(open_.topic)
        flt = filter_from_request(open_.filter, open_.filter_text, self.filter_limits).validate(
            self.topics.schema(topic), self.filter_limits)
        policy = policy_of(open_.redelivery, topic.name)  # checked in full before (redelivery.check_open)
        name = open_.subscription
        if name:
            if name.startswith("~"):  # in its owner's scope already (ownership.py)
                raise InvalidArgument(f"subscription name {name[:60]!r}: no leading '~' and no '/'")
            sub = self.subs.get(name)
            if sub is not None:
                if sub.durable:
                    raise FailedPrecondition(f"subscription {name!r} is durable: open it with durable options")
                if sub.attached:
                    raise AlreadyExists(f"subscription {name!r} is attached to another stream")
                if sub.topic != topic.name:
                    raise FailedPrecondition(f"subscription {name!r} is on topic {sub.topic!r}")
                sub.attach(open_.credits)
                apply(sub, policy, self.dead_letters, self.metrics)  # its new open's
                if sub.filter != flt:
                    # The new filter is wanted from here; if the tier cannot be reached now,
                    # reconciliation registers it later.
                    sub.filter = flt
                    try:
                        await self._register(sub)
                    except BaseException:
                        sub.detach()
                        raise
                    self._save()
                return sub
        else:
            self._ephemeral += 1
            name = f"~{self._ephemeral}"
        sub = self._new(name, topic.name, flt, owner, evict=open_.evict and not open_.subscription)
        sub.attach(open_.credits)
        apply(sub, policy, self.dead_letters, self.metrics)
        self.subs[name] = sub
        self._changed()
        try:
            await self._register(sub)
        except BaseException:  # refused, unreachable, or the client went away meanwhile
            self.close(sub)
            raise
        if sub.named:
            self._save()
        return sub

    def _new(self, name: str, topic: str, flt, owner: str, evict: bool = False) -> Subscription:
        sub = Subscription(f"{self.me}/{name}", name, topic, flt, self.max_backlog, self.max_bytes,
                           evict=evict)  # named subscriptions lag
        sub.owner = owner
        sub.on_stall, sub.on_shed, sub.stall_seconds = self._stalled, self.metrics.shed.inc, self.stall_seconds
        return sub

    def restore(self) -> list[Subscription]:
        """The named subscriptions a previous process of this agent kept (named.py): held
        again, detached, with their creation time, and registered on the tier (retried by
        reconciliation if it cannot be reached now). What was published before now may have
        been delivered by that process: it comes marked as a redelivery."""
        now = time.time_ns()
        restored = []
        for saved in self.saved.load():
            if saved.name in self.subs:
                continue
            sub = self._new(saved.name, saved.topic, saved.filter, saved.owner)
            sub.created_ns, sub.restored_ns = saved.created_ns, now
            self.subs[sub.name] = sub
            restored.append(sub)
        if restored:
            self._changed()
            log.info("restored %d named subscriptions kept by the previous process", len(restored))
            task = asyncio.get_running_loop().create_task(self._register_all(restored))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return restored

    async def _register_all(self, subs: list[Subscription]) -> None:
        """In one request, begun before reconciliation's first round (which would take the
        tier's copies of those not yet registered for a previous life's ghosts)."""
        entries = []
        for sub in subs:
            ids = term_ids(sub.id, len(sub.filter.terms))
            self._terms[sub.id] = len(ids)
            entries += [xpb.Subscription(id=i, agent=self.me, topic=sub.topic, filter=filter_to_pb(t))
                        for i, t in zip(ids, sub.filter.terms)]
        try:
            await self.matching.register(entries)
        except Exception as e:  # noqa: BLE001 - reconciliation registers them later
            log.warning("%d restored subscriptions not registered yet: %s", len(subs), e)

    def _save(self) -> None:
        try:
            self.saved.save(s for s in self.subs.values() if s.named and not s.durable)
        except OSError as e:  # the subscription works; only a crash of this process would lose it
            log.error("named subscriptions not kept on disk (%s): a crash of this agent ends them", e)

    async def _register(self, sub: Subscription) -> None:
        """Each term of the filter's normal form is an entry of its own on the tier (the
        matchers index conjunctions); the entries of a former filter's extra terms go."""
        terms = sub.filter.terms
        ids = term_ids(sub.id, len(terms))
        stale = term_ids(sub.id, self._terms.get(sub.id, 1))[len(ids):]
        self._terms[sub.id] = len(ids)
        if stale:
            self.matching.unregister(stale)
        try:
            await self.matching.register([xpb.Subscription(id=i, agent=self.me, topic=sub.topic, filter=filter_to_pb(t))
                                          for i, t in zip(ids, terms)])
        except grpc.aio.AioRpcError as e:
            raise InvalidArgument(e.details()) if e.code() == grpc.StatusCode.INVALID_ARGUMENT \
                else Unavailable(e.details()) from None

    def _stalled(self, sub: Subscription, shed: int) -> None:
        """A lagging subscription acknowledged nothing for its stall bound (subscriptions.py)."""
        kind = "durable" if sub.durable else "named" if sub.named else "ephemeral"
        self.metrics.stalls.labels(kind).inc()
        log.warning("subscription %s acknowledged nothing for %gs while holding its publishers back: %s", sub.id,
                    sub.stall_seconds, f"shedding its oldest ({shed} dropped)" if sub.named else "closed")

    def close(self, sub: Subscription) -> asyncio.Future:
        """Remove a subscription here at once (no await: a cancelled caller cannot stop
        half-way) and queue its removal from the tier; the future says when a matcher
        acknowledged it."""
        if sub.closed:
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        sub.closed = True
        sub.release()  # it holds no frame back any more
        sub.unkeep()
        sub.changed.set()
        if self.subs.get(sub.name) is sub:
            del self.subs[sub.name]
            if sub.named and not sub.durable:
                self._save()
        self._changed()
        return self.matching.unregister(term_ids(sub.id, self._terms.pop(sub.id, 1)))

    def close_orphans(self) -> int:
        """Ephemeral subscriptions no stream holds (none can attach again): closed."""
        orphans = [s for s in self.subs.values() if not s.named and not s.attached]
        for sub in orphans:
            log.warning("subscription %s had no stream: closed", sub.id)
            self.close(sub)
        return len(orphans)

    def close_ephemeral(self) -> None:
        """The agent stops: its ephemeral subscriptions end with it."""
        for sub in [s for s in self.subs.values() if not s.named]:
            self.close(sub)

    def _changed(self) -> None:
        self.metrics.subscriptions.set(len(self.subs))
        self.advertise({s.topic for s in self.subs.values()})
