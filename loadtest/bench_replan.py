"""The routing job at scale: synthetic metric rows -> a plan, side by side in one run:

- pandas/numpy (the rows in memory),
- Spark local[2] from the rows at rest (the Parquet snapshot `--snapshot` reads),
- Spark local[2] on the production ingest path: the executors fetch time shards of the
  window from a real Prometheus (Debian's `prometheus`, loaded with the same samples by
  `promtool tsdb create-blocks-from openmetrics`, loadtest/prom_backfill.py) with the job's
  own `prometheus_frame`,
- both again on a standalone Spark cluster started here from the pyspark wheel (a master
  and two one-core workers, loadtest/spark_standalone.py), stopped by pid after.

    python -m loadtest.bench_replan [--rows 1000000,10000000 | --quick] [--master local[2]]
                                    [--no-standalone] [--no-prometheus] [--out DIR]

The rows are the job's own schema (spark/metrics.py): 200 agents with 16 outgoing links
each (enqueued/dequeued counters, queue length, round trip) and 16 matchers with 32 zones
each (zone events counter, zone subscriptions gauge), scraped once a second until the rows
add up (whole scrapes, so every series has every time of the window and Prometheus' lookback
adds no sample). Every value is a formula of (series, scrape), so every engine gets the same
rows: Spark generates them with `range` and writes Parquet; pandas gets numpy columns;
Prometheus gets them as OpenMetrics text. The stages are the job's transforms (counter
increase, gauge last/mean, matcher load, OctopiA CE per link and interval, latency), then the
same decision on their output (zones from a stock sample of 4 x 4096 points, Kyra cliques
over the 216 x 16 latencies, bucket hints). Every engine's answers are checked equal.
Prints wall time per stage and rows/s, then each engine's job (rows at rest -> plan,
session start included) with its ratio to pandas and to local[2] from Parquet; the target
is under 60 s on local[2] from the snapshot. Generating the rows and loading Prometheus is
timed but not part of the job. Results in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
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


class Timings(list):
    """(engine, stage, seconds) in the order they ran."""

    def timed(self, engine: str, stage: str, fn):
        start = time.perf_counter()
        out = fn()
        self.append((engine, stage, time.perf_counter() - start))
        print(f"  ... {engine}: {stage} {self[-1][2]:.1f}s", file=sys.stderr, flush=True)  # a long run's progress
        return out


def spark_answers(out: dict) -> tuple[dict, dict, dict]:
    return ({r.member: r.subscriptions for r in out["matcher_load"]}, {r.member: r.congested for r in out["congestion"]},
            {(r.member, r.peer): r.rtt for r in out["latency"]})


def check_same(out: dict, plan: dict, ref: dict, ref_plan: dict, what: str) -> None:
    """`out` (spark_transforms) gives the reference's answers, to float rounding."""
    (load, cong, rtt), (r_load, r_cong, r_rtt) = spark_answers(out), spark_answers(ref)
    assert (out["increase"], out["last"]) == (ref["increase"], ref["last"]), what
    assert load.keys() == r_load.keys() and all(abs(load[k] - r_load[k]) < 1e-6 for k in load), what
    assert cong.keys() == r_cong.keys() and all(abs(cong[k] - r_cong[k]) < 1e-9 for k in cong), what
    assert rtt.keys() == r_rtt.keys() and all(abs(rtt[k] - r_rtt[k]) < 1e-12 for k in rtt), what
    assert plan == ref_plan, (what, plan, ref_plan)


@dataclass
class Source:
    """Where the rows are at rest: the Parquet snapshot, and Prometheus holding the same
    samples at times base + t (the job's answers do not depend on the origin of time)."""

    parquet: Path
    prometheus: str = ""
    base: int = 0
    scrapes: int = 0
    shards: int = 0


