"""The dedup window: a second copy of a message id is recognised, and told apart from a
different event reusing the id.

A client that retries after a lost ack (even through another agent) resends the same
(producer id, sequence); every receiver remembers the ids it has seen for `horizon`
seconds and at most `capacity` of them, oldest forgotten first. Time comes in as `now`.

An offer may carry a digest of the event's content: a later offer of the id with
another digest is `Seen.DIFFERENT` (the publishing agent refuses it rather than drop it
as a duplicate). Each entry also keeps what its first copy came to (`outcome`), so a
duplicate can be answered as the first was.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable


class Seen(enum.Enum):
    FIRST = "first"  # recorded now
    SAME = "same"  # seen before, same digest: a duplicate
    DIFFERENT = "different"  # seen before with another digest: another event under a used id


@dataclass
class Entry:
    seen_at: float
    digest: bytes = b""
    outcome: Any = None  # set by the owner: what the first copy came to


class DedupWindow:
    def __init__(self, capacity: int = 1_000_000, horizon: float = 600.0):
        self.capacity = capacity
        self.horizon = horizon
        self._seen: OrderedDict[Hashable, Entry | float] = OrderedDict()  # a float: first_time's

    def offer(self, key: Hashable, now: float, digest: bytes = b"", expire: bool = True) -> tuple[Seen, Entry]:
        """Record `key` the first time it is offered within the window; else say whether
        the content matches the first offer's. `expire=False`: the caller ran `expire(now)`
        once for many offers at one time."""
        if expire:
            self.expire(now)
        entry = self._seen.get(key)
        if entry.__class__ is float:  # recorded by first_time (no digest)
            entry = self._seen[key] = Entry(entry)  # type: ignore[arg-type]
        if entry is not None:
            return (Seen.SAME if entry.digest == digest else Seen.DIFFERENT), entry
        entry = self._seen[key] = Entry(now, digest)
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        return Seen.FIRST, entry

    def first_time(self, key: Hashable, now: float) -> bool:
        """True the first time `key` is offered within the window; records it: its time
        alone, no Entry (a window of a million ids would otherwise hold a million objects
        that every full pass of the cyclic GC scans: ~0.2-0.5 s each, on the delivery path)."""
        self.expire(now)
        if key in self._seen:
            return False
        self._seen[key] = float(now)
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        return True

    def forget(self, key: Hashable) -> None:
        """The first copy was not published after all: the id may be used again."""
        self._seen.pop(key, None)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._seen

    def __len__(self) -> int:
        return len(self._seen)

    def expire(self, now: float) -> None:
        """Forget the ids older than the horizon."""
        while self._seen:
            key, entry = next(iter(self._seen.items()))
            if now - (entry if entry.__class__ is float else entry.seen_at) <= self.horizon:
                return
            self._seen.popitem(last=False)
