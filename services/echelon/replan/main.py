"""The routing job's thin main: read, aggregate (transforms.py), decide (plan.py), push.

One `main` for every entry point: `echelon replan`, `python -m echelon.replan` and
`spark-submit spark/main.py`. Metrics come from Prometheus (`--prometheus URL`, query_range
over `--window`), from a snapshot (`--snapshot file.jsonl|file.parquet`, written by
`echelon metrics dump`), or else from the services' `/metrics` scraped for `--window`.
The matchers' samples and zones, the view and the plan always come from the cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

from echelon.core.space import Space
from echelon.contract.errors import InvalidArgument
from echelon.contract.wire import schema_from_pb
from echelon.v1 import membership_pb2 as mpb
from echelon.replan import cluster, metrics
from echelon.replan import plan as planning


def duration(text: str) -> float:
    """'90', '90s', '5m', '1h' -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30s, 5m)")
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


def _selector(text: str) -> str:
    try:
        return metrics.check_selector(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="echelon replan", description=__doc__.split("\n\n")[0])
    p.add_argument("--membership", default="127.0.0.1:7100", help="membership replicas (comma list), tried in order")
    p.add_argument("--prometheus", default="", help="Prometheus base URL: metrics by query_range")
    p.add_argument("--selector", default="", type=_selector,
                   help='label matchers naming this release in Prometheus, e.g. namespace="echelon",pod=~"echelon-.*"')
    p.add_argument("--shards", type=int, default=0,
                   help="time shards of the Prometheus window, fetched in parallel by the executors "
                        "(default: Spark's default parallelism, more when a shard would exceed "
                        f"{metrics.SHARD_ROWS:,} rows)")
    p.add_argument("--snapshot", default="", help="metrics from a snapshot file (.jsonl or .parquet)")
    p.add_argument("--window", type=duration, default=duration("5m"), help="metrics window (default 5m)")
    p.add_argument("--step", type=duration, default=None, help="sample step (default: 15s for Prometheus, "
                   "window/4 for scrapes)")
    p.add_argument("--deadline", type=duration, default=0.0,
                   help="stop a run still going after this long: exit 1, reported as failed (default: none)")
    p.add_argument("--dry-run", action="store_true", help="print the table and the plan, push nothing")
    p.add_argument("--master", default=None, help="Spark master (default local[*]; spark-submit sets its own)")
    p.add_argument("--margin", type=float, default=0.1, help="push only if imbalance falls by this share")
    p.add_argument("--max-distance", type=duration, default=duration("50ms"), help="Kyra maxDistance")
    p.add_argument("--max-servers", type=int, default=8, help="Kyra maxNumServers")
    p.add_argument("--delta", type=float, default=8.0, help="queue length above which CE >= 1 is congestion")
    p.add_argument("--max-points", type=int, default=4096, help="sampled subscriptions per topic and matcher")
    p.add_argument("--json", action="store_true", help="print the decision as JSON")
    p.add_argument("--tls-dir", default=os.environ.get("ECHELON_TLS_DIR", ""),
                   help="mTLS certificates (tls.crt, tls.key, ca.crt) of the job (role replan) [env ECHELON_TLS_DIR]")
    p.add_argument("--token", default=os.environ.get("ECHELON_TOKEN", ""),
                   help="bearer token of a cluster admin, for clusters run with --auth [env ECHELON_TOKEN]")
    return p


@dataclass
class Result:
    decision: planning.Decision | None
    pushed: int = 0  # the version pushed, 0 for none
    refused: str = ""  # membership's reason, when it refused the plan
    note: str = ""
    measured: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per stage
    membership: str = ""  # the replica that answered

    @property
    def outcome(self) -> str:
        """What Control.ReportRun is told: pushed, unchanged or refused."""
        return "refused" if self.refused else "pushed" if self.pushed else "unchanged"


