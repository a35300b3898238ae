"""The operator's caps over what a subscriber asks of a durable subscription
(docs/security.md): its backlog's messages and bytes, its idle time and its replicas
are bounded by the agent's limits (`--limits durable_max_messages=...`, the chart's
`auth.limits`), or the caller's own caps where the cluster admin set them (`echelon acl
cap`, the chart's `auth.identityCaps`), and by its topic's caps (`Topic.durable_caps`, set by whoever creates the
topic, an admin of it: `echelon topic create --durable-caps ...`), and only an admin
of the topic may choose REJECT_PUBLISH, the one policy that pushes back on every
publisher of the topic. Checked where the client's
stream arrives, before the open is relayed to the subscription's holder (which sees an
agent, a member, as its caller); members are not capped.

A request over a cap is refused (INVALID_ARGUMENT naming the cap), not clamped: a
subscriber that asked for a million messages of backlog and silently got fewer would
lose messages it thought were kept.
"""

from __future__ import annotations

from echelon.runtime.auth import CALLER, Access
from echelon.contract.errors import InvalidArgument, PermissionDenied
from echelon.v1 import common_pb2 as pb
from echelon.v1 import pubsub_pb2 as ppb

_CAPPED = (("max_messages", "durable_max_messages"), ("max_bytes", "durable_max_bytes"),
           ("idle_seconds", "durable_max_idle_seconds"), ("replicas", "durable_max_replicas"))


def check_options(access: Access, open_: ppb.SubscriptionOpen, topic: pb.Topic | None = None,
                  defaults=None) -> None:
    """Refuse `open_`'s durable options over the caller's caps (its identity's if the
    cluster admin set them, else the agent's: `Access.limit`) or its topic's (the lower
    one counts; a topic's 0 leaves the other). An option left at 0 whose agent default
    (`defaults`) is over the identity's cap is set to the cap here: the holder that
    creates it sees an agent, not the caller."""
    caller = CALLER.get()
    if caller is None or not caller.limited:
        return
    o = open_.durable
    for field, cap in _CAPPED:
        asked, most = getattr(o, field), access.limit(caller.identity, cap)
        if asked > most:
            raise InvalidArgument(f"durable {field}={asked} is over the cap {cap}={most} for {caller.identity}")
        mine = getattr(topic.durable_caps, field) if topic is not None else 0
        if mine and asked > mine:
            raise InvalidArgument(f"durable {field}={asked} is over topic {topic.name!r}'s cap {field}={mine}")
        if not asked and defaults is not None and getattr(defaults, field) > most:
            setattr(o, field, min(most, mine or most))
    if o.policy == ppb.BACKLOG_POLICY_REJECT_PUBLISH:
        refusal = access.acl().refusal(caller.identity, "admin", open_.topic)
        if refusal:
            access.count("echelon.v1.PubSub", "permission_denied")
            raise PermissionDenied(f"backlog policy REJECT_PUBLISH refuses other users' publishes: {refusal}")


def within_caps(field: str, default: int, limits, topic: pb.Topic) -> int:
    """The agent's default for an option left at 0, lowered to the caps that apply (an
    operator or topic admin who caps below the default means it for defaults too)."""
    cap = getattr(limits, dict(_CAPPED)[field])
    mine = getattr(topic.durable_caps, field)
    return min(default, cap, mine or cap)
