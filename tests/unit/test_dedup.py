"""The dedup window: first, same, different; forgetting and expiry."""

from echelon.core.dedup import DedupWindow, Seen


def test_a_second_offer_is_same_or_different_by_digest():
    w = DedupWindow()
    seen, entry = w.offer(("p", 1), 0.0, b"one")
    assert seen is Seen.FIRST
    entry.outcome = 3
    assert w.offer(("p", 1), 1.0, b"one") == (Seen.SAME, entry) and entry.outcome == 3
    assert w.offer(("p", 1), 1.0, b"two")[0] is Seen.DIFFERENT
    assert w.first_time(("p", 2), 1.0) and not w.first_time(("p", 2), 1.0)


def test_forgotten_and_expired_ids_may_be_used_again():
    w = DedupWindow(capacity=2, horizon=10.0)
    w.offer("a", 0.0, b"x")
    w.forget("a")
    assert w.offer("a", 0.0, b"y")[0] is Seen.FIRST
    assert w.offer("a", 11.0, b"z")[0] is Seen.FIRST  # past the horizon
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
    assert not w.first_time(("p", 149), 2.0) and w.offer(("p", 149), 2.0)[0] is Seen.SAME
    assert w.first_time(("p", 149), 20.0)  # past the horizon
