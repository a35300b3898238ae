"""The dedup window: a second copy of a message id is recognised, and told apart from a
different event reusing the id.

A client that retries after a lost ack (even through another agent) resends the same
(producer id, sequence); every receiver remembers the ids it has seen for a while and
recognises a retry within it. Time comes in as `now` (not decreasing from one call to
the next).

An offer may carry a digest of the event's content: a later offer of the id with
another digest is `Seen.DIFFERENT` (the publishing agent refuses it rather than drop it
as a duplicate). An offer also keeps what its owner says of the first copy (`outcome`,
read back with `outcome(key)`), so a duplicate can be answered as the first was.

The window's guarantee, exactly (tests/unit/test_dedup.py checks both bounds against a
brute-force list of every offer). An id first offered at time t is recognised as long as
it was not forgotten, `now - t <= horizon` and fewer than `capacity` other ids were
first offered after it. It is forgotten once `now - t > 2 * horizon`, or once
`2 * capacity - 1` ids first offered after it are held or were dropped with it. Between
the two it may be either. So the window holds at most `2 * capacity - 1` ids.

Generations (the window is on every publish and every delivery, and at a
million ids every new id used to evict the oldest one by one): ids go into a young dict;
when it holds `capacity` ids, or its first id passes the horizon, it becomes the old
dict and the old one is dropped whole; the old one also goes once its newest id passes
the horizon. A lookup is two dict probes, eviction one dict freed per `capacity` ids,
and `forget` a pop. `generation` counts the moves: an id offered while it was g is
held no longer than while it is g + 1.
"""

from __future__ import annotations

import enum
import math
from typing import Any, Hashable


class Seen(enum.Enum):
    FIRST = "first"  # recorded now
    SAME = "same"  # seen before, same digest: a duplicate
    DIFFERENT = "different"  # seen before with another digest: another event under a used id


_FIRST, _SAME, _DIFFERENT = Seen.FIRST, Seen.SAME, Seen.DIFFERENT
_INF = math.inf


class DedupWindow:
    # Generations of 500,000: at most a million ids held (~145 MiB of keys and times at
    # saturation), the bound one window of a million had before generations.
    def __init__(self, capacity: int = 500_000, horizon: float = 600.0):
        self.capacity = capacity
        self.horizon = horizon
        self.generation = 0  # moves of the young dict to old (module doc)
        # id -> its time (first_time), or (time, digest, outcome) (offer)
        self._young: dict[Hashable, float | tuple[float, object, Any]] = {}
        self._old: dict[Hashable, float | tuple[float, object, Any]] = {}
        self._since = _INF  # the time of the young dict's first id (inf: empty)
        self._newest = -_INF  # the time of the young dict's newest id
        self._old_newest = _INF  # the time of the old dict's newest id (inf: empty)
        self._due = _INF  # the earlier of `_since` and `_old_newest`: past the horizon, `_expire`

    def offer(self, key: Hashable, now: float, digest: object = b"", outcome: Any = None,
              expire: bool = True) -> Seen:
        """Record `key` (with `outcome`) the first time it is offered within the window;
        else say whether the content matches the first offer's. `expire=False`: the caller
        ran `expire(now)` once for many offers at one time."""
        if expire and now - self._due > self.horizon:
            self._expire(now)
        young = self._young
        record = young.get(key)
        if record is None:
            record = self._old.get(key)
            if record is None:
                if not young:
                    self._start(now)
                young[key] = (now, digest, outcome)
                self._newest = now
                if len(young) >= self.capacity:
                    self._rotate()
                return _FIRST
        if record.__class__ is float:  # recorded by first_time: no digest
            return _SAME if digest == b"" else _DIFFERENT
        return _SAME if record[1] == digest else _DIFFERENT  # type: ignore[index]

    def outcome(self, key: Hashable) -> Any:
        """What the owner said of `key`'s first copy (None for an id of `first_time`, or not held)."""
        record = self._young.get(key)
        if record is None:
            record = self._old.get(key)
        return None if record is None or record.__class__ is float else record[2]  # type: ignore[index]

    def first_time(self, key: Hashable, now: float) -> bool:
        """True the first time `key` is offered within the window; records it: its time
        alone (a window of a million ids would otherwise hold a million objects that every
        full pass of the cyclic GC scans, on the delivery path)."""
        if now - self._due > self.horizon:
            self._expire(now)
        young = self._young
        if key in young or key in self._old:
            return False
        if not young:
            self._start(now)
        young[key] = float(now)
        self._newest = now
        if len(young) >= self.capacity:
            self._rotate()
        return True

    def first_times(self, keys, now: float) -> list[bool]:
        """`first_time` of each of `keys` in turn, at one time (a frame's: one call)."""
        if now - self._due > self.horizon:
            self._expire(now)
        young, old, capacity, stamp = self._young, self._old, self.capacity, float(now)
        out = []
        for key in keys:
            if key in young or key in old:
                out.append(False)
                continue
            if not young:
                self._start(now)
            young[key] = stamp
            self._newest = now
            out.append(True)
            if len(young) >= capacity:
                self._rotate()  # no expiry follows at this `now`: `_rotate` leaves `_due` at it
                young, old = self._young, self._old
        return out

    def forget(self, key: Hashable) -> None:
        """The first copy was not published after all: the id may be used again."""
        if self._young.pop(key, None) is None:
            self._old.pop(key, None)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._young or key in self._old

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def expire(self, now: float) -> None:
        """Forget the ids the horizon lets go (module doc: whole dicts, so some older than
        the horizon may stay, none older than twice the horizon)."""
        if now - self._due > self.horizon:
            self._expire(now)

    def _start(self, now: float) -> None:
        """The young dict's first id, at `now`."""
        self._since = now
        self._due = min(now, self._old_newest)

    def _rotate(self) -> None:
        """The young dict becomes the old one; the old one is dropped."""
        self._old, self._young = self._young, {}
        self._old_newest, self._since = self._newest, _INF
        self._due = self._old_newest
        self.generation += 1

    def _expire(self, now: float) -> None:
        horizon = self.horizon
        if now - self._since > horizon:  # its first id is past the horizon (its later ones may not be)
            self._rotate()
        if now - self._old_newest > horizon:  # every id in it is past the horizon
            self._old, self._old_newest = {}, _INF
        self._due = min(self._since, self._old_newest)
