"""core/redelivery.py: the policy's bounds, a dead-letter topic's schema against its
source's, and the deadline marks against a brute-force oracle (one deadline per id)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from echelon.core import redelivery as r
from echelon.contract.schema import Schema, parse_attribute


def schema(*specs: str, max_attribute_bytes: int | None = None) -> Schema:
    return Schema(tuple(parse_attribute(s) for s in specs), max_attribute_bytes)


def test_defaults_and_bounds():
    assert r.policy(0, False, 0, "", "t") == r.Policy(60.0, 0, "")
    assert r.policy(0, True, 0, "", "t") == r.Policy(None, 0, "")
    assert r.policy(100, False, 5, "t.dead", "t") == r.Policy(0.1, 5, "t.dead")
    assert r.policy(600_000, False, 0, "", "t").ack_deadline == 600.0
    for bad, says in [((-1, False, 0, "", "t"), "negative"), ((99, False, 0, "", "t"), "100 to 600000"),
                      ((600_001, False, 0, "", "t"), "100 to 600000"), ((5, True, 0, "", "t"), "100 to"),
                      ((500, True, 0, "", "t"), "one or the other"),
                      ((0, False, 1001, "d", "t"), "to 1000"), ((0, False, 3, "", "t"), "needs a dead_letter_topic"),
                      ((0, False, 0, "d", "t"), "needs max_deliveries"), ((0, False, 3, "t", "t"), "own topic")]:
        with pytest.raises(ValueError, match=says):
            r.policy(*bad)


def test_a_dead_letter_topic_takes_the_letters_or_says_why_not():
    src = schema("Symbol:string", "Price:float:0:1000", "n:int:0:10")
    fits = schema("Symbol:string", "Price:float", "n:float", "dead_letter_deliveries:int",
                  "dead_letter_subscription:string")
    assert r.schema_refusal(src, Schema(), "w", 5) is None  # no schema: anything
    assert r.schema_refusal(src, fits, "w", 5) is None  # int widens to float; wider domains
    assert r.schema_refusal(Schema(), Schema(), "w", 5) is None
    cases = [
        (schema("Symbol:string", "Price:float", "n:int", "dead_letter_deliveries:int"), "no attribute "
                                                                                         "'dead_letter_subscription'"),
        (schema("Symbol:int", "Price:float", "n:int", "dead_letter_deliveries:int", "dead_letter_subscription:string"),
         "'Symbol' is int, not string"),
        (schema("Symbol:string", "Price:float:0:100", "n:int", "dead_letter_deliveries:int",
                "dead_letter_subscription:string"), "'Price' has a narrower domain"),
        (schema("Symbol:string", "Price:float", "n:int", "dead_letter_deliveries:int:0:3",
                "dead_letter_subscription:string"), "'dead_letter_deliveries' has a narrower domain"),
        (schema("Symbol:string", "Price:int", "n:int", "dead_letter_deliveries:int",
                "dead_letter_subscription:string"), "'Price' is int, not float"),
    ]
    for dead, says in cases:
        assert says in (r.schema_refusal(src, dead, "w", 5) or ""), dead
    assert "no schema" in r.schema_refusal(Schema(), fits, "w", 5)
    assert "attribute bytes" in r.schema_refusal(src, Schema(max_attribute_bytes=100), "w", 5)


@given(st.floats(0.1, 10), st.lists(st.tuples(st.floats(0, 5), st.integers(0, 5)), min_size=1, max_size=60),
       st.floats(0, 40))
def test_marks_are_never_early_and_at_most_a_grain_late(seconds, sends, end):
    """Sends at increasing times, each of a few new ids; at any later time, `due` says
    exactly the ids whose deadline (send + seconds) passed, give or take one grain late."""
    marks, sent_at, now, last = r.Marks(seconds), {}, 0.0, 0
    for gap, n in sends:
        now += gap
        if n:
            for i in range(last + 1, last + n + 1):
                sent_at[i] = now
            last += n
            marks.sent(now, last)
    bound, t = 0, now
    for step in range(int(end) + 1):  # sweeps at later times, as the timer would make them
        t = now + step * seconds / 3
        bound = max(bound, marks.due(t))
        for i, at in sent_at.items():
            if i <= bound:
                assert at + seconds <= t, "never early"
            else:
                assert at + seconds + seconds / r.GRAIN > t, "at most a grain late"
    assert marks.next_due() is None or marks.next_due() > t
