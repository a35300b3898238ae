"""A standalone Spark cluster on 127.0.0.1 from the pyspark wheel's own `spark-class`: one
master and N workers (one core each), on free ports, and `spark-submit` against it.

Used by the test that runs the routing job on a real cluster
(tests/integration/test_replan_standalone.py) and by `make bench-replan`. What ran where
is read from the master's and workers' web UIs (`/json/`) and from the application's
event log (`spark.eventLog.dir`), which names the executor of every finished task.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from echelon.launch.placement import free_port
from loadtest.daemons import wait_ready


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def _json(url: str, timeout: float = 3.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback)
        return json.loads(r.read().decode())


@dataclass
class Standalone:
    """`with Standalone(dir, workers=2) as s:` then `s.submit(...)`, `s.master_json()`."""

    root: Path
    workers: int = 2
    worker_memory: str = "1g"
    master_url: str = ""
    ui: str = ""
    worker_uis: list[str] = field(default_factory=list)
    _procs: list[subprocess.Popen] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_LOG_DIR=str(self.root / "logs"), PYSPARK_PYTHON=sys.executable,
                   PYSPARK_DRIVER_PYTHON=sys.executable)
        env.pop("PYSPARK_GATEWAY_PORT", None)
        return env

    def _spawn(self, name: str, *argv: str) -> None:
        log = open(self.root / f"{name}.log", "w")  # noqa: SIM115 (the child keeps it)
        self._procs.append(subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *argv], env=self.env(),
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def start(self, timeout: float = 120.0) -> Standalone:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        (self.root / "events").mkdir(exist_ok=True)
        port, ui = free_port(), free_port()
        self.master_url, self.ui = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}"
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                    "--webui-port", str(ui))
        self._wait(lambda: self.master_json().get("status") == "ALIVE", timeout, "the master")
        for k in range(self.workers):
            wui = free_port()
            self.worker_uis.append(f"http://127.0.0.1:{wui}")
            work = self.root / f"worker-{k}"
            work.mkdir(exist_ok=True)
            self._spawn(f"worker-{k}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                        "--webui-port", str(wui), "--cores", "1", "--memory", self.worker_memory,
                        "--work-dir", str(work), self.master_url)
        self._wait(lambda: sum(w["state"] == "ALIVE" for w in self.master_json().get("workers", [])) == self.workers,
                   timeout, f"{self.workers} workers registered")
        return self

    def _wait(self, ready, timeout: float, what: str) -> None:
        wait_ready(ready, timeout, f"standalone Spark: {what}", self._procs, self.root.glob("*.log"), tail=1500)

    def master_json(self) -> dict:
        return _json(f"{self.ui}/json/")

    def worker_json(self) -> list[dict]:
        return [_json(f"{u}/json/") for u in self.worker_uis]

    def conf(self) -> list[str]:
        """`--conf` pairs for a job on this cluster: every executor registered before the
        first stage (so both workers get tasks), an event log to read the tasks from, the
        driver on loopback where the executors reach it, and Python workers that import
        what the driver imports."""
        pairs = {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": f"file://{self.root / 'events'}",
            "spark.eventLog.rolling.enabled": "false",  # one plain JSON-lines file per application
            "spark.eventLog.compress": "false",
            "spark.ui.showConsoleProgress": "false",
            # The executors' Python workers import the job (the Prometheus shards are
            # fetched there): this interpreter with its import path, as in local mode.
            "spark.pyspark.python": sys.executable,
            "spark.executorEnv.PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        }
        return [x for k, v in pairs.items() for x in ("--conf", f"{k}={v}")]

    def submit(self, app: str | Path, args: list[str], extra_env: dict[str, str] | None = None,
               timeout: float = 600.0) -> subprocess.CompletedProcess:
        argv = [str(spark_home() / "bin" / "spark-submit"), "--master", self.master_url, *self.conf(), str(app), *args]
        return subprocess.run(argv, env=dict(self.env(), **(extra_env or {})), capture_output=True, text=True,
                              timeout=timeout)

    def task_executors(self) -> dict[str, dict[str, int]]:
        """Per application id in the event log: finished tasks by (executor id, host)."""
        out: dict[str, dict[str, int]] = {}
        for path in (self.root / "events").iterdir():
            app, counts = path.name.split(".")[0], {}
            for line in path.read_text().splitlines():
                e = json.loads(line)
                if e.get("Event") == "SparkListenerTaskEnd":
                    info = e["Task Info"]
                    key = f"{info['Executor ID']}@{info['Host']}"
                    counts[key] = counts.get(key, 0) + 1
            out[app] = counts
        return out

    def stop(self) -> None:
        for p in reversed(self._procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self._procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def __enter__(self) -> Standalone:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
