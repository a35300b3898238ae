"""Holders' copies of a durable subscription (durables.py "Restart"): what a holder hands
another (`copy_of`: its backlog, out-for-delivery first, and what it acked lately), and
how a holder that restarted, or holds a copy with nothing in it, takes one (`take_copy`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import grpc

from echelon.agent.durable.store import key_of
from echelon.agent.durable.subscription import DurableSubscription
from echelon.contract.errors import FailedPrecondition, NotFound, Unavailable
from echelon.v1 import common_pb2 as pb
from echelon.v1 import durable_pb2 as dpb

if TYPE_CHECKING:
    from echelon.agent.durable.durables import Durables

log = logging.getLogger("echelon.agent.durable.durables")
CALL_TIMEOUT = 3.0  # every call between holders
TOP_UP_AFTER = (2.0, 10.0)  # seconds between looks at a copy's holder again (`top_up`)


async def take_copy(d: Durables, sub: DurableSubscription) -> None:
    """Take the copy of an alive co-holder whose process is older than this one (any
    synced copy, if this agent has none: `sub.empty`). Synced when a copy was taken, or
    when every other alive holder answered and none is older (a copy of this agent's
    own disk is then the freshest); a fresh copy with nobody to take from stays
    unsynced (it is empty: it must not serve). Deleted meanwhile: deleted here."""
    await d.register(sub)
    fresh = sub.empty
    answered_all = True
    for h in [h for h in sub.holders if h != d.me and h in d.peers.alive()]:
        try:
            state = await d.peers.stub(h).Fetch(dpb.FetchRequest(name=sub.name), timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:  # a tombstone there
                log.info("durable %s: deleted on %s while this agent was down", sub.name, h)
                d.forget(sub.name)
                return
            answered_all = answered_all and e.code() == grpc.StatusCode.FAILED_PRECONDITION and not fresh
            continue
        except Unavailable:
            answered_all = False
            continue
        if not fresh and state.sender_started_unix_nanos >= d.started_ns:
            continue  # a newer process: this copy is the fresher one
        # What this process received itself stays beside the copy: the copy's holder may
        # not have it yet (this agent can be ahead of it in the event's dissemination tree).
        d.store.replace(sub.name, state.backlog, sub.arrived)
        sub.load(d.store.backlog(sub.name))
        sub.apply_acks([(m.producer_id, m.sequence) for m in state.acked])
        sub.record.last_active_unix_nanos = max(sub.record.last_active_unix_nanos,
                                                state.record.last_active_unix_nanos)
        log.info("durable %s: took %s's copy (%d messages owed)", sub.name, h, sub.depth)
        sub.synced, sub.empty = True, False
        sub.arrived.clear()
        sub.top_up = asyncio.create_task(top_up(d, sub, h), name=f"durable-top-up {sub.name}")
        return
    sub.synced = answered_all and not fresh
    if sub.synced:
        sub.arrived.clear()


async def top_up(d: Durables, sub: DurableSubscription, holder: str) -> None:
    """Look at `holder`'s copy again, a while after taking it, and owe what it received
    since that this agent never logged: an event this agent was handed before it held the
    subscription (an adopted copy: it matched nothing here) reaches the other holder later
    when that one is below this agent in the event's dissemination tree, so the copy taken
    did not have it. Acks that holder knows apply first; what was acked is never owed again."""
    for delay in TOP_UP_AFTER:
        await asyncio.sleep(delay)
        if sub.closed or d.subs.get(sub.name) is not sub:
            return
        try:
            state = await d.peers.stub(holder).Fetch(dpb.FetchRequest(name=sub.name), timeout=CALL_TIMEOUT)
        except (grpc.aio.AioRpcError, Unavailable):
            continue  # gone or busy: its acks and our own log stand
        sub.apply_acks([(m.producer_id, m.sequence) for m in state.acked])
        missing = [e for e in state.backlog if key_of(e) not in sub.sizes and key_of(e) not in sub.recent]
        for e in missing:
            sub.offer(e)
        if missing:
            log.info("durable %s: %d messages %s had received after its copy were owed here too", sub.name,
                     len(missing), holder)


def copy_of(d: Durables, name: str) -> dpb.DurableState:
    sub = d.subs.get(name)
    if sub is None:
        if d.store.deleted(name):
            raise NotFound(f"durable subscription {name!r} was deleted")
        raise FailedPrecondition(f"durable subscription {name!r} is not held here")
    if not sub.synced:
        raise FailedPrecondition(f"durable subscription {name!r}: this copy is being synced")
    return dpb.DurableState(record=sub.record, backlog=sub.owed(), sender_started_unix_nanos=d.started_ns,
                            acked=[pb.MessageId(producer_id=p, sequence=q) for p, q in sub.recent])
