"""Durable subscriptions' housekeeping (durables.py), every second on each agent: idle
expiry, the topic logs' retention (core/durability.py `expired`), telling co-holders
that came back with a new process about the subscriptions they hold, resending acks
they missed (acks.py), and the REJECT_PUBLISH notices to every agent. And the
`batch` fsync policy's periodic fsync (store.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from echelon.core.durability import Policy, expired, idle
from echelon.runtime.member import lifetime
from echelon.v1 import durable_pb2 as dpb

if TYPE_CHECKING:
    from echelon.agent.durable.durables import Durables

log = logging.getLogger("echelon.agent.durable.durables")


async def flush_loop(d: Durables, period: float) -> None:
    """A commit is fsynced at most `period` (plus one fsync) after it was made, as a timer
    every `period` would, but the loop sleeps while nothing is committed."""
    committed = d.store.committed
    while True:
        await committed.wait()
        await asyncio.sleep(period)
        committed.clear()  # before `dirty()` reads the changes: a later commit sets it again
        # In a thread: an fsync blocks for as long as the disk takes, every `period`, and on
        # the event loop it held up every stream of the agent meanwhile.
        if d.store.dirty():
            await asyncio.to_thread(d.store.flush)
            d.flushes.inc()


async def maintain_loop(d: Durables) -> None:
    lifetimes: dict[str, int] = {}  # agent -> process lifetime last seen (a new one is told)
    while True:
        await asyncio.sleep(1.0)
        try:
            await maintain(d, lifetimes)
        except Exception:  # noqa: BLE001 - the next round tries again
            log.exception("durable maintenance failed")


async def maintain(d: Durables, lifetimes: dict[str, int]) -> None:
    now = time.time_ns()
    for sub in list(d.subs.values()):
        if idle(sub.record.last_active_unix_nanos, now, sub.record.options.idle_seconds, sub.attached):
            log.warning("durable %s: idle for %ds: deleted", sub.name, sub.record.options.idle_seconds)
            d.idle_expired.inc()
            d.apply_delete(sub.name)
        elif not sub.synced and not d.syncing(sub.name):
            asyncio.create_task(d.sync(sub))
    expire_retention(d, now)
    agents = d.peers.alive()
    came_back = {a for a, m in agents.items() if a != d.me
                 and lifetimes.get(a, lifetime(m.incarnation)) != lifetime(m.incarnation)}
    lifetimes.update({a: lifetime(m.incarnation) for a, m in agents.items()})
    await d.acks.retry()
    for sub in list(d.subs.values()):
        back = [h for h in sub.holders if h in came_back]
        if back and sub.synced:  # a new process: it takes this copy if it has none or an older one
            await d.peers.tell(back, dpb.DurableChange(name=sub.name, create=sub.record))
        if sub.bound.policy is Policy.REJECT_PUBLISH and sub.synced:
            notice = dpb.BacklogFull(topic=sub.topic, filter=sub.record.filter, full=sub.full())
            if notice.full or sub.name in d.refusing:
                change = dpb.DurableChange(name=sub.name, full=notice)
                asyncio.create_task(d.peers.tell([a for a in agents if a != d.me], change))
                await d.apply(change)


def expire_retention(d: Durables, now_ns: int) -> None:
    for name in d.store.topics():
        topic = d.host.membership.topics.get(name)
        seconds = (topic.retention_seconds if topic else 0) or d.defaults.retention_seconds
        nbytes = (topic.retention_bytes if topic else 0) or d.defaults.retention_bytes
        swept: list[int] = []  # the positions the sweep read: what it lets go, and one more

        def oldest_first(topic: str = name):
            for pos, t, size, owed in d.store.retained(topic):
                swept.append(pos)
                yield t, size, owed

        rows = oldest_first()
        n = expired(rows, now_ns, seconds * 1_000_000_000, nbytes, d.store.logged_bytes(name))
        rows.close()  # its statement ends before the log changes
        if n:
            d.store.drop_events(name, swept[n - 1])
            d.retention_expired.inc(n)
