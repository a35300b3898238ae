"""The routing job at scale: 10M synthetic metric rows -> a plan, on Spark local[2] and in
plain pandas/numpy, side by side in one run.

    python -m loadtest.bench_replan [--rows 10000000] [--master local[2]] [--standalone] [--out DIR]

With --standalone the same Parquet rows also go through the job's transforms on a standalone
Spark cluster started here from the pyspark wheel (a master and two one-core workers,
loadtest/spark_standalone.py), beside local[2] and pandas, with the same answers checked.

The rows are the job's own schema (spark/metrics.py): 200 agents with 16 outgoing links
each (enqueued/dequeued counters, queue length, round trip) and 16 matchers with 32 zones
each (zone events counter, zone subscriptions gauge), scraped until the rows add up.
Every value is a formula of (series, scrape), so both engines get the same rows: Spark
generates them with `range` and writes Parquet (the snapshot format); pandas gets numpy
columns. The stages are the job's transforms (counter increase, gauge last/mean, matcher
load, OctopiA CE per link and interval, latency), then the same decision on their output
(zones from a stock sample of 4 x 4096 points, Kyra cliques over the 216 x 16 latencies,
bucket hints). Both engines' answers are checked equal. Prints wall time per stage and
rows/s; the target is under 60 s from rows at rest (the Parquet snapshot) to a plan on
local[2], JVM start included; generating the rows is timed but not part of the job.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

AGENTS, PEERS, MATCHERS, ZONES = 200, 16, 16, 32
LINK = ["echelon_link_enqueued_total", "echelon_link_dequeued_total", "echelon_link_queue_length",
        "echelon_peer_rtt_seconds"]
ZONE = ["echelon_matcher_zone_events_total", "echelon_matcher_zone_subscriptions"]


def series_table() -> dict[str, np.ndarray]:
    """One row per series: member, name, topic, zone, peer (strings) and its index."""
    cols: dict[str, list] = {k: [] for k in ("member", "name", "topic", "zone", "peer")}
    for a in range(AGENTS):
        for j in range(PEERS):
            for n in LINK:
                cols["member"].append(f"agent-{a}")
                cols["name"].append(n)
                cols["topic"].append("")
                cols["zone"].append("")
                cols["peer"].append(f"agent-{(a + 1 + j * 7) % AGENTS}")
    for m in range(MATCHERS):
        for z in range(ZONES):
            for n in ZONE:
                cols["member"].append(f"matcher-{m}")
                cols["name"].append(n)
                cols["topic"].append("quotes")
                cols["zone"].append(f"z{m * ZONES + z}")
                cols["peer"].append("")
    return {k: np.array(v) for k, v in cols.items()}


def value(sid: np.ndarray, t: np.ndarray, counter: np.ndarray, rtt: np.ndarray):
    """The sample of series `sid` at scrape `t` (numpy or Spark columns alike)."""
    return (counter * (t * (sid % 7 + 1) + (sid * t) % 3)
            + (1 - counter) * (1 - rtt) * ((sid * 31 + t * 17) % 50)
            + rtt * (0.001 + ((sid * 13 + t) % 10) * 0.0001))


def spark_rows(spark, n: int, table: dict[str, np.ndarray], path: Path):
    from pyspark.sql import functions as F

    from echelon.replan.transforms import METRIC_SCHEMA

    s = len(table["member"])
    names = table["name"]
    series = spark.createDataFrame(
        [(i, *(str(table[k][i]) for k in ("member", "name", "topic", "zone", "peer")),
          float(names[i].endswith("_total")), float(names[i] == "echelon_peer_rtt_seconds")) for i in range(s)],
        "sid long, member string, name string, topic string, zone string, peer string, counter double, "
        "rtt double")
    ids = spark.range(n).select((F.col("id") % s).alias("sid"), (F.col("id") / s).cast("long").alias("t"))
    df = ids.join(F.broadcast(series), "sid")
    df = df.select(F.col("t").cast("double").alias("ts"), "member", "name", "topic", "zone", "peer",
                   value(F.col("sid"), F.col("t"), F.col("counter"), F.col("rtt")).cast("double").alias("value"))
    df.write.mode("overwrite").parquet(str(path))
    return spark.read.schema(METRIC_SCHEMA).parquet(str(path))


def pandas_rows(n: int, table: dict[str, np.ndarray]):
    import pandas as pd

    s = len(table["member"])
    ids = np.arange(n, dtype=np.int64)
    sid, t = ids % s, ids // s
    counter = np.char.endswith(table["name"], "_total").astype(np.float64)[sid]
    rtt = (table["name"] == "echelon_peer_rtt_seconds").astype(np.float64)[sid]
    cols = {"ts": t.astype(np.float64), "sid": sid}
    df = pd.DataFrame(cols)
    for k in ("member", "name", "topic", "zone", "peer"):
        cat = pd.Categorical(table[k])
        df[k] = pd.Categorical.from_codes(cat.codes[sid], cat.categories)
    df["value"] = value(sid, t, counter, rtt).astype(np.float64)
    return df


def pandas_transforms(df) -> dict:
    """The job's transforms in pandas/numpy: same definitions as spark/transforms.py."""
    import pandas as pd

    out = {}
    df = df.sort_values(["sid", "ts"], kind="stable")
    counters = df[df["name"].str.endswith("_total").to_numpy()]
    v, first = counters["value"].to_numpy(), np.r_[True, counters["sid"].to_numpy()[1:] != counters["sid"].to_numpy()[:-1]]
    prev = np.r_[np.nan, v[:-1]]
    delta = np.where(first, 0.0, np.where(v >= prev, v - prev, v))
    g = counters.assign(delta=delta).groupby("sid", sort=True)
    inc = pd.DataFrame({"increase": g["delta"].sum(), "seconds": g["ts"].max() - g["ts"].min()})
    inc["rate"] = np.where(inc["seconds"] > 0, inc["increase"] / inc["seconds"].where(inc["seconds"] > 0, 1), 0.0)
    out["increase"] = inc
    gauges = df[~df["name"].str.endswith("_total").to_numpy()]
    gg = gauges.groupby("sid", sort=True)
    out["last"] = pd.DataFrame({"last": gg["value"].last(), "mean": gg["value"].mean()})
    meta = df.drop_duplicates("sid").set_index("sid")
    zev = inc.join(meta)[lambda x: x["name"] == "echelon_matcher_zone_events_total"]
    zsub = out["last"].join(meta)[lambda x: x["name"] == "echelon_matcher_zone_subscriptions"]
    out["matcher_load"] = pd.DataFrame({"subscriptions": zsub.groupby("member", observed=True)["last"].sum(),
                                        "events": zev.groupby("member", observed=True)["increase"].sum()})
    # CE per link and interval: enqueued/dequeued deltas beside the queue length.
    link = df[df["name"].isin(LINK[:3]).to_numpy()]
    wide = link.pivot_table(index=["member", "peer", "ts"], columns="name", values="value", observed=True)
    wide = wide.reset_index().sort_values(["member", "peer", "ts"])
    key = wide["member"].astype(str) + "|" + wide["peer"].astype(str)
    firstl = np.r_[True, key.to_numpy()[1:] != key.to_numpy()[:-1]]
    deltas = {}
    for col in LINK[:2]:
        x = wide[col].to_numpy()
        p = np.r_[np.nan, x[:-1]]
        deltas[col] = np.where(x >= p, x - p, x)
    q = wide[LINK[2]].fillna(0).to_numpy()
    enq, deq = deltas[LINK[0]], deltas[LINK[1]]
    with np.errstate(divide="ignore", invalid="ignore"):
        ce = np.where(deq > 0, enq / deq, np.inf)
    congested = (q > 8.0) & (ce >= 1) & (q > 0)
    per_link = pd.DataFrame({"key": key, "member": wide["member"], "c": congested.astype(float),
                             "q": q})[~firstl].groupby(["member", "key"], observed=True).agg(c=("c", "mean"), q=("q", "max"))
    out["congestion"] = per_link.groupby("member", observed=True).agg(congested=("c", "max"), max_queue=("q", "max"))
    rttrows = out["last"].join(meta)[lambda x: x["name"] == "echelon_peer_rtt_seconds"]
    out["latency"] = rttrows[["member", "peer", "mean"]]
    return out


