"""Client commands of the `echelon` CLI: topics, pub, sub, status."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import time
from pathlib import Path

import click
import grpc
from rich.console import Console
from rich.live import Live
from rich.table import Table

from echelon.client import ACCEPTED, DELIVERED, Client, Durable, EchelonError
from echelon.client.subscription import MAX_WHOLE
from echelon.runtime.member import fetch_view  # noqa: F401 - `echelon status`'s, and observe.py's
from echelon.runtime.transport import TlsDir, Transport, call_any
from echelon.v1 import common_pb2 as pb
from echelon.v1 import membership_pb2 as mpb

console = Console()
TLS_DIR = "echelon.tls_dir"
TOKEN_KEY = "echelon.token"
TOKEN = click.option("--token", default=None, envvar="ECHELON_TOKEN", expose_value=False,
                     callback=lambda ctx, _, value: ctx.meta.__setitem__(TOKEN_KEY, value),
                     help="A bearer token (a static token or a JWT) for clusters run with --auth "
                          "[env ECHELON_TOKEN].")
TLS = click.option("--tls-dir", default=None, envvar="ECHELON_TLS_DIR", expose_value=False,
                   type=click.Path(file_okay=False, exists=True),
                   callback=lambda ctx, _, value: ctx.meta.__setitem__(TLS_DIR, value),
                   help="TLS: a directory with ca.crt (and tls.crt, tls.key for a client certificate) "
                        "[env ECHELON_TLS_DIR].")


def AGENT(f):
    """--agent, and --tls-dir and --token for the `client()` the command makes."""
    return click.option("--agent", default="127.0.0.1:7200", show_default=True,
                        help="An agent's address.")(TLS(TOKEN(f)))


def client(agent: str) -> Client:
    """A client of `agent`, over TLS if the command was given --tls-dir, with its --token."""
    meta = click.get_current_context().meta
    return Client(agent, tls=meta.get(TLS_DIR), token=meta.get(TOKEN_KEY))


def with_client(agent: str, call):
    """`call(client)` on a client of `agent`, run to its end; a failure is the command's error."""
    async def run():
        async with client(agent) as c:
            return await call(c)

    try:
        return asyncio.run(run())
    except EchelonError as e:
        _fail(e)


def transport() -> Transport:
    """The command's channels to services (membership), over TLS if given --tls-dir, with
    its --token."""
    meta = click.get_current_context().meta
    tls = meta.get(TLS_DIR)
    return Transport(TlsDir(Path(tls)) if tls else None, token=meta.get(TOKEN_KEY) or "")


