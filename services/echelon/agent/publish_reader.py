"""A Publish stream read in runs: what has arrived is taken in one go, and consecutive
single-event requests become one batch, as if the client had sent `PublishRequest.batch`
(docs/event-path.md).

Why: a client generated from the protos sends one event per request. Admitted,
dispatched and acked one by one (a unit, a future, an ack message each), its events cost
the agent much more Python work than the same events in a batch (docs/performance.md,
the `Publish handler` pieces). A reader task takes the stream's messages as gRPC hands
them over, the consumer (publishing.py) all that queued meanwhile. gRPC hands over one
message per read, and the consumer is faster than the reads: taken as they come, runs
would be of one. So while the client pipelines, a run waits for the next request, at most
GAP for each and LINGER in all; GAP_DEEP and LINGER_DEEP once MAX_RUN events of the stream
await their acks, or when the last run was cut by its LINGER with requests still coming (a
client that deep in flight, or that never pauses, is bound by throughput; each run's fixed
cost, its unit, its futures and above all its ack message, a gRPC write, is paid per
run). Pipelining: earlier requests of the stream await their acks, or this request came
within BURST of the one before it (acks settle fast at ACCEPTED, or with no destination,
while the client keeps writing: waiting on acks alone, such a stream's runs were of one or
two). A lone request (nothing in flight,
after a pause) goes at once, and so does a run that ends in a slice or a batch (no run
grows behind it). What a run costs against gRPC's own read: docs/performance.md.

The contract stays the client's: the acks of a run are written as that client asked, one
PublishAck per request (its fields at the top level, in request order), or, with
`coalesce_acks`, in `acks` (as the agent may coalesce them anyway). Merged: whole events
(no slices, no batch of their own) with the same producer id, ack level and
`coalesce_acks`; anything else goes through as it came, in its place.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import AsyncIterator, Callable

from echelon.contract.zstream import Decompressor, decoded
from echelon.v1 import pubsub_pb2 as ppb

MAX_QUEUED = 1024  # requests read ahead of the consumer (then reading waits: HTTP/2 pushes back)
MAX_RUN = 256  # a run stops waiting for more at this many requests
GAP = 0.0003  # seconds: a pipelining client's next request is usually in within one gRPC read
GAP_DEEP = 0.001  # the same for a stream deep in flight or that never pauses (a busy client writes in bursts)
BURST = 0.0001  # seconds between two requests that mark a pipelining client (a round trip takes longer)
LINGER = 0.001  # seconds a run waits for more at most (only while the client pipelines)
LINGER_DEEP = 0.005  # the same with MAX_RUN events or more awaiting their acks


class Run:
    """Consecutive single-event requests as one batch request: the fields publishing.py
    reads of a request with a `batch` (the elements are the requests themselves, not copies)."""

    __slots__ = ("batch", "producer_id", "ack_level", "coalesce_acks", "lean_acks")
    slice_count = slice_index = sequence = 0

    def __init__(self, batch: list[ppb.PublishRequest]):
        first = batch[0]
        self.batch, self.producer_id, self.ack_level, self.coalesce_acks = \
            batch, first.producer_id, first.ack_level, first.coalesce_acks
        # Lean only where the acks stay listed: a run's acks split one per request (`_acks`)
        # each reach the client as an ack of its own, which keeps its producer id.
        self.lean_acks = first.lean_acks and first.coalesce_acks


def _single(req) -> bool:
    return not req.slice_index and req.slice_count <= 1 and not req.batch


def coalesce(stream: Callable[[AsyncIterator], AsyncIterator[ppb.PublishAck]], requests,
             decompress: Decompressor | None = None) -> AsyncIterator:
    """`stream` (Publishing.stream) over `requests` read in runs; its acks split back to one
    message per request where the client did not take coalesced acks. A compressed request
    is decoded by `decompress` (the stream's, if its zstd offer was accepted: compressed.py)."""
    answers = Answers()
    return _acks(stream(_runs(requests, answers, decompress)), answers)


class Answers(deque):
    """Per request (or run) to be acked, in order: its ack count, negative for a run whose
    acks are split one per request; `events`: how many events they hold."""

    __slots__ = ("events",)

    def __init__(self):
        super().__init__()
        self.events = 0

    def append(self, n: int) -> None:
        super().append(n)
        self.events += abs(n)

    def popleft(self) -> int:
        n = super().popleft()
        self.events -= abs(n)
        return n


async def _runs(requests, answers: Answers, decompress: Decompressor | None):
    queued: deque = deque()
    news = asyncio.Event()
    room = asyncio.Event()
    room.set()
    ended = False
    arrivals = [0.0, -1.0]  # when the last request came, and the one before it
    streaming = False  # the last run was cut by its linger, requests still coming
    clock = asyncio.get_running_loop().time

    async def read():
        nonlocal ended
        try:
            async for req in requests:
                if req.zstd:  # refused before anything of it is queued (compressed.py)
                    req = decoded(req, decompress)
                queued.append(req)
                arrivals[1], arrivals[0] = arrivals[0], clock()
                news.set()
                # A slice of a bulk payload (or a batch) is not read ahead: the consumer takes
                # it first, so HTTP/2 holds the rest of a payload in the client, not here.
                if len(queued) >= MAX_QUEUED or not _single(req):
                    room.clear()
                    await room.wait()
        finally:
            ended = True
            news.set()

    async def more() -> None:
        """While the client pipelines, its next requests usually follow within a gRPC read:
        wait for them a little (each gap at most GAP, all at most LINGER; deep: GAP_DEEP,
        LINGER_DEEP).
        A lone request never waits."""
        nonlocal streaming
        if not (answers or len(queued) > 1 or arrivals[0] - arrivals[1] < BURST):
            streaming = False
            return
        loop = asyncio.get_running_loop()
        deep = streaming or answers.events >= MAX_RUN
        deadline, gap = loop.time() + (LINGER_DEEP if deep else LINGER), GAP_DEEP if deep else GAP
        streaming = False
        while not ended and len(queued) < MAX_RUN:
            if (left := deadline - loop.time()) <= 0:
                streaming = True
                return
            news.clear()
            timer = loop.call_later(min(gap, left), news.set)
            had = len(queued)
            await news.wait()
            timer.cancel()
            if len(queued) == had or not _single(queued[-1]):
                return  # the gap passed with nothing new, or the reader waits for this pass (read)

    reader = asyncio.create_task(read())
    try:
        while True:
            if not queued:
                if ended:
                    reader.result()  # the reader's error, if any
                    return
                news.clear()
                await news.wait()
                continue
            # Only a run of single events can grow; behind a slice or a batch the reader waits
            # for this pass (read), so waiting would only add a timer and a gap per request.
            if len(queued) < MAX_RUN and _single(queued[-1]):
                await more()
            taken, run = list(queued), []
            queued.clear()
            room.set()
            for req in taken:
                if run and not (_single(req) and req.producer_id == run[0].producer_id
                                and req.ack_level == run[0].ack_level and req.coalesce_acks == run[0].coalesce_acks
                                and req.lean_acks == run[0].lean_acks):
                    yield _flush(run, answers)
                    run = []
                if _single(req):
                    run.append(req)
                    continue
                if not req.slice_index:  # a later slice is acked with slice 0
                    answers.append(len(req.batch) or 1)
                yield req
            if run:
                yield _flush(run, answers)
    finally:
        reader.cancel()


def _flush(run: list, answers: Answers):
    if len(run) == 1:
        answers.append(1)
        return run[0]
    answers.append(len(run) if run[0].coalesce_acks else -len(run))
    return Run(run)


async def _acks(acks: AsyncIterator[ppb.PublishAck], answers: Answers):
    async for ack in acks:
        if answers and answers[0] < 0:  # a run of requests that each want their own ack
            answers.popleft()
            for element in ack.acks:
                yield element
            continue
        count, covered = len(ack.acks) or 1, 0
        while covered < count and answers:
            covered += answers.popleft()
        yield ack
