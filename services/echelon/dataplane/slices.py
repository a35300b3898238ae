"""Bulk payloads as slices, cut through (LBDD section 4: 64 KB slices, pipelined).

The root cuts a payload above the slice size into `slice_count` slices; slice i holds
bytes [i * size, (i + 1) * size) and travels alone, so a relay forwards slice k while
slice k + 1 is still on its way. Slice 0 carries the event's attributes and ordering
key; every slice carries the id, topic and publish time, which is all a relay needs to
route it. No agent ever holds a whole payload:

- The publishing agent reads the client's slices into a `PayloadStream`, at most
  `STREAM_WINDOW` bytes of them; the Publish stream's reader waits in `put` while the
  window is full, so it stops reading and HTTP/2 flow control holds the client back.
  The data plane reads the stream (`PayloadReader.slices`) and forwards each relay
  slice as it is cut; it waits for room on its links (links.py), so what is in flight
  below it is bounded by its links' windows, whatever the size.
- A destination hands the slices to its subscribers in order as they arrive
  (`Streams`): each local subscription that matched gets a `ChunkStream`, and the
  frame carrying a slice is acknowledged only once every such subscription stream has
  written the slice out (the slice's hold, as in dissemination.py). So a slow subscriber
  holds back the root's window (back-pressure up the tree) instead of filling this
  agent's memory. Slices arriving ahead of a missing one (stripes take different
  paths) wait here; the root sends in index order and relays never wait, so the
  missing one is already on its way and the wait is bounded by the root's windows.

What this costs, and how it is bounded:

- A payload is delivered at most once per subscription stream: there is no copy to
  redeliver from. Only subscriptions attached when the payload starts get it; a
  stream that ends or nacks mid-payload, or does not read a slice for
  `STALL_SECONDS`, loses it (counted in `echelon_agent_bulk_aborted_total`, the
  client's chunk iterator raises). A stalled subscriber cannot hold every other one
  back longer than that.
- A payload whose publisher's stream ends mid-way is ended by the root with an
  `aborted` message down the trees; one whose slices just stop coming (its root died)
  is dropped after `IDLE_SECONDS` without a new slice. Either way the subscribers get
  `aborted` (the client raises DataLoss), and the message id is forgotten (here, on
  the relays, at the root): the client's retry of the publish is delivered afresh.
  A retry through another root while the first copy is still arriving continues it
  (slices are the same bytes at the same index).
- Duplicate slices (a re-route after a relay died) are dropped by index; a whole
  payload already started here is dropped by message id (the agent's dedup window,
  marked when slice 0 is handed out). A duplicate is acknowledged at once: the first
  copy is already in this agent's hands.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Callable

from echelon.contract.errors import InvalidArgument
from echelon.v1 import common_pb2 as pb
from echelon.v1 import relay_pb2 as rpb

IDLE_SECONDS = 120.0  # a partial payload with no new slice for this long is dropped (its root died)
STALL_SECONDS = 60.0  # a subscription stream that takes no slice for this long loses the payload
STREAM_WINDOW = 8 << 20  # bytes of a publisher's payload read ahead of the data plane


def slice_count(size: int, slice_bytes: int) -> int:
    return max(1, -(-size // slice_bytes))


def slice_event(event: pb.Event, chunk: bytes, index: int) -> pb.Event:
    """Slice `index` (its bytes `chunk`) as an event of its own (`event` has no payload)."""
    if index == 0:
        e = pb.Event()
        e.CopyFrom(event)
        e.payload = chunk
        return e
    return pb.Event(id=event.id, topic=event.topic, payload=chunk,
                    publish_time_unix_nanos=event.publish_time_unix_nanos)


# -- the publishing agent: the client's slices in, relay slices out ------------------------


class PayloadStream:
    """One payload arriving on a Publish stream, read ahead by at most `window` bytes.

    The Publish reader `put`s the client's slices and `end`s it; the data plane (and
    the gateway plane, when other regions want it too) read it through the readers
    made by `split`. A part is dropped once every reader has taken it. A stream
    split into no readers (nobody subscribed) drops what it is given."""

    def __init__(self, size: int, window: int = STREAM_WINDOW):
        self.size = size
        self.window = window
        self.received = 0
        self.parts = 0  # slices put so far: the next slice index expected
        self.error: Exception | None = None
        self._buf: deque[bytes] = deque()
        self._base = 0  # part index of _buf[0]
        self._buffered = 0
        self._readers: list[PayloadReader] = []
        self._discard = False
        self._ended = False
        self._more = asyncio.Event()
        self._room = asyncio.Event()

    def __len__(self) -> int:
        return self.size

    def split(self, n: int) -> list[PayloadReader]:
        """`n` readers, each to read the whole payload; made before anyone reads."""
        self._readers = [PayloadReader(self) for _ in range(n)]
        self._discard = n == 0
        if self._discard:
            self._drop(len(self._buf))
        return list(self._readers)

    async def put(self, data: bytes) -> None:
        """Add the next slice; waits while `window` bytes are buffered (back-pressure)."""
        if self.error is not None:
            return  # aborted: the rest of its slices are read and dropped
        self.received += len(data)
        self.parts += 1
        if self.received > self.size:
            self.abort(InvalidArgument(f"slices carry more than payload_size {self.size} bytes"))
            return
        while self._buffered >= self.window and self.error is None and not self._discard:
            self._room.clear()
            await self._room.wait()
        if self._discard or self.error is not None:
            return
        self._buf.append(data)
        self._buffered += len(data)
        self._more.set()

    def end(self) -> None:
        if self.received != self.size:
            self.abort(InvalidArgument(f"payload_size says {self.size} bytes, the slices carried {self.received}"))
            return
        self._ended = True
        self._more.set()

    def abort(self, error: Exception) -> None:
        if self.error is None and not self._ended:
            self.error = error
            self._buf.clear()
            self._buffered = 0
            self._more.set()
            self._room.set()

    def _taken(self) -> None:
        base = min(r.pos for r in self._readers)
        self._drop(base - self._base)

    def _drop(self, n: int) -> None:
        for _ in range(n):
            self._buffered -= len(self._buf.popleft())
            self._base += 1
        if n:
            self._room.set()


class PayloadReader:
    """One reader of a `PayloadStream`: its parts, or relay slices cut from them."""

    def __init__(self, stream: PayloadStream):
        self.stream = stream
        self.pos = 0

    def __len__(self) -> int:
        return self.stream.size

    async def parts(self):
        s = self.stream
        while True:
            if s.error is not None:
                raise s.error
            i = self.pos - s._base
            if i < len(s._buf):
                part = s._buf[i]
                self.pos += 1
                s._taken()
                yield part
                continue
            if s._ended:
                return
            s._more.clear()
            await s._more.wait()

    async def slices(self, slice_bytes: int):
        """The payload as slices of exactly `slice_bytes` (the last may be short)."""
        carry = b""
        async for part in self.parts():
            if carry:
                part = carry + part
            n = len(part) - len(part) % slice_bytes
            view = memoryview(part)
            for i in range(0, n, slice_bytes):
                yield bytes(view[i:i + slice_bytes])
            carry = part[n:]
        if carry or not self.stream.size:
            yield carry


async def cut(payload: bytes, slice_bytes: int):
    """A payload held whole (published by an in-process caller) as relay slices."""
    view = memoryview(payload)
    for i in range(0, max(1, len(payload)), slice_bytes):
        yield bytes(view[i:i + slice_bytes])


# -- a destination: slices in, chunks out to the subscription streams ----------------------


class ChunkStream:
    """One subscription's copy of a payload arriving here: slices in order, each with
    the hold its frame's ack waits on, released when the Subscribe stream wrote it."""

    __slots__ = ("size", "chunks", "ended", "aborted", "wake", "taken_at", "on_abort")

    def __init__(self, size: int, on_abort: Callable[[str], None] | None = None):
        self.size = size
        self.chunks: deque = deque()  # (bytes, hold)
        self.ended = False
        self.aborted = ""
        self.wake = asyncio.Event()
        self.taken_at = time.monotonic()
        self.on_abort = on_abort

    def push(self, data: bytes, hold) -> None:
        if self.aborted:
            return
        hold.pending += 1
        self.chunks.append((data, hold))
        self.wake.set()

    def end(self) -> None:
        self.ended = True
        self.wake.set()

    def take(self):
        """The next (bytes, hold), or None if none is here yet; release the hold once written."""
        if self.chunks:
            self.taken_at = time.monotonic()
            return self.chunks.popleft()
        self.wake.clear()
        return None

    @property
    def done(self) -> bool:
        return self.aborted != "" or (self.ended and not self.chunks)

    def abort(self, reason: str) -> None:
        """Lose the payload for this subscription: its slices' holds are released."""
        if self.done:
            return
        self.aborted = reason
        chunks, self.chunks = self.chunks, deque()
        for _, hold in chunks:
            hold.release()
        self.wake.set()
        if self.on_abort:
            self.on_abort(reason)


