"""The dedup window: receivers drop a second copy of a message id.

A client that retries after a lost ack (even through another agent) resends the same
(producer id, sequence); every receiver remembers the ids it has seen for `horizon`
seconds and at most `capacity` of them, oldest forgotten first. Time comes in as `now`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable


class DedupWindow:
    def __init__(self, capacity: int = 1_000_000, horizon: float = 600.0):
        self.capacity = capacity
        self.horizon = horizon
        self._seen: OrderedDict[Hashable, float] = OrderedDict()

    def first_time(self, key: Hashable, now: float) -> bool:
        """True the first time `key` is offered within the window; records it."""
        self._expire(now)
        if key in self._seen:
            return False
        self._seen[key] = now
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        return True

    def __contains__(self, key: Hashable) -> bool:
        return key in self._seen

    def __len__(self) -> int:
        return len(self._seen)

    def _expire(self, now: float) -> None:
        while self._seen:
            key, seen_at = next(iter(self._seen.items()))
            if now - seen_at <= self.horizon:
                return
            self._seen.popitem(last=False)
