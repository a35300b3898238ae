"""`echelon pub` and `echelon sub`: publish events and read them, from the terminal."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import time

import click
from rich.console import Console

from echelon.cli.common import AGENT, COMPRESS, connected, console, fail, parse_value
from echelon.cli.common import client as make_client
from echelon.cli.progress import progress
from echelon.client import ACCEPTED, DELIVERED, Durable, EchelonError
from echelon.client.bulk import file_chunks
from echelon.client.subscription import MAX_WHOLE

BATCH = 1000  # events per publish_batch when --count is large (the progress moves per batch)
QUIET = click.option("--quiet", "-q", is_flag=True, help="No progress display (it shows only on a terminal anyway).")


@click.command()
@AGENT
@click.option("--topic", "topic_name", required=True, help="The topic to publish to.")
@click.option("--attr", "attrs", multiple=True, metavar="NAME=VALUE",
              help="An attribute; a number is an int or a float, quote a value to force a string. Repeat it.")
@click.option("--payload", default="", help="Payload text.")
@click.option("--payload-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Payload from a file, read as it is sent (never held whole: any size).")
@click.option("--count", default=1, type=click.IntRange(1, 10_000_000), show_default=True,
              help="Publish the event this many times.")
@click.option("--delivered", is_flag=True, help="Wait until every destination agent holds each message.")
@click.option("--json", "as_json", is_flag=True, help="The outcome as one JSON line.")
@QUIET
@COMPRESS
def pub(agent, topic_name, attrs, payload, payload_file, count, delivered, as_json, quiet) -> None:
    """Publish events (the same attributes, --count times).

    Example: `echelon pub --topic quotes --attr Symbol=aapl --attr High=50.5`."""
    attributes = {}
    for a in attrs:
        if "=" not in a:
            raise click.BadParameter(f"{a!r}: expected name=value", param_hint="--attr")
        k, v = a.split("=", 1)
        attributes[k.strip()] = parse_value(v.strip())
    body = payload.encode()

    async def from_file(p, bar) -> list:
        results = []
        for i in range(count):
            chunks, size = file_chunks(payload_file)
            task = bar and bar.add_task(f"{os.path.basename(payload_file)}" + (f" {i + 1}/{count}" if count > 1
                                                                              else ""), total=size)

            def counted(chunks=chunks, task=task):
                for c in chunks:
                    yield c
                    if bar is not None:
                        bar.advance(task, len(c))

            try:
                results.append(await p.publish_stream(topic_name, attributes, counted(), size))
            except EchelonError as e:
                results.append(e)
        return results

    async def batches(p, bar) -> list:
        task = bar and bar.add_task(f"publishing to {topic_name}", total=count)
        results = []
        for first in range(0, count, BATCH):
            n = min(BATCH, count - first)
            results += await p.publish_batch(topic_name, [(attributes, body)] * n, return_exceptions=True)
            if bar is not None:
                bar.advance(task, n)
        return results

    async def run():
        async with make_client(agent) as c:
            await connected(c)
            p = c.publisher(ack_level=DELIVERED if delivered else ACCEPTED)
            start = time.perf_counter()
            with progress(quiet or as_json or (count == 1 and not payload_file),
                          "bytes" if payload_file else "events") as bar:
                results = await (from_file(p, bar) if payload_file else batches(p, bar))
            await p.close()
            return results, time.perf_counter() - start

    try:
        results, seconds = asyncio.run(run())
    except EchelonError as e:
        fail(e)
    errors = [r for r in results if isinstance(r, BaseException)]
    if as_json:
        print(json.dumps({"published": count - len(errors), "errors": [str(e) for e in errors[:10]],
                          "seconds": round(seconds, 4)}))
    else:
        console.print(f"published {count - len(errors)}/{count} in {seconds:.3f}s")
        for e in errors[:10]:
            Console(stderr=True).print(f"[red]{e}[/red]")
    if errors:
        raise SystemExit(1 if isinstance(errors[0], EchelonError) else 2)


@click.command()
@AGENT
@click.option("--topic", "topic_name", required=True, help="The topic to subscribe to.")
@click.option("--filter", "filter_text", default="",
              help='Which events, e.g. Symbol = "aapl" and High >= 45 (docs/filters.md); none: all.')
@click.option("--name", default="", help="A named subscription (kept by its agent across streams; reopened on "
                                         "another agent if that one dies, with a gap).")
@click.option("--durable", "durable_name", default="", metavar="NAME",
              help="A durable subscription: a cluster object kept on disk and by a replica agent, resumed from "
                   "any agent (echelon subscription list|show|seek|delete).")
@click.option("--start", default="now", type=click.Choice(["now", "earliest"]), show_default=True,
              help="Where a new durable subscription starts.")
@click.option("--policy", default="lag", type=click.Choice(["lag", "drop-oldest", "drop-new", "reject-publish"]),
              show_default=True, help="A new durable subscription past its backlog bound: lag (its publishers "
                                      "slow down), drop (counted) or refuse publishes.")
@click.option("--ack-deadline", default=60.0, type=click.FloatRange(0), show_default=True,
              help="Seconds a delivery may stay unacked before the agent redelivers it (0: none).")
@click.option("--max-deliveries", default=0, type=click.IntRange(0), show_default=True,
              help="Past this many deliveries a message goes to --dead-letter-topic (0: no bound).")
@click.option("--dead-letter-topic", default="", help="Where messages past --max-deliveries go (docs/cli.md, "
                                                      "\"Dead messages\"); you need the publish right on it.")
@click.option("--count", default=0, type=click.IntRange(0), help="Stop after this many (0: run until Ctrl-C).")
@click.option("--timeout", default=0.0, type=click.FloatRange(0), help="Stop after this many seconds idle.")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="Write each payload to this file as it arrives (never held whole: any size); with a "
                   "--count other than 1, to FILE.1, FILE.2, ...")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per delivery.")
@QUIET
@COMPRESS
def sub(agent, topic_name, filter_text, name, durable_name, start, policy, ack_deadline, max_deliveries,
        dead_letter_topic, count, timeout, out, as_json, quiet) -> None:
    """Subscribe and print deliveries (each acked once printed).

    Example: `echelon sub --topic quotes --filter 'Symbol = "aapl"' --count 10`."""
    if name and durable_name:
        raise click.UsageError("--name or --durable, not both")
    durable = Durable(start=start, policy=policy) if durable_name else None

    async def run():
        n = 0
        async with make_client(agent) as c:
            await connected(c)
            async with c.subscribe(topic_name, filter_text, name=name or durable_name, durable=durable,
                                   max_whole=0 if out else MAX_WHOLE, ack_deadline=ack_deadline,
                                   max_deliveries=max_deliveries, dead_letter_topic=dead_letter_topic) as s:
                with progress(quiet or as_json or not out) as bar:
                    while not count or n < count:
                        try:
                            m = await s.next(timeout=timeout or None)
                        except asyncio.TimeoutError:
                            break
                        n += 1
                        size, digest = len(m.payload), None
                        path = out if count == 1 else f"{out}.{n}"
                        if out:
                            size, digest = await write_payload(m, path, bar)
                        if as_json:
                            print(json.dumps({"topic": m.topic, "attributes": m.attributes, "producer": m.producer_id,
                                              "sequence": m.sequence, "payload_bytes": size,
                                              "redelivery": m.redelivery_count,
                                              **({"sha256": digest} if out else {})}), flush=True)
                        else:
                            console.print(f"{m.producer_id}:{m.sequence} {m.attributes} ({size} bytes)"
                                          + (f" -> {path}" if out else ""))
                        await m.ack()
        return n

    try:
        asyncio.run(run())
    except EchelonError as e:
        fail(e)
    except KeyboardInterrupt:
        pass


async def write_payload(m, path: str, bar=None) -> tuple[int, str]:
    """Write a delivery's payload to `path` chunk by chunk (via a temporary file, renamed when
    whole); its size and SHA-256. A payload lost on the way leaves no file and raises DataLoss.
    `bar`: a rich Progress to show it on."""
    h = hashlib.sha256()
    size = 0
    part = f"{path}.part"
    task = bar and bar.add_task(os.path.basename(path), total=m.payload_size or None)
    try:
        with open(part, "wb") as f:
            async for chunk in m.chunks():
                f.write(chunk)
                h.update(chunk)
                size += len(chunk)
                if bar is not None:
                    bar.advance(task, len(chunk))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise
    os.replace(part, path)
    return size, h.hexdigest()
