"""How the three membership replicas stay consistent enough, and the pure merge rules.

The membership StatefulSet runs 3 replicas with no leader and no consensus. Each kind of
state gets the weakest rule that is still correct for it:

1. Liveness is not replicated. Every member beats to ALL replicas and each replica runs
   its own `detector.Detector` on the beats it sees, so each replica alone can judge
   liveness and a replica crash stops nothing. Replicas may disagree for a moment (one
   sees a SUSPECT the others do not); each view is self-consistent, and the detectors see
   the same beats, so they agree within a beat or two.

2. Views are per replica. A member watches ONE replica and gets that replica's view,
   numbered by that replica's `view.ViewLog`. Members watch the first reachable replica
   in one fixed order (`watch_target`: membership-0, then -1, then -2), so in steady state
   every member shares one view history, and view versions (plan epochs, destination
   bitmaps) mean the same thing to all of them. When its stream breaks a member fails
   over to the next replica and watches with known_version 0 (a snapshot: another
   replica's numbering means nothing); it moves back once the preferred replica has been
   reachable for a while. ViewLog's `base` (process start in microseconds) makes a stale
   known_version miss the log and fall back to a snapshot even if a member forgets this.

3. Topics are a last-writer-wins map (`LwwMap`), a state-based CRDT. The replica that
   accepts a write stamps it (version, origin) with a Lamport clock -- version = max seen
   + 1, ties broken by origin -- and pushes the entry to its peers; deletes are tombstones
   so a delete beats the older put it removes, wherever the two meet. Merge keeps the
   entry with the larger stamp: commutative, associative and idempotent, so replicas
   converge whatever the delivery order, loss (repaired below) or duplication. `origin`
   is the replica id plus its process start time, so a replica that restarts empty never
   reissues a stamp it used before. A write made after seeing an entry always beats it.
   A concurrent create of one topic on two replicas keeps one of them everywhere.

4. Routing plans are a last-writer-wins register (`PlanRegister`) ordered by
   (plan version, origin). The receiving replica validates a push once, against its own
   view (`view.check_plan`); accepted plans are then merged by peers WITHOUT
   re-validation: re-checking against a different view could make replicas disagree
   forever, while a plan naming an owner that died meanwhile is just a failure the data
   plane already handles. Two replicas accepting different plans with the same version
   settle on the one with the larger origin. Each replica streams the plan with the
   epoch set to its own view version when the plan won there.

5. Repair. Pushes are best effort. Every few seconds each replica compares `digest()`
   with each peer and, when they differ, pulls the peer's full state (topics plus one
   plan: small) and merges it; a restarted replica does the same before serving. Tombstones
   are kept: topics are few, and dropping one could resurrect a deleted topic.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, order=True)
class Stamp:
    """Lamport version plus the writing replica's origin: a total order on writes."""

    version: int
    origin: str


@dataclass(frozen=True)
class Entry:
    """One stamped write; `deleted` marks a tombstone (value None)."""

    stamp: Stamp
    value: Any = None
    deleted: bool = False


def wins(new: Entry, old: Entry | None) -> bool:
    """The LWW rule: `new` replaces `old` iff its stamp is larger."""
    return old is None or new.stamp > old.stamp


class LwwMap:
    """A replica's topic table: key -> Entry, with tombstones and a Lamport clock."""

    def __init__(self, origin: str, state: Mapping[str, Entry] | None = None):
        self.origin = origin
        self.clock = 0
        self._entries: dict[str, Entry] = {}
        if state:
            self.merge_state(state)

    def put(self, key: str, value: Any) -> Entry:
        """A local write; push the returned entry to the peers."""
        return self._write(key, Entry(self._tick(), value))

    def delete(self, key: str) -> Entry | None:
        """A local delete (a tombstone to push); None when the key is not present here."""
        if key not in self:
            return None
        return self._write(key, Entry(self._tick(), None, deleted=True))

    def merge(self, key: str, entry: Entry) -> bool:
        """A peer's entry; True when it replaced ours."""
        self.clock = max(self.clock, entry.stamp.version)
        if not wins(entry, self._entries.get(key)):
            return False
        self._entries[key] = entry
        return True

    def merge_state(self, state: Mapping[str, Entry]) -> list[str]:
        """A peer's full state (anti-entropy, restart); returns the keys that changed."""
        return [k for k, e in sorted(state.items()) if self.merge(k, e)]

    def state(self) -> dict[str, Entry]:
        """Every entry, tombstones included: what a peer pulls."""
        return dict(self._entries)

    def entry(self, key: str) -> Entry | None:
        """The stamped entry of `key` (a tombstone too); None when never written."""
        return self._entries.get(key)

    def get(self, key: str, default: Any = None) -> Any:
        e = self._entries.get(key)
        return default if e is None or e.deleted else e.value

    def live(self) -> dict[str, Any]:
        """The visible map: key -> value without tombstones."""
        return {k: e.value for k, e in self._entries.items() if not e.deleted}

    def __contains__(self, key: object) -> bool:
        e = self._entries.get(key)  # type: ignore[arg-type]
        return e is not None and not e.deleted

    def digest(self) -> str:
        """Equal digests <=> equal states (stamps are unique, so values need not be hashed)."""
        return _digest((k, e.stamp.version, e.stamp.origin, e.deleted) for k, e in sorted(self._entries.items()))

    def _tick(self) -> Stamp:
        self.clock += 1
        return Stamp(self.clock, self.origin)

    def _write(self, key: str, entry: Entry) -> Entry:
        self._entries[key] = entry
        return entry


class PlanRegister:
    """The current routing plan of a replica, ordered by (plan version, origin)."""

    def __init__(self, origin: str):
        self.origin = origin
        self.current: Entry | None = None

    @property
    def version(self) -> int:
        return 0 if self.current is None else self.current.stamp.version

    @property
    def plan(self) -> Any:
        return None if self.current is None else self.current.value

    def accept(self, version: int, plan: Any) -> Entry:
        """A push validated here (`view.check_plan`); push the returned entry to the peers."""
        if version <= self.version:
            raise ValueError(f"plan version {version} is not above the current {self.version}")
        self.current = Entry(Stamp(version, self.origin), plan)
        return self.current

    def merge(self, entry: Entry) -> bool:
        """A peer's accepted plan, taken without re-validation; True when it became ours."""
        if not wins(entry, self.current):
            return False
        self.current = entry
        return True

    def digest(self) -> str:
        s = self.current.stamp if self.current else Stamp(0, "")
        return _digest([(s.version, s.origin)])


def watch_target(replicas: Sequence[str], reachable: set[str]) -> str | None:
    """The replica a member should watch: the first reachable one in the fixed order."""
    return next((r for r in replicas if r in reachable), None)


def _digest(rows) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(repr(row).encode())
        h.update(b"\n")
    return h.hexdigest()