def spark_transforms(df) -> dict:
    from echelon.replan import transforms as T

    inc, last = T.counter_increase(df).cache(), T.gauge_last(df).cache()
    return {"matcher_load": T.matcher_load(inc, last).collect(),
            "congestion": T.congestion(T.link_intervals(df), 8.0).collect(),
            "latency": T.latency(last).collect(), "increase": inc.count(), "last": last.count()}


def decide(load: dict, congestion: dict, rtt: dict) -> dict:
    """The pure part: zones on a stock sample, Kyra cliques, hints (spark/plan.py)."""
    from echelon.core import kyra, zoning
    from echelon.core.space import Space
    from loadtest import stock

    space = Space.of(stock.STOCK_SCHEMA)
    pts = np.array([space.subscription_point(f) for f in stock.subscriptions(4 * 4096, seed=1)])
    evs = np.array([space.event_point(e) for e in stock.events(4096, seed=2)])
    matchers = sorted(load)[:4]
    zones = zoning.plan_zones(space, pts, evs, matchers)
    members = sorted({a for a, _ in rtt} | {b for _, b in rtt})
    idx = {m: i for i, m in enumerate(members)}
    m = np.full((len(members), len(members)), np.nan)
    for (a, b), v in rtt.items():
        m[idx[a], idx[b]] = v
    cliques = kyra.cliques(m, 0.0015, 8)
    hints = sorted(a for a, c in congestion.items() if c >= 0.5)
    return {"zones": len(zones), "cliques": len(cliques), "hints": len(hints)}


