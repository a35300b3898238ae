"""Failure detector for the membership service: SWIM suspicion with Lifeguard refinements.

Every member beats to every membership replica on one ordered stream, one beat every
BEAT_EVERY heartbeat intervals T; each replica runs one `Detector` on the beats it sees, so
liveness is judged first-hand and this is a small state machine over `MemberRecord`s
(ALIVE -> SUSPECT -> DEAD, or LEFT). The caller feeds it events and calls `tick(now)`
every heartbeat_interval / 4; `now` is seconds.

Why a beat every 2 T and not every T: a beat costs each replica a gRPC stream
message (about 0.25 ms of CPU, nearly all of it gRPC's and the event loop's), and 7
members beating 3 replicas every 0.2 s made most of the replicas' constant load. The timings
below stay in T, so detection is as fast as before: a crash is still found by its ended
stream, silence is still measured in seconds. What shrinks is the margin of a late beat
before SUSPECT (one beat period more of silence is normal), never the one before DEAD.

Decisions (SWIM, Das et al. 2002; Lifeguard, Dadgar et al. 2018):
- Incarnations separate process lifetimes. A DEAD or LEFT member comes back only by
  `join` with a strictly higher incarnation (start time in ms, +1 per refutation);
  anything else is a stale claim and raises `StaleIncarnation`.
- Refutation. SWIM demands a higher incarnation because third parties gossip stale ALIVE
  messages. Here there are none: a beat on the member's own ordered stream was sent after
  every beat seen so far, so ANY beat with incarnation >= the recorded one refutes (kind
  "beat"). The service still pushes BeatReply(SUSPECT) on suspicion; the member's answer,
  incarnation + 1, refutes too (kind "incarnation") and outranks the suspicion in every
  view. Both kinds are counted.
- A crash is not a pause. When a process dies its kernel closes its sockets, so the
  replica sees the member's heartbeat stream END without a Leave (`stream_ended`): strong
  evidence, DEAD after `crash_grace` (5 T = 1.0 s) unless a beat or a Join (the member
  reconnecting) comes first. Plain silence on an OPEN stream is what a paused process
  (SIGSTOP, GC, a swapped host), a partition or a lossy link looks like: SUSPECT after
  `suspect_after` (5 T = 1.0 s), DEAD only after `suspect_after + suspicion_timeout`
  (35 T = 7.0 s). So kill -9 is declared in about 1 s, and a member paused for 3 s or
  behind a link with 5% loss is suspected at worst, never declared dead. A host that
  vanishes without closing its connections (power, a cut cable) takes the 7 s path.
- Evidence (a data-plane peer saw the stream break) makes an ALIVE member SUSPECT at once
  but never kills on its own: only silence or an ended stream does. Each distinct ALIVE
  reporter is a confirmation that shortens the silence timeout by Lifeguard's rule
  t(k) = max(min, max - (max - min) * log(k + 1) / log(K + 1)), down to DEAD at 4.0 s of
  silence with K = 3 reporters: longer than a 3 s pause, so accusations from peers whose
  streams stalled behind the paused member cannot kill it either.
- Local health (Lifeguard's LHM) is the detector's own: a tick far later than its cadence
  means this replica was paused or starved, every member looks silent and their beats
  still sit unread in socket buffers. A late tick opens a 2-interval grace without silence
  transitions, so a SIGSTOPped replica does not kill the cluster on resume. A member
  whose beats arrive late gets no longer timeout; late beats are counted so the routing
  job can move slow agents to the leaves.

Defaults, in heartbeat intervals T = 0.2 s: crash (stream ended) DEAD 5 T = 1.0 s after
the end, so < 2 s from the kill with a T/4 tick; silence SUSPECT after 5 T = 1.0 s, DEAD
at 35 T = 7.0 s (20 T = 4.0 s with K = 3 reporters); a beat every 2 T = 0.4 s.

Why an alive member is not declared dead. Beats travel on one TCP stream, so a lost
segment holds every later beat until it is retransmitted: the silence after k
consecutive losses of one segment is about 2 T + RTO * (2^k - 1), RTO >= 0.2 s (Linux;
0.3-0.4 s behind a 100 ms +- 50 ms link). With loss p = 0.05 per direction, SUSPECT (1.0 s)
needs k >= 2 (p^2 = 2.5e-3 per beat: a few suspicions per member per 5 minutes, each
refuted by the next beat), DEAD (7.0 s) needs k >= 5 (p^5 = 3e-7 per beat, about 1e-3
per member per 5 minutes at 3 replicas). A 3 s pause stays 1 s short of the shortest
DEAD silence (4.0 s, three accusers). A stream that ends while the process lives (a reset connection) is
reconnected at once: Join refutes within a round trip or two, well inside the 1.0 s grace.
"""

