"""One membership replica's state, without I/O: the glue between the failure detector,
the view log and the replicated topic and ACL maps and plan register (core/detector.py,
core/view.py, core/replication.py).

Everything is driven by the caller with `now` (monotonic seconds), so the whole replica
runs under a fake clock in unit tests. Every change becomes at most one view version;
listeners (the Watch streams, the heartbeat prompts, the metrics) are called with it.

Tombstones. A DEAD or LEFT member stays in the view for `tombstone_ttl` seconds, so every
watcher sees the verdict (path update), then one delta removes it: views do not
grow with every process that ever lived. The detector keeps its record (one small row
per id), which still refuses a stale incarnation; a member that rejoins later comes
back into the view as an upsert.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from echelon.core.detector import LIVE, Detector, MemberRecord, State, Transition, identity
from echelon.core.replication import Entry, LwwMap, PlanRegister
from echelon.core.view import ViewDelta, ViewLog

GONE = frozenset({State.DEAD, State.LEFT})


def view_record(rec: MemberRecord) -> MemberRecord:
    """What the view holds of a record: no clock fields, so a beat changes no version."""
    return identity(rec)


class Replica:
    """The members, topics and plan of one membership replica."""

    def __init__(self, replica_id: str, started_us: int, heartbeat_interval: float = 0.2,
                 tombstone_ttl: float = 300.0, keep: int = 1024, **detector_options: Any):
        self.origin = f"{replica_id}@{started_us}"
        self.detector = Detector(heartbeat_interval, **detector_options)
        self.log = ViewLog(keep=keep, base=started_us)
        self.topics = LwwMap(self.origin)
        self.acls = LwwMap(self.origin)  # rule key -> AclRule (core/acl.py), replicated like topics
        self.plans = PlanRegister(self.origin)
        self.plan_epoch = 0  # this replica's view version when the current plan won here
        self.last_run_ok = 0.0  # unix seconds of the routing job's last run that did not fail
        self.tombstone_ttl = tombstone_ttl
        self._gone: dict[str, float] = {}  # member id -> when it became DEAD or LEFT
        self.on_delta: list[Callable[[ViewDelta], None]] = []
        self.on_transitions: list[Callable[[list[Transition]], None]] = []
        self.on_plan: list[Callable[[], None]] = []
        self.on_run: list[Callable[[], None]] = []
        # (kind, key, entry) of every write to the replicated state, local or merged, as it
        # happens: where a durable replica commits it (membership/store.py) before replying.
        self.on_write: list[Callable[[str, str, Entry], None]] = []

    # -- members ---------------------------------------------------------------------

    def join(self, record: MemberRecord, now: float) -> list[Transition]:
        return self._apply(self.detector.join(record, now), now)

    def beat(self, member_id: str, incarnation: int, now: float,
             publishes: Iterable[str] | None = None, subscribes: Iterable[str] | None = None) -> list[Transition]:
        return self._apply(self.detector.beat(member_id, incarnation, now, publishes, subscribes), now)

    def evidence(self, member_id: str, reporter: str, now: float, incarnation: int | None = None) -> list[Transition]:
        return self._apply(self.detector.evidence(member_id, reporter, now, incarnation), now)

    def stream_ended(self, member_id: str, now: float, last_beat: float | None = None) -> list[Transition]:
        return self._apply(self.detector.stream_ended(member_id, now, last_beat), now)

    def leave(self, member_id: str, incarnation: int, now: float) -> list[Transition]:
        return self._apply(self.detector.leave(member_id, incarnation, now), now)

    def tick(self, now: float) -> list[Transition]:
        """Silence transitions, then tombstones past their time leave the view."""
        out = self._apply(self.detector.tick(now), now)
        expired = [i for i, since in self._gone.items() if now - since >= self.tombstone_ttl]
        if expired:
            for i in expired:
                del self._gone[i]
            self._publish(self.log.remove_members(expired))
        return out

    def alive(self) -> set[str]:
        """Members ALIVE or SUSPECT here: the owners a plan may name."""
        return self.detector.live()

    def live_members(self) -> dict[str, tuple[str, str]]:
        """Members ALIVE or SUSPECT here: id -> (role name, region joined with)."""
        live = self.alive()
        return {i: (r.role, r.region) for i, r in self.log.snapshot().members.items() if i in live}

    def counts(self) -> dict[State, int]:
        """Members of the view by state (expired tombstones are no longer counted)."""
        out = dict.fromkeys(State, 0)
        for rec in self.log.snapshot().members.values():
            out[rec.state] += 1
        return out

    def _apply(self, transitions: list[Transition], now: float) -> list[Transition]:
        if not transitions:
            return transitions
        upserts = {}
        for t in transitions:
            if t.new in GONE:
                self._gone.setdefault(t.member_id, now)
            elif t.new in LIVE:
                self._gone.pop(t.member_id, None)
            upserts[t.member_id] = view_record(self.detector.get(t.member_id))
        self._publish(self.log.change(members=upserts))
        for cb in self.on_transitions:
            cb(transitions)
        return transitions

    # -- topics (LWW map) ------------------------------------------------------------

    def put_topic(self, name: str, topic: Any) -> Entry:
        """A local write; push the entry to the peers."""
        entry = self.topics.put(name, topic)
        self._written("topic", name, entry)
        self._publish(self.log.upsert_topic(name, topic))
        return entry

    def delete_topic(self, name: str) -> Entry | None:
        """A local delete; None when there is no such topic. Push the tombstone."""
        entry = self.topics.delete(name)
        if entry is not None:
            self._written("topic", name, entry)
            self._publish(self.log.delete_topic(name))
        return entry

    def merge_topics(self, state: Mapping[str, Entry]) -> list[str]:
        """Entries from a peer (push or pull); the view follows the winners."""
        changed = self.topics.merge_state(state)
        for k in changed:
            self._written("topic", k, self.topics.entry(k))
        if changed:
            live = self.topics.live()
            self._publish(self.log.change(topics={k: live[k] for k in changed if k in live},
                                          topics_deleted=[k for k in changed if k not in live]))
        return changed

    # -- ACL rules (LWW map, as topics) ---------------------------------------------

    def put_acl(self, key: str, rule: Any) -> Entry:
        """A local write; push the entry to the peers."""
        entry = self.acls.put(key, rule)
        self._written("acl", key, entry)
        self._publish(self.log.change(acls={key: rule}))
        return entry

    def delete_acl(self, key: str) -> Entry | None:
        """A local delete; None when there is no such rule. Push the tombstone."""
        entry = self.acls.delete(key)
        if entry is not None:
            self._written("acl", key, entry)
            self._publish(self.log.change(acls_deleted=(key,)))
        return entry

    def merge_acls(self, state: Mapping[str, Entry]) -> list[str]:
        """Rules from a peer (push or pull); the view follows the winners."""
        changed = self.acls.merge_state(state)
        for k in changed:
            self._written("acl", k, self.acls.entry(k))
        if changed:
            live = self.acls.live()
            self._publish(self.log.change(acls={k: live[k] for k in changed if k in live},
                                          acls_deleted=[k for k in changed if k not in live]))
        return changed

    # -- plans (LWW register) --------------------------------------------------------

    def accept_plan(self, version: int, plan: Any) -> Entry:
        """A push validated here; push the entry to the peers."""
        entry = self.plans.accept(version, plan)
        self._plan_won()
        return entry

    def merge_plan(self, entry: Entry | None) -> bool:
        """A peer's accepted plan, taken without re-validation."""
        if entry is None or not self.plans.merge(entry):
            return False
        self._plan_won()
        return True

    def record_run(self, when: float) -> None:
        """The routing job reported a run that did not fail at `when` (unix seconds)."""
        self.last_run_ok = max(self.last_run_ok, when)
        for cb in self.on_run:
            cb()

    def _plan_won(self) -> None:
        self._written("plan", "", self.plans.current)
        self.plan_epoch = self.log.version
        for cb in self.on_plan:
            cb()

    # -- replication -----------------------------------------------------------------

    def digest(self) -> tuple[str, str, str]:
        return self.topics.digest(), self.plans.digest(), self.acls.digest()

    def merge_state(self, topics: Mapping[str, Entry], plan: Entry | None,
                    acls: Mapping[str, Entry] | None = None) -> bool:
        """A peer's full state (anti-entropy, restart); True when anything changed."""
        changed = bool(self.merge_topics(topics)) | bool(self.merge_acls(acls or {}))
        return self.merge_plan(plan) or changed

    def _written(self, kind: str, key: str, entry: Entry) -> None:
        for cb in self.on_write:
            cb(kind, key, entry)

    def _publish(self, delta: ViewDelta | None) -> None:
        if delta is not None:
            for cb in self.on_delta:
                cb(delta)
