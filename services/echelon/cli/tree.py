"""`echelon tree`: print the LBDD dissemination tree for a source and its subscribers.

The tree is what every node computes locally (docs/papers.md, "LBDD"); this command
shows it whole: edges, each node's bucket and rank, depth and out-degrees.
"""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from echelon.core.lbdd import Tree, build_tree


def tree_json(tree: Tree) -> dict:
    """The tree as plain JSON data: nodes listed level by level, source first."""
    nodes = [tree.source, *(c for _, c in tree.edges)]
    return {
        "source": tree.source,
        "depth": tree.depth,
        "edges": [list(e) for e in tree.edges],
        "nodes": [
            {
                "key": k,
                "parent": tree.parent.get(k),
                "bucket": tree.bucket[k],
                "rank": tree.rank[k],
                "out_degree": len(tree.children[k]),
            }
            for k in nodes
        ],
    }


def _split(values: tuple[str, ...]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


@click.command("tree")
@click.option("--source", required=True, help="Key of the publisher (root), e.g. its IP address.")
@click.option(
    "--members",
    multiple=True,
    required=True,
    help="Subscriber keys; repeat the option or separate them by commas.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def tree(source: str, members: tuple[str, ...], as_json: bool) -> None:
    """Show the LBDD dissemination tree rooted at SOURCE over MEMBERS."""
    data = tree_json(build_tree(source, _split(members)))
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    table = Table(title=f"LBDD tree from {source}")
    for column in ("node", "parent", "bucket", "rank", "out-degree"):
        table.add_column(column, justify="left" if column in ("node", "parent") else "right")
    for n in data["nodes"]:
        cells = (n["bucket"], n["rank"], n["out_degree"])
        table.add_row(n["key"], n["parent"] or "-", *map(str, cells))
    console = Console()
    console.print(table)
    inner = [n["out_degree"] for n in data["nodes"] if n["out_degree"]]
    mean = sum(inner) / len(inner) if inner else 0.0
    console.print(
        f"depth {data['depth']}  edges {len(data['edges'])}  "
        f"source out-degree {data['nodes'][0]['out_degree']}  mean inner out-degree {mean:.2f}"
    )
