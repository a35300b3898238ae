"""The routing job's Prometheus input (spark/metrics.py, query_range) against the real
Prometheus (Debian `prometheus`) scraping a real `prometheus_client` endpoint."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import start_http_server

from dataclasses import astuple

from echelon.replan import metrics
from echelon.replan.main import parser, prometheus_frame
from tests.harness import free_port

pytestmark = pytest.mark.skipif(not shutil.which("prometheus"), reason="needs the prometheus binary (make install)")


def test_query_range_reads_the_kept_families_with_their_members(tmp_path, spark):
    registry = CollectorRegistry()
    queue = Gauge("echelon_link_queue_length", "q", ["peer"], registry=registry)
    sent = Counter("echelon_link_enqueued_total", "e", ["peer"], registry=registry)
    Gauge("echelon_other", "not kept", registry=registry).set(1)
    port, prom_port = free_port(), free_port()
    server, thread = start_http_server(port, "127.0.0.1", registry=registry)
    (tmp_path / "prom.yml").write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: echelon\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prom.yml'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}", f"--storage.tsdb.path={tmp_path / 'data'}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{prom_port}"
    try:
        queue.labels("agent-2").set(3)
        sent.labels("agent-2").inc(10)
        rows: list[metrics.Row] = []
        deadline = time.monotonic() + 30
        while len({r.name for r in rows}) < 2:  # both families scraped at least once
            assert time.monotonic() < deadline, "Prometheus never scraped the endpoint"
            time.sleep(0.5)
            try:
                rows = metrics.prometheus(url, 60, 1, {f"127.0.0.1:{port}": "agent-1"})
            except OSError:
                rows = []  # not serving yet
        assert {r.name for r in rows} == {"echelon_link_queue_length", "echelon_link_enqueued_total"}
        assert {(r.member, r.peer) for r in rows} == {("agent-1", "agent-2")}
        assert {r.value for r in rows if r.name == "echelon_link_queue_length"} == {3.0}
        assert {r.value for r in rows if r.name == "echelon_link_enqueued_total"} == {10.0}
        with pytest.raises(RuntimeError, match="bad_data"):  # Prometheus' own refusal, passed on
            metrics.prometheus(url, 60, 0)

        # The production path: time shards fetched by Spark tasks, one partition each, the
        # same rows as one query_range in the driver over the same window.
        end = time.time()
        args = parser().parse_args(["--prometheus", url, "--window", "20s", "--step", "1s", "--shards", "4"])
        instances = {f"127.0.0.1:{port}": "agent-1"}
        frame = prometheus_frame(spark, args, instances, end=end)
        assert frame.rdd.getNumPartitions() == 4
        assert sorted(tuple(r) for r in frame.collect()) == \
            sorted(astuple(r) for r in metrics.prometheus(url, 20, 1, instances, end=end))
        scoped = parser().parse_args(["--prometheus", url, "--window", "20s", "--step", "1s",
                                      "--selector", 'job="elsewhere"'])
        assert prometheus_frame(spark, scoped, instances, end=end).count() == 0  # another release's series
    finally:
        prom.terminate()
        prom.wait(10)
        server.shutdown()
