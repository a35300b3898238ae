"""The small-event benchmark (`loadtest.bench_events`) in its --quick form: a real
Echelon cluster of processes, a real nats-server and redis-server, every cell of the
table present with its measures, and Echelon delivering to each subscription exactly
the events a brute-force filter of everything published says it should (no speed is
asserted: `make bench-events` shows that)."""

from __future__ import annotations

import json

import pytest

from loadtest.bench_events import run as bench
from loadtest.bench_events.systems import MODES, NODE_MODES, missing_peers

pytestmark = pytest.mark.skipif(bool(missing_peers()), reason=f"{', '.join(missing_peers())} missing "
                                "(Debian packages; `make install` as root installs them)")


@pytest.mark.timeout(300)  # three workloads, six Echelon modes, paced and saturated cells
def test_quick_run_has_every_cell_and_echelon_delivers_what_the_oracle_says(tmp_path, capsys):
    r = bench.main(["--quick", "--out", str(tmp_path), "--base-port", "0"])  # free ports: tests share the machine

    want = {(system, mode, sel, pubs, rate if rate else "max") for system, modes in MODES.items() for mode in modes
            if mode not in NODE_MODES  # --quick leaves them to tests/interop/test_node_loadgen.py
            for sel in (2, 20, bench.RANGE) for pubs in (1, 4) for rate in bench.QUICK_RATES}
    got = [(c["system"], c["mode"], c["selectivity"], c["publishers"], c["rate"]) for c in r.cells]
    assert sorted(got, key=str) == sorted(want, key=str)  # each cell once

    for c in r.cells:
        assert c["events"] > 0 and c["published_per_s"] > 0, c
        for key in ("delivered_per_s", "p50_ms", "p99_ms", "p999_ms", "bytes_per_useful_delivery"):
            assert c[key] is not None and c[key] > 0, (key, c)
        assert c["p50_ms"] <= c["p99_ms"] <= c["p999_ms"]
        assert set(c["cpu_s_per_1k"]) == ({"nats"} if c["system"] == "nats" else {"redis"} if c["system"] == "redis"
                                          else {f"{role}-{i}" for role, n in (("agent", 4), ("matcher", 3),
                                                                              ("membership", 3)) for i in range(n)})
        assert ("sustained" in c) == (c["rate"] != "max")
        if c["system"] == "echelon":
            assert c["errors"] == {} and c["acked"] == c["events"], c
            assert c["oracle"] == {"missing": 0, "extra": 0, "duplicated": 0}, c
            assert c["useful_deliveries"] == c["expected_deliveries"], c

    printed = capsys.readouterr().out
    table = bench.table(r.cells)
    assert table in printed
    assert bench.targets(r.cells) in printed
    assert len([line for line in bench.targets(r.cells).splitlines() if line.endswith(("MET", "NOT MET"))]) == 4
    header, rule, *rows = table.splitlines()
    assert "pub/NATS" in header and len(rows) == len(want)
    assert all(row.split()[-2] == "1.000" for row in rows if row.startswith("nats"))  # NATS against itself
    assert bench.range_table(r.cells) in printed
    ranged = [c for c in r.cells if c["selectivity"] == bench.RANGE]
    # The peers' subscribers take every event and filter it themselves; Echelon's filter nothing.
    assert all((c["client_filtered_per_useful"] > 1) == (c["system"] != "echelon") for c in ranged), ranged
    assert all(c["cpu_us_per_useful_delivery"] is not None and len(c["load_average"]) == 2 for c in r.cells)
    saved = json.loads((tmp_path / "bench_events.json").read_text())
    assert len(saved["cells"]) == len(want)
    assert (tmp_path / "latency_vs_rate.png").stat().st_size > 10_000
