"""`python -m loadtest.chaos`: run the fault schedule and print the report."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from loadtest.chaos.config import Config
from loadtest.chaos.runner import run


@click.command()
@click.option("--minutes", default=5.0, type=click.FloatRange(0.5, 120), show_default=True,
              help="How long the workload runs while faults are injected.")
@click.option("--agents", default=6, type=click.IntRange(4, 20), show_default=True)
@click.option("--producers", default=3, type=click.IntRange(1, 8), show_default=True)
@click.option("--rate", default=Config.rate, type=click.FloatRange(1, 1000), show_default=True,
              help="Messages per second per producer.")
@click.option("--partition-seconds", default=10.0, type=click.FloatRange(1, 120), show_default=True)
@click.option("--short", is_flag=True, help="The CI schedule: one of each fault, shorter.")
@click.option("--loopback", is_flag=True, help="Run on loopback even where namespaces work (no partition, netem).")
@click.option("--wipe-disk", is_flag=True, help="A killed agent restarts with an empty data dir (node loss).")
@click.option("--tls/--no-tls", default=True, show_default=True,
              help="mTLS between every process and for the clients, certificates from a throw-away CA.")
@click.option("--auth/--no-auth", default=True, show_default=True,
              help="Bearer tokens and ACLs everywhere (the workload's clients are the cluster admin).")
@click.option("--intruder/--no-intruder", default=None,
              help="Run the intruder (loadtest/chaos/intruder.py) beside the workload. [default: with --tls]")
@click.option("--out", default="out/chaos", type=click.Path(file_okay=False, path_type=Path), show_default=True)
def main(minutes, agents, producers, rate, partition_seconds, short, loopback, wipe_disk, tls, auth, intruder,
         out) -> None:
    """Run the fault schedule against a cluster and print a table per fault."""
    kw = dict(agents=agents, producers=producers, rate=rate, loopback=loopback, wipe_disk=wipe_disk, tls=tls,
              auth=auth, intruder=intruder, out=out)
    cfg = Config.short(artifacts=True, **kw) if short else Config(minutes=minutes, partition_seconds=partition_seconds, **kw)
    result = run(cfg)
    print(result.text)
    print(f"\nreport: {cfg.out / 'report.txt'}, {cfg.out / 'report.json'}, {cfg.out / 'timeline.png'}; "
          f"logs: {cfg.out / 'logs'}")
    sys.exit(0 if result.ok else 1)


if __name__ == "__main__":
    main()
