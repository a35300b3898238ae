"""`echelon replan` and `echelon metrics dump`: the routing job's two commands.

`replan` runs the job (echelon/replan/main.py, the same `run` spark-submit's entry
calls) in this process. Spark's own logging (the log4j banner, "Python worker exited
unexpectedly" lines that a finished Python worker leaves) goes to a log file unless
--verbose; the command prints its table, and on a failure where that log is.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from argparse import ArgumentTypeError
from pathlib import Path

import click

from echelon.cli.common import MEMBERSHIP_OPTION, TLS, TOKEN, _meta


def _duration(ctx, param, value):
    from echelon.replan.main import duration

    if value is None:
        return None
    try:
        return duration(value)
    except ArgumentTypeError as e:
        raise click.BadParameter(str(e)) from None


@contextlib.contextmanager
def _spark_quiet(verbose: bool):
    """The process's stderr (fd 2, which the JVM inherits) into a log file while Spark runs."""
    if verbose:
        yield None
        return
    log = tempfile.NamedTemporaryFile(prefix="echelon-replan-", suffix=".log", delete=False)
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    try:
        yield log.name
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        log.close()


@click.command()
@MEMBERSHIP_OPTION
@click.option("--prometheus", default="", help="Prometheus' URL: metrics by query_range (default: scrape the "
                                              "services' /metrics for --window).")
@click.option("--snapshot", default="", help="Metrics from a snapshot file (.jsonl or .parquet) that "
                                             "`echelon metrics dump` wrote.")
@click.option("--window", default="5m", show_default=True, callback=_duration, help="Metrics window (30s, 5m, 1h).")
@click.option("--step", default=None, callback=_duration,
              help="Sample step (default: 15s from Prometheus, window/4 for scrapes).")
@click.option("--dry-run", is_flag=True, help="Print the table and the plan; push nothing.")
@click.option("--master", default=None, help="Spark master (default local[*]).")
@click.option("--margin", default=0.1, show_default=True, type=click.FloatRange(0, 1),
              help="Push only if the imbalance falls by this share.")
@click.option("--max-distance", default="50ms", show_default=True, callback=_duration, help="Kyra maxDistance.")
@click.option("--max-servers", default=8, show_default=True, type=click.IntRange(1), help="Kyra maxNumServers.")
@click.option("--delta", default=8.0, show_default=True, type=click.FloatRange(0),
              help="Queue length above which CE >= 1 is congestion.")
@click.option("--max-points", default=4096, show_default=True, type=click.IntRange(1),
              help="Sampled subscriptions per topic and matcher.")
@click.option("--json", "as_json", is_flag=True, help="The decision as JSON.")
@click.option("--verbose", "-v", is_flag=True, help="Let Spark's own log through to stderr.")
@TLS
@TOKEN
def replan(addresses, prometheus, snapshot, window, step, dry_run, master, margin, max_distance, max_servers, delta,
           max_points, as_json, verbose) -> None:
    """Recompute the routing plan from the cluster's metrics and push it (docs/operations.md,
    "The routing job"). Exit 2 when membership refused the plan."""
    import grpc

    from echelon.replan.main import parser, report, run

    args = parser().parse_args([])
    for k, v in dict(membership=",".join(addresses), prometheus=prometheus, snapshot=snapshot, window=window,
                     step=step, dry_run=dry_run, master=master, margin=margin, max_distance=max_distance,
                     max_servers=max_servers, delta=delta, max_points=max_points, json=as_json,
                     tls_dir=_meta("tls_dir") or "", token=_meta("token") or "").items():
        setattr(args, k, v)
    with _spark_quiet(verbose) as log:
        from echelon.replan.session import session

        error = None
        spark = session(master)
        try:
            result = run(args, spark)
        except (RuntimeError, ValueError, OSError, grpc.RpcError) as e:
            error = e
        finally:
            spark.stop()  # before the interpreter exits: the JVM's last tasks still talk to it
    if error is not None:
        details = error.details() if isinstance(error, grpc.RpcError) else str(error)
        raise click.ClickException(f"replan failed: {details}" + (f" (Spark's log: {log})" if log else ""))
    if log:
        with contextlib.suppress(OSError):
            os.unlink(log)
    click.echo(report(result, as_json))
    sys.exit(2 if result.refused else 0)


@click.group()
def metrics() -> None:
    """The cluster's metrics as the routing job reads them."""


@metrics.command()
@MEMBERSHIP_OPTION
@click.option("--window", default="30s", show_default=True, help="How long to scrape.")
@click.option("--step", default="5s", show_default=True, help="Seconds between scrapes.")
@click.option("--out", required=True, type=click.Path(dir_okay=True, path_type=Path),
              help="Snapshot file: .jsonl, or .parquet (written by Spark).")
def dump(addresses, window, step, out) -> None:
    """Scrape every member's /metrics over a window into a snapshot for `replan --snapshot`."""
    from echelon.replan import cluster
    from echelon.replan import metrics as m
    from echelon.replan.main import duration

    if out.suffix not in (".jsonl", ".parquet"):
        raise click.BadParameter("--out must end in .jsonl or .parquet")
    v = cluster.view(addresses[0])
    endpoints = {x.id: x.metrics_address for x in v.members if x.metrics_address and x.state in cluster.ALIVE}
    rows, failed = m.scrape(endpoints, duration(window), duration(step))
    if out.suffix == ".jsonl":
        n = m.write_jsonl(rows, out)
    else:
        from echelon.replan.session import session
        from echelon.replan.transforms import METRIC_SCHEMA

        with _spark_quiet(False):
            spark = session()
            spark.createDataFrame([tuple(r.__dict__.values()) for r in rows], METRIC_SCHEMA) \
                .write.mode("overwrite").parquet(str(out))
        n = len(rows)
    click.echo(f"{n} rows from {len(endpoints)} members ({failed} scrapes failed) -> {out}")
