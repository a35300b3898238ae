"""The delivery checker: what was acknowledged to publishers against what every
subscription received.

Independent of the system under test: it sees only the publishers' acks (message ids
with the event's attributes) and each subscription's delivery log, and evaluates the
subscriptions' filters itself (brute force), so it can tell

- lost: acknowledged, matched the filter, never delivered;
- unexpected: delivered but never acknowledged as published, or not matching the filter;
- duplicated: delivered to the client more than once (redeliveries of an unacked message
  after a stream broke are counted apart, as `redelivered`, since at-least-once allows them);
- reordered: a producer's messages with one ordering key out of sequence order.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from echelon.contract.filters import Filter

MessageKey = tuple[str, int]  # (producer id, sequence)


@dataclass(frozen=True)
class Delivered:
    producer: str
    sequence: int
    redelivery: int = 0
    ordering_key: str = ""


@dataclass
class Report:
    subscription: str
    expected: int = 0
    received: int = 0
    lost: list[MessageKey] = field(default_factory=list)
    unexpected: list[MessageKey] = field(default_factory=list)
    duplicated: list[MessageKey] = field(default_factory=list)
    redelivered: int = 0
    reordered: list[tuple[MessageKey, MessageKey]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.unexpected or self.duplicated or self.reordered)

    def row(self) -> dict:
        return {"subscription": self.subscription, "expected": self.expected, "received": self.received,
                "lost": len(self.lost), "unexpected": len(self.unexpected), "duplicated": len(self.duplicated),
                "redelivered": self.redelivered, "reordered": len(self.reordered)}


def check(acked: Mapping[MessageKey, Mapping[str, object]], filters: Mapping[str, Filter],
          deliveries: Mapping[str, Iterable[Delivered]],
          maybe: Mapping[MessageKey, Mapping[str, object]] | None = None) -> list[Report]:
    """One report per subscription.

    `acked`: every acknowledged publish and its attributes. `maybe`: publishes whose
    ack never came (the publisher gave up or was cut off), with their attributes:
    delivering them to a matching subscription is allowed, missing them is not a loss.
    """
    maybe = maybe or {}
    reports = []
    for name, flt in sorted(filters.items()):
        expected = {k for k, attrs in acked.items() if flt.matches(attrs)}
        allowed = expected | {k for k, attrs in maybe.items() if flt.matches(attrs)}
        log = list(deliveries.get(name, ()))
        r = Report(name, expected=len(expected), received=len(log))
        counts = Counter((d.producer, d.sequence) for d in log)
        first_time: set[MessageKey] = set()
        last_seq: dict[tuple[str, str], MessageKey] = {}
        for d in log:
            key = (d.producer, d.sequence)
            if key not in allowed:
                r.unexpected.append(key)
                continue
            if key in first_time:
                if d.redelivery:
                    r.redelivered += 1
                else:
                    r.duplicated.append(key)
                continue
            first_time.add(key)
            stream = (d.producer, d.ordering_key)
            prev = last_seq.get(stream)
            if prev is not None and d.sequence < prev[1] and not d.redelivery:
                r.reordered.append((prev, key))
            last_seq[stream] = key if prev is None or d.sequence > prev[1] else prev
        r.lost = sorted(expected - set(counts))
        reports.append(r)
    return reports


def totals(reports: Iterable[Report]) -> dict:
    t: dict = defaultdict(int)
    for r in reports:
        for k, v in r.row().items():
            if k != "subscription":
                t[k] += v
    return dict(t)


async def drain(sub, idle: float = 0.3) -> list:
    """Everything a subscription (the SDK's) receives until it is idle for `idle` seconds,
    each acked: a subscription's log for `check`, in the tests and the runs alike."""
    out = []
    while True:
        try:
            m = await sub.next(timeout=idle)
        except asyncio.TimeoutError:
            return out
        out.append(m)
        await m.ack()
