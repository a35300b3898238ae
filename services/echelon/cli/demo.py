"""`echelon demo`: a local cluster, a stock-quotes topic, filtered subscribers on three
agents, a burst of quotes from a fourth — and a check of who received what against
brute-force evaluation of every filter. With `--regions N` the agents are spread over N
regions joined by routers (OctopiA SCOT), so the quotes cross regions."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import sys
import time

import click
from rich.console import Console
from rich.table import Table

from echelon.client import DELIVERED, Client, EchelonError
from echelon.contract.filters import parse
from echelon.launch import Cluster, Loopback

SCHEMA = ["Symbol:string", "Open:float:0:500", "High:float:0:500", "Low:float:0:500", "Close:float:0:500",
          "Volume:int:0:310000000"]
SYMBOLS = ["aapl", "msft", "mstr", "goog", "ibm", "orcl"]
SUBSCRIBERS = [  # (agent index, filter)
    (1, 'Symbol = "aapl" and High >= 45'),
    (2, 'Symbol prefix "ms" and Low <= 100'),
    (3, "Volume >= 200000000"),
    (3, 'Symbol = "aapl" and Close between 100 and 200'),
    (2, 'Symbol = "zzzz"'),  # matches nothing: must receive nothing
]


def quotes(n: int, seed: int = 7) -> list[dict]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        low = round(rnd.uniform(0, 400), 2)
        high = round(min(500.0, low + rnd.uniform(0, 100)), 2)
        out.append({"Symbol": rnd.choice(SYMBOLS), "Open": round(rnd.uniform(low, high), 2), "High": high,
                    "Low": low, "Close": round(rnd.uniform(low, high), 2), "Volume": rnd.randrange(310_000_001)})
    return out


async def collect(sub, expected: int, idle: float = 3.0) -> list:
    """Read until `expected` arrived, then a little longer to catch any extra."""
    got = []
    while True:
        try:
            m = await sub.next(timeout=idle if len(got) >= expected else 30.0)
        except asyncio.TimeoutError:
            return got
        got.append(m)
        await m.ack()


async def run_demo(agents: int = 4, events: int = 200, base_port: int = 0, as_json: bool = False,
                   console: Console | None = None, regions: int = 1, routers: int = 2, tls: bool = False,
                   auth: bool = False) -> bool:
    console = console or Console()
    cluster = Cluster(agents=agents, matchers=1, memberships=3, placement=Loopback(base_port), regions=regions,
                      routers=routers if regions > 1 else 0, tls=tls, auth=auth)
    where = f" in {regions} regions with {routers} routers each" if regions > 1 else ""
    over = (" over mTLS" if tls else "") + (" with bearer tokens" if auth else "")
    console.print(f"starting {agents} agents{where}, 1 matcher, 3 membership replicas{over} "
                  f"(logs in {cluster.log_dir}) ...")
    t0 = time.perf_counter()
    await cluster.start()
    console.print(f"cluster serving in {time.perf_counter() - t0:.1f}s")
    addrs = cluster.agent_addresses()
    try:
        token = cluster.admin_token
        async with Client(addrs[0], tls=cluster.client_tls, token=token) as admin:
            await admin.create_topic("quotes", SCHEMA)
        if auth and not tls:  # what a stranger gets
            async with Client(addrs[0], token="") as stranger:
                try:
                    await stranger.list_topics()
                    console.print("[red]a call without a token was answered[/red]")
                    return False
                except EchelonError as e:
                    console.print(f"a call without a token: {type(e).__name__} ({e})")
        clients = [Client(a, tls=cluster.client_tls, token=token) for a in addrs]
        subs = [clients[i].subscribe("quotes", f, max_outstanding=256) for i, f in SUBSCRIBERS]
        for s in subs:
            await s.start()
        await asyncio.sleep(0.5)  # registration reaches the matcher before the burst

        burst = quotes(events)
        big = bytes(random.Random(1).randbytes(1 << 20))
        publisher = clients[0].publisher(ack_level=DELIVERED)
        t0 = time.perf_counter()
        futures = [publisher.publish_nowait("quotes", q) for q in burst]
        futures.append(publisher.publish_nowait("quotes", {"Symbol": "aapl", "High": 99.0, "Low": 90.0,
                                                           "Close": 150.0, "Volume": 250_000_000}, payload=big))
        await asyncio.gather(*futures)
        burst.append({"Symbol": "aapl", "High": 99.0, "Low": 90.0, "Close": 150.0, "Volume": 250_000_000})
        elapsed = time.perf_counter() - t0

        expected = [[q for q in burst if parse(f).matches(q)] for _, f in SUBSCRIBERS]
        received = await asyncio.gather(*(collect(s, len(e)) for s, e in zip(subs, expected)))
        rows, ok = [], True
        for (agent, f), exp, got in zip(SUBSCRIBERS, expected, received):
            got_attrs = [m.attributes for m in got]
            exact = got_attrs == exp
            payload_ok = all(hashlib.sha256(m.payload).digest() == hashlib.sha256(big).digest()
                             for m in got if m.payload)
            ok &= exact and payload_ok
            rows.append({"agent": f"agent-{agent}" + (f" (region-{agent % regions})" if regions > 1 else ""),
                         "filter": f, "expected": len(exp), "received": len(got),
                         "in_order_exact": exact, "payload_intact": payload_ok,
                         "first": got_attrs[0] if got_attrs else None})
        for s in subs:
            await s.close()
        await publisher.close()
        for c in clients:
            await c.close()
    finally:
        cluster.stop()

    if as_json:
        print(json.dumps({"ok": ok, "events": len(burst), "publish_seconds": round(elapsed, 3), "subscribers": rows}))
        return ok
    console.print(f"published {len(burst)} quotes (one with a 1 MiB payload) from agent-0 in {elapsed:.2f}s, "
                  "acked when every destination agent held them")
    t = Table(title="who received what")
    for col in ("agent", "filter", "expected", "received", "exact & in order", "payload", "first delivery"):
        t.add_column(col)
    for r in rows:
        first = r["first"]
        t.add_row(r["agent"], r["filter"], str(r["expected"]), str(r["received"]),
                  "yes" if r["in_order_exact"] else "[red]NO[/red]", "ok" if r["payload_intact"] else "[red]BAD[/red]",
                  (f"{first['Symbol']} H={first.get('High')} L={first.get('Low')} V={first.get('Volume')}"
                   if first else "-"))
    console.print(t)
    console.print("[green]every subscriber got exactly what its filter matched[/green]" if ok
                  else "[red]mismatch: see the table[/red]")
    return ok


@click.command("demo")
@click.option("--agents", default=4, type=click.IntRange(4, 40), show_default=True)
@click.option("--events", default=200, type=click.IntRange(1, 1_000_000), show_default=True)
@click.option("--base-port", default=0, type=click.IntRange(0, 60000), show_default=True)
@click.option("--regions", default=1, type=click.IntRange(1, 4), show_default=True,
              help="The multi-region act: agents spread over regions joined by 2 routers each.")
@click.option("--json", "as_json", is_flag=True)
@click.option("--tls", is_flag=True, help="The cluster and its clients over mTLS (a throw-away CA).")
@click.option("--auth", is_flag=True, help="Bearer tokens: every call authenticated, the topics' ACLs enforced.")
def demo(agents, events, base_port, regions, as_json, tls, auth) -> None:
    """Start a local cluster, publish stock quotes to filtered subscribers, show who got what."""
    # Piped output (CI, `| tee`) would wrap the table at 80 columns.
    console = Console()
    out = console if console.is_terminal else Console(width=140)
    ok = asyncio.run(run_demo(agents=agents, events=events, base_port=base_port, as_json=as_json, console=out,
                              regions=regions, tls=tls, auth=auth))
    sys.exit(0 if ok else 1)
