"""`echelon subscription list|show|seek|delete`: durable subscriptions, answered by any agent
for the whole cluster (agent/durable/rpc.py)."""

from __future__ import annotations

import json
import time
from datetime import datetime

import click
from rich.table import Table

from echelon.cli.common import AGENT, console, with_client


def _age(ns: int) -> str:
    return f"{(time.time_ns() - ns) / 1e9:.1f}s" if ns else "-"


@click.group()
def subscription() -> None:
    """Durable subscriptions: list, show, seek, delete."""


@subscription.command("list")
@AGENT
@click.option("--json", "as_json", is_flag=True, help="One JSON array instead of a table.")
def subscription_list(agent, as_json) -> None:
    """List the durable subscriptions: holders, backlog, policy, attached or not."""
    subs = with_client(agent, lambda c: c.list_subscriptions())
    if as_json:
        print(json.dumps([s.as_dict() for s in subs]))
        return
    t = Table("name", "topic", "holders", "backlog", "bytes", "oldest", "dropped", "policy", "attached")
    for s in subs:
        t.add_row(s.name, s.topic, ",".join(s.holders), str(s.backlog_messages), str(s.backlog_bytes),
                  _age(s.oldest_unacked_unix_nanos), str(s.dropped), s.policy, "yes" if s.attached else "no")
    console.print(t)


@subscription.command("show")
@AGENT
@click.argument("name")
def subscription_show(agent, name) -> None:
    """Show durable subscription NAME: its record and backlog, as JSON."""
    print(json.dumps(with_client(agent, lambda c: c.get_subscription(name)).as_dict(), indent=2))


@subscription.command("seek")
@AGENT
@click.argument("name")
@click.option("--time", "when", default=None, help="ISO time (2026-11-23T12:00:00) or Unix seconds.")
@click.option("--message", default=None, metavar="PRODUCER:SEQUENCE")
def subscription_seek(agent, name, when, message) -> None:
    """Replay from a time or a message within the topic's retention (acked ones included)."""
    if (when is None) == (message is None):
        raise click.UsageError("give --time or --message")
    target: dict = {}
    if message is not None:
        producer, _, seq = message.rpartition(":")
        if not producer or not seq.isdigit():
            raise click.UsageError(f"--message {message!r}: PRODUCER:SEQUENCE")
        target["message"] = (producer, int(seq))
    else:
        try:
            target["time"] = float(when)
        except ValueError:
            try:
                target["time"] = datetime.fromisoformat(when)
            except ValueError:
                raise click.UsageError(f"--time {when!r}: ISO time or Unix seconds") from None

    console.print(f"{name}: {with_client(agent, lambda c: c.seek(name, **target))} messages owed")


@subscription.command("delete")
@AGENT
@click.argument("name")
def subscription_delete(agent, name) -> None:
    """Delete durable subscription NAME and its backlog."""
    with_client(agent, lambda c: c.delete_subscription(name))
    console.print(f"deleted {name}")
