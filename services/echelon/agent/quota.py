"""How many subscriptions one identity may hold (docs/security.md, "Caps per identity"),
checked where its open arrives, before anything is created:

- `subscriptions`: held on this agent, the open ones (runtime/limits.py counts them per
  stream) and the named ones kept while detached, which outlive their stream (and keep
  receiving up to their backlog bound) until unsubscribed. Checked when an open would
  create a named subscription; resuming one is never refused.
- `durable_subscriptions`: owned in the whole cluster, counted by asking every alive
  agent for the copies of this owner's subscriptions (names record their owner:
  ownership.py), when an open would create one. Two creates racing through two agents
  may both pass at the cap's edge; an agent that does not answer is not counted.

The limit is the identity's cap if the cluster admin set one (`echelon acl cap`), else
the agent's --limits (`Access.limit`). Over it: RESOURCE_EXHAUSTED naming the cap.
Members and, with auth off, anonymous callers (whose names are not scoped) are not
counted here.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import grpc

from echelon.agent.ownership import caller_name, owner_of
from echelon.runtime.auth import CALLER, Access
from echelon.contract.errors import ResourceExhausted, Unavailable
from echelon.v1 import durable_pb2 as dpb
from echelon.v1 import pubsub_pb2 as ppb

if TYPE_CHECKING:
    from echelon.agent.durable.durables import Durables
    from echelon.agent.registry import Registry

SERVICE = ppb.DESCRIPTOR.services_by_name["PubSub"].full_name
ASK_TIMEOUT = 5.0  # seconds an agent has to list an owner's durable copies


def check_named(access: Access, registry: Registry, name: str) -> None:
    """Refuse creating the named subscription `name` (not yet held here) past the caller's
    `subscriptions`, counting its open subscriptions and its named ones left detached."""
    me = caller_name(access)
    if not me or not name or name in registry.subs:
        return
    caller = CALLER.get()
    detached = sum(1 for s in list(registry.subs.values()) if s.owner == me and s.named and not s.attached)
    held = access.quotas.subscriptions[caller.key] + detached  # the open ones count this one already
    most = access.limit(caller.identity, "subscriptions")
    if held > most:
        access.count(SERVICE, "subscriptions")
        raise ResourceExhausted(f"{caller.identity} holds {held - 1} subscriptions on this agent ({detached} named "
                                f"ones detached), the limit is subscriptions={most}: unsubscribe some first")


async def owned(durables: Durables, owner: str) -> set[str]:
    """The names of `owner`'s durable subscriptions held by this agent or any alive one."""
    names = {n for n in list(durables.subs) if owner_of(n) == owner}

    async def ask(agent: str) -> list[str]:
        try:
            listed = await durables.peers.stub(agent).ListSubscriptions(
                dpb.ListSubscriptionsRequest(local=True, owner=owner), timeout=ASK_TIMEOUT)
        except (grpc.aio.AioRpcError, Unavailable):
            return []
        return [s.name for s in listed.subscriptions]
    for found in await asyncio.gather(*(ask(a) for a in durables.peers.alive() if a != durables.me)):
        names.update(found)
    return names


async def check_durables(access: Access, durables: Durables, name: str) -> None:
    """Refuse creating the durable subscription `name` past its owner's
    `durable_subscriptions` (an admin opening another identity's leaves it to that one)."""
    me = caller_name(access)
    if not me or owner_of(name) != me or name in durables.subs:
        return
    caller = CALLER.get()
    most = access.limit(caller.identity, "durable_subscriptions")
    names = await owned(durables, me)
    if name in names or len(names) < most:
        return
    access.count(SERVICE, "subscriptions")
    raise ResourceExhausted(f"{caller.identity} owns {len(names)} durable subscriptions, the limit is "
                            f"durable_subscriptions={most}: delete one first")
