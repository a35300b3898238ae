"""The failure detector's state machine, driven by a fake clock."""

from __future__ import annotations

import heapq
import math
import random

import pytest

from echelon.core.detector import (
    BEAT_EVERY,
    Detector,
    MemberGone,
    MemberRecord,
    State,
    StaleIncarnation,
    UnknownMember,
)

TICK = 0.05  # the service ticks every heartbeat_interval / 4


def rec(mid: str, inc: int = 1, address: str | None = None, **kw) -> MemberRecord:
    return MemberRecord(id=mid, role="agent", address=address or f"{mid}:7000", incarnation=inc, **kw)


def run(det: Detector, start: float, end: float, beats: dict[str, int] | None = None):
    """Tick from `start` to `end`; members in `beats` beat as members do (every BEAT_EVERY
    intervals) at that incarnation."""
    out, now, n = [], start, 0
    while now <= end + 1e-9:
        if beats and n % round(BEAT_EVERY * det.heartbeat_interval / TICK) == 0:
            for mid, inc in beats.items():
                out += det.beat(mid, inc, now)
        out += det.tick(now)
        n += 1
        now = start + n * TICK
    return out


def states(transitions):
    return [(t.member_id, t.old, t.new) for t in transitions]


def test_defaults_are_expressed_in_beats():
    det = Detector()
    assert det.heartbeat_interval == 0.2
    assert det.suspect_after == pytest.approx(1.0)
    assert det.crash_grace == pytest.approx(1.0)
    assert det.dead_after == pytest.approx(7.0)
    assert det.suspicion_timeout_for(0) == pytest.approx(6.0)
    assert det.suspicion_timeout_for(3) == pytest.approx(3.0)
    assert det.suspicion_timeout_for(99) == pytest.approx(3.0)
    ts = [det.suspicion_timeout_for(k) for k in range(5)]
    assert ts == sorted(ts, reverse=True)
    assert det.suspect_after + det.suspicion_timeout_for(99) > 3.0  # longer than a 3 s pause


def test_an_ended_stream_is_a_crash_declared_within_two_seconds():
    det = Detector()
    det.join(rec("a"), 0.0)
    run(det, 0.0, 1.2, beats={"a": 1})  # last beat at 1.2
    last = det.get("a").last_beat
    assert last == pytest.approx(1.2)
    assert det.stream_ended("a", 1.25, last_beat=last) == []  # the process died: its socket closed
    out = run(det, 1.25, 3.2)
    assert states(out) == [("a", State.ALIVE, State.SUSPECT), ("a", State.SUSPECT, State.DEAD)]
    suspect, dead = out
    assert suspect.at <= dead.at == pytest.approx(2.25) and dead.reason == "stream ended"
    assert dead.silence == pytest.approx(1.05) and dead.at - 1.25 < 2.0
    assert list(det.stats.detection_latencies) == [dead.silence]
    assert det.get("a").state is State.DEAD and det.live() == set()
    assert det.get("a").stream_ended is None


def test_silence_on_an_open_stream_suspects_early_and_kills_late():
    det = Detector()
    assert states(det.join(rec("a"), 0.0)) == [("a", None, State.ALIVE)]
    out = run(det, 0.0, 8.0)
    assert states(out) == [("a", State.ALIVE, State.SUSPECT), ("a", State.SUSPECT, State.DEAD)]
    suspect, dead = out
    assert suspect.at == pytest.approx(1.0) and suspect.reason == "silence"
    assert dead.at == pytest.approx(7.0) and dead.reason == "silence"
    assert dead.silence == pytest.approx(7.0)
    assert det.stats.transitions[(State.SUSPECT, State.DEAD)] == 1


def test_a_member_that_reconnects_within_the_grace_stays_alive():
    det = Detector()
    det.join(rec("a"), 0.0)
    run(det, 0.0, 1.0, beats={"a": 1})
    det.stream_ended("a", 1.05, last_beat=1.0)
    assert det.join(rec("a"), 1.5) == []  # the member's retried Join: same process, same address
    assert det.get("a").stream_ended is None
    det.stream_ended("a", 2.0, last_beat=1.0)
    assert det.beat("a", 1, 2.3) == []  # or a beat on the new stream
    assert run(det, 2.3, 6.0, beats={"a": 1}) == []
    assert det.get("a").state is State.ALIVE


def test_an_old_stream_ending_after_the_member_moved_on_means_nothing():
    det = Detector()
    det.join(rec("a"), 0.0)
    det.beat("a", 1, 0.2)
    det.join(rec("a"), 0.3)  # reconnected (Join, then a new stream) before the old end was seen
    det.beat("a", 1, 0.4)
    assert det.stream_ended("a", 0.5, last_beat=0.2) == []
    assert det.get("a").stream_ended is None
    assert run(det, 0.5, 3.0, beats={"a": 1}) == []


