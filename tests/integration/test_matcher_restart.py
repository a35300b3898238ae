"""Every acknowledged event is delivered across a matcher's kill -9 and restart, on real
processes (the launcher's, as `echelon up`).

Two publishers (ACCEPTED and DELIVERED) publish without pause to a schemaless topic
while an ephemeral and a durable subscriber (on other agents) take everything. The
matchers are killed with SIGKILL and started again on the same address, twice, while the
durable subscriber's agent is stalled (SIGSTOP, then SIGCONT a moment after the matcher
is back: a slow node, which refills the matcher last); publishing goes on. The oracle
is the publishers' own acks: every event acked OK, at either level, must reach both
subscribers. A restarted matcher is empty until the agents refill it; an
entry that answered meanwhile named too few destinations and the agent acked events
nobody would deliver (matcher/refill.py: the reconciliation barrier). A publish that
fails meanwhile (UNAVAILABLE, a timeout) is not acked, so it is owed to nobody.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from echelon.client import AckLevel, Client, Durable, errors
from echelon.core.durability import holders
from echelon.launch import Cluster, Loopback

pytestmark = pytest.mark.asyncio

TOPIC = "restart"
BALLAST = "ballast"  # subscribed to, never published to
BALLAST_SUBS = 200
RESTARTS = 2
STALL = 1.5  # seconds the durable subscriber's agent stays stopped after the matcher is back
WINDOW = 64  # publishes in flight per publisher


class Tally:
    """Acked events per publisher and events received per subscriber."""

    def __init__(self):
        self.acked: dict[str, set[int]] = {}
        self.failed: dict[str, int] = {}
        self.received: dict[str, set[tuple[str, int]]] = {}

    def lost(self, sub: str) -> list[tuple[str, int]]:
        got = self.received[sub]
        return sorted((p, n) for p, ns in self.acked.items() for n in ns if (p, n) not in got)


async def publish(address: str, name: str, level: AckLevel, tally: Tally, stop: asyncio.Event) -> None:
    acked, tally.failed[name] = tally.acked.setdefault(name, set()), 0
    async with Client(address) as client:
        pub = client.publisher(producer_id=name, ack_level=level)
        inflight: set[asyncio.Future] = set()
        n = 0

        def done(f: asyncio.Future, n: int) -> None:
            inflight.discard(f)
            if f.cancelled() or f.exception() is not None:
                tally.failed[name] += 1
            else:
                acked.add(n)

        while not stop.is_set():
            if len(inflight) >= WINDOW:
                await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                continue
            f = pub.publish_nowait(TOPIC, {"p": name, "n": n})
            f.add_done_callback(lambda f, n=n: done(f, n))
            inflight.add(f)
            n += 1
            await asyncio.sleep(0.002)
        if inflight:
            await asyncio.wait(inflight, timeout=60)
        await pub.close(timeout=10)


async def receive(address: str, name: str, durable: bool, tally: Tally, ready: asyncio.Event,
                  stop: asyncio.Event) -> None:
    got = tally.received.setdefault(name, set())
    async with Client(address) as client:
        # Ballast: an agent that owns more subscriptions takes longer to refill a matcher.
        ballast = [client.subscribe(BALLAST, "", name=f"{name}-{i}") for i in range(BALLAST_SUBS)]
        for b in ballast:
            await b.start()
        sub = client.subscribe(TOPIC, "", name=name, durable=Durable(replicas=1) if durable else None,
                               max_outstanding=256)
        await sub.start()
        ready.set()
        while not stop.is_set():
            try:
                msg = await sub.next(timeout=0.5)
            except errors.Timeout:
                continue
            got.add((msg.attributes["p"], int(msg.attributes["n"])))
            await msg.ack()
        await sub.close()


async def run(tmp_path, matchers: int, victims: list[str]) -> Tally:
    cluster = Cluster(agents=3, matchers=matchers, memberships=1, placement=Loopback(0), log_dir=tmp_path)
    await cluster.start()
    try:
        agents = [p.address for p in cluster.by_role("agent")]
        async with Client(agents[0]) as admin:
            await admin.create_topic(TOPIC)
            await admin.create_topic(BALLAST)
        tally, stop_pub, stop_sub = Tally(), asyncio.Event(), asyncio.Event()
        ready = [asyncio.Event(), asyncio.Event()]
        # Held (and registered at the matchers) by agent-2 alone.
        ids = {p.id: p.address for p in cluster.by_role("agent")}
        durable = next(f"durable-{i}" for i in range(500) if holders(f"durable-{i}", ids, 1) == ["agent-2"])
        subs = [asyncio.create_task(receive(agents[1], "ephemeral", False, tally, ready[0], stop_sub)),
                asyncio.create_task(receive(agents[2], durable, True, tally, ready[1], stop_sub))]
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in ready)), 60)
        await asyncio.sleep(1.0)  # the subscriptions registered at the matchers
        pubs = [asyncio.create_task(publish(agents[0], "accepted", AckLevel.ACCEPTED, tally, stop_pub)),
                asyncio.create_task(publish(agents[0], "delivered", AckLevel.DELIVERED, tally, stop_pub))]
        for _ in range(RESTARTS):
            await asyncio.sleep(3.0)
            # The durable subscriber's agent stalls (a GC pause, a starved node) across the
            # restart: it refills the matcher last.
            cluster.signal("agent-2", signal.SIGSTOP)
            try:
                for v in victims:
                    cluster.signal(v, signal.SIGKILL)
                await asyncio.gather(*(cluster.launch(cluster.process(v)) for v in victims))
                await asyncio.sleep(STALL)
            finally:
                cluster.signal("agent-2", signal.SIGCONT)
            await cluster.wait_members(60)
        await asyncio.sleep(6.0)  # publishing on through the refill
        stop_pub.set()
        await asyncio.wait_for(asyncio.gather(*pubs), 120)
        # Until every acked event arrived, or nothing more arrives for 10 s.
        last, quiet = -1, time.monotonic()
        while any(tally.lost(s) for s in tally.received) and time.monotonic() - quiet < 10:
            total = sum(map(len, tally.received.values()))
            if total != last:
                last, quiet = total, time.monotonic()
            await asyncio.sleep(0.2)
        stop_sub.set()
        await asyncio.wait_for(asyncio.gather(*subs), 30)
        return tally
    finally:
        cluster.stop()


def report(tally: Tally) -> str:
    lines = [f"acked: {', '.join(f'{p} {len(ns)}' for p, ns in tally.acked.items())}; "
             f"failed (not acked): {tally.failed}"]
    for s in tally.received:
        lost = tally.lost(s)
        by = {p: sum(1 for q, _ in lost if q == p) for p in tally.acked}
        lines.append(f"{s}: received {len(tally.received[s])}, acked and lost {len(lost)} {by}")
    return "\n".join(lines)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("matchers,victims", [
    (1, ["matcher-0"]),
    pytest.param(2, ["matcher-0"], marks=pytest.mark.chaos),  # make chaos: the handoff path
], ids=["one", "two"])
async def test_no_acked_event_lost_to_a_matcher_restart(tmp_path, matchers, victims):
    tally = await run(tmp_path, matchers, victims)
    print(report(tally))
    assert all(len(ns) > 500 for ns in tally.acked.values()), report(tally)
    for s in tally.received:
        assert not tally.lost(s), report(tally)
