"""Smoke test of loadtest/bench_match.py at a tiny size: CDM and the brute force agree."""

from __future__ import annotations

from echelon.core.cdm import CountingIndex, Entry
from echelon.core.space import Space
from loadtest import bench_match, stock


def test_cdm_and_brute_force_agree_on_the_benchmark_data():
    subs = [Entry(f"s{i}", "a", f) for i, f in enumerate(stock.subscriptions(3000, seed=1))]
    index = CountingIndex(subs)
    brute = bench_match.BruteForce(Space.of(stock.STOCK_SCHEMA), subs)
    for skewed in (False, True):
        batch = stock.events(200, seed=2, skewed=skewed)
        assert [set(r) for r in index.match_batch(batch)] == [set(r) for r in brute.match_batch(batch)]
        assert [set(index.match(e)) for e in batch[:20]] == [set(brute.match(e)) for e in batch[:20]]


def test_bench_prints_a_table_and_writes_a_plot(tmp_path, capsys):
    rows = bench_match.main(["--sizes", "500,1500", "--events", "300", "--brute", "60", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert all(r.agree for r in rows) and "batch ratio" in out and "1,500" in out
    assert (tmp_path / "bench_match.png").stat().st_size > 0
