"""A Publisher's unacknowledged events and their acks as results (issue 12).

Events wait in runs, one per publish call (`publish()`: a run of one; `publish_batch()`:
a run of all its events), with consecutive sequences: an ack finds its event by the
offset of its sequence in the run, and the run's one future is settled once its last
event is (a PublishResult, an exception, or a batch's list of them). The agent acks in
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
    """Consecutive events of one publish call: `first` sequence, each event's requests
    (kept for a resend: a request, or a list of slices), each one's outcome once acked
    (None until then), and the call's future."""

    __slots__ = ("first", "requests", "outcomes", "left", "future", "single")

    def __init__(self, first: int, requests: list, single: bool):
        self.first = first
        self.requests = requests
        self.outcomes: list = [None] * len(requests)
        self.left = len(requests)
        self.future = asyncio.get_running_loop().create_future()
        self.single = single  # publish(): the future's result is the one outcome, not a list

    def settle(self) -> None:
        """All outcomes are in: the future's result."""
        future = self.future
        if future.done():  # the caller gave up waiting
            return
        if self.single:
            outcome = self.outcomes[0]
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        else:
            future.set_result(self.outcomes)


class Pending:
    """A Publisher's runs still unacknowledged, in sequence order."""

    def __init__(self, producer_id: str):
        self.producer_id = producer_id
        self.runs: deque[Run] = deque()

    def __bool__(self) -> bool:
        return bool(self.runs)

    def add(self, run: Run) -> None:
        self.runs.append(run)

    def acked(self, acks) -> None:
        """A PublishAck's acks (in sequence order), each to its event: a PublishResult, or
        the error it was refused with. An ack for no unacknowledged event is ignored."""
        producer_id, run, first, outcomes, n, left = self.producer_id, None, 0, (), 0, 0
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
                first, outcomes, n, left = run.first, run.outcomes, len(run.outcomes), run.left
                i = seq - first
            if outcomes[i] is not None:
                continue  # acked already
            if ack.code:
                outcomes[i] = from_status(ack.code, ack.error)
            else:
                result = outcomes[i] = _new(PublishResult)
                d = result.__dict__  # its fields set directly: a frozen dataclass's __init__ costs 4x
                d["producer_id"] = producer_id
                d["sequence"] = seq
                d["destinations"] = ack.destinations
                d["duplicate"] = ack.duplicate
            left -= 1
        if run is not None:
            self._left(run, left)

    def fail(self, error: EchelonError) -> None:
        """Every unacknowledged event fails with `error`."""
        for run in self.runs:
            run.outcomes = [error if o is None else o for o in run.outcomes]
            run.left = 0
            run.settle()
        self.runs.clear()

    def unacked(self):
        """Each unacknowledged event's requests, in sequence order (for a resend)."""
        for run in self.runs:
            for requests, outcome in zip(run.requests, run.outcomes):
                if outcome is None:
                    yield requests

    def futures(self) -> list[asyncio.Future]:
        return [run.future for run in self.runs]

    def _left(self, run: Run, left: int) -> None:
        run.left = left
        if left == 0:
            run.settle()
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
