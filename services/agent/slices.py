"""Bulk payloads as slices (LBDD section 4: 64 KB slices, pipelined).

The root cuts a payload above the slice size into `slice_count` slices; slice i holds
bytes [i * size, (i + 1) * size) and travels alone, so a relay forwards slice k while
slice k + 1 is still on its way (cut-through). Slice 0 carries the event's attributes
and ordering key; every slice carries the id, topic and publish time, which is all a
relay needs to route it. A destination reassembles the slices (by index, in any order:
stripes take different paths) and delivers the whole event once.
"""

from __future__ import annotations

import time

from echelon.v1 import common_pb2 as pb
from echelon.v1 import relay_pb2 as rpb

IDLE_SECONDS = 300.0  # a partial payload with no new slice for this long is dropped (its root died)


def slice_count(size: int, slice_bytes: int) -> int:
    return max(1, -(-size // slice_bytes))


def slice_event(event: pb.Event, payload: bytes, index: int, slice_bytes: int) -> pb.Event:
    """Slice `index` of `payload` as an event of its own (`event` has no payload)."""
    chunk = payload[index * slice_bytes:(index + 1) * slice_bytes]  # the one copy: protobuf takes bytes only
    if index == 0:
        e = pb.Event()
        e.CopyFrom(event)
        e.payload = chunk
        return e
    return pb.Event(id=event.id, topic=event.topic, payload=chunk,
                    publish_time_unix_nanos=event.publish_time_unix_nanos)


class _Assembly:
    __slots__ = ("parts", "missing", "head", "touched")

    def __init__(self, count: int, now: float):
        self.parts: list[bytes | None] = [None] * count
        self.missing = count
        self.head: pb.Event | None = None
        self.touched = now


class Reassembler:
    """Slices held until the whole payload is there."""

    def __init__(self, idle: float = IDLE_SECONDS):
        self.idle = idle
        self._open: dict[tuple[str, int], _Assembly] = {}
        self._next_sweep = 0.0

    def __len__(self) -> int:
        return len(self._open)

    def add(self, msg: rpb.RelayMessage) -> pb.Event | None:
        """Keep one slice; return the whole event when this was the last one missing."""
        now = time.monotonic()
        if now >= self._next_sweep:
            self._sweep(now)
        ev = msg.event
        key = (ev.id.producer_id, ev.id.sequence)
        a = self._open.get(key)
        if a is None:
            a = self._open[key] = _Assembly(msg.slice_count, now)
        i = msg.slice_index
        if i >= len(a.parts) or a.parts[i] is not None:
            return None  # a duplicate slice (re-sent after a path update)
        a.parts[i] = ev.payload
        a.touched = now
        if i == 0:
            a.head = ev
        a.missing -= 1
        if a.missing:
            return None
        del self._open[key]
        whole = pb.Event()
        whole.CopyFrom(a.head)
        whole.payload = b"".join(a.parts)
        return whole

    def _sweep(self, now: float) -> None:
        self._next_sweep = now + min(self.idle, 10.0)
        for key in [k for k, a in self._open.items() if now - a.touched > self.idle]:
            del self._open[key]
