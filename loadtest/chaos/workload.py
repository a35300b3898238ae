"""The workload: numbered publishers and named, acking subscribers that reopen their
subscription on the same agent when its stream breaks; and the drain at the end."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from echelon.client import ACCEPTED, Client, EchelonError
from echelon.client.errors import ClientClosed
from echelon.contract.filters import parse
from echelon.contract.transport import OWN_SUBCHANNEL, RECONNECT_OPTIONS
from loadtest import checker
from loadtest.chaos.config import KILL_MAYBE_BEFORE

TOPIC = "chaos"
SCHEMA = ["kind:string", "v:float:0:100", "n:int:0:1000000000"]
FILTERS = ["", 'kind = "a"', "v >= 50", 'kind = "b" and v < 30', 'kind != "c" and v between 10 and 60']
MAX_IN_FLIGHT = 2000  # unacknowledged publishes per producer before it waits
# Deliveries a subscriber lets the agent have unsettled: it moves at most this many per round
# trip, and must carry 600/s (an unfiltered subscription at 10x) across netem's 200-300 ms and
# a loaded 2-core machine; 64 could not, so it fell behind past the agent's backlog bound
# (Pub/Sub's and JetStream's default, as bench_events and bench_durable use).
CREDITS = 1000


def attributes(producer: int, seq: int) -> dict:
    return {"kind": "abc"[(seq * 7 + producer) % 3], "v": float((seq * 37 + producer * 11) % 100), "n": seq}


@dataclass
class Sent:
    at: float
    attrs: dict
    acked: bool = False
    failed: str = ""


class Producer:
    def __init__(self, index: int, address: str, rate: float, keys: int, tls=None, token: str = ""):
        self.index = index
        self.id = f"producer-{index}"
        self.client = Client(address, tls=tls, token=token)  # the cluster's certificate and token ("" none)
        self.pub = self.client.publisher(self.id, ACCEPTED)
        self.rate = rate
        self.keys = keys
        self.sent: dict[int, Sent] = {}
        self.in_flight = 0
        self.until = float("inf")

    def _done(self, seq: int, future: asyncio.Future) -> None:
        self.in_flight -= 1
        if future.cancelled():
            self.sent[seq].failed = "cancelled"
        elif future.exception() is not None:
            e = future.exception()
            self.sent[seq].failed = e.code.name if isinstance(e, EchelonError) else type(e).__name__
        else:
            self.sent[seq].acked = True

    async def run(self, until: float) -> None:
        seq = 0
        start = time.monotonic()
        self.until = until  # set earlier to stop sooner (runner.py)
        while time.monotonic() < self.until:
            wait_until = start + seq / self.rate
            await asyncio.sleep(max(0.0, wait_until - time.monotonic()))
            if self.in_flight >= MAX_IN_FLIGHT:
                await asyncio.sleep(0.05)  # the agent is stalled: hold off (the loop is bounded by `until`)
                continue
            seq += 1  # the Publisher numbers its messages 1, 2, ... in call order
            attrs = attributes(self.index, seq)
            self.sent[seq] = Sent(time.monotonic(), attrs)
            self.in_flight += 1
            future = self.pub.publish_nowait(TOPIC, attrs, ordering_key=f"k{seq % self.keys}")
            future.add_done_callback(lambda f, s=seq: self._done(s, f))

    async def close(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.pub.flush(), timeout)
        task = self.pub._task  # noqa: SLF001 - the SDK has no "close without waiting"
        if task:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self.client.close()


@dataclass
class Received:
    at: float
    d: checker.Delivered


class Subscriber:
    """One named subscription on one agent; reopens it on the same agent when its stream breaks."""

    def __init__(self, name: str, agent: str, address: str, text: str, tls=None, token: str = ""):
        self.name, self.agent, self.address, self.text = name, agent, address, text
        self.tls, self.token = tls, token  # the cluster's client certificate (None: plain text) and token ("")
        self.filter = parse(text)
        self.log: list[Received] = []
        self.opened: list[float] = []  # when each stream was open (registered)
        self.breaks = 0
        self.ended: list[tuple[float, str]] = []  # when and how each stream broke (e.g. RESOURCE_EXHAUSTED)
        self.stopping = False

    async def run(self) -> None:
        backoff = 0.2
        while not self.stopping:
            client = Client(self.address, tls=self.tls, token=self.token)
            # A channel of its own: a shared subchannel would keep the dead process's backoff.
            client._channels[self.address] = client.transport.dial(  # noqa: SLF001
                self.address, RECONNECT_OPTIONS + OWN_SUBCHANNEL)
            sub = client.subscribe(TOPIC, self.text, name=self.name, max_outstanding=CREDITS)
            try:
                await asyncio.wait_for(sub.start(), 5.0)
                self.opened.append(time.monotonic())
                backoff = 0.2
                while not self.stopping:
                    try:
                        msg = await sub.next(timeout=0.5)
                    except asyncio.TimeoutError:
                        continue
                    self.log.append(Received(time.monotonic(), checker.Delivered(
                        msg.producer_id, msg.sequence, msg.redelivery_count, msg.ordering_key)))
                    with contextlib.suppress(ClientClosed):  # the stream ended: next() raises how
                        await msg.ack()  # queued for the stream: no wait for the write (no task per ack)
            except Exception as e:  # noqa: BLE001 - any broken stream: reopen (bounded by `stopping`)
                self.breaks += 1
                self.ended.append((time.monotonic(), e.code.name if isinstance(e, EchelonError) else type(e).__name__))
            finally:
                await sub.close()
                await client.close()
            if not self.stopping:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

async def wait_opened(subscribers: list[Subscriber], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(s.opened for s in subscribers):
        if time.monotonic() > deadline:
            raise TimeoutError(f"subscriptions not open: {[s.name for s in subscribers if not s.opened]}")
        await asyncio.sleep(0.1)


async def drain(producers, subscribers, faults, timeout: float, wipe_disk: bool = False) -> None:
    """Wait (bounded) until every subscription holds every acked message it is owed (all
    of them; a window around each kill only when the killed agent lost its disk: report.py)."""
    acked = {(p.id, seq): s for p in producers for seq, s in p.sent.items() if s.acked}
    deadline = time.monotonic() + timeout
    kills = [f for f in faults if f.kind == "kill"] if wipe_disk else []
    owed = []
    for s in subscribers:
        gaps = [(f.start - KILL_MAYBE_BEFORE, next((t for t in s.opened if t >= f.start), 1e18))
                for f in kills if s.agent in f.targets]
        owed.append((s, {k for k, x in acked.items() if s.filter.matches(x.attrs)
                         and not any(a <= x.at <= b for a, b in gaps)}))
    await wait_received([Outstanding(s.log, want) for s, want in owed], deadline)


class Outstanding:
    """What one subscriber is still owed, kept up to date from its log as it grows. The
    drains check every second, in the process whose subscribers they wait for: rebuilding
    every received set at each check took the event loop from those subscribers."""

    def __init__(self, log: list[Received], want: set):
        self.log, self.missing, self.seen = log, set(want), 0

    def done(self) -> bool:
        log, missing = self.log, self.missing
        for i in range(self.seen, len(log)):
            missing.discard((log[i].d.producer, log[i].d.sequence))
        self.seen = len(log)
        return not missing


async def wait_received(owed: list[Outstanding], deadline: float) -> None:
    while time.monotonic() < deadline:
        if all(o.done() for o in owed):
            return
        await asyncio.sleep(1.0)