def run(n: int, master: str, workdir: Path, standalone: bool = False) -> list[tuple[str, str, float]]:
    from echelon.replan.session import session

    table = series_table()
    timings: list[tuple[str, str, float]] = []

    def timed(engine: str, stage: str, fn):
        start = time.perf_counter()
        out = fn()
        timings.append((engine, stage, time.perf_counter() - start))
        return out

    spark = timed("spark", "start session", lambda: session(master, "bench-replan"))
    df = timed("spark", "generate -> parquet", lambda: spark_rows(spark, n, table, workdir / "rows.parquet"))
    s_out = timed("spark", "transforms", lambda: spark_transforms(df))
    s_load = {r.member: r.subscriptions for r in s_out["matcher_load"]}
    s_cong = {r.member: r.congested for r in s_out["congestion"]}
    s_rtt = {(r.member, r.peer): r.rtt for r in s_out["latency"]}
    s_plan = timed("spark", "decide", lambda: decide(s_load, s_cong, s_rtt))

    pdf = timed("pandas", "generate", lambda: pandas_rows(n, table))
    p_out = timed("pandas", "transforms", lambda: pandas_transforms(pdf))
    p_load = p_out["matcher_load"]["subscriptions"].to_dict()
    p_cong = p_out["congestion"]["congested"].to_dict()
    p_rtt = {(r.member, r.peer): r.mean for r in p_out["latency"].itertuples()}
    p_plan = timed("pandas", "decide", lambda: decide(p_load, p_cong, p_rtt))

    # Both engines must give the same answers.
    assert s_out["increase"] == len(p_out["increase"]) and s_out["last"] == len(p_out["last"])
    assert s_load.keys() == p_load.keys() and all(abs(s_load[k] - p_load[k]) < 1e-6 for k in s_load)
    assert s_cong.keys() == p_cong.keys() and all(abs(s_cong[k] - p_cong[k]) < 1e-9 for k in s_cong)
    assert s_rtt.keys() == p_rtt.keys() and all(abs(s_rtt[k] - p_rtt[k]) < 1e-12 for k in s_rtt)
    assert s_plan == p_plan, (s_plan, p_plan)
    spark.stop()
    if standalone:
        timings += run_standalone(workdir, s_out, s_plan)
    return timings


def run_standalone(workdir: Path, local_out: dict, local_plan: dict) -> list[tuple[str, str, float]]:
    """The job's transforms on the rows at rest, on a master and two workers of this machine."""
    from echelon.replan.session import session
    from loadtest.spark_standalone import Standalone

    timings: list[tuple[str, str, float]] = []
    with Standalone(workdir / "standalone", workers=2) as cluster:
        conf = dict(c.split("=", 1) for c in cluster.conf()[1::2])
        engine = "spark standalone 2x1"
        start = time.perf_counter()
        spark = session(cluster.master_url, "bench-replan", conf)
        timings.append((engine, "start session", time.perf_counter() - start))
        assert spark.sparkContext.master == cluster.master_url, spark.sparkContext.master
        df = spark.read.parquet(str(workdir / "rows.parquet"))
        start = time.perf_counter()
        out = spark_transforms(df)
        timings.append((engine, "transforms", time.perf_counter() - start))
        start = time.perf_counter()
        plan = decide({r.member: r.subscriptions for r in out["matcher_load"]},
                      {r.member: r.congested for r in out["congestion"]},
                      {(r.member, r.peer): r.rtt for r in out["latency"]})
        timings.append((engine, "decide", time.perf_counter() - start))
        assert plan == local_plan and out["increase"] == local_out["increase"], (plan, local_plan)
        spark.stop()
    return timings


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--out", type=Path, default=Path("out/bench_replan"))
    p.add_argument("--standalone", action="store_true", help="also on a standalone master + 2 workers started here")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        timings = run(args.rows, args.master, Path(tmp), args.standalone)
    # The job's own work: from rows at rest to a plan. Generating the rows is the test
    # fixture (Spark writes the Parquet snapshot the job reads; pandas builds them in memory).
    job = {"spark": ("start session", "transforms", "decide"), "pandas": ("transforms", "decide")}
    if args.standalone:
        job["spark standalone 2x1"] = ("start session", "transforms", "decide")
    total = {e: sum(s for en, st, s in timings if en == e and st in job[e]) for e in job}
    print(f"{args.rows:,} metric rows, Spark {args.master} beside pandas/numpy (same rows, same answers)")
    print(f"{'engine':<22}{'stage':<22}{'seconds':>9}{'rows/s':>14}")
    for engine, stage, s in timings:
        rate = f"{args.rows / s:,.0f}" if stage in ("transforms", "generate -> parquet", "generate") else "-"
        print(f"{engine:<22}{stage:<22}{s:>9.2f}{rate:>14}")
    for e, s in total.items():
        print(f"{e:<22}{'job: ' + ' + '.join(job[e]):<40}{s:>9.2f}{args.rows / s:>14,.0f}")
    ratio = total["spark"] / total["pandas"]
    verdict = "PASS" if total["spark"] < 60 else "FALLS SHORT"
    print(f"spark / pandas wall time of the job: {ratio:.2f}x; target < 60 s (rows at rest -> plan) on "
          f"{args.master}: {verdict}")
    (args.out / "bench_replan.json").write_text(json.dumps({"rows": args.rows, "timings": timings}, indent=2))


if __name__ == "__main__":
    main()
