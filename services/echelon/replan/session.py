"""The one SparkSession of a run: `local[*]` by default, whatever `spark-submit` set otherwise."""

from __future__ import annotations

from pyspark.sql import SparkSession

LOCAL_CONF = {
    "spark.sql.shuffle.partitions": "4",  # the job's frames are small; 200 partitions is all overhead
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def session(master: str | None = None, app: str = "echelon-replan") -> SparkSession:
    """Under spark-submit the master comes from there (master None); else `master` or local[*]."""
    builder = SparkSession.builder.appName(app)
    if master or not SparkSession.getActiveSession():
        from pyspark import SparkConf
        if master or not SparkConf().contains("spark.master"):
            builder = builder.master(master or "local[*]")
            for k, v in LOCAL_CONF.items():
                builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
