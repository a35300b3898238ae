"""CRAWL (core/crawl.py): the walk finds a holder when one is reachable (breadth-first
search is the oracle), never invents one, restarts when blocked, and is bounded."""

import random
from collections import deque

import pytest

from echelon.core.crawl import Crawler, walk


def random_graph(n: int, degree: int, rng: random.Random) -> dict[int, list[int]]:
    """Undirected: each node links to `degree` random others."""
    g: dict[int, set[int]] = {i: set() for i in range(n)}
    for i in range(n):
        for j in rng.sample([k for k in range(n) if k != i], min(degree, n - 1)):
            g[i].add(j)
            g[j].add(i)
    return {i: sorted(s) for i, s in g.items()}


def reachable(g: dict, source) -> set:
    seen, todo = {source}, deque([source])
    while todo:
        for m in g[todo.popleft()]:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def check_path(g: dict, path: tuple) -> None:
    """Each move is along an edge, or a restart back to a node already visited."""
    for k in range(1, len(path)):
        assert path[k] in g[path[k - 1]] or path[k] in path[:k], path


def test_finds_a_holder_whenever_one_is_reachable():
    rng = random.Random(1)
    found = 0
    for case in range(300):
        n = rng.randint(3, 30)
        g = random_graph(n, rng.randint(2, 4), rng)  # a view of a few peers each, as in the paper
        # Two components half of the time: holders may lie out of reach.
        if case % 2:
            cut = n // 2
            g = {i: [j for j in nb if (i < cut) == (j < cut)] for i, nb in g.items()}
        apt = {i: f"m{i}" for i in rng.sample(range(n), rng.randint(0, 2))}
        source = rng.randrange(n)
        # A walk is random: the budget is generous enough that every reachable holder
        # of these graphs is found (docs/papers.md, CBDLO).
        w = walk(source, apt.get, g.__getitem__, max_hops=50 * n, trace=4, rng=random.Random(case))
        can = any(i in apt for i in reachable(g, source))
        assert (w.holder is not None) == can, (case, w)
        if w.holder is not None:
            found += 1
            assert w.holder == apt[w.path[-1]]  # the APT of the node it stopped at
            assert not any(p in apt for p in w.path[:-1])  # it stops at the first hit
        check_path(g, w.path)
        assert w.messages <= 50 * n + 1
    assert found > 100


def test_a_hit_at_the_source_costs_one_message():
    w = walk("s", {"s": "m"}.get, lambda n: ["a"], rng=random.Random(0))
    assert (w.holder, w.messages, w.path) == ("m", 1, ("s",))


def test_the_trace_keeps_the_walk_from_going_back():
    # A cycle: with a trace of 2 the walk can never step back to where it came from.
    ring = {i: [(i - 1) % 10, (i + 1) % 10] for i in range(10)}
    w = walk(0, {5: "m"}.get, ring.__getitem__, max_hops=10, trace=2, rng=random.Random(3))
    assert w.holder == "m" and w.restarts == 0 and w.messages == 6  # five hops round one side, then the holder


def test_a_blocked_walk_restarts_and_still_finds_the_holder():
    # s - a - {leaf, b}; only b knows the holder. A walk that enters the leaf is blocked there.
    g = {"s": ["a"], "a": ["s", "leaf", "b"], "leaf": ["a"], "b": ["a"]}
    blocked = found = 0
    for seed in range(100):
        w = walk("s", {"b": "m"}.get, g.__getitem__, max_hops=64, trace=8, rng=random.Random(seed))
        check_path(g, w.path)
        found += w.holder == "m"
        if "leaf" in w.path:
            blocked += 1
            assert w.restarts >= 1
    # Halving the hops left at each block bounds the walk, so a walk that keeps hitting
    # the dead end can run out: rarely, with this budget.
    assert blocked > 20 and found >= 95


def test_each_restart_halves_the_hops_left():
    # Two nodes, nothing found: every visit after the first is blocked.
    g = {"s": ["x"], "x": ["s"]}
    c = Crawler("s", max_hops=16, trace=4, rng=random.Random(0))
    budgets = []
    node = "s"
    while node is not None:
        node = c.next_hop(g[node])
        budgets.append(c.budget)
    # s->x (15 left); blocked: 7, restart to s (6); blocked: 3, to x (2); blocked: 1, to s (0); over.
    assert budgets == [15, 6, 2, 0, 0]
    assert (c.messages, c.restarts) == (4, 3)


@pytest.mark.parametrize("trace", [1, 3, 50])
def test_bounded_without_a_holder(trace):
    rng = random.Random(trace)
    for case in range(100):
        g = random_graph(rng.randint(1, 40), rng.randint(1, 4), rng)
        hops = rng.randint(1, 60)
        w = walk(0, lambda n: None, g.__getitem__, max_hops=hops, trace=trace, rng=random.Random(case))
        assert w.holder is None and w.messages <= hops
        check_path(g, w.path)


def test_bad_parameters():
    with pytest.raises(ValueError):
        Crawler("s", max_hops=0)
    with pytest.raises(ValueError):
        Crawler("s", trace=0)
