"""Parking: the messages of a destination that is DEAD in this node's view wait here
for it (the path update of LBDD's Algorithm 3, with a grace period; docs/guarantees.md). The
data plane decides what to park and what a parked message becomes;
this is the bounded store.

A destination whose member is DEAD is not dropped: the message is parked for it
(bounded: `seconds`, `messages`, `max_bytes`). The ack upstream does not wait for it
(acks mean "every destination in the view holds it", so a DELIVERED publish or a full
window never waits on a dead member; a parked message is this node's to keep, as a
frame is until acked). When the same member id is ALIVE again (a live agent that was
falsely declared dead, or partitioned, and rejoined with a higher incarnation) the
parked messages are sent to it in arrival order; past the bounds, or when the member
LEFT, they are dropped and counted (`echelon_agent_destinations_lost_total`). A destination
absent from the view altogether is parked the same way: a view rebuilt by membership
replicas that all restarted lacks members until they rejoin, and one that has not yet
learned of a new member lacks it too; both are back within the bounds. A restarted process (same id, new process)
gets them too, but its subscriptions are new and take only messages published after
they were opened (subscriptions.py): at-least-once covers the subscriptions that
survive, and a rejoining node is sent no duplicate of what it delivered before it crashed.
"""

from __future__ import annotations

from collections import deque

from echelon.v1 import relay_pb2 as rpb

PARK_SECONDS = 30.0  # a DEAD member's messages wait this long for it to come back
PARK_MESSAGES = 50_000  # parked (message, destination) pairs per node
PARK_BYTES = 64 << 20


class Parked:
    """One message waiting for a DEAD destination to come back."""

    __slots__ = ("at", "source", "source_key", "msg", "topic", "size", "hold")

    def __init__(self, at: float, source: str, source_key: str, msg: rpb.RelayMessage, topic: str, size: int,
                 hold=None):
        self.at, self.source, self.source_key, self.msg, self.topic, self.size = at, source, source_key, msg, topic, size
        self.hold = hold  # a relay's: the incoming frame's ack waits until this is sent on or dropped


class Parking:
    """A node's parked messages by member, oldest first, within the bounds."""

    def __init__(self, seconds: float = PARK_SECONDS, messages: int = PARK_MESSAGES, max_bytes: int = PARK_BYTES):
        self.seconds = seconds
        self.messages = messages
        self.max_bytes = max_bytes
        self.parked: dict[str, deque[Parked]] = {}
        self.count = 0  # (message, destination) pairs
        self.bytes = 0

    def park(self, member_id: str, entry: Parked) -> bool:
        """Keep `entry` for `member_id`; False (not kept) past the bounds."""
        if self.count >= self.messages or self.bytes + entry.size > self.max_bytes:
            return False
        self.parked.setdefault(member_id, deque()).append(entry)
        self.count += 1
        self.bytes += entry.size
        return True

    def holding(self, before: float) -> list[Parked]:
        """Entries parked before `before` whose frame's ack still waits for them."""
        return [e for queue in self.parked.values() for e in queue if e.hold is not None and e.at < before]

    def members(self) -> list[str]:
        return list(self.parked)

    def take(self, member_id: str) -> deque[Parked]:
        """Everything parked for `member_id`, in arrival order, out of the store."""
        entries = self.parked.pop(member_id, deque())
        self._taken(entries)
        return entries

    def expire(self, now: float) -> dict[str, list[Parked]]:
        """Take out, by member, what waited `seconds` or longer."""
        out = {}
        for member_id in list(self.parked):
            queue = self.parked[member_id]
            old = []
            while queue and now - queue[0].at >= self.seconds:
                old.append(queue.popleft())
            if old:
                self._taken(old)
                out[member_id] = old
            if not queue:
                del self.parked[member_id]
        return out

    def _taken(self, entries) -> None:
        self.count -= len(entries)
        self.bytes -= sum(e.size for e in entries)
