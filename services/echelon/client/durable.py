"""Durable subscriptions in the client: their options, and their administration.

    async with client.subscribe("orders", "Qty > 10", name="billing", durable=Durable(start="earliest")) as sub:
        async for msg in sub: ...

    await client.seek("billing", time=datetime(...))           # or message=("p-1", 42)
    [s.name for s in await client.list_subscriptions()]

A durable subscription outlives its agent: any agent of the cluster resumes it (the
stream is relayed to the agent that holds it), unacknowledged messages first. When the
agent a stream runs through dies, the Subscription opens a new stream on the next agent
of the Client's list by itself (client/connection.py; docs/cli.md, "Subscriptions across
an agent's death"). A message acked once is never handed to the application again by
subscriptions of that name on this Client (a redelivery of it, possible when the stream
died with the ack queued or in flight, is acked again and counted in the Subscription's
`acked_redeliveries`), until the subscription is sought (the agent says how often it was
at each open). A seek ends the subscription's open stream with ABORTED, and it reopens the
same way, from the point sought, acked messages included.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from echelon.client.errors import InvalidArgument
from echelon.v1 import pubsub_pb2 as ppb

STARTS = {"now": ppb.START_POSITION_NOW, "earliest": ppb.START_POSITION_EARLIEST}
POLICIES = {"lag": ppb.BACKLOG_POLICY_UNSPECIFIED, "drop-oldest": ppb.BACKLOG_POLICY_DROP_OLDEST, "drop-new": ppb.BACKLOG_POLICY_DROP_NEW,
            "reject-publish": ppb.BACKLOG_POLICY_REJECT_PUBLISH}


@dataclass(frozen=True)
class Durable:
    """Options applied when the subscription is created (0: the agents' defaults)."""

    start: str = "now"  # or "earliest": every event its topic retains
    max_messages: int = 0
    max_bytes: int = 0
    # Past the bound: "lag" (its publishers slow down until the subscriber's acks make room;
    # nothing is lost), "drop-oldest" or "drop-new" (a counted loss), "reject-publish".
    policy: str = "lag"
    idle_seconds: int = 0  # deleted after this long with no stream
    replicas: int = 0  # agents holding it (default 2)

    def to_pb(self) -> ppb.DurableOptions:
        if self.start not in STARTS:
            raise InvalidArgument(f"start {self.start!r}: one of {', '.join(STARTS)}")
        if self.policy not in POLICIES:
            raise InvalidArgument(f"policy {self.policy!r}: one of {', '.join(POLICIES)}")
        if min(self.max_messages, self.max_bytes, self.idle_seconds, self.replicas) < 0:
            raise InvalidArgument("durable options are not negative")
        return ppb.DurableOptions(start=STARTS[self.start], max_messages=self.max_messages,
                                  max_bytes=self.max_bytes, policy=POLICIES[self.policy],
                                  idle_seconds=self.idle_seconds, replicas=self.replicas)


def seek_target(time: datetime | float | None, message: tuple[str, int] | None) -> dict:
    """The oneof of a SeekRequest: a time (datetime or Unix seconds) or a (producer, sequence)."""
    if (time is None) == (message is None):
        raise InvalidArgument("seek to a time or to a message, not both or neither")
    if message is not None:
        producer, sequence = message
        return {"message": {"producer_id": producer, "sequence": sequence}}
    seconds = time.timestamp() if isinstance(time, datetime) else float(time)
    return {"time_unix_nanos": int(seconds * 1e9)}