def test_an_ended_stream_after_a_leave_or_a_verdict_changes_nothing():
    det = Detector()
    det.join(rec("a"), 0.0)
    det.leave("a", 1, 0.1)
    assert det.stream_ended("a", 0.2) == []
    assert run(det, 0.2, 3.0) == [] and det.get("a").state is State.LEFT


def test_steady_beats_keep_a_member_alive():
    det = Detector()
    det.join(rec("a"), 0.0)
    assert run(det, 0.0, 10.0, beats={"a": 1}) == []
    assert det.get("a").state is State.ALIVE
    assert det.stats.late_beats == 0  # a beat every BEAT_EVERY intervals is on time
    det.beat("a", 1, 10.0 + 2 * BEAT_EVERY * det.heartbeat_interval + TICK)
    assert det.stats.late_beats == 1


def test_plain_beat_refutes_silence_suspicion():
    det = Detector()
    det.join(rec("a"), 0.0)
    run(det, 0.0, 1.2)
    assert det.get("a").state is State.SUSPECT
    out = det.beat("a", 1, 1.25)
    assert states(out) == [("a", State.SUSPECT, State.ALIVE)]
    assert out[0].reason == "refuted by beat"
    assert det.stats.refutations["beat"] == 1
    assert det.get("a").suspect_since is None


def test_suspect_refutes_with_a_higher_incarnation_after_the_prompt():
    det = Detector()
    det.join(rec("a"), 0.0)
    run(det, 0.0, 1.2)
    out = det.beat("a", 2, 1.3)
    assert states(out) == [("a", State.SUSPECT, State.ALIVE)]
    assert det.get("a").incarnation == 2
    assert det.stats.refutations["incarnation"] == 1
    with pytest.raises(StaleIncarnation):  # the old incarnation is now stale
        det.beat("a", 1, 1.4)


def test_topic_change_in_a_beat_is_an_update():
    det = Detector()
    det.join(rec("a", subscribes=frozenset({"t"})), 0.0)
    assert det.beat("a", 1, 0.2) == []
    assert det.beat("a", 1, 0.4, subscribes=["t"]) == []  # unchanged
    out = det.beat("a", 1, 0.6, publishes=["p"], subscribes=["t", "u"])
    assert states(out) == [("a", State.ALIVE, State.ALIVE)] and out[0].reason == "update"
    assert det.get("a").subscribes == {"t", "u"} and det.get("a").publishes == {"p"}
    assert det.stats.updates == 1 and not det.stats.transitions[(State.ALIVE, State.ALIVE)]


def test_rejoin_of_a_dead_member_needs_a_higher_incarnation():
    det = Detector()
    det.join(rec("a", inc=5), 0.0)
    det.stream_ended("a", 0.1)
    run(det, 0.0, 2.0)
    assert det.get("a").state is State.DEAD
    with pytest.raises(MemberGone):
        det.beat("a", 5, 2.1)
    for inc in (5, 4):
        with pytest.raises(StaleIncarnation, match="rejoin with an incarnation > 5"):
            det.join(rec("a", inc=inc), 2.2)
    assert det.get("a").state is State.DEAD
    out = det.join(rec("a", inc=6, address="a:7001"), 2.3)
    assert states(out) == [("a", State.DEAD, State.ALIVE)] and out[0].reason == "rejoin"
    assert det.get("a").address == "a:7001" and det.get("a").last_beat == 2.3


def test_join_retry_is_idempotent_but_a_conflicting_claim_is_refused():
    det = Detector()
    det.join(rec("a"), 0.0)
    assert det.join(rec("a"), 0.1) == []
    with pytest.raises(StaleIncarnation):
        det.join(rec("a", address="elsewhere:1"), 0.2)
    out = det.join(rec("a", inc=2, address="elsewhere:1"), 0.3)  # restarted before detection
    assert states(out) == [("a", State.ALIVE, State.ALIVE)]


def test_leave_is_final_and_idempotent():
    det = Detector()
    det.join(rec("a", inc=3), 0.0)
    with pytest.raises(StaleIncarnation):
        det.leave("a", 2, 0.1)
    assert states(det.leave("a", 3, 0.2)) == [("a", State.ALIVE, State.LEFT)]
    assert det.leave("a", 3, 0.3) == []
    assert run(det, 0.3, 5.0) == []  # a member that left is never declared dead
    with pytest.raises(MemberGone):
        det.beat("a", 3, 5.1)
    with pytest.raises(StaleIncarnation):
        det.join(rec("a", inc=3), 5.2)
    assert det.join(rec("a", inc=4), 5.3)[0].old is State.LEFT


