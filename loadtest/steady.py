"""A steady workload for watching a cluster: stock quotes published at a fixed rate from
one agent, a catch-all and a filtered subscriber on every agent (acking what they get),
optionally one slow subscriber that never acks (its backlog grows toward the bound).

`python -m loadtest.steady --agent 127.0.0.1:7200 --agent 127.0.0.1:7201 ... --seconds 60`
drives an `echelon up` cluster; the observability test runs it in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from dataclasses import dataclass

from echelon.client import DELIVERED, Client
from echelon.cli.demo import SCHEMA, quotes

TOPIC = "quotes"
FILTER = 'Symbol = "aapl" and High >= 45'


@dataclass
class Counts:
    published: int = 0
    received: int = 0
    refused: int = 0


async def _drain(sub, counts: Counts) -> None:
    while True:
        m = await sub.next()
        counts.received += 1
        await m.ack()


async def run(agents: list[str], seconds: float, rate: float = 50.0, slow: bool = False) -> Counts:
    """Publish for `seconds` at `rate` events/s; one bad event per second (refused, counted)."""
    counts = Counts()
    clients = [Client(a) for a in agents]
    tasks: list[asyncio.Task] = []
    subs = []
    try:
        with contextlib.suppress(Exception):  # already there: another run made it
            await clients[0].create_topic(TOPIC, SCHEMA)
        for c in clients:
            for flt in ("", FILTER):
                s = c.subscribe(TOPIC, flt, max_outstanding=256)
                await s.start()
                subs.append(s)
                tasks.append(asyncio.create_task(_drain(s, counts)))
        if slow:  # never acks: 8 in flight, the rest waits in its backlog
            s = clients[-1].subscribe(TOPIC, "", max_outstanding=8)
            await s.start()
            subs.append(s)
        publisher = clients[0].publisher(ack_level=DELIVERED)
        events = quotes(max(1, int(rate * seconds)))
        start = time.monotonic()
        pending = []
        for i, q in enumerate(events):
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            pending.append(publisher.publish_nowait(TOPIC, q))
            if i % max(1, int(rate)) == 0:
                pending.append(publisher.publish_nowait(TOPIC, {"Symbol": "aapl", "High": 9999.0}))  # out of range
        for r in await asyncio.gather(*pending, return_exceptions=True):
            if isinstance(r, BaseException):
                counts.refused += 1
            else:
                counts.published += 1
        await publisher.close()
    finally:
        for t in tasks:
            t.cancel()
        for s in subs:
            with contextlib.suppress(Exception):
                await s.close()
        for c in clients:
            await c.close()
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agent", action="append", required=True, help="an agent's address (repeat)")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=50.0, help="events per second")
    ap.add_argument("--slow", action="store_true", help="add a subscriber that never acks")
    args = ap.parse_args()
    c = asyncio.run(run(args.agent, args.seconds, args.rate, args.slow))
    print(f"published {c.published}, refused {c.refused}, received {c.received}")


if __name__ == "__main__":
    main()
