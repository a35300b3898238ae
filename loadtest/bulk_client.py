"""The two ends of the bulk experiment, run inside a host's namespace next to its agent.

    python -m loadtest.bulk_client sub --agent 198.18.0.97:7100 --topic bulk-1 --size N --chunk M
    python -m loadtest.bulk_client pub --agent 198.18.0.74:7100 --topic bulk-1 --size N --chunk M

The bulk payload is `size` bytes cut into messages of `chunk` bytes, each carrying its
index in the attribute `chunk` (the paper sends its 8 GB as a stream of 64 KB slices;
our agents slice each message further). Chunk bytes are a pure function of (seed,
index), so nobody holds the whole payload and the orchestrator can check the hash on
its own (`payload_sha256`).

Both ends report JSON lines on stdout with wall-clock times (every namespace shares the
kernel's clock): the subscriber `ready` once its subscription is open, then `done` with
the time its last chunk arrived and the SHA-256 of the chunks in index order (and
`progress` lines meanwhile, at most one a second, so a stalled transfer shows); the
publisher `start` just before its first publish and `done` when every chunk is acked
at DELIVERED. Every wait is bounded by `--timeout`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import sys
import time

import click

from echelon.client import DELIVERED, Client

SCHEMA = ["chunk:int:0:100000000"]
PROGRESS_EVERY = 1.0  # seconds between a subscriber's progress lines


def chunk_bytes(seed: int, index: int, size: int, chunk: int) -> bytes:
    """Chunk `index` of the payload: the last one may be short."""
    n = min(chunk, size - index * chunk)
    return random.Random(seed * 1_000_003 + index).randbytes(n)


def chunk_count(size: int, chunk: int) -> int:
    return max(1, -(-size // chunk))


def payload_sha256(seed: int, size: int, chunk: int) -> str:
    h = hashlib.sha256()
    for i in range(chunk_count(size, chunk)):
        h.update(chunk_bytes(seed, i, size, chunk))
    return h.hexdigest()


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


async def subscribe(agent: str, topic: str, size: int, chunk: int, credits: int, timeout: float) -> int:
    total = chunk_count(size, chunk)
    deadline = time.monotonic() + timeout
    h = hashlib.sha256()
    pending: dict[int, bytes] = {}  # arrived ahead of the next index to hash
    seen: set[int] = set()
    nxt = received = duplicates = reordered = 0
    first = last = None
    reported = 0.0
    async with Client(agent) as client, client.subscribe(topic, "", max_outstanding=credits) as sub:
        emit(event="ready", t=time.time())
        while nxt < total:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                msg = await sub.next(timeout=left)
            except asyncio.TimeoutError:
                break
            now = time.time()
            first = first or now
            i = int(msg.attributes.get("chunk", -1))
            await msg.ack()
            if i in seen or not 0 <= i < total:
                duplicates += 1
                continue
            seen.add(i)
            received += len(msg.payload)
            if i != nxt:
                reordered += 1
            pending[i] = msg.payload
            while nxt in pending:
                h.update(pending.pop(nxt))
                nxt += 1
            last = now
            if now - reported >= PROGRESS_EVERY:
                reported = now
                emit(event="progress", t=now, chunks=len(seen))
    complete = nxt == total
    emit(event="done", complete=complete, first=first, last=last, bytes=received, chunks=len(seen),
         duplicates=duplicates, reordered=reordered, sha256=h.hexdigest() if complete else None)
    return 0 if complete else 1


async def publish(agent: str, topic: str, size: int, chunk: int, window: int, seed: int, timeout: float) -> int:
    total = chunk_count(size, chunk)
    in_flight = asyncio.Semaphore(max(1, window // chunk))
    destinations: list[int] = []
    errors: list[str] = []

    async def one(pub, i: int) -> None:
        try:
            result = await pub.publish(topic, {"chunk": i}, payload=chunk_bytes(seed, i, size, chunk))
            destinations.append(result.destinations)
        except Exception as e:  # noqa: BLE001 - reported, the run fails
            errors.append(f"chunk {i}: {e}")
        finally:
            in_flight.release()

    async with Client(agent) as client:
        pub = client.publisher(ack_level=DELIVERED)
        tasks = []
        start = time.time()
        emit(event="start", t=start, chunks=total)

        async def run() -> None:
            for i in range(total):
                await in_flight.acquire()
                if errors:
                    break
                tasks.append(asyncio.create_task(one(pub, i)))
            await asyncio.gather(*tasks)

        try:
            await asyncio.wait_for(run(), timeout)
        except asyncio.TimeoutError:
            errors.append(f"not every chunk was acknowledged within {timeout:.0f}s")
        end = time.time()
        await asyncio.wait_for(pub.close(), 10)
    emit(event="done", t=end, seconds=end - start, acked=len(destinations),
         min_destinations=min(destinations, default=0), errors=errors[:5])
    return 0 if not errors and len(destinations) == total else 1


def _common(f):
    for opt in reversed([
        click.option("--agent", required=True, help="host:port of the local agent."),
        click.option("--topic", required=True),
        click.option("--size", type=click.IntRange(1), required=True, help="Payload bytes."),
        click.option("--chunk", type=click.IntRange(1), required=True, help="Bytes per message."),
        click.option("--timeout", type=click.FloatRange(1, 86_400), default=600.0, show_default=True),
    ]):
        f = opt(f)
    return f


@click.group()
def cli() -> None:
    """Bulk experiment endpoints (run by loadtest.bulk inside the hosts' namespaces)."""


@cli.command()
@_common
@click.option("--credits", type=click.IntRange(1), default=16, show_default=True)
def sub(agent, topic, size, chunk, timeout, credits) -> None:
    sys.exit(asyncio.run(subscribe(agent, topic, size, chunk, credits, timeout)))


@cli.command()
@_common
@click.option("--window", type=click.IntRange(1), default=32 << 20, show_default=True,
              help="Bytes published but not yet acknowledged (DELIVERED).")
@click.option("--seed", type=int, default=1, show_default=True)
def pub(agent, topic, size, chunk, timeout, window, seed) -> None:
    sys.exit(asyncio.run(publish(agent, topic, size, chunk, window, seed, timeout)))


if __name__ == "__main__":
    cli()
