"""`echelon status`: the membership view (members, states, incarnations, heartbeats), and
the one function every command that needs a view calls (`first_view`)."""

from __future__ import annotations

import asyncio
import json
import time

import click
import grpc
from rich.live import Live
from rich.table import Table

from echelon.cli.common import MEMBERSHIP_OPTION, TLS, TOKEN, console, membership_failure, transport
from echelon.runtime.member import fetch_view
from echelon.contract.transport import call_any
from echelon.v1 import membership_pb2 as mpb


async def first_view(replicas: list[str], timeout: float = 2.0, diagnose: bool = True) -> tuple[str, mpb.View]:
    """A fresh snapshot from the first replica that answers, in the given order; a
    ClickException naming each replica's cause when none does (`diagnose`: asked of each)."""
    via = transport()

    async def one(address: str) -> tuple[str, mpb.View]:
        return address, await asyncio.wait_for(fetch_view(address, via), timeout)

    try:
        return await call_any(replicas, one, retry=lambda e: isinstance(
            e, (grpc.aio.AioRpcError, asyncio.TimeoutError, click.ClickException, ValueError)))
    except (grpc.aio.AioRpcError, asyncio.TimeoutError, click.ClickException, ValueError):
        raise click.ClickException(await membership_failure(replicas) if diagnose else
                                   f"no membership replica answered: {', '.join(replicas)}") from None


def _state(s: int) -> str:
    return mpb.MemberState.Name(s).removeprefix("MEMBER_STATE_").lower()


def view_table(view: mpb.View, source: str = "", unreachable_for: float | None = None) -> Table:
    """The view as a table: states, incarnations and how long ago each member last beat."""
    now = time.time() * 1000
    colours = {"alive": "green", "suspect": "yellow", "dead": "red", "left": "dim"}
    counts = {s: 0 for s in colours}
    for m in view.members:
        counts[_state(m.state)] = counts.get(_state(m.state), 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    t = Table(title=f"view version {view.version}" + (f" from {source}" if source else "") + f" ({summary or 'empty'})")
    if unreachable_for is not None:
        t.caption = f"[red]no replica reachable: the last view, {unreachable_for:.0f}s old[/red]"
    regions = len({m.region for m in view.members}) > 1
    for col in ("id", "role", "state", "incarnation", "last beat", "address", *(["region"] if regions else [])):
        t.add_column(col, no_wrap=True, justify="right" if col in ("incarnation", "last beat") else "left")
    t.add_column("topics", overflow="fold")
    last_region = None
    for m in sorted(view.members, key=lambda m: ((m.region,) if regions else ()) + (m.role, m.id)):
        if regions and last_region is not None and m.region != last_region:
            t.add_section()  # grouped by region
        last_region = m.region
        state = _state(m.state)
        age = f"{max(now - m.last_beat_unix_ms, 0) / 1000:.1f}s" if m.last_beat_unix_ms else "-"
        topics = " ".join([*(f"pub:{x}" for x in m.publishes), *(f"sub:{x}" for x in m.subscribes)])
        t.add_row(m.id, mpb.Role.Name(m.role).removeprefix("ROLE_").lower(),
                  f"[{colours.get(state, 'white')}]{state}[/]", str(m.incarnation), age, m.address,
                  *([m.region] if regions else []), topics)
    return t


@click.command()
@MEMBERSHIP_OPTION
@click.option("--json", "as_json", is_flag=True, help="The view as JSON (one line per refresh with --watch).")
@click.option("--watch", is_flag=True, help="Refresh every second until Ctrl-C.")
@TLS
@TOKEN
def status(addresses, as_json, watch) -> None:
    """The membership view: members, states, incarnations, heartbeat ages (--watch: live)."""
    replicas = addresses

    async def live() -> None:
        source, view = await first_view(replicas)
        seen = time.monotonic()
        with Live(view_table(view, source), console=console, refresh_per_second=4) as screen:
            while True:
                await asyncio.sleep(1)
                try:
                    source, view = await first_view(replicas, diagnose=False)  # (the screen says how long)
                    seen = time.monotonic()
                    screen.update(view_table(view, source))
                except (grpc.aio.AioRpcError, asyncio.TimeoutError, click.ClickException):
                    screen.update(view_table(view, source, unreachable_for=time.monotonic() - seen))

    async def json_lines() -> None:
        from google.protobuf.json_format import MessageToDict

        while True:
            _, view = await first_view(replicas)
            print(json.dumps(MessageToDict(view)), flush=True)
            if not watch:
                return
            await asyncio.sleep(1)

    try:
        if as_json:
            asyncio.run(json_lines())
        elif watch:
            asyncio.run(live())
        else:
            source, view = asyncio.run(first_view(replicas))
            console.print(view_table(view, source))
    except KeyboardInterrupt:
        pass
