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
