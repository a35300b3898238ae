"""loadtest.trace_hops' arithmetic: the time between consecutive points an event reached,
over the events that reached both, and the end-to-end time beside them."""

from loadtest.trace_hops import ORDER, _budget, _pct


def test_budget_of_consecutive_points():
    ms = 1_000_000
    stamps = {"sent": {1: 0, 2: 10 * ms}, "admit": {1: 1 * ms, 2: 12 * ms}, "match out": {1: 3 * ms},
              "sub in": {1: 4 * ms, 2: 15 * ms}, "delivered": {1: 6 * ms, 2: 16 * ms}}
    rows = dict(_budget(stamps, range(1, 3)))
    assert list(rows) == ["sent -> admit", "admit -> match out", "match out -> sub in", "sub in -> delivered",
                          "sent -> delivered (end to end)"]
    assert rows["sent -> admit"] == [1.0, 2.0]
    assert rows["admit -> match out"] == [2.0]  # event 2 never got a "match out" stamp: left out
    assert rows["sub in -> delivered"] == [2.0, 1.0]
    assert rows["sent -> delivered (end to end)"] == [6.0, 6.0]
    assert [p for p in ORDER if p in stamps] == ["sent", "admit", "match out", "sub in", "delivered"]


def test_percentile_is_an_observed_value():
    v = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert (_pct(v, 0.0), _pct(v, 0.5), _pct(v, 0.99)) == (1.0, 3.0, 5.0)
    assert _pct([], 0.5) != _pct([], 0.5)  # nan: nothing measured
