"""Dead messages at the agent (docs/guarantees.md, "Dead messages"): each subscription's
ack deadline, `in_progress` and `term`, and max deliveries with a dead-letter topic
(the pure rules: core/redelivery.py).

- The deadline is the agent's: a delivery not settled within it is taken back and
  redelivered (`redelivery_count` + 1), as a nack without delay would; the client's
  later ack or nack of it settles nothing (its credit still comes back: every delivery
  sent is paid for by one credit, repaid when the client settles its id). `in_progress`
  starts a delivery's deadline again. A sliced payload has none (it is not redelivered).
- `term` settles deliveries as an ack does (a durable subscription logs them acked), and
  counts them apart.
- A delivery given back (nacked, past its deadline, its stream ended) after
  `max_deliveries` deliveries is not queued again: this agent publishes it to the
  dead-letter topic (in-process, as a member: the caller's right was checked at the
  open) with `dead_letter_deliveries` and `dead_letter_subscription`, at the DELIVERED
  level, and settles it once that is acknowledged. Until then it counts against the
  subscription's backlog bound; a failed publish is counted and retried with backoff,
  for as long as the subscription exists (its removal drops it with the rest of its
  backlog, logged).

The open is checked before anything is held (`check_open`): bad values are
INVALID_ARGUMENT, no publish right on the dead-letter topic PERMISSION_DENIED, no such
topic NOT_FOUND. An agent that enforces all this says so in every subscription stream's
initial metadata (`HEADER`): the SDK then sends `term` and `in_progress` and leaves dead
letters to the agent (client/deadlines.py is its fallback for older agents).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from itertools import count
from time import monotonic as _monotonic
from typing import TYPE_CHECKING, Callable

import grpc

from echelon.core import redelivery as rules
from echelon.contract.errors import InvalidArgument
from echelon.contract.transport import REDELIVERY_KEY
from echelon.v1 import pubsub_pb2 as ppb

if TYPE_CHECKING:
    from echelon.agent.metrics import AgentMetrics
    from echelon.agent.subscriptions import Pending, Subscription
    from echelon.agent.topics import Topics

log = logging.getLogger("echelon.agent.redelivery")

HEADER = (REDELIVERY_KEY, "1")
SERVICE = ppb.DESCRIPTOR.services_by_name["PubSub"].full_name
RETRY_FIRST, RETRY_MOST = 0.5, 30.0  # seconds between attempts of a failed dead-letter publish


def policy_of(p: ppb.RedeliveryPolicy, topic: str) -> rules.Policy:
    """The policy asked for on `topic`, defaults filled in; INVALID_ARGUMENT if it is bad."""
    try:
        return rules.policy(p.ack_deadline_ms, p.no_ack_deadline, p.max_deliveries, p.dead_letter_topic, topic)
    except ValueError as e:
        raise InvalidArgument(str(e)) from None


def to_pb(policy: rules.Policy) -> ppb.RedeliveryPolicy:
    """As a durable subscription's record keeps it (the deadline filled in)."""
    return ppb.RedeliveryPolicy(ack_deadline_ms=policy.ack_deadline_ms, no_ack_deadline=policy.ack_deadline is None,
                                max_deliveries=policy.max_deliveries, dead_letter_topic=policy.dead_letter_topic)


async def check_open(topics: Topics, access, open_: ppb.SubscriptionOpen) -> rules.Policy:
    """The open's policy, checked before anything is held: its values, then the caller's
    publish right on the dead-letter topic, the topic, and its schema against the
    subscription topic's."""
    policy = policy_of(open_.redelivery, open_.topic)
    dead = policy.dead_letter_topic
    if dead:
        access.require("publish", dead, SERVICE)  # PERMISSION_DENIED, counted
        source, target = await topics.get(open_.topic), await topics.get(dead)  # NOT_FOUND
        refusal = rules.schema_refusal(topics.schema(source), topics.schema(target),
                                       open_.subscription or "~", policy.max_deliveries)
        if refusal:
            raise InvalidArgument(f"dead_letter_topic {dead!r} cannot take the dead letters of topic "
                                  f"{source.name!r}: {refusal}")
    return policy


def apply(sub: Subscription, policy: rules.Policy, dead_letters: DeadLetters, metrics: AgentMetrics) -> None:
    """`sub` follows `policy` from now on (a named subscription resumed: its new open's)."""
    if sub.deadlines is not None:
        sub.deadlines.stop()
    sub.deadlines = None if policy.ack_deadline is None else Deadlines(sub, policy.ack_deadline, metrics)
    sub.policy = policy
    sub.dead = dead_letters if policy.max_deliveries else None


def handle(metrics: AgentMetrics, sub: Subscription, req) -> bool:
    """A subscriber's `term` or `in_progress` (of a stream of its own, or an element of a
    shared one's batch); False for any other request."""
    kind = req.WhichOneof("kind")
    if kind == "term":
        n = sub.ack(req.term.delivery_ids, req.term.credits)
        if n:
            metrics.terminated.labels(sub.topic).inc(n)
        return True
    if kind == "in_progress":
        if sub.deadlines is not None:
            sub.deadlines.progress(req.in_progress.delivery_ids)
        return True
    return False


