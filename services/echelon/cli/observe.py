"""`echelon top` and `echelon topology`: the catalog's panels in the terminal, and a
picture of the cluster, both from a Prometheus (the one `echelon up` starts)."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.console import Console
from rich.live import Live

from echelon.cli.common import MEMBERSHIP_OPTION, PROMETHEUS, TLS, TOKEN


@click.command()
@PROMETHEUS
@click.option("--topic", default=".*", show_default=True, help="Topic filter (a regex, as Grafana's $topic).")
@click.option("--region", default=".*", show_default=True, help="Region filter (a regex).")
@click.option("--interval", default=2.0, type=click.FloatRange(0.5, 60), show_default=True, help="Refresh, seconds.")
@click.option("--once", is_flag=True, help="Print one frame and exit.")
def top(url, topic, region, interval, once) -> None:
    """The Overview and Data-plane panels, live from Prometheus."""
    from echelon.observe.prometheus import PrometheusAPI, PromQLError
    from echelon.observe.top import screen

    api = PrometheusAPI(url)
    console = Console()
    try:
        api.query("1")
    except PromQLError as e:
        raise click.ClickException(f"no Prometheus at {url} ({e}): is `echelon up` running? it starts one "
                                   "(`echelon context` shows where)") from None
    if once:
        console.print(screen(api, topic=topic, region=region))
        return
    try:
        with Live(screen(api, topic=topic, region=region), console=console, screen=True, auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(screen(api, topic=topic, region=region), refresh=True)
    except KeyboardInterrupt:
        pass


@click.command()
@PROMETHEUS
@MEMBERSHIP_OPTION
@click.option("--topic", "topic_name", required=True, help="The topic whose LBDD tree is drawn.")
@click.option("--root", default=None, help="The root agent's id (default: the first agent publishing the topic).")
@click.option("--stripes", default=1, type=click.IntRange(1, 16), show_default=True,
              help="Draw stripes 0..N-1 of the tree (a panel each).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="topo.png or topo.svg")
@TLS
@TOKEN
def topology(url, addresses, topic_name, root, stripes, out) -> None:
    """Members by region, a topic's LBDD tree and the router links, coloured by congestion."""
    import asyncio

    from echelon.cli.status import first_view
    from echelon.observe.prometheus import PrometheusAPI
    from echelon.observe.topology import Topology, draw, link_states, members_of, pick_root, replicas, tree_edges

    if out.suffix.lower() not in (".png", ".svg"):
        raise click.BadParameter(f"{out}: .png or .svg", param_hint="--out")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.ClickException("drawing needs matplotlib: pip install 'echelon-pubsub[plot]'") from None
    _, view = asyncio.run(first_view(addresses, 5.0))
    topics = sorted(t.name for t in view.topics)
    if topic_name not in topics:
        raise click.ClickException(f"no topic {topic_name!r} in the cluster (topics: {', '.join(topics) or 'none'})")
    api = PrometheusAPI(url)
    members = members_of(view) + replicas(api)
    root = pick_root(members, topic_name, root, api)
    if root is not None and not any(m.id == root and m.role == "agent" and m.state == "alive" for m in members):
        raise click.BadParameter(f"{root!r} is not an alive agent", param_hint="--root")
    trees = [tree_edges(members, topic_name, root, s) for s in range(stripes)] if root else []
    links = link_states(api)
    if not links:
        Console(stderr=True).print(f"[yellow]no link metrics from {url}: links drawn grey[/yellow]")
    path = draw(Topology(members, topic_name, root, trees, links), out)
    click.echo(f"wrote {path} ({len(members)} members, root {root or '-'}, "
               f"{sum(map(len, trees))} tree edges over {len(trees)} stripe(s), {len(links)} measured links)")
