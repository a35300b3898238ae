"""`echelon topic create|list|show|delete`: topics and their schemas, through any agent."""

from __future__ import annotations

import json

import click
from rich.table import Table

from echelon.cli.common import AGENT, console, with_client
from echelon.client.admin import Topic, attribute_spec


def _schema(t: Topic) -> str:
    return ", ".join(attribute_spec(a) for a in t.attributes) or "(any attributes)"


@click.group()
def topic() -> None:
    """Create, list, show and delete topics."""


@topic.command("create")
@AGENT
@click.argument("name")
@click.option("--attr", "attrs", multiple=True, metavar="NAME:TYPE[:MIN:MAX]",
              help="An attribute of the schema, e.g. High:float:0:500 (types: string, int, float); "
                   "repeat it. None: any attributes (docs/filters.md).")
@click.option("--retention-seconds", default=0, type=click.IntRange(0),
              help="Replay window kept for durable subscriptions (0: the agents' default).")
@click.option("--retention-bytes", default=0, type=click.IntRange(0), help="Replay bytes kept (0: the default).")
@click.option("--durable-caps", default="", metavar="NAME=N,...",
              help="Caps on what a durable subscription of the topic may ask for, under the agents' own, e.g. "
                   "max_messages=100000,max_bytes=67108864,idle_seconds=86400,replicas=2 (docs/security.md).")
def topic_create(agent, name, attrs, retention_seconds, retention_bytes, durable_caps) -> None:
    """Create topic NAME with a schema (again with the same schema: nothing changes).

    Example: `echelon topic create quotes --attr Symbol:string --attr High:float:0:500`."""
    try:
        caps = {k.strip(): int(v) for k, _, v in (x.partition("=") for x in durable_caps.split(",") if x.strip())}
    except ValueError:
        raise click.BadParameter(f"{durable_caps!r}: name=number pairs", param_hint="--durable-caps") from None
    t = with_client(agent, lambda c: c.create_topic(name, attrs, retention_bytes=retention_bytes,
                                                    retention_seconds=retention_seconds, durable_caps=caps))
    console.print(f"topic {t.name} ({len(t.attributes)} attributes: {_schema(t)})")


@topic.command("list")
@AGENT
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of a table.")
def topic_list(agent, as_json) -> None:
    """List the topics and their schemas."""
    topics = with_client(agent, lambda c: c.list_topics())
    if as_json:
        print(json.dumps([t.as_dict() for t in topics]))
        return
    t = Table("topic", "schema")
    for tp in topics:
        t.add_row(tp.name, _schema(tp))
    console.print(t)


@topic.command("show")
@AGENT
@click.argument("name")
def topic_show(agent, name) -> None:
    """Show topic NAME: its schema and retention, as JSON."""
    print(json.dumps(with_client(agent, lambda c: c.get_topic(name)).as_dict(), indent=2))


@topic.command("delete")
@AGENT
@click.argument("name")
def topic_delete(agent, name) -> None:
    """Delete topic NAME (its subscriptions end)."""
    with_client(agent, lambda c: c.delete_topic(name))
    console.print(f"deleted {name}")
