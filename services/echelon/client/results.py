"""A Publisher's unacknowledged events and their acks as results.

Events wait in runs of consecutive sequences (a `publish_batch()`: all its events;
lone `publish()`es: up to LONE_RUN in a row): an ack finds its event by the offset of
its sequence in the run; a batch's one future is settled once its last event is (with
the list of PublishResults and exceptions), a lone publish's at its ack. The agent acks in
the order of the requests, each request's events in order, so acks come in sequence
order and almost every one lands in the run the previous one did: no lookup per event,
no object kept per event but its requests (for a resend) and its outcome.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from echelon.client.errors import EchelonError, from_status

_new = object.__new__


@dataclass(frozen=True)
class PublishResult:
    """The agent's ack of one publish.

    `destinations`: agents that held a matching subscription at publish time (0: nobody
    was subscribed to it). `duplicate`: the agent had already accepted this (producer id,
    sequence) for the same event (a retry after a lost ack): it was not published again,
    and `destinations` are the first copy's."""

    producer_id: str
    sequence: int
    destinations: int
    duplicate: bool = False


class Run:
    """Consecutive events: `first` sequence, each event's requests (kept for a resend: a
    request, or a list of slices), each one's outcome once acked (None until then). A
    publish_batch's run has one future for all (its list of outcomes); a run of lone
    publishes (`publish()`, up to LONE_RUN of them in a row) has a future per event,
    settled at its ack."""

    __slots__ = ("first", "requests", "outcomes", "left", "future", "futures")

    def __init__(self, first: int, requests: list, futures: list[asyncio.Future] | None = None,
                 future: asyncio.Future | None = None):
        self.first = first
        self.requests = requests
        self.outcomes: list = [None] * len(requests)
        self.left = len(requests)
        self.futures = futures
        self.future = future


LONE_RUN = 512  # lone publishes in one run: its acked ones are let go when all are


class Pending:
    """A Publisher's runs still unacknowledged, in sequence order."""

    def __init__(self, producer_id: str):
        self.producer_id = producer_id
        self.runs: deque[Run] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None  # (asyncio.get_running_loop() makes a syscall per call)

    def __bool__(self) -> bool:
        return bool(self.runs)

    def batch(self, first: int, requests: list) -> asyncio.Future:
        """A publish_batch's events (numbered from `first`): the future of their outcomes."""
        run = Run(first, requests, future=self._future())
        self.runs.append(run)
        return run.future

    def one(self, seq: int, requests) -> asyncio.Future:
        """A lone publish: the future of its outcome (the next event of the last run of lone
        ones, if it follows it: no run made per event)."""
        future = self._future()
        runs = self.runs
        if runs:
            last = runs[-1]
            n = len(last.outcomes)
            if last.futures is not None and last.left and n < LONE_RUN and last.first + n == seq:
                last.requests.append(requests)
                last.outcomes.append(None)
                last.futures.append(future)
                last.left += 1
                return future
        runs.append(Run(seq, [requests], [future]))
        return future

    def acked(self, acks) -> None:
        """A PublishAck's acks (in sequence order), each to its event: a PublishResult, or
        the error it was refused with. An ack for no unacknowledged event is ignored."""
        producer_id, run, first, outcomes, futures, n, left = self.producer_id, None, 0, (), None, 0, 0
        for ack in acks:
            seq = ack.sequence
            i = seq - first
            if not 0 <= i < n:  # the next run (or one out of order)
                if run is not None:
                    self._left(run, left)
                run = self._run_of(seq)
                if run is None:
                    n = 0
                    continue
                first, outcomes, futures, n, left = run.first, run.outcomes, run.futures, len(run.outcomes), run.left
                i = seq - first
            if outcomes[i] is not None:
                continue  # acked already
            if ack.code:
                outcome = outcomes[i] = from_status(ack.code, ack.error)
            else:
                outcome = outcomes[i] = _new(PublishResult)
                d = outcome.__dict__  # its fields set directly: a frozen dataclass's __init__ costs more
                d["producer_id"] = producer_id
                d["sequence"] = seq
                d["destinations"] = ack.destinations
                d["duplicate"] = ack.duplicate
            left -= 1
            if futures is not None:
                _settle(futures[i], outcome)
        if run is not None:
            self._left(run, left)

    def fail(self, error: EchelonError) -> None:
        """Every unacknowledged event fails with `error`."""
        for run in self.runs:
            if run.futures is not None:
                for future, outcome in zip(run.futures, run.outcomes):
                    if outcome is None:
                        _settle(future, error)
            run.outcomes = [error if o is None else o for o in run.outcomes]
            run.left = 0
            if run.future is not None and not run.future.done():
                run.future.set_result(run.outcomes)
        self.runs.clear()

    def unacked(self):
        """Each unacknowledged event's requests, in sequence order (for a resend)."""
        for run in self.runs:
            for requests, outcome in zip(run.requests, run.outcomes):
                if outcome is None:
                    yield requests

    def futures(self) -> list[asyncio.Future]:
        return [f for run in self.runs for f in (run.futures or (run.future,))]

    def _future(self) -> asyncio.Future:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop.create_future()

    def _left(self, run: Run, left: int) -> None:
        run.left = left
        if left == 0:
            if run.future is not None and not run.future.done():  # (not done: the caller gave up waiting)
                run.future.set_result(run.outcomes)
            runs = self.runs
            while runs and runs[0].left == 0:  # settled ones leave from the front
                runs.popleft()

    def _run_of(self, seq: int) -> Run | None:
        for run in self.runs:
            if run.first <= seq < run.first + len(run.outcomes):
                return run if run.left else None
            if run.first > seq:
                break
        return None


def _settle(future: asyncio.Future, outcome) -> None:
    if not future.done():  # (done: the caller gave up waiting)
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
