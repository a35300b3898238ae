"""Dead messages' pure rules (docs/guarantees.md, "Dead messages"): a subscription's
redelivery policy (ack deadline, max deliveries, dead-letter topic) checked and filled
in, whether a dead-letter topic's schema takes what it will be sent, and the ack
deadlines of deliveries out kept without a cost per delivery (`Marks`).

Why marks: deliveries go out in delivery id order, so "every id up to X was sent by
time t" says when each one's deadline falls. A subscription records one mark per
`GRAIN` of its deadline, not one deadline per delivery (the hot path hands out hundreds
of deliveries per call); a delivery's deadline is then judged at most one grain late,
never early.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from echelon.contract.schema import AttrType, Schema, utf8_length

DEFAULT_ACK_DEADLINE_MS = 60_000  # as Google Pub/Sub's default
MIN_ACK_DEADLINE_MS = 100  # below it, redeliveries would cost more than the work they retry
MAX_ACK_DEADLINE_MS = 600_000  # as Google Pub/Sub's longest
MAX_DELIVERIES = 1000
DELIVERIES = "dead_letter_deliveries"  # attributes a dead letter carries besides its own
SUBSCRIPTION = "dead_letter_subscription"
GRAIN = 8  # marks per deadline: a deadline is judged at most 1/GRAIN of it late


@dataclass(frozen=True)
class Policy:
    ack_deadline: float | None  # seconds; None: no deadline
    max_deliveries: int  # 0: no bound
    dead_letter_topic: str

    @property
    def ack_deadline_ms(self) -> int:
        return 0 if self.ack_deadline is None else round(self.ack_deadline * 1000)


DEFAULT = Policy(DEFAULT_ACK_DEADLINE_MS / 1000, 0, "")


def policy(ack_deadline_ms: int, no_ack_deadline: bool, max_deliveries: int, dead_letter_topic: str,
           topic: str) -> Policy:
    """The policy a subscription of `topic` asks for, defaults filled in; ValueError says
    what is wrong with it."""
    if ack_deadline_ms < 0:
        raise ValueError(f"ack_deadline_ms {ack_deadline_ms}: 0 (the default, {DEFAULT_ACK_DEADLINE_MS}) or "
                         f"{MIN_ACK_DEADLINE_MS} to {MAX_ACK_DEADLINE_MS}; negative is not a deadline")
    if ack_deadline_ms and not MIN_ACK_DEADLINE_MS <= ack_deadline_ms <= MAX_ACK_DEADLINE_MS:
        raise ValueError(f"ack_deadline_ms {ack_deadline_ms}: 0 (the default, {DEFAULT_ACK_DEADLINE_MS}) or "
                         f"{MIN_ACK_DEADLINE_MS} to {MAX_ACK_DEADLINE_MS}")
    if no_ack_deadline and ack_deadline_ms:
        raise ValueError("no_ack_deadline with an ack_deadline_ms: one or the other")
    if max_deliveries > MAX_DELIVERIES:
        raise ValueError(f"max_deliveries {max_deliveries}: 0 (no bound) to {MAX_DELIVERIES}")
    if max_deliveries and not dead_letter_topic:
        raise ValueError("max_deliveries needs a dead_letter_topic for the messages past it")
    if dead_letter_topic and not max_deliveries:
        raise ValueError(f"dead_letter_topic {dead_letter_topic!r} needs max_deliveries (1 to {MAX_DELIVERIES})")
    if dead_letter_topic and dead_letter_topic == topic:
        raise ValueError(f"dead_letter_topic {topic!r} is the subscription's own topic: its dead letters "
                         f"would come back to it")
    deadline = None if no_ack_deadline else (ack_deadline_ms or DEFAULT_ACK_DEADLINE_MS) / 1000
    return Policy(deadline, max_deliveries, dead_letter_topic)


def schema_refusal(source: Schema, dead: Schema, name: str, max_deliveries: int) -> str | None:
    """Why the dead-letter topic's schema (`dead`) would refuse some dead letter of a
    subscription `name` on a topic with schema `source` (None: it takes every one): each
    of the source's attributes with a type and domain that hold its values, the two
    dead-letter attributes, and an attribute bytes limit as high as the source's. (An event
    within a few dozen bytes of that limit may still not fit with the two added: its
    publish fails, is counted and retried; refusing every equal limit would refuse the
    usual case, two topics with the default.)"""
    if dead.attribute_bytes_limit < source.attribute_bytes_limit:
        return (f"its attribute bytes limit ({dead.attribute_bytes_limit}) is under the source topic's "
                f"({source.attribute_bytes_limit})")
    if dead.empty:
        return None
    if source.empty:
        return "the source topic has no schema (its events may carry any attribute); this one has"
    wanted = [(a.name, a.type, a.low, a.high, a.length_limit if a.type is AttrType.STRING else 0)
              for a in source.attributes]
    wanted += [(DELIVERIES, AttrType.INT, max_deliveries, max_deliveries, 0),
               (SUBSCRIPTION, AttrType.STRING, 0, 0, utf8_length(name))]
    declared = {a.name: a for a in dead.attributes}
    for attr, kind, low, high, length in wanted:
        d = declared.get(attr)
        if d is None:
            return f"it has no attribute {attr!r}"
        if d.type is not kind and not (kind is AttrType.INT and d.type is AttrType.FLOAT):
            return f"its attribute {attr!r} is {d.type.value}, not {kind.value}"
        if kind is AttrType.STRING:
            if d.length_limit < length:
                return f"its attribute {attr!r} takes {d.length_limit} bytes, under {length}"
        elif not d.low <= low or not high <= d.high:
            return f"its attribute {attr!r} has a narrower domain than the values it would be sent"
    return None


class Marks:
    """When the deliveries of one stream were sent, as (first, last send time, highest id)
    marks in id order; `due` pops the marks whose deadline passed."""

    __slots__ = ("seconds", "grain", "marks", "_open")

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.grain = seconds / GRAIN
        self.marks: deque[list] = deque()
        self._open = [0.0, 0.0, 0, float("-inf")]  # the newest mark, and when its grain ends

    def sent(self, now: float, last_id: int) -> bool:
        """Deliveries up to `last_id` were sent at `now`; True when this starts the only
        mark (the caller's timer may need setting). Called once per hand-out: the common
        case, within the newest mark's grain, is a comparison and two stores."""
        mark = self._open
        if now < mark[3]:  # within its grain: its deadline moves to this send (later, never earlier)
            mark[1] = now
            mark[2] = last_id
            return False
        mark = self._open = [now, now, last_id, now + self.grain]
        self.marks.append(mark)
        return len(self.marks) == 1

    def due(self, now: float) -> int:
        """The highest id whose deadline passed by `now` (0: none), its marks dropped."""
        bound, marks = 0, self.marks
        while marks and marks[0][1] + self.seconds <= now:
            bound = marks.popleft()[2]
        if not marks:
            self._open = [0.0, 0.0, 0, float("-inf")]  # (popped: a later send starts a new one)
        return bound

    def next_due(self) -> float | None:
        """When the oldest mark's deadline falls (None: no mark)."""
        return self.marks[0][1] + self.seconds if self.marks else None

    def clear(self) -> None:
        self.marks.clear()
        self._open = [0.0, 0.0, 0, float("-inf")]