def parse_value(text: str):
    """`45` -> int, `45.5` -> float, `"45"` or anything else -> string."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _fail(e: Exception) -> None:
    if isinstance(e, grpc.aio.AioRpcError):
        raise click.ClickException(f"{e.code().name}: {e.details()}")
    raise click.ClickException(str(e))


@click.group()
def topic() -> None:
    """Create, list, show and delete topics."""


@topic.command("create")
@AGENT
@click.argument("name")
@click.option("--attr", "attrs", multiple=True, help="name:type[:min:max], e.g. High:float:0:500.")
@click.option("--retention-seconds", default=0, type=click.IntRange(0),
              help="Replay window kept for durable subscriptions (0: the agents' default).")
@click.option("--retention-bytes", default=0, type=click.IntRange(0), help="Replay bytes kept (0: the default).")
def topic_create(agent, name, attrs, retention_seconds, retention_bytes) -> None:
    async def run():
        async with client(agent) as c:
            return await c.create_topic(name, attrs, retention_bytes=retention_bytes,
                                        retention_seconds=retention_seconds)

    try:
        t = asyncio.run(run())
    except EchelonError as e:
        _fail(e)
    console.print(f"topic {t.name} ({len(t.schema.attributes)} attributes)")


@topic.command("list")
@AGENT
@click.option("--json", "as_json", is_flag=True)
def topic_list(agent, as_json) -> None:
    async def run():
        async with client(agent) as c:
            return await c.list_topics()

    try:
        topics = asyncio.run(run())
    except EchelonError as e:
        _fail(e)
    from google.protobuf.json_format import MessageToDict

    if as_json:
        print(json.dumps([MessageToDict(t) for t in topics]))
        return
    t = Table("topic", "schema")
    for tp in topics:
        attrs = [f"{a.name}:{pb.AttributeType.Name(a.type).removeprefix('ATTRIBUTE_TYPE_').lower()}"
                 for a in tp.schema.attributes]
        t.add_row(tp.name, ", ".join(attrs) or "(any)")
    console.print(t)


@topic.command("delete")
@AGENT
@click.argument("name")
def topic_delete(agent, name) -> None:
    async def run():
        async with client(agent) as c:
            await c.delete_topic(name)

    try:
        asyncio.run(run())
    except EchelonError as e:
        _fail(e)
    console.print(f"deleted {name}")


@click.command()
@AGENT
@click.option("--topic", "topic_name", required=True)
@click.option("--attr", "attrs", multiple=True, help="name=value; quote a value to force a string.")
@click.option("--payload", default="", help="Payload text.")
@click.option("--payload-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Payload from a file, read as it is sent (never held whole: any size).")
@click.option("--count", default=1, type=click.IntRange(1, 10_000_000), show_default=True)
@click.option("--delivered", is_flag=True, help="Wait until every destination agent holds each message.")
@click.option("--json", "as_json", is_flag=True)
def pub(agent, topic_name, attrs, payload, payload_file, count, delivered, as_json) -> None:
    """Publish events (the same attributes, `--count` times)."""
    attributes = {}
    for a in attrs:
        if "=" not in a:
            raise click.BadParameter(f"{a!r}: expected name=value", param_hint="--attr")
        k, v = a.split("=", 1)
        attributes[k.strip()] = parse_value(v.strip())
    body = payload.encode()

    async def from_file(p) -> list:
        results = []
        for _ in range(count):
            try:
                results.append(await p.publish_file(topic_name, attributes, payload_file))
            except EchelonError as e:
                results.append(e)
        return results

    async def run():
        async with client(agent) as c:
            p = c.publisher(ack_level=DELIVERED if delivered else ACCEPTED)
            start = time.perf_counter()
            if payload_file:
                results = await from_file(p)
            else:
                results = await p.publish_batch(topic_name, [(attributes, body)] * count, return_exceptions=True)
            await p.close()
            return results, time.perf_counter() - start

    results, seconds = asyncio.run(run())
    errors = [r for r in results if isinstance(r, BaseException)]
    if as_json:
        print(json.dumps({"published": count - len(errors), "errors": [str(e) for e in errors[:10]],
                          "seconds": round(seconds, 4)}))
    else:
        console.print(f"published {count - len(errors)}/{count} in {seconds:.3f}s")
        for e in errors[:10]:
            console.print(f"[red]{e}[/red]")
    if errors:
        raise SystemExit(1 if isinstance(errors[0], EchelonError) else 2)


@click.command()
@AGENT
@click.option("--topic", "topic_name", required=True)
@click.option("--filter", "filter_text", default="", help='e.g. Symbol = "aapl" and High >= 45')
@click.option("--name", default="", help="A named subscription (kept by this agent across streams).")
@click.option("--durable", "durable_name", default="", metavar="NAME",
              help="A durable subscription: a cluster object kept on disk and by a replica agent, resumed from "
                   "any agent (echelon subscription list|show|seek|delete).")
@click.option("--start", default="now", type=click.Choice(["now", "earliest"]), show_default=True,
              help="Where a new durable subscription starts.")
@click.option("--policy", default="drop-oldest", type=click.Choice(["drop-oldest", "drop-new", "reject-publish"]),
              show_default=True, help="A new durable subscription past its backlog bound.")
@click.option("--count", default=0, type=click.IntRange(0), help="Stop after this many (0: run until Ctrl-C).")
@click.option("--timeout", default=0.0, type=click.FloatRange(0), help="Stop after this many seconds idle.")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="Write each payload to this file as it arrives (never held whole: any size); with a "
                   "--count other than 1, to FILE.1, FILE.2, ...")
@click.option("--json", "as_json", is_flag=True)
def sub(agent, topic_name, filter_text, name, durable_name, start, policy, count, timeout, out, as_json) -> None:
    """Subscribe and print deliveries (acked as printed)."""
    if name and durable_name:
        raise click.UsageError("--name or --durable, not both")
    durable = Durable(start=start, policy=policy) if durable_name else None

    async def run():
        n = 0
        async with client(agent) as c, c.subscribe(topic_name, filter_text, name=name or durable_name,
                                                   durable=durable, max_whole=0 if out else MAX_WHOLE) as s:
            while not count or n < count:
                try:
                    m = await s.next(timeout=timeout or None)
                except asyncio.TimeoutError:
                    break
                n += 1
                size, digest = len(m.payload), None
                if out:
                    size, digest = await write_payload(m, out if count == 1 else f"{out}.{n}")
                if as_json:
                    print(json.dumps({"topic": m.topic, "attributes": m.attributes, "producer": m.producer_id,
                                      "sequence": m.sequence, "payload_bytes": size,
                                      "redelivery": m.redelivery_count, **({"sha256": digest} if out else {})}),
                          flush=True)
                else:
                    console.print(f"{m.producer_id}:{m.sequence} {m.attributes} ({size} bytes)"
                                  + (f" -> {out if count == 1 else f'{out}.{n}'}" if out else ""))
                await m.ack()
        return n

    try:
        asyncio.run(run())
    except EchelonError as e:
        _fail(e)
    except KeyboardInterrupt:
        pass


async def write_payload(m, path: str) -> tuple[int, str]:
    """Write a delivery's payload to `path` chunk by chunk (via a temporary file, renamed when
    whole); its size and SHA-256. A payload lost on the way leaves no file and raises DataLoss."""
    h = hashlib.sha256()
    size = 0
    part = f"{path}.part"
    try:
        with open(part, "wb") as f:
            async for chunk in m.chunks():
                f.write(chunk)
                h.update(chunk)
                size += len(chunk)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise
    os.replace(part, path)
    return size, h.hexdigest()


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
@click.option("--membership", "addresses", multiple=True, default=["127.0.0.1:7100"], show_default=True,
              help="Membership replica addresses (comma list), tried in order.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--watch", is_flag=True, help="Refresh every second until Ctrl-C.")
@TLS
@TOKEN
def status(addresses, as_json, watch) -> None:
    """The membership view: members, states, incarnations, heartbeat ages (--watch: live)."""
    replicas = [a for v in addresses for a in v.split(",") if a]
    via = transport()

    async def first_view() -> tuple[str, mpb.View]:
        """A fresh snapshot from the first replica that answers, in the given order."""
        async def one(address: str) -> tuple[str, mpb.View]:
            return address, await asyncio.wait_for(fetch_view(address, via), 2.0)

        try:
            return await call_any(replicas, one, retry=lambda e: isinstance(
                e, (grpc.aio.AioRpcError, asyncio.TimeoutError, click.ClickException)))
        except grpc.aio.AioRpcError:
            raise
        except (asyncio.TimeoutError, click.ClickException, ValueError):
            raise click.ClickException(f"no membership replica answered: {', '.join(replicas) or 'none given'}") \
                from None

    async def live() -> None:
        source, view = await first_view()
        seen = time.monotonic()
        with Live(view_table(view, source), console=console, refresh_per_second=4) as screen:
            while True:
                await asyncio.sleep(1)
                try:
                    source, view = await first_view()
                    seen = time.monotonic()
                    screen.update(view_table(view, source))
                except (grpc.aio.AioRpcError, asyncio.TimeoutError, click.ClickException):
                    screen.update(view_table(view, source, unreachable_for=time.monotonic() - seen))

    async def json_lines() -> None:
        from google.protobuf.json_format import MessageToDict

        while True:
            _, view = await first_view()
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
            source, view = asyncio.run(first_view())
            console.print(view_table(view, source))
    except grpc.aio.AioRpcError as e:
        _fail(e)
    except KeyboardInterrupt:
        pass
