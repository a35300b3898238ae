"""What a `Publisher`'s stream has yet to write: client batching, as NATS's.

Each event is encoded once, as wire bytes (encoding.py), into the open batch, whether it
comes from `publish()` or `publish_batch()`; those bytes are what a resend sends again.
The stream's writer takes everything queued whenever it is ready to write: the open batch
is closed then (its request joined from its events' bytes), so batching adds no delay (a
lone publish goes at once, as itself) and under load events coalesce while the previous
write is on its way. A batch closes at MAX_BATCH_EVENTS events or MAX_BATCH_BYTES; a
payload above SLICE_BYTES goes as slices, each a request alone, in its place between the
batches. Requests are queued serialized: the stream writes them as they are.

One `Outbox` per stream: a reconnect starts a new one with the unacknowledged events
again (`again`), so a broken stream's writer can never take what the next one sends.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Iterable, Mapping

from echelon.client.encoding import Encoder
from echelon.client.errors import translating
from echelon.contract.schema import Value
from echelon.contract.wire import attributes_into_pb
from echelon.v1 import pubsub_pb2 as ppb

SLICE_BYTES = 4 << 20  # larger payloads are published as slices
MAX_BATCH_EVENTS = 512  # events per request (a slice always goes alone)
MAX_BATCH_BYTES = 1 << 20


class Outbox:
    def __init__(self, producer_id: str, ack_level: int):
        self.producer_id = producer_id
        self.ack_level = ack_level
        self.encoder = Encoder(producer_id, ack_level)
        self.ready: deque[bytes] = deque()  # closed batches, lone events, slices, in order (serialized)
        self.open: list[bytes] | None = None  # the events of the batch being filled
        self.size = 0  # their bytes
        self.ended = False  # half-close once all is written
        self._wake: asyncio.Future | None = None  # the writer waiting for something to write

    def add(self, topic: str, attributes: Mapping[str, Value], payload: bytes, ordering_key: str,
            seq: int) -> bytes | list[bytes]:
        """One event queued: its bytes (in the open batch), or its list of slices, to be
        kept for a resend (`again`). Raises the client's InvalidArgument for a value no
        attribute can hold (nothing queued)."""
        return self.extend(topic, ((attributes, payload),), ordering_key, seq)[0]

    def extend(self, topic: str, events: Iterable, ordering_key: str, first: int) -> list:
        """Events queued with sequences from `first` on, each its attributes or
        (attributes, payload): what `add` returns for each. A refused one raises as `add`
        does; those before it stay queued (publish_batch rolls them back: `rollback`)."""
        kept = []
        seq = first
        encode = self.encoder.event
        batch, size = self.open, self.size
        try:
            for e in events:
                attributes, payload = e if isinstance(e, tuple) else (e, b"")
                if len(payload) > SLICE_BYTES:
                    self.size = size
                    kept.append(self._sliced(topic, attributes, payload, ordering_key, seq))
                    batch, size = None, 0
                    seq += 1
                    continue
                try:
                    event = encode(topic, attributes, payload, ordering_key, seq)
                except BaseException:
                    with translating():  # the caller's bad value, as the client's InvalidArgument
                        raise
                if batch is None or len(batch) >= MAX_BATCH_EVENTS or size >= MAX_BATCH_BYTES:
                    self.size = size
                    batch = self._batch()
                    size = 0
                batch.append(event)
                size += len(event)
                kept.append(event)
                seq += 1
        finally:
            if batch is not None:
                self.size = size
            self._notify()
        return kept

    def again(self, requests: bytes | list[bytes]) -> None:
        """An unacknowledged event's requests (as `add` returned them) queued again (on a
        new stream), as they were."""
        if type(requests) is list:  # slices
            self._close()
            self.ready.extend(requests)
        else:
            self._batch().append(requests)
            self.size += len(requests)
        self._notify()

    def mark(self) -> tuple:
        """The outbox as it is, to `rollback` to (no write may happen in between)."""
        return len(self.ready), self.open, len(self.open) if self.open is not None else 0, self.size

    def rollback(self, mark: tuple) -> None:
        """Forget what was queued since `mark` (a publish_batch refused part way through)."""
        n, self.open, k, self.size = mark
        while len(self.ready) > n:
            self.ready.pop()
        if self.open is not None:
            del self.open[k:]

    def end(self) -> None:
        """Half-close the stream once everything queued is written."""
        self.ended = True
        self._notify()

    def requests(self) -> "Requests":
        """The stream's requests (serialized): whatever is queued when the writer is ready
        (the open batch closed then), until `end`."""
        return Requests(self)

    # -- internals ---------------------------------------------------------------------

    def _batch(self) -> list[bytes]:
        """The open batch, a new one if there is none or it is full."""
        if self.open is None or len(self.open) >= MAX_BATCH_EVENTS or self.size >= MAX_BATCH_BYTES:
            self._close()
            self.open = []
        return self.open

    def _close(self) -> None:
        """The open batch to the ready ones (a batch of one as its event alone). The list
        is left as it was: a rollback's mark may hold it."""
        if self.open is None:
            return
        batch = self.open
        self.open, self.size = None, 0
        if len(batch) > 1:
            self.ready.append(self.encoder.request(batch))
        elif batch:  # (none: its only event was refused)
            self.ready.append(self.encoder.alone(batch[0]))

    def _sliced(self, topic: str, attributes: Mapping[str, Value], payload: bytes, ordering_key: str,
                seq: int) -> list[bytes]:
        """A payload above SLICE_BYTES: its slices queued, each a request alone, in its place."""
        count = -(-len(payload) // SLICE_BYTES)
        requests = []
        for i in range(count):
            req = ppb.PublishRequest(topic=topic, payload=payload[i * SLICE_BYTES:(i + 1) * SLICE_BYTES],
                                     ordering_key=ordering_key, sequence=seq, slice_index=i, slice_count=count,
                                     payload_size=len(payload), producer_id=self.producer_id,
                                     ack_level=self.ack_level, coalesce_acks=True)
            if i == 0:
                with translating():  # the caller's bad value, as the client's InvalidArgument
                    attributes_into_pb(attributes, req.attributes)
            requests.append(req.SerializeToString())
        self._close()
        self.ready.extend(requests)
        return requests

    def _notify(self) -> None:
        if self._wake is not None:
            if not self._wake.done():
                self._wake.set_result(None)
            self._wake = None


class Requests:
    """An `Outbox`'s requests as gRPC's request iterator. An iterator object, not an async
    generator: gRPC drops its request task when a call ends under it, and a generator
    dropped while it waits is finalized by an `aclose()` that fails ("already running")
    and is logged as an exception nobody retrieved."""

    def __init__(self, outbox: Outbox):
        self.outbox = outbox
        self.taken: deque[bytes] = deque()

    def __aiter__(self) -> "Requests":
        return self

    async def __anext__(self) -> bytes:
        box = self.outbox
        while not self.taken:
            if not box.ready and box.open is None:
                if box.ended:
                    raise StopAsyncIteration
                box._wake = asyncio.get_running_loop().create_future()
                await box._wake
                continue
            box._close()
            self.taken, box.ready = box.ready, deque()
        return self.taken.popleft()
