"""CRAWL: CBDLO's random walk with a labelled trace (section 3), for finding a holder
in an overlay where no node knows them all.

The walk starts at a source and moves one node per hop. At each node it looks the
target up in that node's access-point table (APT); a hit ends it (one last message, to
the holder). Otherwise it goes on to a random neighbour that is not in the trace, the
last `trace` nodes visited (3.1), so it does not come back at once to where it has
just been. When every neighbour is in the trace the walk is blocked (3.2): it restarts
from a random trace node with half of the hops it had left, so block-and-restart cannot
loop for ever. The restarted walk is a new one (the paper's words): its trace starts
afresh, holding its start and the node where the last one was blocked, so it does not
walk straight back into the dead end, and nodes the old trace held are open to it.

`Crawler` is the walk's state, stepped by whoever moves it: the simulator
(`loadtest/crawl_sim.py`) and an agent looking for a matcher when no membership
replica answers (`agent/crawl.py`), which visits each node by asking it. `walk` runs
one to the end over plain callbacks.

Every message counts against one budget, restarts included, so a walk sends at most
`max_hops` messages before the one to the holder. The paper's restart halves the
maximum hop count; ours halves what is left, which is the same bound or tighter
(docs/papers.md, CBDLO).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Optional, Sequence, TypeVar

Node = TypeVar("Node", bound=Hashable)

MAX_HOPS = 30  # the paper's experiments use 10 and 30
TRACE = 8


class Crawler:
    """One walk from `source`: call `next_hop` at the node it is at (`here`) after that
    node's APT missed; it returns where to send the walk, or None when the walk is over
    without a holder."""

    def __init__(self, source, *, max_hops: int = MAX_HOPS, trace: int = TRACE, rng: random.Random | None = None):
        if max_hops < 1 or trace < 1:
            raise ValueError("max_hops and trace must be at least 1")
        self.rng = rng or random.Random()
        self.trace: deque = deque([source], maxlen=trace)  # the source is traced first (3.1, step 1)
        self.here = source
        self.budget = max_hops  # messages left
        self.messages = 0
        self.restarts = 0
        self.path = [source]

    def next_hop(self, neighbours: Iterable) -> Optional[Hashable]:
        """The next node, from `here` and its neighbours; None: the budget is spent."""
        if self.budget <= 0:
            return None
        if self.here not in self.trace:
            self.trace.append(self.here)
        free = [n for n in dict.fromkeys(neighbours) if n not in self.trace]
        if free:
            return self._go(self.rng.choice(free))
        # Blocked (3.2): restart from a trace node with half the hops left.
        back = [n for n in self.trace if n != self.here]
        self.budget //= 2
        if not back or self.budget <= 0:
            self.budget = 0
            return None
        self.restarts += 1
        blocked, start = self.here, self.rng.choice(back)
        # A new walk from `start` (3.2): its own trace, which keeps the dead end out.
        self.trace.clear()
        self.trace.extend((blocked, start))
        return self._go(start)

    def found(self) -> None:
        """`here`'s APT hit: the last message, to the holder."""
        self.messages += 1

    def _go(self, node):
        self.budget -= 1
        self.messages += 1
        self.here = node
        self.path.append(node)
        return node


@dataclass(frozen=True)
class Walk:
    holder: Optional[Hashable]  # None: not found within the budget
    messages: int  # hops, restarts and the last message to the holder
    restarts: int
    path: tuple  # the nodes visited, the source first


def walk(
    source: Node,
    lookup: Callable[[Node], Optional[Hashable]],
    neighbours: Callable[[Node], Sequence[Node]],
    *,
    max_hops: int = MAX_HOPS,
    trace: int = TRACE,
    rng: random.Random | None = None,
) -> Walk:
    """One CRAWL walk to the end: `lookup(node)` is the node's APT (a holder or None),
    `neighbours(node)` its view."""
    c = Crawler(source, max_hops=max_hops, trace=trace, rng=rng)
    node: Optional[Hashable] = source
    while node is not None:
        holder = lookup(node)
        if holder is not None:
            c.found()
            return Walk(holder, c.messages, c.restarts, tuple(c.path))
        node = c.next_hop(neighbours(node))
    return Walk(None, c.messages, c.restarts, tuple(c.path))
