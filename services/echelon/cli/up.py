"""`echelon up`: a local cluster as processes, and the context file that says where it is
(cli/context.py): every later command finds the cluster without flags."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from echelon.cli.context import Context, forget


@click.command()
@click.option("--agents", default=3, type=click.IntRange(1, 40), show_default=True)
@click.option("--matchers", default=1, type=click.IntRange(1, 40), show_default=True)
@click.option("--memberships", default=3, type=click.IntRange(1, 9), show_default=True,
              help="Membership replicas (three: no single point of failure).")
@click.option("--base-port", default=7100, type=click.IntRange(0, 60000), show_default=True,
              help="Ports are laid out above it; 0 picks free ports.")
@click.option("--regions", default=1, type=click.IntRange(1, 8), show_default=True,
              help="Regions (region-0, ...): agents spread over them, joined by routers (OctopiA SCOT).")
@click.option("--routers-per-region", default=0, type=click.IntRange(0, 13), show_default=True,
              help="Routers B(a, c) in each region (the tree T); needed with --regions > 1.")
@click.option("--regional-matchers", is_flag=True,
              help="--matchers in EACH region, its own tier (docs/event-path.md, Regions that stand alone).")
@click.option("--routing", default="idr", type=click.Choice(["snr", "idr"]), show_default=True)
@click.option("--log-dir", default=None, type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the endpoints as one JSON line.")
@click.option("--replan-every", default=None, help="Run the routing job (echelon replan) this often, e.g. 60s.")
@click.option("--no-prometheus", is_flag=True, help="Do not start a Prometheus scraping the cluster.")
@click.option("--prometheus-port", default=None, type=click.IntRange(0, 65535),
              help="Prometheus' port on 127.0.0.1 (default 9090; a free one with --base-port 0).")
@click.option("--tls", is_flag=True, help="mTLS everywhere, certificates from a throw-away CA in the log dir.")
@click.option("--auth", is_flag=True, help="Bearer tokens everywhere (--auth tokens, a throw-away tokens file in the "
                                           "log dir); prints the cluster admin's token.")
def up(agents, matchers, memberships, base_port, regions, routers_per_region, regional_matchers, routing, log_dir,
       as_json, no_prometheus, prometheus_port, replan_every, tls, auth) -> None:
    """Start a local cluster as processes; Ctrl-C or SIGTERM stops it.

    It writes where the cluster is (agents, membership, Prometheus, TLS directory, token
    file) to the context file (`echelon context` shows it), so the other commands need
    no --agent, --membership or --prometheus while it runs."""
    from echelon.launch import Cluster, Loopback

    interval = None
    if replan_every:
        from argparse import ArgumentTypeError

        from echelon.replan.main import duration

        try:
            interval = duration(replan_every)
        except ArgumentTypeError as e:
            raise click.BadParameter(str(e), param_hint="--replan-every") from None
    kw = {"log_dir": log_dir} if log_dir else {}
    if regions > 1 and not routers_per_region:
        raise click.BadParameter("--regions > 1 needs --routers-per-region >= 1")
    try:
        cluster = Cluster(agents=agents, matchers=matchers, memberships=memberships, placement=Loopback(base_port),
                          regions=regions, routers=routers_per_region, regional_matchers=regional_matchers,
                          extra={"router": ["--routing", routing]},
                          tls=tls, auth=auth, **kw)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    if interval:  # the routing job, a periodic child (its runs in replan.log); window: half the period, <= 30 s
        window = f"{min(30.0, max(2.0, interval / 2)):.0f}s"
        cluster.add_aux("replan", [sys.executable, "-m", "echelon.replan", "--membership", ",".join(cluster.replicas),
                                   "--window", window], every=interval)
    # Outside a terminal (a pipe, a log) rich would cut the table to 80 columns.
    console = Console() if Console().is_terminal else Console(width=200)
    stop = asyncio.Event()
    prometheus = None

    async def main() -> None:
        nonlocal prometheus
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await cluster.start()
        rows = [p.as_dict() for p in cluster.processes]
        if not no_prometheus:
            from echelon.observe.prometheus import start_for_cluster

            port = (9090 if base_port else 0) if prometheus_port is None else prometheus_port
            prometheus = start_for_cluster(rows, port, cluster.log_dir / "prometheus")
        url = prometheus.url if prometheus else None
        token_file = None
        if cluster.auth:  # the admin's token alone, for the context (the tokens file holds every token)
            token_file = cluster.log_dir / "auth" / "admin.token"
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(cluster.admin_token + "\n")
        context = Context(agents=cluster.agent_addresses(), membership=cluster.replicas, prometheus=url,
                          tls_dir=str(cluster.client_tls.resolve()) if cluster.tls else None,
                          token_file=str(token_file.resolve()) if token_file else None,
                          log_dir=str(cluster.log_dir.resolve()), pid=os.getpid())
        written = context.save()
        if as_json:
            print(json.dumps({"ready": True, "processes": rows, "prometheus": prometheus and prometheus.as_dict(),
                              "client_tls": cluster.client_tls and str(cluster.client_tls),
                              "admin_token": cluster.admin_token or None, "context": str(written)}), flush=True)
        else:
            t = Table(title="Echelon local cluster")
            for col in ("role", "id", "region", "address", "metrics", "pid"):
                t.add_column(col, no_wrap=True)  # (addresses are what a person copies: never cut)
            for r in rows:
                t.add_row(r["role"], r["id"], r["region"], r["address"], r["metrics"], str(r["pid"]))
            console.print(t)
            if url:
                console.print(f"Prometheus at {url} (`echelon top`)")
            if cluster.tls:
                console.print(f"mTLS: clients use --tls-dir {cluster.client_tls} (or ECHELON_TLS_DIR)")
            if cluster.auth:
                console.print(f"auth: tokens in {cluster.tokens_file}; the cluster admin: "
                              f"export ECHELON_TOKEN={cluster.admin_token}"
                              + (" (with --tls-dir the certificate's user `local` is the admin)" if tls else ""))
            console.print(f"logs in {cluster.log_dir}; Ctrl-C stops the cluster")
            console.print(f"context in {written}: other commands find this cluster by themselves "
                          "(`echelon context` shows it)")
        await stop.wait()

    try:
        asyncio.run(main())
    finally:
        if prometheus:
            prometheus.stop()
        cluster.stop()
        forget(os.getpid())
    if not as_json:
        console.print("stopped")


