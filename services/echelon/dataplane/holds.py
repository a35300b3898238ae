"""Holds and jobs: how acks aggregate up an LBDD tree (LBDD section 3.3; DESIGN.md
"Guarantees"; dataplane.py says who holds what).

A node keeps every message it forwards in a `Hold` until each copy it produced is
acknowledged (`pending` counts the frames carrying it); a `Job` waits for a set of holds
to settle and then fires once: an incoming frame's ack upstream, a run of the root's
messages reported delivered. Neither allocates a future per message.

Per frame, not per message (issue 12): the messages of one incoming frame that go to
the same destinations share one hold (a relay forwards them in the same frames), and a
frame counts each distinct hold it carries once. A later copy of one of them that must
go further gets a hold of its own, chained to the first (`prior`): what waits for it
waits for both. A relay remembers its holds in a table bounded by `forget_settled`.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Callable, Sequence


class Hold:
    """One message (or slice) this node is responsible for until its copies are acked."""

    __slots__ = ("covered", "pending", "waiters", "prior", "lost")

    def __init__(self, covered: Sequence[str] = (), prior: "Hold | None" = None):
        self.covered = covered  # destinations taken on; replaced, never changed (it may be shared)
        self.pending = 0  # frames carrying it, not yet acknowledged
        self.lost = 0  # destinations dropped (no route, not parked): the root fails its delivery
        self.waiters: list[Job] = []
        self.prior = prior  # an earlier copy's hold of the same message: waited for with this one

    def release(self) -> None:
        self.pending -= 1
        if self.pending == 0 and self.waiters:
            waiters, self.waiters = self.waiters, []
            for job in waiters:
                job.tick()


class Job:
    """Waits for a set of holds to settle, then calls `done` once."""

    __slots__ = ("count", "done")

    def __init__(self, done: Callable[[], None]):
        self.count = 1  # the arming guard
        self.done = done

    def wait(self, hold: Hold | None) -> None:
        while hold is not None:
            if hold.pending:
                self.count += 1
                hold.waiters.append(self)
            hold = hold.prior

    def tick(self) -> None:
        self.count -= 1
        if self.count == 0:
            self.done()

    arm = tick


async def settled(holds: Sequence[Hold]) -> None:
    """Until every one of `holds` is settled."""
    future = asyncio.get_running_loop().create_future()
    job = Job(lambda: future.done() or future.set_result(None))
    for hold in holds:
        job.wait(hold)
    job.arm()
    await future


def forget_settled(holds: OrderedDict, bound: int) -> None:
    """The oldest settled holds forgotten in bulk, down to `bound` (called past a sixteenth
    above it); one still in flight stops it: the table is bounded by the windows anyway."""
    settled = None  # the last hold found settled: the next entries mostly share it (a frame's, module doc)
    for _ in range(len(holds) - bound):
        old_key, oldest = holds.popitem(last=False)
        if oldest is settled:
            continue
        hold = oldest
        while hold is not None and not hold.pending:
            hold = hold.prior
        if hold is not None:
            holds[old_key] = oldest
            holds.move_to_end(old_key, last=False)
            break
        settled = oldest
