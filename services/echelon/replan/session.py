"""The one SparkSession of a run, on the master it is given.

Which master (docs/operations.md, "The routing job"): `--master` when given; else the
one Spark was configured with (`spark-submit --master`, which is how the spark-operator
and the chart's CronJob run the job, or `spark.master` in spark-defaults.conf or
PYSPARK_SUBMIT_ARGS); `local[*]` only when none is. The configured master is read from
the JVM's system properties, so the gateway is started (or, under spark-submit, joined)
first: a `SparkConf()` made before that is an empty Python dict and says nothing.

The settings below are defaults: a key Spark was already configured with (`--conf`,
the chart's `sparkConf`) is left as it is.
"""

from __future__ import annotations

import os
import sys

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"

CONF = {
    "spark.sql.shuffle.partitions": "4",  # the job's frames are small; 200 partitions is all overhead
    "spark.sql.session.timeZone": "UTC",
}
# Only in local mode: one process, nobody to show a UI to, nothing to reach but loopback.
LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def choose_master(given: str | None, configured: str | None) -> str:
    """`--master` beats the configured master, which beats local[*]."""
    return given or configured or DEFAULT_MASTER


def configured() -> SparkConf:
    """What Spark was configured with outside this process's code: the JVM's `spark.*`
    system properties (spark-submit's arguments, spark-defaults.conf)."""
    SparkContext._ensure_initialized()  # noqa: SLF001 (the one way to reach the JVM before a context)
    return SparkConf()


def session(master: str | None = None, app: str = "echelon-replan",
            conf: dict[str, str] | None = None) -> SparkSession:
    """The active session when there is one and no master is asked for; else a new one on
    `choose_master(master, <configured>)`, with `conf` over every default."""
    active = SparkSession.getActiveSession()
    if active is not None and not master:
        return active
    configured_conf = configured()
    chosen = choose_master(master, configured_conf.get("spark.master", None))
    builder = SparkSession.builder.appName(app).master(chosen)
    defaults = dict(CONF, **(LOCAL_CONF if chosen.startswith("local") else {}))
    if chosen.startswith("local") and "PYSPARK_PYTHON" not in os.environ:
        # Python workers (the executors' side of the Prometheus ingest) run this interpreter,
        # the one with the job's packages, not whatever `python3` is first on PATH.
        defaults["spark.pyspark.python"] = sys.executable
        # ... with its import path (a virtualenv's interpreter started by Spark may not find
        # its own site-packages).
        defaults["spark.executorEnv.PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    for k, v in defaults.items():
        if not configured_conf.contains(k):
            builder = builder.config(k, v)
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
