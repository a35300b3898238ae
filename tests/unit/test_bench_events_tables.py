"""The bench_events tables that read several cells: the spread of repeated cells (median
and range, each cell's repeats together) and the range workload's comparison (which of
useful deliveries/s, CPU and bytes per useful delivery Echelon is ahead on)."""

from __future__ import annotations

from loadtest.bench_events.run import RANGE, range_table, spread_table


def cell(system: str, rate, pub: float, p50: float, cpu: float = 10.0, wire: float = 100.0, sel=2, rep: int = 0):
    return {"system": system, "mode": "m", "selectivity": sel, "publishers": 1, "rate": rate, "repeat": rep,
            "published_per_s": pub, "delivered_per_s": pub, "p50_ms": p50, "p99_ms": 2 * p50,
            "cpu_us_per_useful_delivery": cpu, "bytes_per_useful_delivery": wire, "client_filtered_per_useful": 0.0,
            "load_average": [1.0, 2.0]}


def test_spread_of_repeated_cells_is_median_and_range_per_cell():
    cells = [cell("echelon", "max", v, 1.0, rep=i) for i, v in enumerate((300.0, 100.0, 200.0))]
    cells.append(cell("echelon", 1000, 1000.0, 1.0))
    out = spread_table(cells)
    (row,) = [r for r in out.splitlines() if " max " in r]
    assert "200 [100-300]" in row and row.split()[5] == "3"
    assert spread_table([cell("echelon", "max", 1.0, 1.0)]) == ""  # nothing repeated: no table


def test_range_comparison_says_where_echelon_is_ahead():
    cells = [cell("echelon", "max", 3000.0, 1.0, cpu=20.0, wire=50.0, sel=RANGE),
             cell("nats", "max", 2000.0, 1.0, cpu=10.0, wire=100.0, sel=RANGE),
             cell("redis", "max", 4000.0, 1.0, cpu=40.0, wire=200.0, sel=RANGE),
             cell("nats", "max", 9e9, 1.0, sel=2)]  # another workload: not compared
    lines = range_table(cells).splitlines()
    nats = next(x for x in lines if "over nats" in x)
    redis = next(x for x in lines if "over redis" in x)
    assert "useful/s 1.50x" in nats and "CPU per useful 2.00x" in nats and "ahead on 2 of 3" in nats
    assert "useful/s 0.75x" in redis and "ahead on 2 of 3" in redis
    assert range_table([cell("nats", "max", 1.0, 1.0)]) == ""