def _first_view(addresses: list[str]) -> tuple[str, mpb.View]:
    last: Exception | None = None
    for a in addresses:
        try:
            return a, cluster.view(a)
        except (grpc.RpcError, RuntimeError) as e:
            last = e
    raise RuntimeError(f"no membership replica answered ({', '.join(addresses)}): {last}")


def metric_frame(spark, args, v: mpb.View):
    """The window's metric rows as a DataFrame; MetricsIncomplete when a scrape failed."""
    from echelon.replan.transforms import METRIC_SCHEMA

    endpoints = {m.id: m.metrics_address for m in v.members if m.metrics_address and m.state in cluster.ALIVE}
    if args.snapshot:
        path = Path(args.snapshot)
        if path.suffix == ".parquet" or path.is_dir():
            return spark.read.schema(METRIC_SCHEMA).parquet(str(path))
        rows = list(metrics.read_jsonl(path))
    elif args.prometheus:
        return prometheus_frame(spark, args, {a: m for m, a in endpoints.items()})
    else:
        rows, failed = metrics.scrape(endpoints, args.window, args.step or max(0.5, args.window / 4))
        if failed:
            raise metrics.MetricsIncomplete(f"{failed} scrapes of the members' /metrics failed "
                                            f"(a NetworkPolicy may close the metrics ports to this pod)")
    return spark.createDataFrame([tuple(r.__dict__.values()) for r in rows], METRIC_SCHEMA)


