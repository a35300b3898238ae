"""The reconciliation barrier: an entry answers Match only while the matchers it routes to
hold every subscription of every agent of the view but those that LEFT (docs/guarantees.md).

A matcher process starts empty. It is *complete* for a topic once

- every agent the view holds, alive or DEAD (whose messages are parked for it; not one that
  LEFT), has refilled it: an agent sends every subscription it
  owns to a matcher new to it (or back in a new lifetime), marked as the whole of them
  (`RegisterRequest.refill`, agent/matching.py), even when it owns none; or
- it switched to a layout of the topic whose other members all said they were complete:
  their handoff pushed it everything the layout gives it (adoption.py, barrier.py). With
  one matcher there is no such peer: only the agents can refill it.

Completeness is monotone within a process lifetime (registrations keep a complete copy
complete) and travels in Sync (`LayoutStatus.complete`). An entry routes a batch of a
topic only when it is complete for the topic and so is every other member of the zones
of its active layout; meanwhile the batch waits (fanout.py, up to the deadline), then
UNAVAILABLE, and the agent acks nothing (its publisher retries). An agent that never
refills (hung, or cut off yet alive in the view) holds the barrier at most `timeout`
seconds: then it is given up, logged and counted (echelon_matcher_refill_timeouts_total).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable

log = logging.getLogger("echelon.matcher.refill")

TIMEOUT = 30.0


class Refill:
    def __init__(self, alive_agents: Callable[[], Iterable[str]] | None = None, timeout: float = TIMEOUT,
                 clock: Callable[[], float] = time.monotonic):
        """`alive_agents()`: the agents whose refill is owed (matcher/server.py; None: no agent owns anything
        here, the tier's unit tests: complete from the start)."""
        self.alive_agents = alive_agents
        self.timeout = timeout
        self.clock = clock
        self.started = clock()
        self.refilled: set[str] = set()
        self.handed: set[str] = set()  # topics filled by complete peers' handoff
        self._done = alive_agents is None
        self.on_timeout: Callable[[int], None] | None = None  # the service's counter

    def agent(self, agent: str) -> None:
        """`agent` has sent every subscription it owns."""
        self.refilled.add(agent)

    def handoff(self, topic: str) -> None:
        """A layout of `topic` was switched to with every other member complete."""
        if topic not in self.handed:
            self.handed.add(topic)
            log.info("topic %s: complete (handoff from complete peers)", topic)

    def done(self) -> bool:
        """Has every alive agent refilled this matcher (or the wait timed out)?"""
        if self._done:
            return True
        missing = set(self.alive_agents()) - self.refilled
        if not missing:
            log.info("every alive agent refilled this matcher (%d)", len(self.refilled))
            self._done = True
        elif self.clock() - self.started > self.timeout:
            log.warning("%d agents did not refill this matcher in %.0f s, answering without them: %s",
                        len(missing), self.timeout, ", ".join(sorted(missing)[:10]))
            if self.on_timeout:
                self.on_timeout(len(missing))
            self._done = True
        return self._done

    def complete(self, topic: str) -> bool:
        return topic in self.handed or self.done()
