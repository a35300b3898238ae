"""Versioned views: the membership log a replica streams to its watchers, and plan checks.

A view is (version, members, topics, acls). Every change a replica makes -- member upserts
from its detector, removals of members whose tombstone expired, topic and ACL rule upserts
and deletes --
becomes one new version and one `ViewDelta` from the version before. A watcher that knows version v gets the deltas after v if the
log still holds them all (`ViewLog.since`), else a snapshot: the `Watch` contract
("a snapshot first, then deltas; a watcher that falls behind gets a snapshot").

Values are opaque: members are keyed by id, topics by name, ACL rules by their key
(core/acl.py rule_key), and the log stores
whatever the service puts in (its `MemberRecord`, its own Topic type); it only needs ==,
so an upsert that changes nothing makes no version.

Versions are per replica (each replica has its own log; see replication.py). `base` lets
a replica start its numbering at a value unique to its process (start time in
microseconds): a known_version from another replica or an earlier life of this one then
falls outside the log and the watcher gets a snapshot instead of wrong deltas. A member
that switches replica should watch with known_version 0 anyway.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass(frozen=True)
class TopicRecord:
    """A generic topic value for tests and the simulator; the service may store its own."""

    name: str
    schema_attrs: tuple = ()
    created_ms: int = 0


class View(NamedTuple):
    """A full view; unpacks as (version, members, topics, acls). Treat the dicts as read-only."""

    version: int
    members: Mapping[str, Any]
    topics: Mapping[str, Any]
    acls: Mapping[str, Any] = {}


@dataclass(frozen=True)
class ViewDelta:
    """The change from `from_version` to `version` (= from_version + 1)."""

    from_version: int
    version: int
    upserted: Mapping[str, Any] = field(default_factory=dict)
    topics_upserted: Mapping[str, Any] = field(default_factory=dict)
    topics_deleted: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()  # member ids that left the view (expired tombstones)
    acls_upserted: Mapping[str, Any] = field(default_factory=dict)
    acls_deleted: tuple[str, ...] = ()


class ViewLog:
    """The current view of one replica plus its last `keep` deltas."""

    def __init__(self, keep: int = 256, base: int = 0):
        if keep < 1 or base < 0:
            raise ValueError("keep must be >= 1 and base >= 0")
        self.base = base
        self._version = base
        self._members: dict[str, Any] = {}
        self._topics: dict[str, Any] = {}
        self._acls: dict[str, Any] = {}
        self._deltas: deque[ViewDelta] = deque(maxlen=keep)

    @property
    def version(self) -> int:
        return self._version

    def change(
        self,
        members: Mapping[str, Any] | None = None,
        topics: Mapping[str, Any] | None = None,
        topics_deleted: Iterable[str] = (),
        removed: Iterable[str] = (),
        acls: Mapping[str, Any] | None = None,
        acls_deleted: Iterable[str] = (),
    ) -> ViewDelta | None:
        """Apply one batch as one version; None when nothing actually changed.
        `removed`: member ids that leave the view (not an upsert to a state)."""
        members, topics, acls = members or {}, topics or {}, acls or {}
        deleted, removed, acls_deleted = tuple(topics_deleted), tuple(removed), tuple(acls_deleted)
        for what, both in (("topics", set(topics) & set(deleted)), ("members", set(members) & set(removed)),
                           ("acls", set(acls) & set(acls_deleted))):
            if both:
                raise ValueError(f"{what} both upserted and removed in one change: {sorted(both)}")
        up_m = {k: v for k, v in members.items() if k not in self._members or self._members[k] != v}
        del_m = tuple(dict.fromkeys(k for k in removed if k in self._members))
        up_t = {k: v for k, v in topics.items() if k not in self._topics or self._topics[k] != v}
        del_t = tuple(dict.fromkeys(k for k in deleted if k in self._topics))
        up_a = {k: v for k, v in acls.items() if k not in self._acls or self._acls[k] != v}
        del_a = tuple(dict.fromkeys(k for k in acls_deleted if k in self._acls))
        if not (up_m or del_m or up_t or del_t or up_a or del_a):
            return None
        delta = ViewDelta(self._version, self._version + 1, up_m, up_t, del_t, del_m, up_a, del_a)
        self._members.update(up_m)
        for k in del_m:
            del self._members[k]
        self._topics.update(up_t)
        for k in del_t:
            del self._topics[k]
        self._acls.update(up_a)
        for k in del_a:
            del self._acls[k]
        self._version = delta.version
        self._deltas.append(delta)
        return delta

    def upsert_member(self, member_id: str, member: Any) -> ViewDelta | None:
        return self.change(members={member_id: member})

    def remove_members(self, member_ids: Iterable[str]) -> ViewDelta | None:
        return self.change(removed=member_ids)

    def upsert_topic(self, name: str, topic: Any) -> ViewDelta | None:
        return self.change(topics={name: topic})

    def delete_topic(self, name: str) -> ViewDelta | None:
        return self.change(topics_deleted=(name,))

    def since(self, known_version: int) -> list[ViewDelta] | None:
        """The deltas that bring `known_version` up to date, or None: send a snapshot."""
        if known_version == self._version:
            return []
        if not self._deltas or known_version > self._version:
            return None
        i = known_version - self._deltas[0].from_version
        if i < 0:
            return None
        return list(self._deltas)[i:]

    def snapshot(self) -> View:
        return View(self._version, dict(self._members), dict(self._topics), dict(self._acls))


def merge(local: View, delta: ViewDelta) -> View | None:
    """A member applying one delta to its view. None: the delta does not follow this view
    (a gap, or another replica's numbering) and the member must ask for a snapshot.
    A delta already applied (version <= local's) is a replay and changes nothing."""
    if delta.version <= local.version:
        return local
    if delta.from_version != local.version:
        return None
    members = {**local.members, **delta.upserted}
    for member_id in delta.removed:
        members.pop(member_id, None)
    topics = {**local.topics, **delta.topics_upserted}
    for name in delta.topics_deleted:
        topics.pop(name, None)
    acls = {**local.acls, **delta.acls_upserted}
    for key in delta.acls_deleted:
        acls.pop(key, None)
    return View(delta.version, members, topics, acls)


class PlanRejection(str):
    """Why a routing plan was refused. A str (goes straight into the status message) that
    also says which status: `stale` -> FAILED_PRECONDITION, else INVALID_ARGUMENT."""

    stale: bool

    def __new__(cls, reason: str, stale: bool = False) -> PlanRejection:
        self = super().__new__(cls, reason)
        self.stale = stale
        return self


def check_plan(
    plan_version: int,
    current_version: int,
    zone_owners: list[str],
    alive: set[str],
    zones_tile: bool,
) -> PlanRejection | None:
    """The `Control.PushPlan` acceptance rule; None means accept.

    Checked at the replica that receives the push, against its own view: the version
    must rise (a retried or raced push is refused, not reapplied), the zones must tile
    the space (computed by the caller from the zone geometry), and every owner must be
    alive there (ALIVE or SUSPECT: a suspicion is not a reason to reject a whole plan).
    """
    if plan_version <= current_version:
        return PlanRejection(f"plan version {plan_version} is not above the current {current_version}", True)
    if not zones_tile:
        return PlanRejection("zones do not tile the content space")
    dead = sorted({o for o in zone_owners if o not in alive})
    if dead:
        shown = ", ".join(repr(o) for o in dead[:5]) + (f" and {len(dead) - 5} more" if len(dead) > 5 else "")
        return PlanRejection(f"zone owners not alive: {shown}")
    return None
