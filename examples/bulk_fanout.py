"""Bulk file fan-out: one publisher sends files, every other agent's subscriber gets them
all and checks each against its SHA-256.

Start a local cluster in another terminal (`echelon up`), then:

    python examples/bulk_fanout.py [FILE ...]       # the agents `echelon up` wrote to its context file
    python examples/bulk_fanout.py --agent 127.0.0.1:7200 --agent 127.0.0.1:7201 --agent 127.0.0.1:7202 [FILE ...]

Without files it makes three (64 KiB, 1 MiB, 6 MiB: the last travels as slices). The
publisher, on the first agent, sends them as one `publish_batch` at DELIVERED; the
agents relay the payloads along LBDD trees, so the publisher uploads a few copies, not
one per subscriber. Received files are written under --out (exit status 0 when every
subscriber has every file intact).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys
import tempfile
from pathlib import Path

from echelon.client import AckLevel, Client, errors
from echelon.client.context import default_agents

TOPIC = "examples.files"

SCHEMA = ["name:string", "size:int", "sha256:string"]


def sample_files(folder: Path) -> list[Path]:
    paths = []
    for name, size in (("small.bin", 64 << 10), ("medium.bin", 1 << 20), ("large.bin", 6 << 20)):
        path = folder / name
        path.write_bytes(os.urandom(size))
        paths.append(path)
    return paths


async def receive(client: Client, sub, count: int, out: Path) -> list[str]:
    """Write every file that arrives; the names of those whose digest matched."""
    intact = []
    async for msg in sub:
        name = msg.attributes["name"]
        ok = hashlib.sha256(msg.payload).hexdigest() == msg.attributes["sha256"]
        (out / name).write_bytes(msg.payload)
        print(f"{client.addresses[0]}: {name} {len(msg.payload)} bytes {'ok' if ok else 'CORRUPT'}")
        await msg.ack()
        if ok:
            intact.append(name)
        if len(intact) == count:
            return intact
    return intact


async def main(agents: list[str], files: list[Path], out: Path, topic: str = TOPIC) -> int:
    if len(agents) < 2:
        print("give at least two agents: one publishes, the others subscribe", file=sys.stderr)
        return 2
    publisher_client, *subscriber_clients = [Client(a) for a in agents]
    try:
        for c in (publisher_client, *subscriber_clients):
            await c.connect()  # fails at once, naming the cause, when no agent is there
        try:
            await publisher_client.create_topic(topic, SCHEMA)
        except errors.AlreadyExists as e:  # the topic exists with another schema
            print(f"cannot use topic {topic!r}: {e.message}; delete it (`echelon topic delete {topic}`) or give "
                  "--topic another name", file=sys.stderr)
            return 2
        subs = [c.subscribe(topic, "", max_outstanding=4) for c in subscriber_clients]
        for sub in subs:
            await sub.start()
        dirs = [out / f"subscriber-{i}" for i in range(len(subs))]
        for d in dirs:
            d.mkdir(parents=True, exist_ok=True)
        receivers = [asyncio.create_task(receive(c, s, len(files), d))
                     for c, s, d in zip(subscriber_clients, subs, dirs)]

        events = []
        for path in files:
            data = path.read_bytes()
            events.append(({"name": path.name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, data))
        async with publisher_client.publisher(ack_level=AckLevel.DELIVERED) as pub:
            results = await pub.publish_batch(topic, events)
        print(f"published {len(results)} files ({sum(len(d) for _, d in events)} bytes), each held by "
              f"{min(r.destinations for r in results)} agents")
        try:
            received = await asyncio.wait_for(asyncio.gather(*receivers), 120)
        except asyncio.TimeoutError:
            print("subscribers did not get every file within 120 s", file=sys.stderr)
            return 1
        complete = all(sorted(r) == sorted(p.name for p in files) for r in received)
        print(f"{len(received)} subscribers, every file intact: {'yes' if complete else 'NO'} (written under {out})")
        return 0 if complete else 1
    except errors.EchelonError as e:
        print(f"bulk_fanout: {e.message}", file=sys.stderr)
        return 1
    finally:
        for c in (publisher_client, *subscriber_clients):
            await c.drain(timeout=10)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", action="append", help="an agent's address (repeat; the first publishes; default: "
                                                         "the context `echelon up` wrote, or $ECHELON_AGENT)")
    parser.add_argument("--topic", default=TOPIC)
    parser.add_argument("--out", type=Path, default=Path("out") / "fanout", help="where subscribers write files")
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(asyncio.run(main(args.agent or default_agents(fallback=3), args.files or sample_files(Path(tmp)),
                                  args.out, args.topic)))
