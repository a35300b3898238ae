"""`echelon acl grant|revoke|list`: per-topic access rules (core/acl.py), changed through any
agent by the cluster admin and replicated by membership like topics."""

from __future__ import annotations

import json

import click
from rich.table import Table

from echelon.cli.common import AGENT, console, with_client
from echelon.core.acl import RIGHTS


def _rights(values) -> list[str]:
    rights = [r for v in values for r in v.split(",") if r]
    bad = [r for r in rights if r not in RIGHTS]
    if bad:
        raise click.BadParameter(f"{', '.join(bad)}: rights are {', '.join(RIGHTS)}", param_hint="RIGHTS")
    return rights


def _show(rule) -> str:
    return f"{rule.principal} on {rule.pattern}: {', '.join(rule.rights) or '(none, rule deleted)'}"


PRINCIPAL = click.argument("principal")
PATTERN = click.argument("pattern")
RIGHTS_ARG = click.argument("rights", nargs=-1, required=True)


@click.group()
def acl() -> None:
    """Access rules: PRINCIPAL (user:<name>, group:<name> or '*') holds RIGHTS (publish,
    subscribe, admin) on the topics PATTERN names (a topic, '<prefix>.*' or '*'). Rules
    only allow; the group `admins` holds every right. Needs the cluster admin's --token."""


@acl.command("grant")
@AGENT
@PRINCIPAL
@PATTERN
@RIGHTS_ARG
def acl_grant(agent, principal, pattern, rights) -> None:
    """Add RIGHTS to the rule of PRINCIPAL on PATTERN.

    Example: `echelon acl grant user:ann 'quotes.*' publish subscribe`."""
    rights = _rights(rights)
    console.print(_show(with_client(agent, lambda c: c.grant_acl(principal, pattern, rights))))


@acl.command("revoke")
@AGENT
@PRINCIPAL
@PATTERN
@RIGHTS_ARG
def acl_revoke(agent, principal, pattern, rights) -> None:
    """Remove RIGHTS from the rule; a rule with none left is deleted."""
    rights = _rights(rights)
    console.print(_show(with_client(agent, lambda c: c.revoke_acl(principal, pattern, rights))))


@acl.command("list")
@AGENT
@click.option("--json", "as_json", is_flag=True)
def acl_list(agent, as_json) -> None:
    """List the rules."""
    rules = with_client(agent, lambda c: c.list_acls())
    if as_json:
        print(json.dumps([r.as_dict() for r in rules]))
        return
    t = Table("principal", "pattern", "rights")
    for r in rules:
        t.add_row(r.principal, r.pattern, ", ".join(r.rights))
    console.print(t)
