"""LBDD's out-degree bound (core/lbdd.py module doc), against an independent tree checker.

The checker walks the computed tree from the source with its own breadth-first search and
its own digests; it shares nothing with `echelon.core.lbdd` but the Tree it inspects.
"""

from __future__ import annotations

import hashlib
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echelon.core import lbdd


def _bucket(source: str, key: str) -> int:
    d = lambda k: int.from_bytes(hashlib.md5(k.encode()).digest()[:4], "big")  # noqa: E731
    return max(1, (d(source) ^ d(key)).bit_length())


def _levels_needed(n: int, bound: int) -> int:
    """Smallest t with bound**t >= n: the extra levels the bound may add."""
    t = 0
    while bound**t < n:
        t += 1
    return t


def check_bounded(tree: lbdd.Tree, source: str, members: set[str], bound: int | None, leaves=frozenset()) -> None:
    """Theorem 1 under the bound: every member reached exactly once from the source, the
    parent relation acyclic and consistent with the children, out-degree <= bound (the
    parents of hinted leaves excepted), depth within buckets + ceil(log_bound n)."""
    members = set(members) - {source}
    seen: dict[str, int] = {source: 0}  # node -> hops from the source
    frontier, visits = [source], 0
    while frontier:  # BFS; a node reached twice, or a cycle, shows up as a repeat
        nxt = []
        for p in frontier:
            for c in tree.children.get(p, ()):
                visits += 1
                assert c not in seen, f"{c!r} reached twice"
                assert tree.parent[c] == p
                seen[c] = seen[p] + 1
                nxt.append(c)
        frontier = nxt
    assert set(seen) - {source} == members and visits == len(members)
    assert set(tree.parent) == members and source not in tree.parent
    if bound is not None:
        for p, cs in tree.children.items():
            if not any(c in leaves for c in cs):
                assert len(cs) <= bound, (p, len(cs))
    if members:
        assert max(seen.values()) <= tree.depth
        plain = len({_bucket(source, k) for k in members - set(leaves)}) + bool(set(leaves) & members)
        extra = 0 if bound is None else _levels_needed(len(members), bound)
        assert tree.depth <= plain + extra


ipv4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t)))
keys = st.one_of(ipv4, st.text(min_size=1, max_size=8))
views = st.tuples(keys, st.sets(keys, max_size=80))


# 100 examples in the default suite; the `slow` twin below draws 300 (make test-slow).
@settings(max_examples=100, deadline=None)
@given(views, st.integers(2, 6))
def test_bounded_tree_reaches_every_member_once_within_the_bound(view, bound):
    source, members = view
    tree = lbdd.build_tree(source, members, max_degree=bound)
    check_bounded(tree, source, members, bound)
    check_bounded(lbdd.build_tree(source, members), source, members, None)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(views, st.integers(2, 6))
def test_bounded_tree_reaches_every_member_once_within_the_bound_thoroughly(view, bound):
    test_bounded_tree_reaches_every_member_once_within_the_bound.hypothesis.inner_test(view, bound)


# 60 examples in the default suite; the `slow` twin below draws 200 (make test-slow).
@settings(max_examples=60, deadline=None)
@given(views, st.integers(2, 6))
def test_bound_changes_nothing_when_no_node_exceeds_it(view, bound):
    """A level overflows exactly when some slice is larger than the bound."""
    source, members = view
    plain = lbdd.build_tree(source, members)
    bounded = lbdd.build_tree(source, members, max_degree=bound)
    if max(plain.out_degree.values()) <= bound:
        assert bounded == plain
    else:
        assert bounded.depth > plain.depth or bounded.parent != plain.parent


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(views, st.integers(2, 6))
def test_bound_changes_nothing_when_no_node_exceeds_it_thoroughly(view, bound):
    test_bound_changes_nothing_when_no_node_exceeds_it.hypothesis.inner_test(view, bound)


# 60 examples in the default suite; the `slow` twin below draws 200 (make test-slow).
@settings(max_examples=60, deadline=None)
@given(views, st.integers(2, 6), st.data())
def test_route_partitions_destinations_by_bounded_subtree(view, bound, data):
    source, members = view
    b = lbdd.buckets(source, members, max_degree=bound)
    tree = b.tree()
    others = sorted(set(members) - {source})
    node = data.draw(st.sampled_from([source, *others]))
    wanted = data.draw(st.lists(st.sampled_from([*others, "stranger"]), unique=True)) if others else []
    routed = b.route(node, wanted)
    for head, ds in routed.items():
        assert head in tree.children[node]
        assert ds <= tree.subtree(head)
    below = tree.subtree(node) - {node}
    assert sorted(d for ds in routed.values() for d in ds) == sorted(set(wanted) & below)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(views, st.integers(2, 6), st.data())
def test_route_partitions_destinations_by_bounded_subtree_thoroughly(view, bound, data):
    test_route_partitions_destinations_by_bounded_subtree.hypothesis.inner_test(view, bound, data)


# 35 examples in the default suite; the `slow` twin below draws 100 (make test-slow).
@settings(max_examples=35, deadline=None)
@given(views, st.integers(2, 6), st.data())
def test_hinted_leaves_stay_last_and_relay_nothing_under_the_bound(view, bound, data):
    source, members = view
    others = sorted(set(members) - {source})
    leaves = frozenset(data.draw(st.lists(st.sampled_from(others), unique=True))) if others else frozenset()
    tree = lbdd.build_tree(source, members, leaves, max_degree=bound)
    check_bounded(tree, source, members, bound, leaves)
    assert all(tree.children[k] == [] for k in leaves)


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(views, st.integers(2, 6), st.data())
def test_hinted_leaves_stay_last_and_relay_nothing_under_the_bound_thoroughly(view, bound, data):
    test_hinted_leaves_stay_last_and_relay_nothing_under_the_bound.hypothesis.inner_test(view, bound, data)


@pytest.mark.parametrize("n", [100, 500])
def test_bound_caps_the_hot_spot_on_paper_sized_sets(n):
    rng = random.Random(n)
    for _ in range(5):
        addrs: set[str] = set()
        while len(addrs) < n + 1:
            addrs.add(".".join(str(rng.randrange(256)) for _ in range(4)))
        source, *members = sorted(addrs)
        for bound in (2, 4, 8):
            check_bounded(lbdd.build_tree(source, members, max_degree=bound), source, set(members), bound)


def test_bound_below_two_is_refused():
    with pytest.raises(ValueError):
        lbdd.build_tree("a", ["b", "c"], max_degree=1)
