"""Durable subscriptions, the pure parts: who holds one, what its backlog bound does with
one more message, and which retained events a topic's retention lets go.

Holders (docs/guarantees.md: a named subscription outlives its agent). A durable
subscription is held by `replicas` agents chosen by rendezvous (highest-random-weight)
hashing of (name, agent id): every agent computes the same order from the same agent
set, without a table, and a change of the set moves only the names whose top agents
changed (as LBDD's MD5 buckets: deterministic, no coordination). The order is fixed in
the subscription's record when it is created; the first holder that is alive serves its
stream, the others keep a copy of its backlog.

Backlog bound. Past `max_messages` or `max_bytes` the policy decides: LAG (the default)
keeps the new one and the agent holds back the frames that bring more until the
subscriber's acks make room, so its publishers slow down (agent/durable/subscription.py);
DROP_OLDEST makes room by dropping the oldest unacknowledged messages, DROP_NEW does not
keep the new one (either way a counted loss, chosen); REJECT_PUBLISH keeps the new one (it
was already accepted) and the publishing agents refuse further matching publishes until
the backlog shrinks. A single message larger than `max_bytes` is kept under LAG and
REJECT_PUBLISH only.

Retention. Per topic, events older than `max_age_ns` or past `max_bytes` (oldest first)
are let go, except those a durable subscription still owes: retention bounds replay
(`seek`, START_POSITION_EARLIEST), never the unacknowledged backlog.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import Enum
from typing import Iterable


def holders(name: str, agents: Iterable[str], replicas: int) -> list[str]:
    """The `replicas` agents that hold subscription `name`, in serving order."""
    def weight(agent: str) -> bytes:
        return hashlib.md5(f"{name}\0{agent}".encode()).digest()
    return sorted(set(agents), key=weight, reverse=True)[:replicas]


class Policy(Enum):
    LAG = 0  # BACKLOG_POLICY_UNSPECIFIED
    DROP_OLDEST = 1
    DROP_NEW = 2
    REJECT_PUBLISH = 3


@dataclass(frozen=True)
class Bound:
    max_messages: int
    max_bytes: int
    policy: Policy

    def full(self, messages: int, nbytes: int) -> bool:
        return messages >= self.max_messages or nbytes >= self.max_bytes


@dataclass(frozen=True)
class Admission:
    keep: bool  # the new message joins the backlog
    evict: int  # this many of the oldest backlog messages are dropped first


def admit(bound: Bound, sizes_oldest_first: Iterable[int], messages: int, nbytes: int, size: int) -> Admission:
    """What to do with a new message of `size` bytes for a backlog of `messages` holding
    `nbytes`; `sizes_oldest_first` are the sizes of the messages DROP_OLDEST may evict
    (the ones not out for delivery), oldest first."""
    if messages + 1 <= bound.max_messages and nbytes + size <= bound.max_bytes:
        return Admission(True, 0)
    if bound.policy is Policy.REJECT_PUBLISH or bound.policy is Policy.LAG:
        return Admission(True, 0)
    if bound.policy is Policy.DROP_NEW or size > bound.max_bytes:
        return Admission(False, 0)
    evict, m, b = 0, messages, nbytes
    for s in sizes_oldest_first:
        if m + 1 <= bound.max_messages and b + size <= bound.max_bytes:
            break
        evict, m, b = evict + 1, m - 1, b - s
    if m + 1 <= bound.max_messages and b + size <= bound.max_bytes:
        return Admission(True, evict)
    return Admission(False, 0)  # what fills it is out for delivery: nothing can make room


def expired(events_oldest_first: Iterable[tuple[int, int, bool]], now_ns: int, max_age_ns: int,
            max_bytes: int, total: int) -> int:
    """How many of the oldest retained events (publish time ns, size, still owed) retention
    lets go: the leading ones past the age or byte bound that no subscription owes, `total`
    being the bytes of all of them. An owed event stops the sweep (order is kept: nothing
    newer goes before it). Reads the events only up to the first one that stays, so a
    lazy iterator over a log costs what expires, not the log (run every second)."""
    n = 0
    for t, size, owed in events_oldest_first:
        too_old = max_age_ns > 0 and t < now_ns - max_age_ns
        too_big = max_bytes > 0 and total > max_bytes
        if owed or not (too_old or too_big):
            break
        n, total = n + 1, total - size
    return n


def idle(last_active_ns: int, now_ns: int, idle_seconds: int, attached: bool) -> bool:
    """Has a subscription passed its idle time (no stream, no ack) and should be deleted?"""
    return not attached and idle_seconds > 0 and now_ns - last_active_ns > idle_seconds * 1_000_000_000
