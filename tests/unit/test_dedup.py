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
    assert w.offer("a", 21.0, b"z") is Seen.FIRST  # past twice the horizon
    for key in "bcd":  # 2 * capacity - 1 ids after it: the oldest goes
        w.offer(key, 21.0)
    assert "a" not in w and "c" in w and "d" in w


def test_eviction_is_a_dict_per_generation():
    """Ids go in generations of `capacity`: a full young dict becomes the old one (the one
    before it dropped whole), so at most 2 * capacity - 1 ids are held."""
    w = DedupWindow(capacity=4, horizon=10.0)
    for i in range(4):
        w.first_time(i, 0.0)
    assert w.generation == 1 and len(w) == 4
    for i in range(4, 7):
        w.first_time(i, 0.0)
    assert len(w) == 7 and 0 in w
    w.first_time(7, 0.0)
    assert w.generation == 2 and len(w) == 4 and 0 not in w and 4 in w


def test_first_time_ids_hold_nothing_the_gc_scans():
    """A delivery window of a million ids must not be a million GC-tracked objects (each
    full collection would scan them all); `offer` on such an id still answers."""
    import gc

    w = DedupWindow(capacity=100, horizon=10.0)
    for i in range(150):
        assert w.first_time(("p", i), 1)
    gc.collect()  # tuples of atomic values are untracked by a collection
    held = [(k, v) for d in (w._young, w._old) for k, v in d.items()]
    assert len(w) == len(held) == 150 and not any(gc.is_tracked(k) or gc.is_tracked(v) for k, v in held)
    assert not w.first_time(("p", 149), 2.0) and w.offer(("p", 149), 2.0) is Seen.SAME
    assert w.offer(("p", 149), 2.0, b"x") is Seen.DIFFERENT
    assert w.first_time(("p", 149), 20.0)  # past the horizon


class _Reference:
    """The window's contract written plainly (module doc of core/dedup.py): every first
    offer in a list, with its time and how many first offers came before it; an id the
    contract says is held must be, one it says is forgotten must not be, and in between
    the window's own answer is followed (once gone, an id stays gone)."""

    def __init__(self, capacity, horizon):
        self.capacity, self.horizon = capacity, horizon
        self.held = {}  # key -> (time, digest, outcome, arrival)
        self.arrivals = 0  # first offers so far
        self.forgotten = []  # arrivals of the ids forgotten by `forget`

    def _later(self, arrival):
        """Ids first offered after `arrival` and not forgotten."""
        return self.arrivals - 1 - arrival - sum(1 for a in self.forgotten if a > arrival)

    def must_hold(self, key, now):
        h = self.held.get(key)
        return h is not None and now - h[0] <= self.horizon and self.arrivals - 1 - h[3] < self.capacity

    def must_not_hold(self, key, now):
        h = self.held.get(key)
        return h is None or now - h[0] > 2 * self.horizon or self._later(h[3]) >= 2 * self.capacity - 1

    def check(self, key, now, held, step):
        """The window says whether it holds `key` at `now`: within the bounds, and followed."""
        assert not (self.must_hold(key, now) and not held), (step, key)
        assert not (self.must_not_hold(key, now) and held), (step, key)
        if not held:
            self.held.pop(key, None)

    def sync(self, window, now, step):
        """Every id (the window last saw `now`) against the contract."""
        for key in list(self.held):
            self.check(key, now, key in window, step)
            if key in self.held:
                assert window.outcome(key) == self.held[key][2], (step, key)

    def first(self, key, now, digest, outcome):
        self.held[key] = (now, digest, outcome, self.arrivals)
        self.arrivals += 1

    def offer(self, window, key, now, digest, outcome, step):
        seen = window.offer(key, now, digest, outcome)
        self.check(key, now, seen is not Seen.FIRST, step)
        h = self.held.get(key)
        if h is None:
            self.first(key, now, digest, outcome)
        else:
            assert seen is (Seen.SAME if h[1] == digest else Seen.DIFFERENT), step

    def first_time(self, window, key, now, step):
        fresh = window.first_time(key, now)
        self.check(key, now, not fresh, step)
        if fresh:
            self.first(key, now, b"", None)

    def forget(self, window, key):
        window.forget(key)
        h = self.held.pop(key, None)
        if h is not None:
            self.forgotten.append(h[3])


@pytest.mark.parametrize("seed", range(8))
def test_the_window_answers_as_the_reference_model(seed):
    """Random offers, first_time, forget, expire and membership over few ids (so ids come
    back: duplicates, reuse after forget and after expiry), small capacities and steps
    of time around the horizon; every answer checked against the contract's bounds."""
    rnd = random.Random(seed)
    capacity, horizon = rnd.choice((1, 2, 3, 5, 8, 50)), rnd.choice((0.0, 1.0, 2.5))
    w, ref = DedupWindow(capacity, horizon), _Reference(capacity, horizon)
    now = seen = 0.0  # the time now, the last time the window was told (forget tells none)
    for step in range(3000):
        now += rnd.choice((0.0, 0.0, 0.0, 0.25, 0.5, 1.0, 3.0))
        key = ("p", rnd.randrange(12))
        op = rnd.random()
        if op < 0.4:
            ref.offer(w, key, now, rnd.choice((b"", b"a", b"b")), step, step)
        elif op < 0.7:
            ref.first_time(w, key, now, step)
        elif op < 0.85:
            ref.forget(w, key)
        else:
            w.expire(now)
        if op < 0.7 or op >= 0.85:
            seen = now
        ref.sync(w, seen, step)
        assert len(w) == len(ref.held) <= 2 * capacity - 1, step


@pytest.mark.parametrize("seed", range(4))
def test_first_times_is_first_time_in_turn(seed):
    """A frame's ids in one call (`first_times`, agent/delivery.py) answer and leave the window
    exactly as `first_time` of each in turn: capacities small enough to rotate within a call,
    times around the horizon, offers and forgets between the calls."""
    rnd = random.Random(seed)
    capacity, horizon = rnd.choice((1, 2, 3, 5, 8)), rnd.choice((0.0, 1.0, 2.5))
    one, many = DedupWindow(capacity, horizon), DedupWindow(capacity, horizon)
    now = 0.0
    for step in range(1500):
        now += rnd.choice((0.0, 0.0, 0.25, 1.0, 3.0))
        op = rnd.random()
        if op < 0.7:
            keys = [("p", rnd.randrange(15)) for _ in range(rnd.choice((1, 2, 5, 12)))]
            assert many.first_times(keys, now) == [one.first_time(k, now) for k in keys], step
        elif op < 0.85:
            key = ("p", rnd.randrange(15))
            assert one.offer(key, now) is many.offer(key, now), step
        else:
            key = ("p", rnd.randrange(15))
            one.forget(key)
            many.forget(key)
        state = [(w._young, w._old, w.generation, w._since, w._newest, w._old_newest, w._due) for w in (one, many)]
        assert state[0] == state[1], step