def test_unknown_members_are_refused():
    det = Detector()
    for call in (lambda: det.beat("x", 1, 0.0), lambda: det.leave("x", 1, 0.0),
                 lambda: det.evidence("x", "y", 0.0), lambda: det.get("x")):
        with pytest.raises(UnknownMember):
            call()


def test_evidence_suspects_early_but_never_kills_a_beating_member():
    det = Detector()
    for m in "abcd":
        det.join(rec(m), 0.0)
    out = det.evidence("a", "b", 0.1)
    assert states(out) == [("a", State.ALIVE, State.SUSPECT)] and out[0].reason == "evidence from b"
    det.evidence("a", "c", 0.1)
    det.evidence("a", "d", 0.1)
    assert det.accusers("a") == {"b", "c", "d"}
    assert det.beat("a", 1, 0.2)[0].new is State.ALIVE  # first-hand proof beats hearsay
    assert det.accusers("a") == frozenset()
    # Accused over and over while beating: never dead.
    now = 0.2
    for _ in range(50):
        det.evidence("a", "b", now + 0.01)
        det.evidence("a", "c", now + 0.02)
        out = run(det, now, now + 0.15, beats={m: 1 for m in "abcd"})
        assert all(t.new is not State.DEAD for t in out)
        now += 0.2
    assert det.get("a").state is State.ALIVE


def test_evidence_shortens_the_time_to_dead_down_to_the_floor():
    kill = {}
    for reporters in range(0, 5):
        det = Detector()
        peers = [f"p{i}" for i in range(reporters)]
        det.join(rec("a"), 0.0)
        for p in peers:
            det.join(rec(p), 0.0)
        for p in peers:
            det.evidence("a", p, 0.05)
        out = run(det, 0.0, 8.0, beats={p: 1 for p in peers})
        dead = [t for t in out if t.member_id == "a" and t.new is State.DEAD]
        kill[reporters] = dead[0].silence
    assert kill[0] == pytest.approx(7.0)
    assert kill[0] > kill[1] > kill[2] > kill[3]
    assert kill[3] == pytest.approx(4.0) and kill[4] == pytest.approx(4.0)


def test_evidence_that_does_not_count_is_ignored():
    det = Detector()
    for m in "abc":
        det.join(rec(m, inc=2), 0.0)
    det.leave("c", 2, 0.0)
    assert det.evidence("a", "a", 0.1) == []  # self
    assert det.evidence("a", "zz", 0.1) == []  # unknown reporter
    assert det.evidence("a", "c", 0.1) == []  # reporter not alive
    assert det.evidence("a", "b", 0.1, incarnation=1) == []  # an older life
    assert det.evidence("c", "b", 0.1) == []  # already gone
    assert det.stats.evidence_ignored == 5
    assert det.get("a").state is State.ALIVE


@pytest.mark.parametrize("accusers", [0, 3])
def test_a_member_paused_for_three_seconds_is_suspected_not_killed(accusers):
    det = Detector()
    peers = [f"p{i}" for i in range(accusers)]
    for m in ["a", *peers]:
        det.join(rec(m), 0.0)
    out = run(det, 0.0, 1.0, beats={m: 1 for m in ["a", *peers]})
    for p in peers:  # peers whose relay streams stalled behind it accuse it
        out += det.evidence("a", p, 1.5)
    out += run(det, 1.05, 4.0, beats={p: 1 for p in peers})  # SIGSTOP for 3 s: its beats stop
    assert [(t.member_id, t.new) for t in out] == [("a", State.SUSPECT)]
    assert det.beat("a", 1, 4.05)[0].new is State.ALIVE  # SIGCONT: the queued beats refute
    assert det.stats.refutations["beat"] == 1


def test_a_member_silent_past_the_timeout_is_dead_and_must_rejoin():
    det = Detector()
    det.join(rec("a"), 0.0)
    out = run(det, 0.0, 1.0, beats={"a": 1})
    out += run(det, 1.05, 9.0)  # a partition, or a host gone without closing its connections
    assert [t.new for t in out] == [State.SUSPECT, State.DEAD]
    with pytest.raises(MemberGone):
        det.beat("a", 1, 9.05)


def test_a_stalled_detector_does_not_kill_everyone_on_resume():
    det = Detector()
    for m in "abc":
        det.join(rec(m), 0.0)
    run(det, 0.0, 1.0, beats={m: 1 for m in "abc"})
    # The replica itself is paused for 3 s; on resume the tick fires before the queued beats.
    assert det.tick(4.0) == []
    assert det.stats.stalls == 1
    for m in "abc":
        det.beat(m, 1, 4.01)
    assert run(det, 4.05, 12.0, beats={"a": 1, "b": 1}) != []
    assert det.get("c").state is State.DEAD and det.get("a").state is State.ALIVE


