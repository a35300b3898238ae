"""loadtest/crawl_sim.py, short: CRAWL reaches the matching subscriptions and costs less
per reached match than the paper's Simple; the reached counts against a brute-force
match of every data item."""

from __future__ import annotations

import numpy as np

from loadtest import crawl_sim


def test_crawl_reaches_nearly_all_and_beats_simple():
    crawl, simple = crawl_sim.run(nodes=1000, view=10, apt=20, subs=400, hops=10, data=30, trace=8, seed=3)
    assert crawl.should == simple.should > 0
    assert crawl.reached >= 0.95 * crawl.should
    assert simple.reached < 0.1 * simple.should  # ten random hops of a thousand nodes
    assert simple.messages == 30 * 10
    assert crawl.effective < simple.effective


def test_should_is_the_brute_force_count():
    w = crawl_sim.build(200, 10, 20, 150, 20, 0.6, seed=1)
    items = np.random.default_rng(2).random((5, 20))
    brute = sum(all(w.lo[s, a] <= x[a] <= w.hi[s, a] for a in range(20)) for x in items for s in range(150))
    assert crawl_sim.simple_cost(w, items, [0] * 5, 3, seed=0).should == brute


def test_quick_run_prints_both_figures(capsys):
    text = crawl_sim.main(["--quick"])
    assert "Fig. 5" in text and "Fig. 6" in text and "411,630" in text
