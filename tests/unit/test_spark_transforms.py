"""Every transform of the routing job (spark/transforms.py) on small frames with known
answers, compared with `assertDataFrameEqual`, on the session-scoped local[*] fixture."""

from __future__ import annotations

import json

from pyspark.sql import Row
from pyspark.testing import assertDataFrameEqual

from echelon.replan import metrics
from echelon.replan import transforms as T


def rows(spark, data):
    return spark.createDataFrame([(float(ts), m, n, t, z, p, float(v)) for ts, m, n, t, z, p, v in data],
                                 T.METRIC_SCHEMA)


EV, SUBS = "echelon_matcher_zone_events_total", "echelon_matcher_zone_subscriptions"
ENQ, DEQ, Q, RTT = ("echelon_link_enqueued_total", "echelon_link_dequeued_total", "echelon_link_queue_length",
                    "echelon_peer_rtt_seconds")


def test_counters_gauges_and_matcher_load(spark):
    df = rows(spark, [
        (0, "m0", EV, "q", "z0", "", 10), (2, "m0", EV, "q", "z0", "", 30),
        (4, "m0", EV, "q", "z0", "", 5),  # a restart: counts 5, not -25
        (0, "m1", EV, "q", "z1", "", 7),  # seen once: no increase, rate 0
        (0, "m0", SUBS, "q", "z0", "", 100), (4, "m0", SUBS, "q", "z0", "", 120),
        (0, "m1", SUBS, "q", "z1", "", 50),
    ])
    inc = T.counter_increase(df)
    assertDataFrameEqual(inc.select("member", "zone", "increase", "seconds", "rate"), [
        Row(member="m0", zone="z0", increase=25.0, seconds=4.0, rate=6.25),
        Row(member="m1", zone="z1", increase=0.0, seconds=0.0, rate=0.0)])
    last = T.gauge_last(df)
    assertDataFrameEqual(last.select("member", "zone", "last", "mean"), [
        Row(member="m0", zone="z0", last=120.0, mean=110.0), Row(member="m1", zone="z1", last=50.0, mean=50.0)])
    assertDataFrameEqual(T.matcher_load(inc, last), [
        Row(member="m0", subscriptions=120.0, events=25.0, event_rate=6.25),
        Row(member="m1", subscriptions=50.0, events=0.0, event_rate=0.0)])


def test_congestion_element_per_interval_and_member(spark):
    df = rows(spark, [
        *[(t, "a", ENQ, "", "", "b", v) for t, v in [(0, 0), (1, 10), (2, 30), (3, 5)]],
        *[(t, "a", DEQ, "", "", "b", v) for t, v in [(0, 0), (1, 10), (2, 10), (3, 2)]],
        *[(t, "a", Q, "", "", "b", v) for t, v in [(0, 0), (1, 0), (2, 20), (3, 3)]],
        *[(t, "c", ENQ, "", "", "b", v) for t, v in [(0, 0), (1, 4)]],
        *[(t, "c", DEQ, "", "", "b", v) for t, v in [(0, 0), (1, 4)]],
    ])
    intervals = T.link_intervals(df)
    assertDataFrameEqual(intervals, [
        Row(member="a", peer="b", ts=1.0, enqueued=10.0, dequeued=10.0, queue=0.0, ce=1.0),
        Row(member="a", peer="b", ts=2.0, enqueued=20.0, dequeued=0.0, queue=20.0, ce=None),  # CE infinite
        Row(member="a", peer="b", ts=3.0, enqueued=5.0, dequeued=2.0, queue=3.0, ce=2.5),  # restarted counters
        Row(member="c", peer="b", ts=1.0, enqueued=4.0, dequeued=4.0, queue=0.0, ce=1.0)])
    # delta 2: interval 2 (q 20, nothing dequeued) and 3 (CE 2.5, q 3) are congested, 1 is not (q 0).
    assertDataFrameEqual(T.congestion(intervals, 2.0), [
        Row(member="a", congested=2 / 3, max_queue=20.0), Row(member="c", congested=0.0, max_queue=0.0)])


def test_latency_and_equal_rate_sample(spark):
    df = rows(spark, [(0, "a", RTT, "", "", "b", 0.002), (1, "a", RTT, "", "", "b", 0.004),
                      (0, "b", RTT, "", "", "a", 0.003)])
    assertDataFrameEqual(T.latency(T.gauge_last(df)), [
        Row(member="a", peer="b", rtt=0.003), Row(member="b", peer="a", rtt=0.003)])
    # m0 sampled 4 of 8 (rate 1/2), m1 sent all 3 of 3: m1 is thinned to ceil(3/2) = 2.
    pts = [("q", "m0", "z0", 8, k, [float(k)]) for k in range(4)] + \
          [("q", "m1", "z1", 3, k, [10.0 + k]) for k in range(3)] + [("r", "m1", "y", 2, 0, [1.0])]
    out = T.equal_rate(spark.createDataFrame(pts, T.POINT_SCHEMA))
    assertDataFrameEqual(out, spark.createDataFrame(pts[:4] + pts[4:6] + pts[7:], T.POINT_SCHEMA))


def test_snapshot_rows_round_trip_and_parse_only_the_kept_families(tmp_path):
    text = ('# TYPE echelon_link_queue_length gauge\necho_other 1\n'
            'echelon_link_queue_length{peer="agent-2"} 3.0\n'
            '# TYPE echelon_matcher_zone_events_total counter\n'
            'echelon_matcher_zone_events_total{topic="q",zone="z1"} 7.0\n')
    got = metrics.parse_exposition(text, "agent-1", 5.0)
    assert got == [metrics.Row(5.0, "agent-1", "echelon_link_queue_length", "", "", "agent-2", 3.0),
                   metrics.Row(5.0, "agent-1", "echelon_matcher_zone_events_total", "q", "z1", "", 7.0)]
    path = tmp_path / "m.jsonl"
    assert metrics.write_jsonl(got, path) == 2
    assert list(metrics.read_jsonl(path)) == got
    path.write_text(json.dumps({"ts": 1}) + "\n")
    try:
        list(metrics.read_jsonl(path))
        raise AssertionError("a bad row was read")
    except ValueError as e:
        assert "m.jsonl:1" in str(e)
