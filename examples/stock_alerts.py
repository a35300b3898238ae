"""Stock alerts: each alert rule is a content filter; its subscriber gets only the quotes
that match it, wherever they were published.

Start a local cluster in another terminal (`echelon up`), then:

    python examples/stock_alerts.py          # the agents `echelon up` wrote to its context file
    python examples/stock_alerts.py --agent 127.0.0.1:7200 --agent 127.0.0.1:7201

It uses its own topic (`examples.stock-quotes`, --topic to change it), so it does not
clash with a `quotes` topic made by hand with another schema.

Each rule subscribes on its own agent (round robin over --agent), a publisher on the
first agent sends a burst of quotes at DELIVERED (acked once every subscriber's agent
holds them), the alerts print as they arrive, and the program checks that every rule
got exactly the quotes its filter matches (exit status 0) before draining the clients.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys

from echelon.client import AckLevel, Client, errors
from echelon.client.context import default_agents

TOPIC = "examples.stock-quotes"

SCHEMA = ["Symbol:string", "High:float:0:500", "Low:float:0:500", "Volume:int:0:310000000"]
# (name, filter, the same rule in Python to check what arrived)
RULES = [
    ("aapl above 45", 'Symbol = "aapl" and High >= 45', lambda q: q["Symbol"] == "aapl" and q["High"] >= 45),
    ("cheap ms*", 'Symbol prefix "ms" and Low <= 100', lambda q: q["Symbol"].startswith("ms") and q["Low"] <= 100),
    ("heavy volume", "Volume >= 250000000", lambda q: q["Volume"] >= 250_000_000),
]


def quotes(n: int, seed: int) -> list[dict]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        low = round(rnd.uniform(0, 400), 2)
        out.append({"Symbol": rnd.choice(["aapl", "msft", "mstr", "goog", "ibm"]), "Low": low,
                    "High": round(min(500.0, low + rnd.uniform(0, 100)), 2), "Volume": rnd.randrange(310_000_001)})
    return out


async def main(agents: list[str], count: int, seed: int, topic: str = TOPIC) -> int:
    clients = [Client(a) for a in agents]
    try:
        for c in clients:
            await c.connect()  # fails at once, naming the cause, when no agent is there
        try:
            await clients[0].create_topic(topic, SCHEMA)
        except errors.AlreadyExists as e:  # the topic exists with another schema
            print(f"cannot use topic {topic!r}: {e.message}; delete it (`echelon topic delete {topic}`) or give "
                  "--topic another name", file=sys.stderr)
            return 2
        burst = quotes(count, seed)
        expected = [[q for q in burst if check(q)] for _, _, check in RULES]
        # Subscriptions first: a subscription gets the events published after it exists.
        subs = [clients[i % len(clients)].subscribe(topic, text) for i, (_, text, _) in enumerate(RULES)]
        for sub in subs:
            await sub.start()
        readers = [asyncio.create_task(read(sub, name, len(want))) for sub, (name, _, _), want
                   in zip(subs, RULES, expected)]
        async with clients[0].publisher(ack_level=AckLevel.DELIVERED) as pub:
            results = await pub.publish_batch(topic, burst)
        print(f"published {len(results)} quotes; {sum(r.destinations > 0 for r in results)} matched some rule")
        received = await asyncio.gather(*readers)
        ok = True
        for (name, text, _), want, got in zip(RULES, expected, received):
            exact = sorted(map(key, got)) == sorted(map(key, want))  # each once; order is not checked
            ok &= exact
            print(f"{name:14} {text:40} expected {len(want):3}  got {len(got):3}  {'ok' if exact else 'MISMATCH'}")
        return 0 if ok else 1
    finally:
        for c in clients:
            await c.drain(timeout=10)


def key(quote: dict) -> tuple:
    return tuple(sorted(quote.items()))


async def read(sub, name: str, expected: int) -> list[dict]:
    """This rule's alerts, printed as they arrive, until `expected` came and the stream is quiet."""
    got = []
    while True:
        try:
            msg = await sub.next(timeout=1.0 if len(got) >= expected else 30.0)
        except errors.Timeout:
            return got
        a = msg.attributes
        print(f"[{name}] {a['Symbol']} high={a['High']} low={a['Low']} volume={a['Volume']}")
        got.append(a)
        await msg.ack()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", action="append", help="an agent's address (repeat for more; default: the "
                                                         "context `echelon up` wrote, or $ECHELON_AGENT)")
    parser.add_argument("--topic", default=TOPIC)
    parser.add_argument("--count", type=int, default=200, help="quotes to publish")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    try:
        sys.exit(asyncio.run(main(args.agent or default_agents(), args.count, args.seed, args.topic)))
    except errors.EchelonError as e:  # e.g. no agent there: the cause, not a traceback
        sys.exit(f"stock_alerts: {e.message}")
