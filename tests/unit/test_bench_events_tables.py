"""The bench_events tables that read several cells: the spread of repeated cells (median
and range, each cell's repeats together), the range workload's comparison (which of
useful deliveries/s, CPU and bytes per useful delivery Echelon is ahead on), and the
side by side of `--base REV` (medians per tree, gains the right way up)."""

from __future__ import annotations

from loadtest.bench_events.run import RANGE, range_table, spread_table
from loadtest.bench_events.versus import report, without


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


def test_side_by_side_takes_medians_per_tree_and_a_gain_above_one_means_better_now():
    def rnd(pub: float, p50: float, cpu_s: float) -> list[dict]:
        return [{**cell("echelon", "max", pub, p50), "cpu_s_per_1k_services": cpu_s,
                 "cpu_s_per_1k": {"agent-0": cpu_s / 2, "agent-1": cpu_s / 4, "agent-2": cpu_s / 4, "matcher-0": 1.0}}]

    runs = {"base": [rnd(100.0, 4.0, 0.02), rnd(300.0, 2.0, 0.04), rnd(200.0, 8.0, 0.03)],
            "head": [rnd(400.0, 1.0, 0.01), rnd(500.0, 2.0, 0.01), rnd(600.0, 1.0, 0.01)]}
    lines = report(runs, "t").splitlines()
    row = next(x for x in lines if x.startswith("m 2% 1p max")).split()
    # pub/s: base median 200, head 500, gain 2.5; p50: base 4, head 1, gain 4; cpu ms/1k: 30 -> 10, gain 3;
    # the subscribing agents' (every agent but agent-0: half of it): 15 -> 5; then bytes per
    # useful delivery (the same in every round here: gain 1)
    assert row[4:7] == ["200.00", "500.00", "2.50"]
    assert row[10:13] == ["4.00", "1.00", "4.00"]
    assert row[-9:-6] == ["30.00", "10.00", "3.00"]
    assert row[-6:-3] == ["15.00", "5.00", "3.00"]
    assert row[-1] == "1.00"
    rounds = next(x for x in lines if x.startswith("m 2% 1p max") and "pub/s" in x)
    assert "pub/s 4.00 1.67 3.00" in rounds  # each round's own ratio
    runs["base"][1] = None  # a round whose base cluster failed counts for neither tree
    row = next(x for x in report(runs, "t").splitlines() if x.startswith("m 2% 1p max")).split()
    assert row[4:7] == ["150.00", "500.00", "3.33"]


def test_side_by_side_passes_the_other_options_to_both_trees():
    argv = ["--base", "main", "--short", "--rounds=3", "--selectivity", "2", "--out", "x", "--systems", "nats"]
    assert without(argv, "--base", "--rounds", "--out", "--systems") == ["--short", "--selectivity", "2"]


def test_bytes_by_hop_names_the_receiver_by_the_other_end_of_the_connection():
    """A child process sends a known number of bytes to a socket of this one: the hop
    child>parent counts at least them, and this side's few bytes go the other way."""
    import os
    import socket
    import subprocess
    import sys

    from loadtest.bench_events.workload import tcp_bytes_by_hop, tcp_bytes_sent

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        child = subprocess.Popen([sys.executable, "-c", "import socket, sys\n"
                                  f"s = socket.create_connection(('127.0.0.1', {port}))\n"
                                  "s.sendall(b'x' * 50000); s.recv(1); sys.stdin.read()"],
                                 stdin=subprocess.PIPE)
        try:
            conn, _ = server.accept()
            with conn:
                got = 0
                while got < 50000:
                    got += len(conn.recv(65536))
                conn.sendall(b"y")
                roles = {child.pid: "child", os.getpid(): "parent"}
                hops = tcp_bytes_by_hop(roles)
                assert hops[("child", "parent")] >= 50000
                assert 1 <= hops[("parent", "child")] < 1000
                assert tcp_bytes_sent(set(roles)) >= 50001
        finally:
            child.kill()
            child.wait()


def test_hop_table_lists_the_saturation_cells_by_hop():
    from loadtest.bench_events.run import hop_table

    cells = [dict(cell("echelon", "max", 1.0, 1.0, wire=300.0), bytes_by_hop={"client>pub-agent": 90.0,
                                                                              "pub-agent>agent": 120.0}),
             dict(cell("echelon", 1000, 1.0, 1.0), bytes_by_hop={"client>pub-agent": 500.0})]
    header, row = hop_table(cells).splitlines()[1], hop_table(cells).splitlines()[3]
    assert header.split()[-2:] == ["client>pub-agent", "pub-agent>agent"]
    assert row.split()[-3:] == ["300", "90.0", "120.0"] and len(hop_table(cells).splitlines()) == 4
    assert hop_table([cells[1]]) == ""


def test_raw_cells_are_read_against_the_floor_with_the_same_acks():
    from loadtest.bench_events.run import floor_ratios

    cells = [dict(cell("echelon", "max", 3000.0, 1.0), mode="raw-DELIVERED"),
             dict(cell("echelon", "max", 6000.0, 1.0), mode="rawc-DELIVERED"),
             dict(cell("echelon", 1000, 1000.0, 1.0), mode="raw-DELIVERED"),
             dict(cell("echelon", "max", 9000.0, 1.0), mode="batch-DELIVERED")]
    cells.append(dict(cell("echelon", "max", 14000.0, 1.0), mode="nodec-DELIVERED"))
    floor = [{"mode": "read", "requests_per_s": 8000.0}, {"mode": "ack each", "requests_per_s": 4000.0},
             {"mode": "coalesced", "requests_per_s": 5000.0},
             {"mode": "coalesced", "client": "node", "requests_per_s": 7000.0}]
    lines = floor_ratios(cells, floor).splitlines()
    assert len(lines) == 4
    assert "0.75x gRPC alone, ack each, python client" in lines[1]
    assert "1.20x gRPC alone, coalesced, python client" in lines[2]
    assert "2.00x gRPC alone, coalesced, node client" in lines[3]
    assert floor_ratios(cells, []) == ""


def test_bytes_by_hop_over_a_cell_count_each_socket_from_its_own_start():
    """A socket that closed during the cell counts nothing (not minus what it had sent), a new
    one all it sent, one whose count went down (its address pair reused) as new."""
    from loadtest.bench_events.workload import hop_bytes

    before = {("a:1", "b:1"): ("a", "b", 100), ("a:2", "b:1"): ("a", "b", 5000), ("b:1", "a:1"): ("b", "a", 10),
              ("a:3", "b:1"): ("a", "b", 900)}
    after = {("a:1", "b:1"): ("a", "b", 250), ("b:1", "a:1"): ("b", "a", 10), ("a:4", "b:1"): ("a", "b", 70),
             ("a:3", "b:1"): ("a", "b", 40)}
    assert hop_bytes(after, before) == {("a", "b"): 150 + 70 + 40, ("b", "a"): 0}
    assert hop_bytes(after) == {("a", "b"): 360, ("b", "a"): 10}
