"""`echelon replan` and `echelon metrics dump`: the routing job's two commands."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                 "help_option_names": []})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def replan(argv) -> None:
    """Recompute the routing plan from the cluster's metrics and push it (--help for options)."""
    from echelon.replan.main import main

    sys.exit(main(list(argv)))


@click.group()
def metrics() -> None:
    """The cluster's metrics as the routing job reads them."""


@metrics.command()
@click.option("--membership", default="127.0.0.1:7100", show_default=True, help="A membership replica.")
@click.option("--window", default="30s", show_default=True, help="How long to scrape.")
@click.option("--step", default="5s", show_default=True, help="Seconds between scrapes.")
@click.option("--out", required=True, type=click.Path(dir_okay=True, path_type=Path),
              help="Snapshot file: .jsonl, or .parquet (written by Spark).")
def dump(membership, window, step, out) -> None:
    """Scrape every member's /metrics over a window into a snapshot for `replan --snapshot`."""
    from echelon.replan import cluster
    from echelon.replan import metrics as m
    from echelon.replan.main import duration

    if out.suffix not in (".jsonl", ".parquet"):
        raise click.BadParameter("--out must end in .jsonl or .parquet")
    v = cluster.view(membership)
    endpoints = {x.id: x.metrics_address for x in v.members if x.metrics_address and x.state in cluster.ALIVE}
    rows, failed = m.scrape(endpoints, duration(window), duration(step))
    if out.suffix == ".jsonl":
        n = m.write_jsonl(rows, out)
    else:
        from echelon.replan.session import session
        from echelon.replan.transforms import METRIC_SCHEMA

        spark = session()
        spark.createDataFrame([tuple(r.__dict__.values()) for r in rows], METRIC_SCHEMA) \
            .write.mode("overwrite").parquet(str(out))
        n = len(rows)
    click.echo(f"{n} rows from {len(endpoints)} members ({failed} scrapes failed) -> {out}")