class Deadlines:
    """One subscription's ack deadlines: marks of what was sent when (core/redelivery.py),
    the deliveries whose deadline `in_progress` moved, and one timer."""

    def __init__(self, sub: Subscription, seconds: float, metrics: AgentMetrics):
        self.sub = sub
        self.seconds = seconds
        self.marks = rules.Marks(seconds)
        self.extended: dict[int, float] = {}  # delivery id -> its deadline, once in_progress moved it
        self.metrics = metrics
        self._timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()
        self._stopped = False

    def sent(self, last_id: int) -> None:
        """Subscription.take handed out deliveries up to `last_id` (once per take: the hot
        path; time.monotonic is asyncio's loop clock, without its method's call)."""
        if self.marks.sent(_monotonic(), last_id) and self._timer is None:
            self._arm()

    def progress(self, delivery_ids) -> None:
        unacked, due = self.sub.unacked, _monotonic() + self.seconds
        for i in delivery_ids:
            if i in unacked:
                self.extended[i] = due
        if self._timer is None:
            self._arm()

    def stop(self) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        times = [t for t in (self.marks.next_due(), min(self.extended.values(), default=None)) if t is not None]
        self._timer = self._loop.call_later(max(0.0, min(times) - _monotonic()), self._fire) \
            if times and not self._stopped else None

    def _fire(self) -> None:
        self._timer = None
        sub = self.sub
        if sub.closed or self._stopped:
            return
        now = _monotonic()
        bound = self.marks.due(now)
        unacked, extended, due = sub.unacked, self.extended, []
        for i, pending in unacked.items():  # in id order (ids are given increasing)
            if i > bound:
                break
            if i not in extended and pending.stream is None:  # a sliced payload has no deadline
                due.append(i)
        for i, moved in list(extended.items()):
            if i not in unacked or moved <= now:
                del extended[i]
                if i in unacked and unacked[i].stream is None:
                    due.append(i)
        if due:
            self._expire(sorted(due))
        self._arm()

    def _expire(self, ids: list[int]) -> None:
        sub = self.sub
        pop = sub.unacked.pop
        taken = [pop(i) for i in ids]
        for pending in taken:
            pending.redeliveries += 1
        self.metrics.expired.labels(sub.topic).inc(len(taken))
        log.info("%d deliveries of subscription %s past their %gs ack deadline: redelivered", len(taken), sub.id,
                 self.seconds)
        if sub.dead is not None:
            taken = sub.dead.divert(sub, taken)
        sub.backlog.extendleft(reversed(taken))
        sub.changed.set()


class DeadLetters:
    """This agent's dead-letter publishes: one producer id for the process, one sequence
    per dead letter (kept across its retries, so a retry after a lost ack is a duplicate,
    not a second copy)."""

    def __init__(self, agent_id: str, publish: Callable, metrics: AgentMetrics):
        self.publish = publish  # PubSubServicer.Publish: this agent's own handler, called in-process
        self.metrics = metrics
        self.producer = f"{agent_id}:dead-letters:{time.time_ns()}"
        self._sequence = count(1)
        self.pending = 0  # dead letters not yet published (in flight or waiting to retry)
        self._tasks: set[asyncio.Task] = set()
        metrics.dead_letters_pending.set_function(lambda: self.pending)

    def divert(self, sub: Subscription, given_back: list[Pending]) -> list[Pending]:
        """Of deliveries given back (their redelivery count already raised), those still to
        be redelivered; the ones past max deliveries go to the dead-letter topic."""
        most = sub.policy.max_deliveries
        kept = []
        for pending in given_back:
            if pending.redeliveries < most or pending.stream is not None:
                kept.append(pending)
                continue
            sub.delayed += 1  # held until published: within the backlog bound
            self.pending += 1
            # A context of its own: not the subscriber's call (whose rights and stream the
            # publish must not inherit), so the publish is this agent's, unchecked.
            task = asyncio.get_running_loop().create_task(self._send(sub, pending), context=contextvars.Context())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return kept

    async def _send(self, sub: Subscription, pending: Pending) -> None:
        event, topic = pending.event, sub.policy.dead_letter_topic
        req = ppb.PublishRequest(topic=topic, payload=event.payload, ordering_key=event.ordering_key,
                                 producer_id=self.producer, sequence=next(self._sequence),
                                 ack_level=ppb.ACK_LEVEL_DELIVERED)
        for name, value in event.attributes.items():
            req.attributes[name].CopyFrom(value)
        req.attributes[rules.DELIVERIES].int_value = pending.redeliveries
        req.attributes[rules.SUBSCRIPTION].string_value = sub.name
        wait = RETRY_FIRST
        try:
            while True:
                error = await self._publish(req)
                if error is None:
                    break
                self.metrics.dead_letter_failures.labels(topic).inc()
                if sub.closed:
                    log.error("dead letter %s:%d of subscription %s not published (%s); the subscription was "
                              "removed, and the message with it", event.id.producer_id, event.id.sequence, sub.id,
                              error)
                    return
                log.warning("dead letter %s:%d of subscription %s to %r failed (%s): retried in %gs",
                            event.id.producer_id, event.id.sequence, sub.id, topic, error, wait)
                await asyncio.sleep(wait)
                wait = min(wait * 2, RETRY_MOST)
            sub.forget([pending])  # settled for good (a durable subscription logs it acked)
            self.metrics.dead_lettered.labels(sub.topic).inc()
        finally:
            sub.delayed -= 1
            self.pending -= 1
            sub.changed.set()

    async def _publish(self, req: ppb.PublishRequest) -> str | None:
        """One publish through this agent's own Publish handler: None, or why it failed."""
        async def one():
            yield req
        try:
            acks = [ack async for ack in self.publish(one(), None)]
        except Exception as e:  # noqa: BLE001 - any failure is retried, and said
            return f"{type(e).__name__}: {e}"
        if not acks:
            return "no answer"
        code = acks[0].code
        if code:
            return f"{next((c.name for c in grpc.StatusCode if c.value[0] == code), code)}: {acks[0].error}"
        return None
