"""The routing job on the master it is given (replan/session.py).

- `spark-submit --master local[1]` (default suite): the session runs on that master, not
  `local[*]`, and keeps the `--conf` it was given over the job's own defaults.
- slow: a standalone Spark cluster (a master and two one-core workers from the pyspark
  wheel's `spark-class`, on 127.0.0.1) runs the job through `spark-submit --master
  spark://...` against a live Echelon cluster. The master's `/json/` must list the
  application, each worker's executor must have run tasks (the application's event log
  names the executor of every finished task; none ran on the driver), and the plan it
  pushes must equal the plan `local[*]` decides from the same inputs (one metrics
  snapshot, the same cluster).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from echelon import launch
from echelon.client import Client
from echelon.replan import cluster as job_cluster
from echelon.replan import metrics
from echelon.replan.main import parser, run
from echelon.replan.session import DEFAULT_MASTER, choose_master
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc
from loadtest import stock
from loadtest.spark_standalone import Standalone, spark_home
from tests.harness import wait_for
from tests.integration.test_matcher import settled

REPO = Path(__file__).resolve().parents[2]
TOPIC = "quotes"


def test_master_given_beats_configured_beats_local():
    assert choose_master("spark://a:7077", "local[2]") == "spark://a:7077"
    assert choose_master(None, "k8s://https://kubernetes.default.svc") == "k8s://https://kubernetes.default.svc"
    assert choose_master(None, None) == DEFAULT_MASTER == "local[*]"


@pytest.mark.timeout(180)
def test_spark_submit_master_and_conf_are_kept(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from echelon.replan.session import session\n"
                     "s = session()\n"
                     "print('MASTER', s.sparkContext.master, s.conf.get('spark.sql.shuffle.partitions'))\n"
                     "s.stop()\n")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("PYSPARK_GATEWAY_PORT", None)
    r = subprocess.run([str(spark_home() / "bin" / "spark-submit"), "--master", "local[1]", "--conf",
                        "spark.sql.shuffle.partitions=7", str(probe)], env=env, capture_output=True, text=True,
                       timeout=170)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "MASTER local[1] 7" in r.stdout, r.stdout


def comparable(plan: mpb.RoutingPlan) -> mpb.RoutingPlan:
    """The plan without what a push stamps (version, creation time, membership's epoch)."""
    out = mpb.RoutingPlan()
    out.CopyFrom(plan)
    out.version = 0
    out.created_unix_ms = 0
    out.epoch = 0
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_standalone_cluster_runs_the_job_on_its_executors_and_pushes_the_local_plan(tmp_path, spark):
    c = launch.Cluster(agents=2, matchers=2, memberships=1, placement=launch.Loopback(0), log_dir=tmp_path / "echelon")
    clients: list[Client] = []
    subs = []
    try:
        await c.start()
        matchers = [p.address for p in c.by_role("matcher")]
        membership = c.by_role("membership")[0].address
        clients = [Client(a.address) for a in c.by_role("agent")]
        await clients[0].create_topic(TOPIC, stock.STOCK_SCHEMA)
        for i, f in enumerate(stock.subscriptions(200, seed=7)):
            sub = clients[i % 2].subscribe(TOPIC, f, name=f"s{i}", max_outstanding=1000)
            await sub.start()
            subs.append(sub)
        await wait_for(lambda: settled(matchers, "default"), 60, what="default zones settled")
        pub = clients[1].publisher("p")
        await asyncio.gather(*(pub.publish_nowait(TOPIC, e) for e in stock.events(400, seed=3, skewed=True)))
        await pub.close()

        # One metrics snapshot for both runs: the two must decide from the same input.
        view = job_cluster.view(membership)
        endpoints = {m.id: m.metrics_address for m in view.members if m.metrics_address}
        rows, failed = await asyncio.to_thread(metrics.scrape, endpoints, 2.0, 1.0)
        assert not failed and rows
        snapshot = tmp_path / "metrics.jsonl"
        metrics.write_jsonl(rows, snapshot)
        argv = ["--membership", membership, "--snapshot", str(snapshot), "--max-distance", "1s"]

        local = await asyncio.to_thread(run, parser().parse_args([*argv, "--dry-run"]), spark)
        assert spark.sparkContext.master.startswith("local")
        assert local.decision is not None and local.decision.plan is not None, local.note

        with Standalone(tmp_path / "spark", workers=2) as cluster:
            env = {"PYTHONPATH": os.pathsep.join(sys.path)}
            r = await asyncio.to_thread(cluster.submit, REPO / "spark" / "main.py", [*argv, "--json"], env)
            assert r.returncode == 0, "\n".join(line for line in r.stderr.splitlines()
                                                 if "replan" in line or "Error" in line or "Traceback" in line)
            out = json.loads(r.stdout[r.stdout.index("{"):])
            assert out["pushed"] == local.decision.plan.version, out

            master = cluster.master_json()
            apps = [a for a in master["completedapps"] + master["activeapps"] if a["name"] == "echelon-replan"]
            assert len(apps) == 1 and apps[0]["state"] == "FINISHED", master
            app = apps[0]["id"]
            tasks = cluster.task_executors()[app]
            assert tasks and not any(k.startswith("driver@") for k in tasks), tasks
            for worker in cluster.worker_json():
                mine = [str(e["id"]) for e in worker["finishedexecutors"] + worker["executors"] if e["appid"] == app]
                assert mine, f"worker {worker['id']} ran no executor of {app}"
                assert sum(tasks.get(f"{e}@127.0.0.1", 0) for e in mine) > 0, (worker["id"], mine, tasks)
            print(f"standalone: {app} tasks by executor {tasks}")

        async with grpc.aio.insecure_channel(membership) as ch:
            stored = await mgrpc.ControlStub(ch).GetPlan(mpb.GetPlanRequest())
        assert stored.version == out["pushed"]
        assert comparable(stored) == comparable(local.decision.plan)
    finally:
        for s in subs:
            await s.close()
        for cl in clients:
            await cl.close()
        c.stop()