def run_spark(spark, engine: str, src: Source, timings: Timings, ref: dict | None, ref_plan: dict | None):
    """The job's transforms and decision on `spark`, from the Parquet rows and (given a
    Prometheus) from query_range shards the executors fetch, as the job does in production.
    Returns the Parquet run's answers; every run must give `ref`'s when one is given."""
    from echelon.replan.main import parser, prometheus_frame
    from echelon.replan.transforms import METRIC_SCHEMA

    df = spark.read.schema(METRIC_SCHEMA).parquet(str(src.parquet))
    out = timings.timed(f"{engine} parquet", "transforms", lambda: spark_transforms(df))
    plan = timings.timed(f"{engine} parquet", "decide", lambda: decide(*spark_answers(out)))
    ref, ref_plan = ref or out, ref_plan or plan
    check_same(out, plan, ref, ref_plan, f"{engine} parquet")
    if src.prometheus:
        argv = ["--prometheus", src.prometheus, "--window", f"{src.scrapes - 1}s", "--step", "1s"]
        args = parser().parse_args(argv + (["--shards", str(src.shards)] if src.shards else []))
        end = src.base + src.scrapes - 1
        name = f"{engine} prometheus"

        def fetch():
            frame = prometheus_frame(spark, args, {}, end=end)
            frame.count()  # the shards fetched by the executors and kept there
            return frame

        frame = timings.timed(name, "fetch (executors)", fetch)
        p_out = timings.timed(name, "transforms", lambda: spark_transforms(frame))
        p_plan = timings.timed(name, "decide", lambda: decide(*spark_answers(p_out)))
        check_same(p_out, p_plan, ref, ref_plan, name)
        timings.append((name, f"shards: {frame.rdd.getNumPartitions()}", 0.0))
        frame.unpersist()
    return out, plan


