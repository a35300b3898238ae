"""CDM counting index (services/echelon/core/cdm.py, cdm_keys.py): exactly `Filter.matches`, through
inserts and deletes, for the subscription ids and for the agents answer."""

from __future__ import annotations

import math
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echelon.core import cdm
from echelon.core.cdm import CountingIndex, Entry
from echelon.core.cdm_keys import successor
from echelon.contract.filters import Filter, Op, Predicate, parse
from echelon.contract.schema import SchemaError
from loadtest import stock
from tests.unit.test_space import events, filters, schemas


def brute(subs: dict[str, Entry], e: dict) -> set[str]:
    return {s.id for s in subs.values() if s.filter.matches(e)}


# (SMALL, SMALL_CANDIDATES): numpy for every batch; Python (Run.match_small) for every
# batch; Python giving up after a few candidates, part way through the runs; the default.
PATHS = [(0, 0), (10**9, 10**9), (10**9, 3), (cdm.SMALL, cdm.SMALL_CANDIDATES)]


@contextmanager
def path(small: int, candidates: int):
    saved = cdm.SMALL, cdm.SMALL_CANDIDATES
    cdm.SMALL, cdm.SMALL_CANDIDATES = small, candidates
    try:
        yield
    finally:
        cdm.SMALL, cdm.SMALL_CANDIDATES = saved


def matched(index: CountingIndex, batch: list[dict]) -> list[set[str]]:
    """match_batch's answer, the same (as sets, each id once) through every path."""
    answers = []
    for p in PATHS:
        with path(*p):
            got = index.match_batch(batch)
        assert all(len(r) == len(set(r)) for r in got)
        answers.append([set(r) for r in got])
    assert all(a == answers[0] for a in answers)
    return answers[0]


def check_agents(index: CountingIndex, subs: dict[str, Entry], batch: list[dict]) -> None:
    """match_agents: each matching subscription's agent once per event, and the match count,
    through the (event, agent) table and through the sort that replaces it when large, and
    through each path."""
    want = [brute(subs, e) for e in batch]
    for cells, p in [(cdm.SEEN_CELLS, p) for p in PATHS] + [(0, PATHS[0])]:
        saved, cdm.SEEN_CELLS = cdm.SEEN_CELLS, cells
        try:
            with path(*p):
                agents, n = index.match_agents(batch)
        finally:
            cdm.SEEN_CELLS = saved
        assert [sorted(a) for a in agents] == [sorted({subs[i].agent for i in w}) for w in want]
        assert n == sum(map(len, want))


# 20 examples in the default suite; the `slow` twin below draws 150 (make test-slow).
@settings(max_examples=20, deadline=None)
@given(st.data())
def test_equals_brute_force_through_inserts_and_deletes(data):
    inserts_and_deletes(data)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(st.data())
def test_equals_brute_force_through_inserts_and_deletes_thoroughly(data):
    inserts_and_deletes(data)


def inserts_and_deletes(data) -> None:
    schema = data.draw(schemas())
    # Tiny levels so that merges, cascades, tombstones and compaction all happen.
    index = CountingIndex(base=2, growth=2)
    live: dict[str, Entry] = {}
    for step in range(data.draw(st.integers(1, 40))):
        action = data.draw(st.sampled_from(["insert", "insert", "insert", "delete", "match"]))
        if action == "insert":
            sid = f"s{data.draw(st.integers(0, 25))}"  # ids repeat: replacements
            sub = Entry(sid, f"agent{step % 3}", data.draw(filters(schema)))
            index.insert(sub)
            live[sid] = sub
        elif action == "delete" and live:
            sid = data.draw(st.sampled_from(sorted(live)))
            assert index.delete(sid)
            del live[sid]
        else:
            batch = data.draw(st.lists(events(schema), max_size=6))
            assert matched(index, batch) == [brute(live, e) for e in batch]
            check_agents(index, live, batch)
        assert len(index) == len(live)
    batch = data.draw(st.lists(events(schema), min_size=1, max_size=6))
    assert matched(index, batch) == [brute(live, e) for e in batch]


