"""The routing job's aggregations: pure DataFrame -> DataFrame functions (no I/O).

Input frames:
- metric rows (spark/metrics.py): ts, member, name, topic, zone, peer, value;
- sampled points (from `Matcher.Sample`): topic, member, zone, total, k, coords, where
  k numbers a zone's sampled points 0.. and `total` is how many the zone holds.

What comes out is small (one row per series, zone, link or member pair) and goes to the
pure planners in `echelon.core` (zoning, kyra) and spark/plan.py.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (ArrayType, DoubleType, LongType, StringType, StructField, StructType)

SERIES = ["member", "name", "topic", "zone", "peer"]

METRIC_SCHEMA = StructType([
    StructField("ts", DoubleType(), False),
    StructField("member", StringType(), False),
    StructField("name", StringType(), False),
    StructField("topic", StringType(), False),
    StructField("zone", StringType(), False),
    StructField("peer", StringType(), False),
    StructField("value", DoubleType(), False),
])

POINT_SCHEMA = StructType([
    StructField("topic", StringType(), False),
    StructField("member", StringType(), False),
    StructField("zone", StringType(), False),
    StructField("total", LongType(), False),
    StructField("k", LongType(), False),
    StructField("coords", ArrayType(DoubleType(), False), False),
])


def counter_increase(rows: DataFrame) -> DataFrame:
    """Counters (`*_total`): per series, the increase over the window and its rate.

    A sample below its predecessor is a restart (the counter began again at 0), so it
    adds its own value, as Prometheus' `increase` does. Columns: SERIES, increase,
    seconds, rate (0 for a series seen once).
    """
    w = Window.partitionBy(*SERIES).orderBy("ts")
    prev = F.lag("value").over(w)
    delta = F.when(prev.isNull(), F.lit(0.0)).when(F.col("value") >= prev, F.col("value") - prev) \
        .otherwise(F.col("value"))
    return (rows.filter(F.col("name").endswith("_total"))
            .withColumn("delta", delta)
            .groupBy(*SERIES)
            .agg(F.sum("delta").alias("increase"), (F.max("ts") - F.min("ts")).alias("seconds"))
            .withColumn("rate", F.when(F.col("seconds") > 0, F.col("increase") / F.col("seconds"))
                        .otherwise(F.lit(0.0))))


def gauge_last(rows: DataFrame) -> DataFrame:
    """Gauges (not `*_total`): per series, the latest value and the mean over the window."""
    return (rows.filter(~F.col("name").endswith("_total"))
            .groupBy(*SERIES)
            .agg(F.max_by("value", "ts").alias("last"), F.avg("value").alias("mean")))


def matcher_load(increase: DataFrame, last: DataFrame) -> DataFrame:
    """Per matcher: subscriptions it indexes now, and events matched in its zones (count, rate)."""
    subs = (last.filter(F.col("name") == "echelon_matcher_zone_subscriptions")
            .groupBy("member").agg(F.sum("last").alias("subscriptions")))
    events = (increase.filter(F.col("name") == "echelon_matcher_zone_events_total")
              .groupBy("member").agg(F.sum("increase").alias("events"), F.sum("rate").alias("event_rate")))
    return (subs.join(events, "member", "full")
            .select("member", F.coalesce("subscriptions", F.lit(0.0)).alias("subscriptions"),
                    F.coalesce("events", F.lit(0.0)).alias("events"),
                    F.coalesce("event_rate", F.lit(0.0)).alias("event_rate")))


def link_intervals(rows: DataFrame) -> DataFrame:
    """OctopiA's congestion element per outgoing link and scrape interval (docs/papers.md, "OctopiA").

    Between two consecutive samples of a link: enqueued_t and dequeued_t (counter
    deltas, a restart counted as in `counter_increase`) and q_t, the queue length at the
    interval's end. CE_t = enqueued_t / dequeued_t; null (infinite) when nothing was
    dequeued. Columns: member, peer, ts, enqueued, dequeued, queue, ce.
    """
    names = ["echelon_link_enqueued_total", "echelon_link_dequeued_total", "echelon_link_queue_length"]
    wide = (rows.filter(F.col("name").isin(names))
            .groupBy("member", "peer", "ts").pivot("name", names).agg(F.first("value")))
    w = Window.partitionBy("member", "peer").orderBy("ts")

    def delta(col: str):
        prev = F.lag(col).over(w)
        return F.when(F.col(col) >= prev, F.col(col) - prev).otherwise(F.col(col))

    out = (wide.withColumn("enqueued", delta(names[0])).withColumn("dequeued", delta(names[1]))
           .withColumn("queue", F.coalesce(F.col(names[2]), F.lit(0.0)))
           .withColumn("first", F.lag(names[0]).over(w).isNull())
           .filter(~F.col("first")))
    return (out.withColumn("ce", F.when(F.col("dequeued") > 0, F.col("enqueued") / F.col("dequeued")))
            .select("member", "peer", "ts", "enqueued", "dequeued", "queue", "ce"))


def congestion(intervals: DataFrame, delta: float) -> DataFrame:
    """Per member: the share of intervals in which its most congested uplink was congested
    (CE >= 1 and q > delta, or nothing dequeued while q > 0), and its longest queue."""
    congested = (F.col("queue") > delta) & (F.col("ce").isNull() | (F.col("ce") >= 1)) & (F.col("queue") > 0)
    per_link = (intervals.groupBy("member", "peer")
                .agg(F.avg(congested.cast("double")).alias("congested"), F.max("queue").alias("max_queue")))
    return per_link.groupBy("member").agg(F.max("congested").alias("congested"), F.max("max_queue").alias("max_queue"))


def latency(last: DataFrame) -> DataFrame:
    """Round trip per (member, peer) from `echelon_peer_rtt_seconds`: the window's mean."""
    return (last.filter(F.col("name") == "echelon_peer_rtt_seconds")
            .select("member", "peer", F.col("mean").alias("rtt")))


def equal_rate(points: DataFrame) -> DataFrame:
    """Thin every zone's sample to the topic's lowest sampling rate, so each sampled point
    stands for the same number of subscriptions (zones sampled at different matchers)."""
    per_zone = points.groupBy("topic", "member", "zone", "total").agg(F.count("*").alias("n"))
    rate = (per_zone.filter(F.col("total") > 0)
            .groupBy("topic").agg(F.min(F.col("n") / F.col("total")).alias("rate")))
    return (points.join(rate, "topic")
            .filter(F.col("k") < F.ceil(F.col("total") * F.col("rate")))
            .select(*POINT_SCHEMA.fieldNames()))