def run(n: int, master: str, workdir: Path, standalone: bool = False, prom_root: Path | None = None,
        shards: int = 0) -> Timings:
    """One size: pandas, Spark on `master` (and on a standalone cluster), each from the
    Parquet rows and from Prometheus when `prom_root` is given. `n` is whole scrapes."""
    from echelon.replan.session import session

    table = series_table()
    timings = Timings()
    timings.append(("load average", "start", os.getloadavg()[0]))
    src = Source(workdir / "rows.parquet")
    prom = None
    if prom_root is not None:
        from loadtest import prom_backfill

        s = len(table["name"])
        src.scrapes, src.shards = n // s, shards
        # Yesterday's midnight (UTC): a rerun the same day finds the samples on disk, and
        # they fall in one of Prometheus' two-hour blocks.
        src.base = (int(time.time()) // 86400 - 1) * 86400
        counter = np.char.endswith(table["name"], "_total").astype(np.float64)
        rtt = (table["name"] == "echelon_peer_rtt_seconds").astype(np.float64)
        timings.timed("prometheus", "backfill (promtool)", lambda: prom_backfill.load(
            prom_root, table, src.scrapes, src.base, lambda sid, t: value(sid, t, counter[sid], rtt[sid])))
        prom = prom_backfill.serve(prom_root)
        src.prometheus = prom.url
    try:
        label = f"spark {master}"
        spark = timings.timed(label, "start session", lambda: session(master, "bench-replan"))
        timings.timed(label, "generate -> parquet", lambda: spark_rows(spark, n, table, src.parquet))
        s_out, s_plan = run_spark(spark, label, src, timings, None, None)
        spark.stop()

        pdf = timings.timed("pandas", "generate", lambda: pandas_rows(n, table))
        p_out = timings.timed("pandas", "transforms", lambda: pandas_transforms(pdf))
        del pdf
        p_load = p_out["matcher_load"]["subscriptions"].to_dict()
        p_cong = p_out["congestion"]["congested"].to_dict()
        p_rtt = {(r.member, r.peer): r.mean for r in p_out["latency"].itertuples()}
        p_plan = timings.timed("pandas", "decide", lambda: decide(p_load, p_cong, p_rtt))
        # pandas must give Spark's answers.
        s_load, s_cong, s_rtt = spark_answers(s_out)
        assert s_out["increase"] == len(p_out["increase"]) and s_out["last"] == len(p_out["last"])
        assert s_load.keys() == p_load.keys() and all(abs(s_load[k] - p_load[k]) < 1e-6 for k in s_load)
        assert s_cong.keys() == p_cong.keys() and all(abs(s_cong[k] - p_cong[k]) < 1e-9 for k in s_cong)
        assert s_rtt.keys() == p_rtt.keys() and all(abs(s_rtt[k] - p_rtt[k]) < 1e-12 for k in s_rtt)
        assert s_plan == p_plan, (s_plan, p_plan)
        if standalone:
            run_standalone(workdir, src, timings, s_out, s_plan)
    finally:
        if prom is not None:
            prom.stop()
    timings.append(("load average", "end", os.getloadavg()[0]))
    return timings


STANDALONE = "spark standalone 2x1"


def run_standalone(workdir: Path, src: Source, timings: Timings, ref: dict, ref_plan: dict) -> None:
    """The same runs on a master and two one-core workers started here from the pyspark
    wheel (loadtest/spark_standalone.py), stopped by pid after."""
    from echelon.replan.session import session
    from loadtest.spark_standalone import Standalone

    with Standalone(workdir / "standalone", workers=2) as cluster:
        conf = dict(c.split("=", 1) for c in cluster.conf()[1::2])
        spark = timings.timed(STANDALONE, "start session", lambda: session(cluster.master_url, "bench-replan", conf))
        assert spark.sparkContext.master == cluster.master_url, spark.sparkContext.master
        run_spark(spark, STANDALONE, src, timings, ref, ref_plan)
        spark.stop()


# What each row's job is: from rows at rest to a plan. Generating the rows (and loading
# Prometheus) is the fixture; a session's start counts for each of its rows.
def jobs(timings: Timings) -> dict[str, float]:
    starts = {e: s for e, st, s in timings if st == "start session"}
    out: dict[str, float] = {}
    for engine, stage, s in timings:
        if stage in ("transforms", "decide", "fetch (executors)"):
            out[engine] = out.get(engine, 0.0) + s
    for engine in out:
        out[engine] += next((v for k, v in starts.items() if engine.startswith(k + " ")), 0.0)
    return out


def report(results: dict[int, Timings], master: str) -> str:
    lines = []
    for n, timings in results.items():
        load = " -> ".join(f"{v:.1f}" for e, st, v in timings if e == "load average")
        lines.append(f"{n:,} metric rows ({n // len(series_table()['name'])} scrapes of "
                     f"{len(series_table()['name']):,} series): stages; machine load average {load}")
        lines.append(f"  {'engine':<32}{'stage':<24}{'seconds':>9}{'rows/s':>14}")
        for engine, stage, s in timings:
            if engine == "load average":
                continue
            if stage.startswith("shards"):
                lines.append(f"  {engine:<32}{stage:<24}")
                continue
            rate = f"{n / s:,.0f}" if stage in ("transforms", "generate -> parquet", "generate",
                                                "fetch (executors)") else "-"
            lines.append(f"  {engine:<32}{stage:<24}{s:>9.2f}{rate:>14}")
        lines.append("")
    local = f"spark {master} parquet"
    lines.append("The job, rows at rest -> plan (session start + fetch + transforms + decide), side by side; "
                 "same answers checked")
    lines.append(f"{'rows':>12}  {'engine':<34}{'seconds':>9}{'rows/s':>13}{'x pandas':>10}{'x ' + local:>32}")
    for n, timings in results.items():
        job = jobs(timings)
        for engine, s in job.items():
            lines.append(f"{n:>12,}  {engine:<34}{s:>9.2f}{n / s:>13,.0f}{s / job['pandas']:>10.2f}"
                         f"{s / job[local]:>32.2f}")
        verdict = "PASS" if job[local] < 60 else "FALLS SHORT"
        lines.append(f"{'':>12}  target < 60 s on {master} from the Parquet snapshot: {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1000000,10000000",
                   help="comma-separated sizes, each rounded up to whole scrapes of every series")
    p.add_argument("--quick", action="store_true", help="1M rows only")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--out", type=Path, default=Path("out/bench_replan"))
    p.add_argument("--no-standalone", dest="standalone", action="store_false",
                   help="leave out the standalone master + 2 workers")
    p.add_argument("--no-prometheus", dest="prometheus", action="store_false",
                   help="leave out the production ingest path (executors fetching from a real Prometheus)")
    p.add_argument("--shards", type=int, default=0, help="the job's --shards (default: its own choice)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    s = len(series_table()["name"])
    sizes = [1_000_000] if args.quick else [int(x) for x in args.rows.split(",")]
    sizes = [-(-n // s) * s for n in sizes]
    results: dict[int, Timings] = {}
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            prom_root = args.out / f"prometheus-{n}" if args.prometheus else None
            results[n] = run(n, args.master, Path(tmp), args.standalone, prom_root, args.shards)
        print(report({n: results[n]}, args.master), flush=True)
        print(flush=True)
    if len(results) > 1:
        print(report(results, args.master).split("\n\n")[-1])
    (args.out / "bench_replan.json").write_text(json.dumps(
        {"master": args.master, "runs": {str(n): {"timings": t, "jobs": jobs(t)} for n, t in results.items()}},
        indent=2))


if __name__ == "__main__":
    main()