def simulate(n: int, seconds: float, loss: float, delay, seed: int, accuse_every: float = 0.0):
    """n members beat every BEAT_EVERY * 0.2 s over ordered streams: each beat lost with probability
    `loss`, delayed by `delay(rng)`, never overtaking the previous one (one stream).
    With `accuse_every`, a random peer falsely reports a random member that often."""
    rng = random.Random(seed)
    det = Detector()
    ids = [f"m{i:03d}" for i in range(n)]
    for m in ids:
        det.join(rec(m), 0.0)
    events = []  # (time, order, kind, member)
    period = BEAT_EVERY * det.heartbeat_interval
    for m in ids:
        phase, last = rng.uniform(0, period), 0.0
        for k in range(int(seconds / period)):
            if rng.random() < loss:
                continue
            last = max(last, phase + k * period + delay(rng))
            events.append((last, 0, "beat", m))
    for k in range(1, int(seconds / TICK) + 1):
        events.append((k * TICK, 2, "tick", ""))
    if accuse_every:
        t = 0.0
        while t < seconds:
            t += rng.expovariate(1 / accuse_every)
            a, b = rng.sample(ids, 2)
            events.append((t, 1, b, a))
    heapq.heapify(events)
    transitions = []
    while events:
        now, _, kind, m = heapq.heappop(events)
        if kind == "beat":
            transitions += det.beat(m, 1, now)
        elif kind == "tick":
            transitions += det.tick(now)
        else:
            transitions += det.evidence(m, kind, now)
    return det, transitions


DELAYS = pytest.mark.parametrize(
    "delay",
    [lambda r: r.uniform(0.0, 0.25), lambda r: min(0.25, max(0.0, r.gauss(0.1, 0.05)))],
    ids=["uniform-0-250ms", "100ms+-50ms"],
)


@DELAYS
def test_no_false_dead_under_loss_and_jitter(delay):
    """150 simulated seconds in the default suite; the `slow` twin runs 300 (make test-slow)."""
    no_false_dead(delay, 150.0)


@pytest.mark.slow
@DELAYS
def test_no_false_dead_under_loss_and_jitter_thoroughly(delay):
    no_false_dead(delay, 300.0)


def no_false_dead(delay, seconds: float) -> None:
    det, out = simulate(n=100, seconds=seconds, loss=0.05, delay=delay, seed=7, accuse_every=2.0)
    assert [t for t in out if t.new is State.DEAD] == []
    assert det.live() == {f"m{i:03d}" for i in range(100)}
    # The run did exercise the machine: false accusations were made and all refuted.
    assert det.stats.transitions[(State.ALIVE, State.SUSPECT)] > 50
    suspects = sum(r.state is State.SUSPECT for r in det.snapshot())  # accused at the very end
    assert sum(det.stats.refutations.values()) + suspects == det.stats.transitions[(State.ALIVE, State.SUSPECT)]


def verdicts_after(det: Detector, out: list, now: float) -> list:
    """Tick on (at most 10 s) until nobody is live; every DEAD transition so far."""
    end = now + 10.0
    while det.live() and now < end:
        now += TICK
        out += det.tick(now)
    return [t for t in out if t.new is State.DEAD]


def test_a_crash_in_the_same_conditions_is_found_within_two_seconds():
    det, out = simulate(n=20, seconds=20.0, loss=0.05, delay=lambda r: r.uniform(0, 0.25), seed=3)
    # Every process was killed at 20 s; the kernel's FIN reaches the replica up to a
    # delay later (and a lost FIN is retransmitted, here within 0.5 s).
    rng = random.Random(5)
    last = {r.id: r.last_beat for r in det.snapshot()}
    for m in sorted(last):
        det.stream_ended(m, 20.0 + rng.uniform(0, 0.25) + (0.5 if rng.random() < 0.05 else 0.0), last[m])
    dead = verdicts_after(det, out, 20.0)
    assert len(dead) == 20
    assert all(t.at - 20.0 < 2.0 and math.isclose(t.at - last[t.member_id], t.silence) for t in dead)


def test_a_host_gone_silently_is_found_by_the_silence_timeout():
    det, out = simulate(n=20, seconds=20.0, loss=0.05, delay=lambda r: r.uniform(0, 0.25), seed=3)
    dead = verdicts_after(det, out, 20.0)
    assert len(dead) == 20
    assert all(det.dead_after <= t.silence < det.dead_after + 2 * TICK for t in dead)
