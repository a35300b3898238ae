"""A routing job run whose metrics miss a member fails: exit 1, nothing pushed, and the
failure counted by membership (`echelon_membership_replan_runs_total{result="failed"}`,
what the failed-job alert reads); a complete run is counted by its outcome and moves
`echelon_membership_replan_last_success_timestamp_seconds` (the stale-job alert's input).

The metrics are snapshots built from the in-process nodes' own registries at two
instants, so which member is missing is exactly what the test removes.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import generate_latest

from echelon.replan import metrics
from echelon.replan.main import execute, parser
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc
from tests.harness import Cluster


def runs(node, result: str) -> float:
    return node.registry.get_sample_value("echelon_membership_replan_runs_total", {"result": result})


@pytest.mark.timeout(180)
async def test_missing_metrics_fail_the_run_are_counted_and_push_nothing(tmp_path, spark, capsys):
    c = Cluster(agents=2, matchers=2)
    try:
        await c.start()
        m = c.membership_nodes[0]
        nodes = [*c.agent_nodes, *c.matcher_nodes]
        rows = [r for ts in (1000.0, 1010.0) for n in nodes
                for r in metrics.parse_exposition(generate_latest(n.registry).decode(), n.config.id, ts)]
        assert {r.member for r in rows if r.name == metrics.PRESENCE} == {n.config.id for n in nodes}
        full, partial = tmp_path / "full.jsonl", tmp_path / "partial.jsonl"
        metrics.write_jsonl(rows, full)
        metrics.write_jsonl([r for r in rows if r.member != "matcher-1"], partial)

        def args(*extra: str):
            return parser().parse_args(["--membership", c.replicas[0], "--window", "1s", "--step", "0.5s", *extra])

        assert await asyncio.to_thread(execute, args("--snapshot", str(partial)), spark) == 1
        assert "no metrics in the window for 1 of 4 members (matcher-1)" in capsys.readouterr().err
        # The services' /metrics are not served in process: a scrape finds nobody.
        assert await asyncio.to_thread(execute, args(), spark) == 1
        assert "no metrics in the window for 4 of 4 members" in capsys.readouterr().err
        assert runs(m, "failed") == 2 and m.replica.plans.version == 0
        assert m.registry.get_sample_value("echelon_membership_replan_last_success_timestamp_seconds") == 0

        assert await asyncio.to_thread(execute, args("--snapshot", str(full)), spark) == 0
        assert runs(m, "failed") == 2 and runs(m, "pushed") + runs(m, "unchanged") == 1
        assert m.registry.get_sample_value("echelon_membership_replan_last_success_timestamp_seconds") > 0

        async with grpc.aio.insecure_channel(c.replicas[0]) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await mgrpc.ControlStub(ch).ReportRun(mpb.RunReport(result="great"))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "one of pushed" in bad.value.details()
    finally:
        await c.stop()


def test_selector_is_checked_and_scopes_the_query():
    q = metrics.query('namespace="prod",pod=~"echelon-.*"')
    assert q.endswith(',namespace="prod",pod=~"echelon-.*"}') and q.startswith('{__name__=~"')
    for bad in ('namespace=prod', 'namespace="a" pod="b"', '}', 'a="b"}or{'):
        with pytest.raises(ValueError):
            metrics.check_selector(bad)
    with pytest.raises(SystemExit):
        parser().parse_args(["--selector", "namespace=prod"])


@pytest.mark.parametrize("start,end,step,n", [(0, 100, 15, 4), (0, 10, 1, 3), (5, 5, 1, 4), (0, 299, 1, 16),
                                              (1000.5, 1300.5, 15, 2)])
def test_time_shards_hold_every_step_of_the_window_once(start, end, step, n):
    parts = metrics.shards(start, end, step, n)
    assert 1 <= len(parts) <= n
    times = [a + k * step for a, b in parts for k in range(int(round((b - a) / step)) + 1)]
    grid = [start + k * step for k in range(int((end - start) // step) + 1)]
    assert times == grid  # in order, none twice, none missing


@pytest.mark.parametrize("points,series,parallelism", [(21, 100, 2), (724, 13_824, 2), (724, 13_824, 64),
                                                       (1, 10**6, 8), (40_000, 1, 2), (5, 0, 4)])
def test_shard_count_keeps_every_task_busy_and_every_shard_small(points, series, parallelism):
    n = metrics.shard_count(points, series, parallelism)
    assert 1 <= n <= points
    sizes = [round(points * (i + 1) / n) - round(points * i / n) for i in range(n)]  # as shards() cuts
    if n < points:  # one point per shard is as fine as the window can be cut
        assert max(sizes) * series <= metrics.SHARD_ROWS * 1.01 + series
    assert max(sizes) <= metrics.MAX_POINTS
    assert n >= min(parallelism, points)
