"""The dedup window: a second copy of a message id is recognised, and told apart from a
different event reusing the id.

A client that retries after a lost ack (even through another agent) resends the same
(producer id, sequence); every receiver remembers the ids it has seen for `horizon`
seconds and at most `capacity` of them, oldest forgotten first. Time comes in as `now`
(not decreasing from one call to the next).

An offer may carry a digest of the event's content: a later offer of the id with
another digest is `Seen.DIFFERENT` (the publishing agent refuses it rather than drop it
as a duplicate). An offer also keeps what its owner says of the first copy (`outcome`,
read back with `outcome(key)`), so a duplicate can be answered as the first was.

Per id, a plain dict holds its record and a deque its place in the order of arrival:
no object per id but the record (a float for `first_time`, a tuple for `offer`), no
OrderedDict links (issue 12: the window is on every publish and every delivery). An id
forgotten leaves its place in the deque behind: counted in `_stale`, skipped when the
oldest are dropped (forgetting is rare: a publish that failed).
"""

from __future__ import annotations

import enum
import math
from collections import deque
from typing import Any, Hashable


class Seen(enum.Enum):
    FIRST = "first"  # recorded now
    SAME = "same"  # seen before, same digest: a duplicate
    DIFFERENT = "different"  # seen before with another digest: another event under a used id


_FIRST, _SAME, _DIFFERENT = Seen.FIRST, Seen.SAME, Seen.DIFFERENT


class DedupWindow:
    def __init__(self, capacity: int = 1_000_000, horizon: float = 600.0):
        self.capacity = capacity
        self.horizon = horizon
        # id -> its time (first_time), or (time, digest, outcome) (offer)
        self._seen: dict[Hashable, float | tuple[float, object, Any]] = {}
        self._order: deque[Hashable] = deque()  # the ids in order of arrival, forgotten ones too
        self._stale: dict[Hashable, int] = {}  # id -> its places in _order left by `forget`
        self._oldest = math.inf  # the time of the oldest id held (inf: none)

    def offer(self, key: Hashable, now: float, digest: object = b"", outcome: Any = None,
              expire: bool = True) -> Seen:
        """Record `key` (with `outcome`) the first time it is offered within the window;
        else say whether the content matches the first offer's. `expire=False`: the caller
        ran `expire(now)` once for many offers at one time."""
        if expire and now - self._oldest > self.horizon:
            self._drop(now)
        seen = self._seen
        record = seen.get(key)
        if record is None:
            if not seen:
                self._oldest = now
            seen[key] = (now, digest, outcome)
            self._order.append(key)
            if len(seen) > self.capacity:
                self._drop(None)
            return _FIRST
        if record.__class__ is float:  # recorded by first_time: no digest
            return _SAME if digest == b"" else _DIFFERENT
        return _SAME if record[1] == digest else _DIFFERENT  # type: ignore[index]

    def outcome(self, key: Hashable) -> Any:
        """What the owner said of `key`'s first copy (None for an id of `first_time`, or not held)."""
        record = self._seen.get(key)
        return None if record is None or record.__class__ is float else record[2]  # type: ignore[index]

    def first_time(self, key: Hashable, now: float) -> bool:
        """True the first time `key` is offered within the window; records it: its time
        alone (a window of a million ids would otherwise hold a million objects that every
        full pass of the cyclic GC scans: ~0.2-0.5 s each, on the delivery path)."""
        if now - self._oldest > self.horizon:
            self._drop(now)
        seen = self._seen
        if key in seen:
            return False
        if not seen:
            self._oldest = now
        seen[key] = float(now)
        self._order.append(key)
        if len(seen) > self.capacity:
            self._drop(None)
        return True

    def forget(self, key: Hashable) -> None:
        """The first copy was not published after all: the id may be used again."""
        if self._seen.pop(key, None) is not None:
            self._stale[key] = self._stale.get(key, 0) + 1
            if not self._seen:
                self._reset()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._seen

    def __len__(self) -> int:
        return len(self._seen)

    def expire(self, now: float) -> None:
        """Forget the ids older than the horizon."""
        if now - self._oldest > self.horizon:
            self._drop(now)

    def _drop(self, now: float | None) -> None:
        """Forget the oldest ids: those older than the horizon at `now`, or (None) one, to
        stay within the capacity. `_oldest` is then the time of the oldest left."""
        seen, order, stale = self._seen, self._order, self._stale
        while order:
            key = order[0]
            if stale:
                n = stale.get(key)
                if n is not None:  # a place `forget` left (older than the key's live one)
                    order.popleft()
                    if n == 1:
                        del stale[key]
                    else:
                        stale[key] = n - 1
                    continue
            record = seen[key]
            at = record if record.__class__ is float else record[0]  # type: ignore[index]
            if now is not None and now - at <= self.horizon:
                self._oldest = at
                return
            order.popleft()
            del seen[key]
            if now is None:
                now = -math.inf  # one dropped: the next one held is the oldest
        self._reset()

    def _reset(self) -> None:
        """Nothing held: no place left behind either."""
        self._order.clear()
        self._stale.clear()
        self._oldest = math.inf