def prometheus_frame(spark, args, instances: dict[str, str], end: float | None = None):
    """The window cut into time shards that the executors fetch from Prometheus in
    parallel (one task each): the rows never pass through the driver, which sees only
    the aggregates the transforms make of them (docs/operations.md, "The routing job").
    The rows are kept on the executors (persisted), so the window is fetched once and every
    aggregate reads the same samples."""
    from pyspark import StorageLevel

    from echelon.replan.transforms import METRIC_SCHEMA

    step = args.step or 15.0
    end = time.time() if end is None else end
    url, selector = args.prometheus, args.selector
    n = args.shards or metrics.shard_count(int(args.window // step) + 1, metrics.series_count(url, end, selector),
                                           spark.sparkContext.defaultParallelism)
    parts = metrics.shards(end - args.window, end, step, n)

    def fetch(shard):
        from echelon.replan import metrics as m  # on the executor

        return m.prometheus_shard(url, shard, step, instances, selector)

    rdd = spark.sparkContext.parallelize(parts, len(parts)).flatMap(fetch)
    return spark.createDataFrame(rdd, METRIC_SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)


def check_complete(frame, required: list[str]) -> None:
    """Every member the plan is about has samples in the window, else MetricsIncomplete."""
    from pyspark.sql import functions as F

    present = {r.member for r in frame.filter(F.col("name") == metrics.PRESENCE).select("member").distinct()
               .collect()}
    absent = metrics.missing(present, required)
    if absent:
        shown = ", ".join(absent[:10]) + (f" and {len(absent) - 10} more" if len(absent) > 10 else "")
        raise metrics.MetricsIncomplete(f"no metrics in the window for {len(absent)} of {len(required)} members "
                                        f"({shown}); nothing decided")


def run(args: argparse.Namespace, spark=None) -> Result:
    from echelon.replan import transforms as T
    from echelon.replan.session import session

    clock = time.perf_counter()
    seconds: dict[str, float] = {}

    def stage(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[name] = now - clock
        clock = now

    cluster.configure(args.tls_dir, args.token)
    address, v = _first_view([a for a in args.membership.split(",") if a])
    current = cluster.current_plan(address)
    matchers = cluster.alive(v, mpb.ROLE_MATCHER)
    if not matchers:
        return Result(None, note="no alive matcher", membership=address)
    layouts = cluster.layouts([m.address for m in matchers])
    if not layouts.settled:
        return Result(None, note="a layout change is still in progress: nothing decided", membership=address)
    samples = [cluster.sample(m.address, args.max_points) for m in matchers]
    stage("cluster")
    spark = spark or session(args.master)
    rows = metric_frame(spark, args, v)
    members = [m.id for m in cluster.alive(v, mpb.ROLE_AGENT, mpb.ROLE_MATCHER, mpb.ROLE_ROUTER)]
    check_complete(rows, members)
    stage("metrics")
    increase, last = T.counter_increase(rows), T.gauge_last(rows)
    measured = {r.member: (r.subscriptions, r.events, r.event_rate) for r in T.matcher_load(increase, last).collect()}
    congested = {r.member: r.congested for r in T.congestion(T.link_intervals(rows), args.delta).collect()}
    rtt = {(r.member, r.peer): r.rtt for r in T.latency(last).collect() if r.rtt is not None}
    point_rows, events = cluster.point_rows(samples)
    points: dict[str, list] = {}
    for r in T.equal_rate(spark.createDataFrame(point_rows, T.POINT_SCHEMA)).orderBy("topic", "member", "zone", "k") \
            .collect():
        points.setdefault(r.topic, []).append(r.coords)
    rows.unpersist()
    stage("aggregate")
    spaces = {}
    for t in v.topics:
        try:
            space = Space.of(schema_from_pb(t.schema))
        except InvalidArgument:
            continue
        if space.dims:
            spaces[t.name] = space
    inputs = planning.Inputs(
        matchers=[m.id for m in matchers], members=members, agents=[m.id for m in cluster.alive(v, mpb.ROLE_AGENT)],
        spaces=spaces, current=current, zones=layouts.zones, sources=layouts.sources,
        points={t: np.asarray(p, dtype=np.float64) for t, p in points.items()}, events=events,
        congested=congested, rtt=rtt, routers=[m.id for m in cluster.alive(v, mpb.ROLE_ROUTER)],
        regions={m.id: m.region for m in v.members})
    settings = planning.Settings(margin=args.margin, max_distance=args.max_distance, max_servers=args.max_servers,
                                 delta=args.delta)
    decision = planning.decide(inputs, settings, current.version + 1)
    stage("decide")
    result = Result(decision, measured=measured, seconds=seconds, membership=address)
    if decision.plan is None or args.dry_run:
        return result
    try:
        result.pushed = cluster.push(address, decision.plan)
    except cluster.PlanRefused as e:
        result.refused = str(e)
    stage("push")
    return result


def report(result: Result, as_json: bool = False) -> str:
    """The table `echelon replan` prints (or the same as JSON)."""
    d = result.decision
    if d is None:
        return json.dumps({"note": result.note}) if as_json else result.note
    matchers = sorted(set(result.measured) | {m for t in d.topics for m in t.load_after})
    rows = []
    for m in matchers:
        subs_now, _, rate_now = result.measured.get(m, (0.0, 0.0, 0.0))
        after_subs = after_rate = 0.0
        for t in d.topics:
            total_b = sum(x.subscriptions for x in t.load_before.values()) or 1.0
            visits_b = sum(x.events for x in t.load_before.values()) or 1.0
            total_subs = sum(result.measured.get(k, (0, 0, 0))[0] for k in matchers)
            total_rate = sum(result.measured.get(k, (0, 0, 0))[2] for k in matchers)
            a = t.load_after.get(m) if t.change else t.load_before.get(m)
            if a:
                after_subs += total_subs * a.subscriptions / total_b
                after_rate += total_rate * a.events / visits_b
        rows.append((m, subs_now, after_subs, rate_now, after_rate))
    out = {
        "matchers": [dict(zip(("matcher", "subscriptions", "subscriptions_after", "zone_events_per_s",
                               "zone_events_per_s_after"), r)) for r in rows],
        "topics": [{"topic": t.topic, "source": t.source, "imbalance": t.before, "imbalance_after": t.after,
                    "change": t.change, "zones": len(t.zones)} for t in d.topics],
        "cliques": d.cliques, "cliques_changed": d.cliques_changed,
        "hints": d.hints, "hints_changed": d.hints_changed,
        "pushed": result.pushed, "refused": result.refused, "seconds": result.seconds,
        "predicted_gain": d.plan.predicted_gain if d.plan else 0.0,
    }
    if as_json:
        return json.dumps(out, indent=2)
    lines = [f"{'matcher':<14}{'subs now':>10}{'subs after':>12}{'zone ev/s now':>15}{'zone ev/s after':>17}"]
    lines += [f"{m:<14}{a:>10.0f}{b:>12.0f}{c:>15.1f}{e:>17.1f}" for m, a, b, c, e in rows]
    lines.append("")
    for t in d.topics:
        verdict = "replace" if t.change else "keep"
        lines.append(f"topic {t.topic} ({t.source}): imbalance {t.before:.2f} -> {t.after:.2f} "
                     f"({len(t.zones)} zones): {verdict}")
    lines.append(f"cliques{' (new)' if d.cliques_changed else ''}: "
                 + ("; ".join(",".join(c) for c in d.cliques) or "none"))
    lines.append(f"bucket hints{' (new)' if d.hints_changed else ''}: " + (", ".join(sorted(d.hints)) or "none"))
    if result.refused:
        lines.append(f"REFUSED by membership: {result.refused} (the cluster keeps plan {d.plan.version - 1 if d.plan else 0})")
    elif result.pushed:
        lines.append(f"pushed plan version {result.pushed} (predicted gain {d.plan.predicted_gain:.0%})")
    elif d.plan is None:
        lines.append("nothing to push: no plan beats the current one by the margin")
    else:
        lines.append(f"dry run: would push plan version {d.plan.version}")
    lines.append("stages: " + ", ".join(f"{k} {v:.1f}s" for k, v in result.seconds.items()))
    return "\n".join(lines)


def tell(addresses: list[str], result: str, reason: str = "") -> None:
    """Control.ReportRun to the first replica that takes it; a run that cannot be reported
    is still the run it was (the stale-job alert covers a job that never reaches membership)."""
    last: Exception | None = None
    for a in addresses:
        try:
            cluster.report_run(a, result, reason)
            return
        except grpc.RpcError as e:
            last = e
    print(f"replan: could not report the run ({result}) to membership: {last or 'no address'}",
          file=sys.stderr)


def execute(args: argparse.Namespace, spark, out=None) -> int:
    """One run on `spark`, printed and reported to membership. 0: a plan pushed or none
    needed; 1: the run failed (nothing pushed; reported as a failed run); 2: membership
    refused the plan."""
    addresses = [a for a in args.membership.split(",") if a]
    try:
        result = run(args, spark)
    except Exception as e:  # noqa: BLE001 - any failure is a failed run, reported (a Spark task's too)
        print(f"replan failed: {type(e).__name__}: {str(e)[:2000]}", file=sys.stderr)
        tell(addresses, "failed", str(e))
        return 1
    print(report(result, args.json), file=out)
    tell([result.membership] if result.membership else addresses, result.outcome, result.refused)
    return 2 if result.refused else 0


def deadline(seconds: float, addresses: list[str]) -> threading.Timer:
    """A watchdog: past `seconds`, report the run as failed and end the process (a hung
    Spark stage or RPC holds no lock the exit needs; under spark-submit the JVM follows)."""
    def expire() -> None:
        print(f"replan failed: still running after its deadline of {seconds:.0f}s", file=sys.stderr)
        tell(addresses, "failed", f"deadline of {seconds:.0f}s passed")
        os._exit(1)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer


def main(argv: list[str] | None = None) -> int:
    from echelon.replan.session import session

    args = parser().parse_args(argv)
    if args.deadline:
        deadline(args.deadline, [a for a in args.membership.split(",") if a])
    spark = session(args.master)
    try:
        return execute(args, spark)
    finally:
        spark.stop()  # before the interpreter exits: the JVM's last tasks still talk to it


if __name__ == "__main__":
    sys.exit(main())
