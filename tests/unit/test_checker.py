"""The chaos checker must catch every kind of anomaly it reports."""

from echelon.contract.filters import parse
from loadtest.checker import Delivered, check, totals

ACKED = {("p", i): {"n": i} for i in range(1, 7)}
FILTERS = {"all": parse(""), "even": parse("n between 2 and 4")}


def run(log, maybe=None, name="all"):
    (report,) = [r for r in check(ACKED, FILTERS, {name: log}, maybe) if r.subscription == name]
    return report


def test_clean_run_is_ok():
    assert run([Delivered("p", i) for i in range(1, 7)]).ok
    assert run([Delivered("p", i) for i in (2, 3, 4)], name="even").ok


def test_each_anomaly_is_reported():
    r = run([Delivered("p", i) for i in (1, 2, 2, 4, 3, 6, 9)])
    assert r.lost == [("p", 5)]
    assert r.duplicated == [("p", 2)]
    assert r.reordered == [(("p", 4), ("p", 3))]
    assert r.unexpected == [("p", 9)]
    assert not r.ok
    assert run([Delivered("p", 5)], name="even").unexpected == [("p", 5)]  # filter says no


def test_redelivery_after_a_broken_stream_is_allowed_and_counted():
    r = run([Delivered("p", i) for i in range(1, 7)] + [Delivered("p", 6, redelivery=1)])
    assert r.ok and r.redelivered == 1


def test_unacked_publishes_may_arrive_but_are_not_lost():
    maybe = {("p", 7): {"n": 7}}
    assert run([Delivered("p", i) for i in range(1, 8)], maybe).ok
    assert run([Delivered("p", i) for i in range(1, 7)], maybe).ok
    assert run([Delivered("p", 7)], maybe, name="even").unexpected == [("p", 7)]
    assert totals(check(ACKED, FILTERS, {"all": [], "even": []}))["lost"] == 6 + 3
