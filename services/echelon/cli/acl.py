"""`echelon acl grant|revoke|list`: per-topic access rules (core/acl.py), and `echelon acl
cap|caps`: per-identity caps kept beside them; changed through any agent by the cluster
admin and replicated (and kept on disk) by membership like topics."""

from __future__ import annotations

import json

import click
from rich.table import Table

from echelon.cli.common import AGENT, console, with_client
from echelon.core.acl import CAP_FIELDS, RIGHTS


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


def _caps(values) -> tuple[dict[str, int], list[str]]:
    """FIELD=VALUE items -> (caps to set, fields to clear: VALUE 0)."""
    caps, clear = {}, []
    for item in (x for v in values for x in v.split(",") if x):
        name, eq, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if name not in CAP_FIELDS or not eq or not value.strip().isdigit():
            raise click.BadParameter(f"{item!r}: FIELD=N, FIELD one of {', '.join(CAP_FIELDS)}", param_hint="CAPS")
        if int(value):
            caps[name] = int(value)
        else:
            clear.append(name)
    return caps, clear


def _show_caps(principal: str, caps: dict[str, int]) -> str:
    shown = ", ".join(f"{k}={v}" for k, v in caps.items()) or "(none: the agents' limits apply)"
    return f"{principal}: {shown}"


@acl.command("cap")
@AGENT
@PRINCIPAL
@click.argument("caps", nargs=-1, required=True)
def acl_cap(agent, principal, caps) -> None:
    """Set caps of PRINCIPAL over the agents' --limits: FIELD=N items (N=0 removes one).

    Fields: subscriptions (held on one agent), durable_subscriptions (owned in the
    cluster), durable_max_messages, durable_max_bytes, durable_max_idle_seconds,
    durable_max_replicas. An identity's own caps win over its groups' (the highest of
    those), which win over '*''s (docs/security.md, "Caps per identity").

    Example: `echelon acl cap user:ann durable_subscriptions=20 durable_max_messages=100000`."""
    caps, clear = _caps(caps)
    console.print(_show_caps(principal, with_client(agent, lambda c: c.set_caps(principal, caps, clear))))


@acl.command("caps")
@AGENT
@click.option("--json", "as_json", is_flag=True)
def acl_caps(agent, as_json) -> None:
    """List the caps set per principal."""
    listed = with_client(agent, lambda c: c.list_caps())
    if as_json:
        print(json.dumps(listed))
        return
    t = Table("principal", *CAP_FIELDS)
    for principal, caps in listed.items():
        t.add_row(principal, *(str(caps.get(f, "")) for f in CAP_FIELDS))
    console.print(t)
