"""What a `Publisher`'s stream has yet to write (issue 12: client batching, as NATS's).

Each event is built once, in place: as the next element of the open `batch` request,
whether it comes from `publish()` or `publish_batch()` (no request built apart and copied
into a batch later). The stream's writer takes everything queued whenever it is ready to
write: the open batch is closed then, so batching adds no delay (a lone publish goes at
once, as itself) and under load events coalesce while the previous write is on its way.
A batch closes at MAX_BATCH_EVENTS events or MAX_BATCH_BYTES; a payload above SLICE_BYTES
goes as slices, each a request alone, in its place between the batches.

One `Outbox` per stream: a reconnect starts a new one with the unacknowledged events
again (`again`), so a broken stream's writer can never take what the next one sends.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Iterable, Mapping

from echelon.client.errors import translating
from echelon.core.schema import Value
from echelon.runtime.wire import attributes_into_pb
from echelon.v1 import pubsub_pb2 as ppb

SLICE_BYTES = 4 << 20  # larger payloads are published as slices
MAX_BATCH_EVENTS = 512  # events per request (a slice always goes alone)
MAX_BATCH_BYTES = 1 << 20


class Outbox:
    def __init__(self, producer_id: str, ack_level: int):
        self.producer_id = producer_id
        self.ack_level = ack_level
        self.ready: deque[ppb.PublishRequest] = deque()  # closed batches, lone events, slices, in order
        self.open: ppb.PublishRequest | None = None  # the batch being filled
        self.count = 0  # events in `open`
        self.size = 0  # their bytes
        self.ended = False  # half-close once all is written
        self._wake: asyncio.Future | None = None  # the writer waiting for something to write

    def add(self, topic: str, attributes: Mapping[str, Value], payload: bytes, ordering_key: str,
            seq: int) -> ppb.PublishRequest | list[ppb.PublishRequest]:
        """One event queued: its request (in the open batch), or its list of slices, to be
        kept for a resend (`again`). Raises the client's InvalidArgument for a value no
        attribute can hold (nothing queued)."""
        return self.extend(topic, ((attributes, payload),), ordering_key, seq)[0]

    def extend(self, topic: str, events: Iterable, ordering_key: str, first: int) -> list:
        """Events queued with sequences from `first` on, each its attributes or
        (attributes, payload): what `add` returns for each. A refused one raises as `add`
        does; those before it stay queued (publish_batch rolls them back: `rollback`)."""
        kept = []
        seq = first
        elements = None
        count, size = self.count, self.size
        try:
            for e in events:
                attributes, payload = e if isinstance(e, tuple) else (e, b"")
                if len(payload) > SLICE_BYTES:
                    self.count, self.size = count, size
                    kept.append(self._sliced(topic, attributes, payload, ordering_key, seq))
                    elements, count, size = None, 0, 0
                    seq += 1
                    continue
                if elements is None or count >= MAX_BATCH_EVENTS or size >= MAX_BATCH_BYTES:
                    self.count, self.size = count, size
                    elements = self._batch().batch
                    count, size = self.count, self.size
                req = elements.add(topic=topic, payload=payload, ordering_key=ordering_key, sequence=seq) \
                    if ordering_key else elements.add(topic=topic, payload=payload, sequence=seq)
                try:
                    attributes_into_pb(attributes, req.attributes)
                except BaseException:
                    del elements[-1]
                    with translating():  # the caller's bad value, as the client's InvalidArgument
                        raise
                count += 1
                size += req.ByteSize()
                kept.append(req)
                seq += 1
        finally:
            if elements is not None:
                self.count, self.size = count, size
            self._notify()
        return kept

    def again(self, requests: ppb.PublishRequest | list[ppb.PublishRequest]) -> None:
        """An unacknowledged event's requests (as `add` returned them) queued again (on a
        new stream), as they were."""
        if type(requests) is list:  # slices
            self._close()
            self.ready.extend(requests)
        else:
            batch = self._batch()
            batch.batch.append(requests)  # a copy: the old stream's request is left as it was
            self.count += 1
            self.size += requests.ByteSize()
        self._notify()

    def mark(self) -> tuple:
        """The outbox as it is, to `rollback` to (no write may happen in between)."""
        return len(self.ready), self.open, len(self.open.batch) if self.open is not None else 0, self.count, self.size

    def rollback(self, mark: tuple) -> None:
        """Forget what was queued since `mark` (a publish_batch refused part way through)."""
        n, self.open, k, self.count, self.size = mark
        while len(self.ready) > n:
            self.ready.pop()
        if self.open is not None:
            del self.open.batch[k:]

    def end(self) -> None:
        """Half-close the stream once everything queued is written."""
        self.ended = True
        self._notify()

    async def requests(self):
        """The stream's requests: whatever is queued when the writer is ready (the open
        batch closed then), until `end`."""
        while True:
            if not self.ready and self.open is None:
                if self.ended:
                    return
                self._wake = asyncio.get_running_loop().create_future()
                await self._wake
                continue
            self._close()
            taken, self.ready = self.ready, deque()
            for req in taken:
                yield req

    # -- internals ---------------------------------------------------------------------

    def _batch(self) -> ppb.PublishRequest:
        """The open batch, a new one if there is none or it is full."""
        if self.open is None or self.count >= MAX_BATCH_EVENTS or self.size >= MAX_BATCH_BYTES:
            self._close()
            self.open = ppb.PublishRequest(producer_id=self.producer_id, ack_level=self.ack_level,
                                           coalesce_acks=True)
        return self.open

    def _close(self) -> None:
        """The open batch to the ready ones (a batch of one as its event alone)."""
        if self.open is None:
            return
        batch = self.open
        self.open, self.count, self.size = None, 0, 0
        n = len(batch.batch)
        if n:  # (none: its only event was refused)
            self.ready.append(self._alone(batch.batch[0]) if n == 1 else batch)

    def _alone(self, req: ppb.PublishRequest) -> ppb.PublishRequest:
        """`req` as a request of its own: the outer fields set on it."""
        req.producer_id, req.ack_level, req.coalesce_acks = self.producer_id, self.ack_level, True
        return req

    def _sliced(self, topic: str, attributes: Mapping[str, Value], payload: bytes, ordering_key: str,
                seq: int) -> list[ppb.PublishRequest]:
        """A payload above SLICE_BYTES: its slices queued, each a request alone, in its place."""
        count = -(-len(payload) // SLICE_BYTES)
        requests = []
        for i in range(count):
            req = self._alone(ppb.PublishRequest(topic=topic, payload=payload[i * SLICE_BYTES:(i + 1) * SLICE_BYTES],
                                                 ordering_key=ordering_key, sequence=seq, slice_index=i,
                                                 slice_count=count, payload_size=len(payload)))
            if i == 0:
                with translating():  # the caller's bad value, as the client's InvalidArgument
                    attributes_into_pb(attributes, req.attributes)
            requests.append(req)
        self._close()
        self.ready.extend(requests)
        return requests

    def _notify(self) -> None:
        if self._wake is not None:
            if not self._wake.done():
                self._wake.set_result(None)
            self._wake = None

