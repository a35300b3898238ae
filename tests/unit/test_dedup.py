"""The dedup window: first, same, different; forgetting and expiry; against a reference model."""

import random

import pytest

from echelon.core.dedup import DedupWindow, Seen


def test_a_second_offer_is_same_or_different_by_digest():
    w = DedupWindow()
    assert w.offer(("p", 1), 0.0, b"one", outcome=3) is Seen.FIRST
    assert w.offer(("p", 1), 1.0, b"one", outcome=4) is Seen.SAME and w.outcome(("p", 1)) == 3
    assert w.offer(("p", 1), 1.0, b"two") is Seen.DIFFERENT and w.outcome(("p", 1)) == 3
    assert w.first_time(("p", 2), 1.0) and not w.first_time(("p", 2), 1.0)
    assert w.outcome(("p", 2)) is None and w.outcome(("p", 3)) is None


def test_forgotten_and_expired_ids_may_be_used_again():
    w = DedupWindow(capacity=2, horizon=10.0)
    w.offer("a", 0.0, b"x")
    w.forget("a")
    assert w.offer("a", 0.0, b"y") is Seen.FIRST
    assert w.offer("a", 11.0, b"z") is Seen.FIRST  # past the horizon
    w.offer("b", 11.0)
    w.offer("c", 11.0)  # over capacity: the oldest goes
    assert "a" not in w and len(w) == 2


def test_first_time_ids_hold_nothing_the_gc_scans():
    """A delivery window of a million ids must not be a million GC-tracked objects (each
    full collection would scan them all); `offer` on such an id still answers."""
    import gc

    w = DedupWindow(capacity=100, horizon=10.0)
    for i in range(150):
        assert w.first_time(("p", i), 1)
    gc.collect()  # tuples of atomic values are untracked by a collection
    assert len(w) == 100 and not any(gc.is_tracked(k) or gc.is_tracked(v) for k, v in w._seen.items())
    assert not w.first_time(("p", 149), 2.0) and w.offer(("p", 149), 2.0) is Seen.SAME
    assert w.offer(("p", 149), 2.0, b"x") is Seen.DIFFERENT
    assert w.first_time(("p", 149), 20.0)  # past the horizon


class _Reference:
    """The window's contract written plainly: a list of (id, time, digest, outcome) in
    order of arrival, scanned in full."""

    def __init__(self, capacity, horizon):
        self.capacity, self.horizon, self.held = capacity, horizon, []

    def _expire(self, now):
        self.held = [h for h in self.held if now - h[1] <= self.horizon]

    def _find(self, key):
        return next((h for h in self.held if h[0] == key), None)

    def _add(self, record):
        self.held.append(record)
        if len(self.held) > self.capacity:
            del self.held[0]

    def offer(self, key, now, digest, outcome):
        self._expire(now)
        h = self._find(key)
        if h is None:
            self._add((key, now, digest, outcome))
            return Seen.FIRST
        return Seen.SAME if h[2] == digest else Seen.DIFFERENT

    def first_time(self, key, now):
        self._expire(now)
        if self._find(key) is not None:
            return False
        self._add((key, now, b"", None))
        return True

    def forget(self, key):
        self.held = [h for h in self.held if h[0] != key]


@pytest.mark.parametrize("seed", range(8))
def test_the_window_answers_as_the_reference_model(seed):
    """Random offers, first_time, forget, expire and membership over few ids (so ids come
    back: duplicates, reuse after forget and after expiry), small capacities and steps
    of time around the horizon; every answer compared with the reference model's."""
    rnd = random.Random(seed)
    capacity, horizon = rnd.choice((1, 2, 3, 5, 8, 50)), rnd.choice((0.0, 1.0, 2.5))
    w, ref = DedupWindow(capacity, horizon), _Reference(capacity, horizon)
    now = 0.0
    for step in range(3000):
        now += rnd.choice((0.0, 0.0, 0.0, 0.25, 0.5, 1.0, 3.0))
        key = ("p", rnd.randrange(12))
        op = rnd.random()
        if op < 0.4:
            digest, outcome = rnd.choice((b"", b"a", b"b")), step
            assert w.offer(key, now, digest, outcome) is ref.offer(key, now, digest, outcome), step
        elif op < 0.7:
            assert w.first_time(key, now) == ref.first_time(key, now), step
        elif op < 0.85:
            w.forget(key)
            ref.forget(key)
        else:
            w.expire(now)
            ref._expire(now)
        assert len(w) == len(ref.held), step
        for k in range(12):
            h = ref._find(("p", k))
            assert (("p", k) in w) == (h is not None), step
            assert w.outcome(("p", k)) == (h[3] if h is not None else None), step
