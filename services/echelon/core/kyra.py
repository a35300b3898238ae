"""Kyra server cliques (Cao and Singh, section III.A, Figure 5; ALGORITHMS.md section 5).

Hierarchical agglomerative clustering with complete linkage over the measured latency
matrix: every server starts as its own clique; the pair of cliques at the smallest
distance (the largest latency between any two of their servers) merges, as long as that
distance is at most `max_distance` and the merged clique has at most `max_servers`
servers. Figure 5 walks the pairs in increasing distance and skips those that would be
too big, which is the same as taking the closest pair that fits.

Choices the paper leaves open:
- ties in distance go to the pair whose cliques come first in (smallest member index)
  order, so every caller gets the same cliques from the same matrix;
- a missing measurement (NaN or infinite) is an infinite distance: those servers are
  never put together on a guess;
- latency is made symmetric by taking the larger of the two directions, so a clique's
  diameter bounds the latency both ways.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np


def symmetric(latency: np.ndarray) -> np.ndarray:
    """The larger of the two directions, +inf where either is missing, 0 on the diagonal."""
    d = np.asarray(latency, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"latency must be a square matrix, got shape {d.shape}")
    d = np.where(np.isfinite(d) & (d >= 0), d, np.inf)
    d = np.maximum(d, d.T)
    np.fill_diagonal(d, 0.0)
    return d


def cliques(latency: np.ndarray, max_distance: float, max_servers: int) -> list[list[int]]:
    """Figure 5 over an n x n latency matrix: cliques as lists of server indexes.

    Each clique is sorted, and the cliques are sorted by their first index. O(n^3) with
    the complete-linkage update d(k, a+b) = max(d(k, a), d(k, b)): fine for hundreds of
    servers, which is what a routing plan names.
    """
    if max_servers < 1:
        raise ValueError("max_servers must be at least 1")
    d = symmetric(latency)
    n = len(d)
    groups: list[list[int] | None] = [[i] for i in range(n)]
    dist = d.copy()
    np.fill_diagonal(dist, np.inf)
    sizes = np.ones(n, dtype=np.int64)
    while True:
        fits = (sizes[:, None] + sizes[None, :] <= max_servers) & (dist <= max_distance)
        if not fits.any():
            break
        cand = np.where(fits, dist, np.inf)
        best = cand.min()
        # Row-major argmin over the upper triangle: the lowest (a, b) among equal distances.
        a, b = divmod(int(np.argmax(np.triu(cand == best, 1))), n)
        groups[a] = sorted(groups[a] + groups[b])  # type: ignore[operator]
        groups[b] = None
        sizes[a] += sizes[b]
        sizes[b] = 0
        dist[a, :] = np.maximum(dist[a, :], dist[b, :])
        dist[:, a] = dist[a, :]
        dist[a, a] = np.inf
        dist[b, :] = np.inf
        dist[:, b] = np.inf
    return sorted((g for g in groups if g is not None), key=lambda g: g[0])


def named_cliques(members: Sequence[str], latency: np.ndarray, max_distance: float,
                  max_servers: int) -> list[list[str]]:
    """`cliques` with member ids in place of indexes."""
    return [[members[i] for i in g] for g in cliques(latency, max_distance, max_servers)]


def unserved(agents: Mapping[str, str], routers: Mapping[str, str], cliques: Mapping[str, str]) -> dict[str, str]:
    """Cliques as regions (OctopiA's clusters, core/scot.py): the agents left without a
    router of their own region. `agents`, `routers`: id -> the region it joined;
    `cliques`: member id -> the region its clique makes it. Returns agent -> its region.
    {} with no router (regions are joined by routers only, so cliques then change
    nothing) or when every agent and router is in one region (nothing to carry)."""
    if not routers:
        return {}
    served = {cliques.get(r, region) for r, region in routers.items()}
    regions = {a: cliques.get(a, region) for a, region in agents.items()}
    if len(set(regions.values()) | served) <= 1:
        return {}
    return {a: region for a, region in regions.items() if region not in served}