ODD_VALUES = [None, True, False, 0, 1, 1.0, -0.0, 3, 2**53 + 1, 10**30, -(10**400), math.inf, -math.inf, math.nan]
ODD_VALUES += ["", "a", "ab", "ab\x00", "abcdefg", "abcdefgh", "\U0010ffff", "\U0010ffff\U0010ffff"]
ODD_FILTERS = [
    "x = 1",
    "x != 1",
    "x > 1",
    "x < 1",
    "x >= 10000000000000000000000000000",
    "x between -1 and 3",
    "x = 9007199254740993",
    "x = 9007199254740992.0",
    'x = "a"',
    'x > "a"',
    'x prefix "ab"',
    'x prefix ""',
    'x != "ab"',
    'x between "a" and "abcdefg"',
    "x = 1 and x != 1",
    'x = 1 and x = "a"',
    "",
    "x != 1 and y != 2",
    "y >= 0",
]


# 60 examples in the default suite; the `slow` twin below draws 200 (make test-slow).
@settings(max_examples=60, deadline=None)
@given(st.lists(st.fixed_dictionaries({}, optional={"x": st.sampled_from(ODD_VALUES), "y": st.sampled_from(ODD_VALUES)}), max_size=8))
def test_schemaless_odd_values_match_exactly(batch):
    subs = {f"s{i}": Entry(f"s{i}", "a", parse(t)) for i, t in enumerate(ODD_FILTERS)}
    subs["nan"] = Entry("nan", "a", Filter((Predicate("x", Op.NE, math.nan),)))
    subs["nan_eq"] = Entry("nan_eq", "a", Filter((Predicate("x", Op.EQ, math.nan),)))
    subs["max"] = Entry("max", "a", Filter((Predicate("x", Op.PREFIX, "\U0010ffff"),)))
    subs["bool"] = Entry("bool", "a", Filter((Predicate("x", Op.EQ, True),)))
    index = CountingIndex(subs.values())
    assert matched(index, batch) == [brute(subs, e) for e in batch]
    check_agents(index, subs, batch)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(st.fixed_dictionaries({}, optional={"x": st.sampled_from(ODD_VALUES), "y": st.sampled_from(ODD_VALUES)}), max_size=8))
def test_schemaless_odd_values_match_exactly_thoroughly(batch):
    test_schemaless_odd_values_match_exactly.hypothesis.inner_test(batch)


def test_successor_bounds_every_string_with_the_prefix():
    assert successor("ab") == "ac"
    assert successor("a\U0010ffff") == "b"
    assert successor("\U0010ffff") is None and successor("") is None


def test_stock_workload_matches_brute_force_and_answers_agents():
    """2000 subscriptions against 100 events of each kind; the `slow` twin sends 300 (make test-slow)."""
    stock_workload(events=100)


@pytest.mark.slow
def test_stock_workload_matches_brute_force_and_answers_agents_thoroughly():
    stock_workload(events=300)


def stock_workload(events: int) -> None:
    filters_ = stock.subscriptions(2000, seed=4)
    subs = {f"s{i}": Entry(f"s{i}", f"agent{i % 7}", f) for i, f in enumerate(filters_)}
    index = CountingIndex(subs.values())
    for skewed in (False, True):
        batch = stock.events(events, seed=5, skewed=skewed)
        assert matched(index, batch) == [brute(subs, e) for e in batch]
        check_agents(index, subs, batch)
    assert sum(map(len, index.match_batch(stock.events(events, seed=5)))) > 0


def test_a_malformed_filter_is_refused_without_changing_the_index():
    index = CountingIndex([Entry("a", "x", parse("v = 1"))])
    bad = Entry("a", "x", Filter((Predicate("v", Op.BETWEEN, 1),)))
    with pytest.raises(SchemaError):
        index.insert(bad)
    assert index.match({"v": 1}) == ["a"]
    assert not index.delete("missing") and index.delete("a") and index.match({"v": 1}) == []


def test_single_match_and_empty_index():
    assert CountingIndex().match_batch([{}, {"v": 1}]) == [[], []]
    index = CountingIndex([Entry("all", "x", Filter())])
    assert index.match({}) == ["all"] and "all" in index and index.get("all").agent == "x"


def test_ints_beyond_float_precision_are_compared_exactly():
    index = CountingIndex([Entry("f", "a", parse("x = 9007199254740992.0")), Entry("g", "a", parse("x > 9007199254740992.0"))])
    assert matched(index, [{"x": 2**53 + 1}, {"x": 2**53}]) == [{"g"}, {"f"}]
