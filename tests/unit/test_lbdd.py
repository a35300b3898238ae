"""LBDD against an independent brute-force oracle (docs/papers.md, "LBDD").

The oracle below re-derives every parent straight from the written rules -- its own MD5
digest, buckets, (digest, key) order and the floor partition with exact fractions -- and
shares no code with `echelon.core.lbdd`.
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echelon.core import lbdd

# --- the oracle --------------------------------------------------------------------------


def _digest(key: str) -> int:
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "big")


class Oracle:
    """The tree spelled out rule by rule, quadratic and obvious."""

    def __init__(self, source: str, members, leaves=()) -> None:
        self.source = source
        self.members = sorted(set(members) - {source})
        sd = _digest(source)
        # A member at distance 0 from the source joins bucket 1 (documented choice);
        # a hinted member joins bucket 33, above all 32 XOR buckets.
        self.bucket = {k: 33 if k in leaves else max(1, (_digest(k) ^ sd).bit_length()) for k in self.members}
        self.bucket[source] = 0
        by_bucket: dict[int, list[str]] = {}
        for k in self.members:
            by_bucket.setdefault(self.bucket[k], []).append(k)
        for ks in by_bucket.values():
            ks.sort(key=lambda k: (_digest(k), k))
        self.by_bucket = by_bucket
        self.numbers = sorted(by_bucket)
        self.parent: dict[str, str] = {}
        prev = [source]
        for num in self.numbers:
            nxt = by_bucket[num]
            for r in range(1, len(prev) + 1):
                lo = math.floor(Fraction((r - 1) * len(nxt), len(prev)))
                hi = math.floor(Fraction(r * len(nxt), len(prev)))
                for k in nxt[lo:hi]:
                    assert k not in self.parent, "slices overlap"
                    self.parent[k] = prev[r - 1]
            prev = nxt

    def children(self, key: str) -> list[str]:
        kids = [c for c, p in self.parent.items() if p == key]
        return sorted(kids, key=lambda k: (_digest(k), k))

    def rank(self, key: str) -> int:
        if key == self.source:
            return 1
        same = self.by_bucket[self.bucket[key]]
        return 1 + sum((_digest(o), o) < (_digest(key), key) for o in same)

    def under(self, key: str, top: str) -> bool:
        """Does `top` lie on the path from `key` up to the source (key itself included)?"""
        while key != self.source:
            if key == top:
                return True
            key = self.parent[key]
        return top == self.source


def check_tree(tree: lbdd.Tree, oracle: Oracle) -> None:
    """Everything Theorem 1 and the rules promise, checked on a computed tree."""
    source, members = oracle.source, oracle.members
    assert tree.source == source
    # Every member has exactly one parent, the one the rules give; the source has none.
    assert tree.parent == oracle.parent
    assert sorted(c for _, c in tree.edges) == sorted(members)
    assert source not in tree.parent
    # One-way: bucket numbers strictly increase along every edge.
    assert tree.bucket == oracle.bucket
    for p, c in tree.edges:
        assert oracle.bucket[p] < oracle.bucket[c]
    # Rooted at the source, no cycles: every member reaches it within depth steps.
    for k in members:
        seen, hops = set(), 0
        while k != source:
            assert k not in seen
            seen.add(k)
            k, hops = tree.parent[k], hops + 1
        assert hops <= tree.depth
    # Depth = number of non-empty buckets.
    assert tree.depth == len(oracle.numbers)
    # Ranks and out-degrees.
    assert tree.rank == {k: oracle.rank(k) for k in [source, *members]}
    assert tree.out_degree == {k: len(oracle.children(k)) for k in [source, *members]}
    # Slices: B_self's targets in rank order concatenate to exactly B_next.
    prev = [source]
    for num in oracle.numbers:
        nxt = oracle.by_bucket[num]
        assert [t for k in prev for t in tree.children[k]] == nxt
        prev = nxt


# --- strategies ----------------------------------------------------------------------------

ipv4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t)))
keys = st.one_of(ipv4, st.text(min_size=1, max_size=8))
views = st.tuples(keys, st.sets(keys, max_size=60))


def random_addresses(rng: random.Random, n: int) -> list[str]:
    out: set[str] = set()
    while len(out) < n:
        out.add(".".join(str(rng.randrange(256)) for _ in range(4)))
    return sorted(out)


# --- properties ----------------------------------------------------------------------------


# 100 examples in the default suite; the `slow` twin below draws 300 (make test-slow).
@settings(max_examples=100, deadline=None)
@given(views)
def test_tree_matches_oracle(view):
    source, members = view
    check_tree(lbdd.build_tree(source, members), Oracle(source, members))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(views)
def test_tree_matches_oracle_thoroughly(view):
    test_tree_matches_oracle.hypothesis.inner_test(view)


# 50 examples in the default suite; the `slow` twin below draws 150 (make test-slow).
@settings(max_examples=50, deadline=None)
@given(views)
def test_each_node_computes_its_own_targets(view):
    """Every relay, from its own copy of the view, picks its children: one parent each."""
    source, members = view
    oracle = Oracle(source, members)
    received: list[str] = []
    for node in [source, *oracle.members]:
        mine = lbdd.targets(source, node, members)
        assert mine == oracle.children(node)
        received.extend(mine)
    assert sorted(received) == oracle.members
    for node in oracle.members:
        assert lbdd.rank(source, node, members) == oracle.rank(node)
        above = lbdd.bucket_sequence(source, node, members)
        assert [n for n, _ in above] == [n for n in oracle.numbers if n > oracle.bucket[node]]
        assert all(ks == oracle.by_bucket[n] for n, ks in above)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(views)
def test_each_node_computes_its_own_targets_thoroughly(view):
    test_each_node_computes_its_own_targets.hypothesis.inner_test(view)


# 60 examples in the default suite; the `slow` twin below draws 200 (make test-slow).
@settings(max_examples=60, deadline=None)
@given(views, st.data())
def test_route_partitions_destinations_by_subtree(view, data):
    source, members = view
    oracle = Oracle(source, members)
    node = data.draw(st.sampled_from([source, *oracle.members]))
    dests = data.draw(st.sets(st.sampled_from([source, "not-a-member", *oracle.members])))
    want = {}
    for t in oracle.children(node):
        inside = {d for d in dests if d in oracle.parent and oracle.under(d, t)}
        if inside:
            want[t] = inside
    assert lbdd.route(source, node, members, dests) == want
    # Routing the whole view from the source reaches every member exactly once.
    if oracle.members:
        full = lbdd.route(source, source, members, oracle.members)
        assert sorted(d for ds in full.values() for d in ds) == oracle.members


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(views, st.data())
def test_route_partitions_destinations_by_subtree_thoroughly(view, data):
    test_route_partitions_destinations_by_subtree.hypothesis.inner_test(view, data)


# 35 examples in the default suite; the `slow` twin below draws 100 (make test-slow).
@settings(max_examples=35, deadline=None)
@given(views, st.sets(keys, max_size=10), st.data())
def test_path_update_is_a_recomputation(view, joined, data):
    source, members = view
    left = data.draw(st.sets(st.sampled_from(sorted(members)))) if members else set()
    new = (members - left) | joined
    node = data.draw(st.sampled_from(sorted({source} | (members & new))))
    added, removed = lbdd.path_update(source, node, members, new)
    before, after = Oracle(source, members).children(node), Oracle(source, new).children(node)
    assert added == [t for t in after if t not in before]
    assert removed == [t for t in before if t not in after]


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(views, st.sets(keys, max_size=10), st.data())
def test_path_update_is_a_recomputation_thoroughly(view, joined, data):
    test_path_update_is_a_recomputation.hypothesis.inner_test(view, joined, data)


def test_outsiders_source_as_member_and_duplicates():
    members = ["a", "b", "c", "d", "e", "b"]
    assert lbdd.targets("src", "zzz", members) == []
    assert lbdd.route("src", "zzz", members, members) == {}
    with pytest.raises(KeyError):
        lbdd.rank("src", "zzz", members)
    # A publisher subscribing to its own topic is still only the root.
    with_self = lbdd.build_tree("src", [*members, "src"])
    assert with_self.parent == lbdd.build_tree("src", members).parent
    assert lbdd.targets("src", "src", []) == []
    assert lbdd.build_tree("src", []).depth == 0


# Two keys with the same 32-bit digest, found by a birthday search over 10.0.x.y.
TWIN_A, TWIN_B = "10.0.81.124", "10.0.170.82"


def test_equal_digests():
    assert _digest(TWIN_A) == _digest(TWIN_B)
    # Member at distance 0 from the source: bucket 1, still below everyone else.
    tree = lbdd.build_tree(TWIN_A, [TWIN_B, "x", "y", "z"])
    check_tree(tree, Oracle(TWIN_A, [TWIN_B, "x", "y", "z"]))
    assert tree.bucket[TWIN_B] == 1 and tree.parent[TWIN_B] == TWIN_A
    # Two members with equal digests: ordered by key.
    tree = lbdd.build_tree("src", [TWIN_B, TWIN_A])
    first, second = sorted([TWIN_A, TWIN_B])
    assert (tree.rank[first], tree.rank[second]) == (1, 2)
    check_tree(tree, Oracle("src", [TWIN_A, TWIN_B]))


def test_primitives():
    assert lbdd.digest("10.3.17.74") == _digest("10.3.17.74")
    assert lbdd.distance(0b1010, 0b0110) == 0b1100
    assert lbdd.bucket(5, 5) == 0
    assert lbdd.bucket(0, 1) == 1
    assert lbdd.bucket(0, 2**31) == lbdd.bucket(0, 2**32 - 1) == 32


# --- the paper's 12 PCs (section 4.2) ------------------------------------------------------

PAPER = [f"10.3.17.{x}" for x in (74, 97, 234, 90, 98, 64, 61, 184, 72, 88, 44, 68)]
PAPER_EDGES = [
    ("10.3.17.74", "10.3.17.98"),
    ("10.3.17.74", "10.3.17.64"),
    ("10.3.17.98", "10.3.17.184"),
    ("10.3.17.64", "10.3.17.61"),
    ("10.3.17.184", "10.3.17.68"),
    ("10.3.17.184", "10.3.17.234"),
    ("10.3.17.184", "10.3.17.90"),
    ("10.3.17.61", "10.3.17.72"),
    ("10.3.17.61", "10.3.17.44"),
    ("10.3.17.61", "10.3.17.88"),
    ("10.3.17.61", "10.3.17.97"),
]


def test_paper_twelve_pcs():
    source, members = PAPER[0], PAPER[1:]
    tree = lbdd.build_tree(source, members)
    check_tree(tree, Oracle(source, members))
    assert tree.edges == PAPER_EDGES
    assert tree.depth == 3
    assert {n: sorted(k for k, b in tree.bucket.items() if b == n) for n in (30, 31)} == {
        30: ["10.3.17.64", "10.3.17.98"],
        31: ["10.3.17.184", "10.3.17.61"],
    }
    # The publisher sends 2 of 11 copies; the rest is carried by subscribers.
    assert tree.out_degree[source] == 2


# --- shape over random address sets (section 3.5.2, Tab. 1) --------------------------------


@pytest.mark.parametrize("n", [100, 300, 500])
def test_median_depth_over_random_address_sets(n):
    rng = random.Random(n)
    depths = []
    for _ in range(100):
        source, *members = random_addresses(rng, n + 1)
        rng.shuffle(members)
        tree = lbdd.build_tree(source, members)
        assert tree.depth == len(set(tree.bucket.values()) - {0})
        depths.append(tree.depth)
    assert 6 <= statistics.median(depths) <= 10
    # Depth about log2(n) + O(1).
    assert abs(statistics.mean(depths) - math.log2(n)) < 3


def test_mean_out_degree_of_inner_nodes_is_about_two():
    rng = random.Random(2000)
    means = []
    for _ in range(5):
        source, *members = random_addresses(rng, 2001)
        tree = lbdd.build_tree(source, members)
        inner = [d for d in tree.out_degree.values() if d]
        means.append(statistics.mean(inner))
    assert all(1.5 <= m <= 3 for m in means), means


@settings(max_examples=200, deadline=None)
@given(views, st.data())
def test_bucket_hints_make_leaves_and_keep_the_tree_one_way_and_complete(view, data):
    """Hinted members (bucket hints) sit in the last bucket: no children, one parent
    each, bucket numbers still increasing along every edge; the rest keep their buckets."""
    source, members = view
    others = sorted(set(members) - {source})
    leaves = set(data.draw(st.lists(st.sampled_from(others), unique=True))) if others else set()
    oracle = Oracle(source, members, leaves)
    tree = lbdd.build_tree(source, members, leaves | {"not-a-member"})
    check_tree(tree, oracle)
    assert all(tree.children[k] == [] for k in leaves)
    plain = Oracle(source, members)
    assert all(tree.bucket[k] == plain.bucket[k] for k in others if k not in leaves)
    if others:  # routing from the source still reaches every member exactly once
        full = lbdd.buckets(source, members, leaves).route(source, others)
        assert sorted(d for ds in full.values() for d in ds) == others