from __future__ import annotations

import enum
import math
from collections import Counter, deque
from dataclasses import dataclass, field, replace


class State(enum.Enum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


LIVE = frozenset({State.ALIVE, State.SUSPECT})
BEAT_EVERY = 2  # heartbeat intervals between a member's beats (runtime/member.py; module doc)


class DetectorError(ValueError):
    """A request the detector refuses; the service maps it to a gRPC status."""


class UnknownMember(DetectorError):
    """No record for this id (NOT_FOUND): the member must join first."""

    def __init__(self, member_id: str):
        super().__init__(f"member {member_id!r} is unknown: join first")
        self.member_id = member_id


class StaleIncarnation(DetectorError):
    """A claim from an older (or conflicting) process lifetime (FAILED_PRECONDITION)."""

    def __init__(self, member_id: str, incarnation: int, current: int, state: State, what: str):
        super().__init__(
            f"member {member_id!r}: {what} at incarnation {incarnation} refused; it is "
            f"{state.value} at incarnation {current}, rejoin with an incarnation > {current}"
        )
        self.member_id, self.incarnation, self.current, self.state = member_id, incarnation, current, state


class MemberGone(DetectorError):
    """A beat from a member already DEAD or LEFT: reply with that state; it must rejoin."""

    def __init__(self, member_id: str, state: State, incarnation: int):
        super().__init__(f"member {member_id!r} is {state.value} at incarnation {incarnation}: rejoin")
        self.member_id, self.state, self.incarnation = member_id, state, incarnation


@dataclass
class MemberRecord:
    """One row of the membership table; the fields of the `Member` message."""

    id: str
    role: str
    address: str
    region: str = ""
    capacity: int = 0
    incarnation: int = 0
    state: State = State.ALIVE
    publishes: frozenset[str] = frozenset()
    subscribes: frozenset[str] = frozenset()
    last_beat: float = 0.0
    suspect_since: float | None = None
    metrics_address: str = ""
    stream_ended: float | None = None  # when its heartbeat stream ended without a Leave


def identity(r: MemberRecord) -> MemberRecord:
    """The record without its clock fields: what a view must carry when it changes."""
    return replace(r, last_beat=0.0, suspect_since=None, stream_ended=None)


@dataclass(frozen=True)
class Transition:
    """A change to one record. `old is None`: a new member; `old == new`: same state, other
    fields changed (topics, incarnation, address). Every Transition means "upsert the view"."""

    member_id: str
    old: State | None
    new: State
    at: float
    reason: str
    silence: float | None = None  # for DEAD: seconds since the last beat (detection latency)


@dataclass
class DetectorStats:
    """Counters for the service to export (it keeps the labels bounded)."""

    transitions: Counter = field(default_factory=Counter)  # (old, new) -> count
    updates: int = 0
    refutations: Counter = field(default_factory=Counter)  # "beat" | "incarnation" | "join"
    stale: int = 0
    evidence_ignored: int = 0
    late_beats: int = 0
    stalls: int = 0
    detection_latencies: deque = field(default_factory=lambda: deque(maxlen=1024))


class Detector:
    """The membership table of one replica and its failure-detection state machine.

    Every mutating method returns the `Transition`s it caused, in order.
    """

    def __init__(self, heartbeat_interval: float = 0.2, suspect_after: float | None = None,
                 suspicion_timeout: float | None = None, min_suspicion_timeout: float | None = None,
                 confirmations: int = 3, max_tick_gap: float | None = None, crash_grace: float | None = None):
        """Unset timings derive from the interval T: suspect after 5 T of silence, dead 30 T
        later (15 T with K reporters), dead 5 T after the stream ended; stall at 2.5 T."""
        t = heartbeat_interval
        self.heartbeat_interval = t
        self.suspect_after = 5 * t if suspect_after is None else suspect_after
        self.suspicion_timeout = 30 * t if suspicion_timeout is None else suspicion_timeout
        self.min_suspicion_timeout = 15 * t if min_suspicion_timeout is None else min_suspicion_timeout
        self.crash_grace = 5 * t if crash_grace is None else crash_grace
        self.confirmations = confirmations
        self.max_tick_gap = 2.5 * t if max_tick_gap is None else max_tick_gap  # math.inf: off
        self.stall_grace = 2 * t
        if not (t > 0 and self.suspect_after > 0 and confirmations >= 1 and self.crash_grace >= 0
                and 0 <= self.min_suspicion_timeout <= self.suspicion_timeout):
            raise ValueError("need interval > 0, suspect_after > 0, K >= 1, crash_grace >= 0, "
                             "0 <= min <= suspicion_timeout")
        self.stats = DetectorStats()
        self._table: dict[str, MemberRecord] = {}
        self._accusers: dict[str, set[str]] = {}
        self._last_tick: float | None = None
        self._quiet_until = -math.inf

    @property
    def dead_after(self) -> float:
        """Silence after which a member nobody reported is declared DEAD."""
        return self.suspect_after + self.suspicion_timeout

    def suspicion_timeout_for(self, reporters: int) -> float:
        """Lifeguard's dynamic suspicion timeout for `reporters` independent confirmations."""
        k = min(max(reporters, 0), self.confirmations)
        lo, hi = self.min_suspicion_timeout, self.suspicion_timeout
        return max(lo, hi - (hi - lo) * math.log(k + 1) / math.log(self.confirmations + 1))

    def get(self, member_id: str) -> MemberRecord:
        """A copy of one record; raises UnknownMember."""
        return replace(self._get(member_id))

    def snapshot(self) -> list[MemberRecord]:
        """Copies of every record (tombstones included), sorted by id."""
        return [replace(r) for _, r in sorted(self._table.items())]

    def live(self) -> set[str]:
        """Ids of members not DEAD or LEFT (a suspect may still be alive)."""
        return {i for i, r in self._table.items() if r.state in LIVE}

    def accusers(self, member_id: str) -> frozenset[str]:
        """Distinct reporters whose evidence stands against a suspect."""
        return frozenset(self._accusers.get(member_id, ()))

    def join(self, record: MemberRecord, now: float) -> list[Transition]:
        """A new member, a retried Join, or a restarted process (higher incarnation)."""
        new = replace(record, state=State.ALIVE, last_beat=now, suspect_since=None,
                      publishes=frozenset(record.publishes), subscribes=frozenset(record.subscribes))
        old = self._table.get(new.id)
        if old is None:
            self._table[new.id] = new
            return [self._moved(new.id, None, State.ALIVE, now, "join")]
        retry = new.incarnation == old.incarnation and old.state in LIVE and new.address == old.address
        if new.incarnation < old.incarnation or (new.incarnation == old.incarnation and not retry):
            self.stats.stale += 1
            raise StaleIncarnation(new.id, new.incarnation, old.incarnation, old.state, "join")
        self._table[new.id] = new
        self._accusers.pop(new.id, None)
        if old.state is State.SUSPECT:
            self.stats.refutations["join"] += 1
        if old.state is State.ALIVE and identity(old) == identity(new):
            return []  # a retried Join that changes nothing
        return [self._moved(new.id, old.state, State.ALIVE, now, "join retry" if retry else "rejoin")]

    def beat(self, member_id: str, incarnation: int, now: float,
             publishes=None, subscribes=None) -> list[Transition]:
        """A heartbeat; topics given only when they changed. Refutes a suspicion."""
        rec = self._get(member_id)
        if rec.state not in LIVE:
            raise MemberGone(member_id, rec.state, rec.incarnation)
        if incarnation < rec.incarnation:
            self.stats.stale += 1
            raise StaleIncarnation(member_id, incarnation, rec.incarnation, rec.state, "beat")
        if now - rec.last_beat > 2 * BEAT_EVERY * self.heartbeat_interval:  # a beat lost or badly late
            self.stats.late_beats += 1
        rec.last_beat = max(rec.last_beat, now)
        rec.stream_ended = None  # a beat on a new stream: the member reconnected
        before = (rec.incarnation, rec.publishes, rec.subscribes)  # all a beat may change of `identity`
        bumped = incarnation > rec.incarnation
        rec.incarnation = incarnation
        if publishes is not None:
            rec.publishes = frozenset(publishes)
        if subscribes is not None:
            rec.subscribes = frozenset(subscribes)
        if rec.state is State.SUSPECT:
            kind = "incarnation" if bumped else "beat"
            self.stats.refutations[kind] += 1
            rec.state, rec.suspect_since = State.ALIVE, None
            self._accusers.pop(member_id, None)
            return [self._moved(member_id, State.SUSPECT, State.ALIVE, now, f"refuted by {kind}")]
        if (rec.incarnation, rec.publishes, rec.subscribes) != before:
            return [self._moved(member_id, State.ALIVE, State.ALIVE, now, "update")]
        return []

    def evidence(self, member_id: str, reporter: str, now: float,
                 incarnation: int | None = None) -> list[Transition]:
        """A peer saw `member_id`'s stream break: suspect it now, shorten its timeout.

        Ignored (and counted) when the reporter is the member itself, unknown or not ALIVE
        (a sick reporter is the likelier culprit), or the evidence names an older incarnation.
        """
        rec = self._get(member_id)
        rep = self._table.get(reporter)
        if (rec.state not in LIVE or reporter == member_id or rep is None
                or rep.state is not State.ALIVE
                or (incarnation is not None and incarnation < rec.incarnation)):
            self.stats.evidence_ignored += 1
            return []
        self._accusers.setdefault(member_id, set()).add(reporter)
        if rec.state is State.SUSPECT:
            return []
        rec.state, rec.suspect_since = State.SUSPECT, now
        return [self._moved(member_id, State.ALIVE, State.SUSPECT, now, f"evidence from {reporter}")]

    def stream_ended(self, member_id: str, now: float, last_beat: float | None = None) -> list[Transition]:
        """The member's heartbeat stream ended without a Leave: the connection closed, as
        it does when the process dies. DEAD `crash_grace` later unless it beats or joins
        again first. `last_beat`: the last beat seen on that stream; if the record holds a
        newer one, a newer stream (or a Join) exists and this end means nothing."""
        rec = self._table.get(member_id)
        if rec is None or rec.state not in LIVE or (last_beat is not None and rec.last_beat > last_beat):
            return []
        if rec.stream_ended is None:
            rec.stream_ended = now
        return []

    def leave(self, member_id: str, incarnation: int, now: float) -> list[Transition]:
        """A graceful leave. Idempotent; a member already DEAD stays DEAD."""
        rec = self._get(member_id)
        if incarnation < rec.incarnation:
            self.stats.stale += 1
            raise StaleIncarnation(member_id, incarnation, rec.incarnation, rec.state, "leave")
        if rec.state not in LIVE:
            return []
        old = rec.state
        rec.state, rec.suspect_since, rec.incarnation = State.LEFT, None, incarnation
        rec.stream_ended = None
        self._accusers.pop(member_id, None)
        return [self._moved(member_id, old, State.LEFT, now, "leave")]

    def tick(self, now: float) -> list[Transition]:
        """Silence transitions: ALIVE -> SUSPECT -> DEAD. Call every interval / 4 or so."""
        if self._last_tick is not None and now - self._last_tick > self.max_tick_gap:
            self.stats.stalls += 1
            self._quiet_until = now + self.stall_grace
        self._last_tick = now if self._last_tick is None else max(self._last_tick, now)
        if now < self._quiet_until:
            return []
        out: list[Transition] = []
        for mid, rec in self._table.items():
            if rec.state not in LIVE:
                continue
            silence = now - rec.last_beat
            ended = rec.stream_ended is not None and now - rec.stream_ended >= self.crash_grace
            if rec.state is State.ALIVE and (ended or silence >= self.suspect_after):
                rec.state, rec.suspect_since = State.SUSPECT, now
                out.append(self._moved(mid, State.ALIVE, State.SUSPECT, now, "stream ended" if ended else "silence"))
            timeout = self.suspicion_timeout_for(len(self._accusers.get(mid, ())))
            if rec.state is State.SUSPECT and (ended or silence >= self.suspect_after + timeout):
                rec.state, rec.stream_ended = State.DEAD, None
                self._accusers.pop(mid, None)
                self.stats.detection_latencies.append(silence)
                out.append(self._moved(mid, State.SUSPECT, State.DEAD, now, "stream ended" if ended else "silence",
                                       silence))
        return out

    def _get(self, member_id: str) -> MemberRecord:
        try:
            return self._table[member_id]
        except KeyError:
            raise UnknownMember(member_id) from None

    def _moved(self, member_id: str, old: State | None, new: State, now: float,
               reason: str, silence: float | None = None) -> Transition:
        if old is new:
            self.stats.updates += 1
        else:
            self.stats.transitions[(old, new)] += 1
        return Transition(member_id, old, new, now, reason, silence)
