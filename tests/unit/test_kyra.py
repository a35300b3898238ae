"""Kyra cliques (core/kyra.py) against a brute-force complete linkage on small random matrices."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from echelon.core import kyra


def brute_force(d: np.ndarray, max_distance: float, max_servers: int) -> list[list[int]]:
    """Figure 5 read literally: every step recomputes every pair's complete linkage from
    the matrix and merges the closest pair that fits (ties: lowest first members)."""
    d = kyra.symmetric(d)
    groups = [[i] for i in range(len(d))]
    while True:
        best = None
        for a, b in itertools.combinations(range(len(groups)), 2):
            ga, gb = groups[a], groups[b]
            link = max(d[i, j] for i in ga for j in gb)
            if link <= max_distance and len(ga) + len(gb) <= max_servers:
                key = (link, min(ga), min(gb))
                if best is None or key < best[0]:
                    best = (key, a, b)
        if best is None:
            return sorted((sorted(g) for g in groups), key=lambda g: g[0])
        _, a, b = best
        groups[a] = groups[a] + groups[b]
        del groups[b]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 9), st.integers(0, 10**6), st.floats(0, 60), st.integers(1, 6), st.booleans())
def test_hac_equals_brute_force_complete_linkage(n, seed, max_distance, max_servers, coarse):
    rng = np.random.default_rng(seed)
    # Coarse values make ties common; some entries missing (NaN) as unmeasured pairs.
    m = rng.integers(0, 6, (n, n)) * 10.0 if coarse else rng.uniform(0, 50, (n, n))
    m[rng.random((n, n)) < 0.05] = np.nan
    got = kyra.cliques(m, max_distance, max_servers)
    assert got == brute_force(m, max_distance, max_servers)
    d = kyra.symmetric(m)
    assert sorted(i for g in got for i in g) == list(range(n))
    for g in got:  # both limits hold in every clique
        assert len(g) <= max_servers
        assert all(d[i, j] <= max_distance for i in g for j in g)


def test_two_sites_become_two_cliques():
    members = ["a", "b", "c", "d"]
    m = np.array([[0, 1, 40, 41], [1, 0, 42, 40], [40, 42, 0, 2], [41, 40, 2, 0]], dtype=float)
    assert kyra.named_cliques(members, m, max_distance=5, max_servers=4) == [["a", "b"], ["c", "d"]]
    assert kyra.named_cliques(members, m, max_distance=50, max_servers=4) == [["a", "b", "c", "d"]]
    assert kyra.named_cliques(members, m, max_distance=50, max_servers=1) == [["a"], ["b"], ["c"], ["d"]]