class _Inbound:
    __slots__ = ("count", "size", "next", "early", "sinks", "touched")

    def __init__(self, count: int, size: int, now: float):
        self.count = count
        self.size = size
        self.next = 0  # the next slice index to hand out
        self.early: dict[int, tuple[bytes | pb.Event, object]] = {}  # arrived ahead of `next`
        self.sinks: list[ChunkStream] = []
        self.touched = now


class Streams:
    """Payloads arriving at this destination, handed out slice by slice (module doc).

    `open(head, size)` is called once per payload, with slice 0's event without its
    payload: it offers the payload to the local subscriptions and returns their
    `ChunkStream`s (none if the message id was delivered here already). `seen(key)`:
    the message id is in the agent's dedup window; `forget(key)` takes it out again when
    the payload ends unfinished, so a retry of the publish is delivered afresh."""

    def __init__(self, open: Callable[[pb.Event, int], list[ChunkStream]], seen: Callable[[tuple], bool],
                 forget: Callable[[tuple], None], idle: float = IDLE_SECONDS, stall: float = STALL_SECONDS):
        self.open = open
        self.seen = seen
        self.forget = forget
        self.idle = idle
        self.stall = stall
        self._open: dict[tuple[str, int], _Inbound] = {}

    def __len__(self) -> int:
        return len(self._open)

    def add(self, msg: rpb.RelayMessage, hold) -> None:
        """Take one slice; `hold` (pending 0) is held until every subscription wrote it."""
        ev = msg.event
        key = (ev.id.producer_id, ev.id.sequence)
        inb = self._open.get(key)
        if inb is None:
            if self.seen(key):
                return  # handed out here already: a duplicate
            inb = self._open[key] = _Inbound(msg.slice_count, msg.payload_size, time.monotonic())
        if msg.aborted:
            del self._open[key]
            self._end(key, inb, "its publisher's stream ended mid-payload")
            return
        i = msg.slice_index
        if i < inb.next or i in inb.early or i >= inb.count:
            return  # a duplicate slice (re-sent after a path update)
        hold.pending += 1  # until handed out
        inb.early[i] = (ev, hold)
        inb.touched = time.monotonic()
        while inb.next in inb.early:
            ev, h = inb.early.pop(inb.next)
            if inb.next == 0:
                head = pb.Event(id=ev.id, topic=ev.topic, attributes=ev.attributes, ordering_key=ev.ordering_key,
                                publish_time_unix_nanos=ev.publish_time_unix_nanos)
                inb.sinks = self.open(head, inb.size)
            for sink in inb.sinks:
                sink.push(ev.payload, h)
            h.release()
            inb.next += 1
        if inb.next == inb.count:
            del self._open[key]
            for sink in inb.sinks:
                sink.end()

    def _end(self, key: tuple, inb: _Inbound, reason: str) -> None:
        """A payload that will not complete: its subscription streams lose it."""
        self.forget(key)
        for _, h in inb.early.values():
            h.release()
        inb.early.clear()
        for sink in inb.sinks:
            sink.abort(reason)

    def sweep(self, now: float | None = None) -> None:
        """Drop payloads idle past `idle`, abort subscription streams stalled past `stall`."""
        now = time.monotonic() if now is None else now
        for key, inb in list(self._open.items()):
            if now - inb.touched > self.idle:
                del self._open[key]
                self._end(key, inb, f"no slice for {self.idle:.0f} s: its publishing agent stopped sending")
                continue
            for sink in inb.sinks:
                if sink.chunks and not sink.done and now - sink.taken_at > self.stall:
                    sink.abort(f"the subscription took no slice for {self.stall:.0f} s")


def payload_error(size: int, count: int, max_size: int) -> Exception | None:
    """Why a sliced publish's header is not acceptable (None if it is)."""
    if not 0 < size <= max_size:
        return InvalidArgument(f"payload_size {size}: 1 byte to {max_size} bytes")
    if count < 2 or count > size:
        return InvalidArgument(f"slice_count {count} for a {size}-byte payload")
    return None

