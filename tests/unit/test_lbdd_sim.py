"""Smoke test: the LBDD simulation runs with tiny settings and prints what build_tree gives."""

from __future__ import annotations

import statistics

from click.testing import CliRunner

from echelon.core.lbdd import build_tree
from loadtest.lbdd_sim import main, sample, seeds_for


def test_tiny_run_prints_depths_of_build_tree(tmp_path):
    result = CliRunner().invoke(main, ["--max-n", "200", "--seeds", "4", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "depth.png").stat().st_size > 0
    assert (tmp_path / "contribution.png").stat().st_size > 0

    tab1 = result.output.split("Fig. 4")[0]
    rows = {}
    for line in tab1.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if cells[0].isdigit():
            rows[int(cells[0])] = cells
    assert sorted(rows) == [100, 200]
    for n, (_, sets, lo, med, hi, _, buckets, _) in rows.items():
        depths = [build_tree(*sample(n, seed)).depth for seed in range(seeds_for(n, 4))]
        assert int(sets) == len(depths) == 4
        assert (int(lo), int(hi)) == (min(depths), max(depths))
        assert float(med) == statistics.median(depths)
        assert float(buckets) == statistics.median(depths)

    bound = result.output.split("Out-degree bound")[1]
    cells = [[c.strip() for c in line.strip("│ ").split("│")] for line in bound.splitlines()]
    rows = {int(c[0]): c for c in cells if c[0].isdigit()}
    assert sorted(rows) == [100, 200]
    for n, (_, depth, _, top, bounded_top) in rows.items():
        trees = [build_tree(*sample(n, seed)) for seed in range(seeds_for(n, 4))]
        assert depth == f"{statistics.median(t.depth for t in trees):g} / {max(t.depth for t in trees)}"
        assert int(top.split(" / ")[1]) == max(max(t.out_degree.values()) for t in trees)
        assert int(bounded_top.split(" / ")[1]) <= 4
