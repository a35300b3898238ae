"""Durable subscribers in the fault run (docs/guarantees.md, "Durable subscriptions"): for
every agent the schedule kills,
pauses or partitions, a durable subscription whose serving holder is that agent (its
name is chosen so: core/durability.py `holders`), and one whose replica is the killed
agent; each subscriber connects through that agent first and, when its stream breaks,
opens it again on any agent (one Client for its whole life, every agent's address).

Counting, apart from the named subscriptions' tables (report.py): every acknowledged
publish matching the filter is owed, with no "not owed" window around a kill (the
subscription outlives the agent). A delivery of a message this subscriber was handed
before and had not acked is a redelivery (at-least-once); a message handed to it again
after it acked it is a duplicate (the target: 0; the SDK acks such a redelivery again
instead of handing it out, and those are counted apart as "acked again by the client").
Order per (producer, ordering key) is checked by `loadtest.checker` and reported (not a
target, as for the named subscriptions: the data plane's order around a restart).
With `--wipe-disk` the killed agent restarts on an empty data dir (the node lost its
disk): the replica's copy is then all there is.
"""

from __future__ import annotations

import asyncio
import time

from echelon.client import Client, Durable
from echelon.core.durability import holders
from echelon.contract.filters import parse
from loadtest import checker
from loadtest.chaos.workload import CREDITS, FILTERS, TOPIC, Outstanding, Received, wait_received


MAX_BACKLOG = 1_000_000


class DurableSubscriber:
    def __init__(self, name: str, agent: str, addresses: list[str], text: str, role: str, tls=None,
                 token: str = ""):
        self.name, self.agent, self.text, self.role = name, agent, text, role
        self.filter = parse(text)
        self.client = Client(addresses, tls=tls, token=token, on_disconnect=self._event, on_reconnect=self._event)
        self.events: list[tuple[float, str]] = []  # the SDK's own reopens, for the report
        self.sub = None
        self.log: list[Received] = []
        self.opened: list[float] = []
        self.breaks = 0
        self._acked_again = 0
        self._reconnects = 0  # streams the SDK opened again by itself, of the streams closed
        self.stopping = False
        self._handed: set[tuple[str, int]] = set()
        self._acked: set[tuple[str, int]] = set()
        self.after_ack = 0  # handed to us again after we acked it

    def _event(self, e) -> None:
        what = f"{e.kind} {e.address}" + (f" {e.error.code.name}" if e.error else f" after {e.attempts} attempts")
        self.events.append((time.monotonic(), what))

    @property
    def acked_again(self) -> int:
        return self._acked_again + (self.sub.acked_redeliveries if self.sub is not None else 0)

    @property
    def reconnects(self) -> int:
        return self._reconnects + (self.sub.reconnects if self.sub is not None else 0)

    async def run(self) -> None:
        while not self.stopping:
            # A bound above the run's volume: a drop (DROP_OLDEST, counted) would be a chosen loss.
            sub = self.client.subscribe(TOPIC, self.text, name=self.name, max_outstanding=CREDITS,
                                        durable=Durable(max_messages=MAX_BACKLOG, max_bytes=1 << 30))
            self.sub = sub
            try:
                await asyncio.wait_for(sub.start(), 10.0)
                self.opened.append(time.monotonic())
                while not self.stopping:
                    try:
                        msg = await sub.next(timeout=0.5)
                    except asyncio.TimeoutError:
                        continue
                    key = (msg.producer_id, msg.sequence)
                    if key in self._acked:
                        self.after_ack += 1
                    again = msg.redelivery_count or key in self._handed
                    self._handed.add(key)
                    self.log.append(Received(time.monotonic(), checker.Delivered(
                        msg.producer_id, msg.sequence, 1 if again else 0, msg.ordering_key)))
                    await asyncio.wait_for(msg.ack(), 5.0)
                    self._acked.add(key)
            except Exception:  # noqa: BLE001 - any broken stream: open again (bounded by `stopping`)
                self.breaks += 1
            finally:
                self._acked_again += sub.acked_redeliveries
                self._reconnects += sub.reconnects
                self.sub = None
                await sub.close()
            if not self.stopping:
                await asyncio.sleep(0.3)

    async def close(self) -> None:
        await self.client.close()


def subscribers(cluster, roles: dict) -> list[DurableSubscriber]:
    """One durable subscription served by each faulted agent, one replicated on the killed one."""
    agents = {p.id: p.address for p in cluster.by_role("agent")}
    ids = sorted(agents)
    wanted = [(roles["kill"][0], 0, "kill"), (roles["pause"][0], 0, "pause"), (roles["partition"][0], 0, "partition"),
              (roles["kill"][0], 1, "kill-replica")]
    out = []
    for k, (agent, place, role) in enumerate(wanted):
        name = next(n for n in (f"d{k}-{i}" for i in range(10_000)) if holders(n, ids, 2)[place] == agent)
        order = [agents[agent]] + [a for i, a in agents.items() if i != agent]
        out.append(DurableSubscriber(name, agent, order, FILTERS[k % len(FILTERS)], role, cluster.client_tls,
                                     cluster.admin_token))
    return out


def owed(producers, subs: list[DurableSubscriber]) -> tuple[dict, dict]:
    acked = {(p.id, seq): s.attrs for p in producers for seq, s in p.sent.items() if s.acked}
    maybe = {(p.id, seq): s.attrs for p in producers for seq, s in p.sent.items() if not s.acked}
    return acked, maybe


async def drain(producers, subs: list[DurableSubscriber], timeout: float) -> None:
    acked, _ = owed(producers, subs)
    deadline = time.monotonic() + timeout
    await wait_received([Outstanding(s.log, {k for k, a in acked.items() if s.filter.matches(a)}) for s in subs],
                        deadline)


def where_lost(s: DurableSubscriber, lost, times: dict, start: float) -> str:
    """The lost messages' publish times as spans (seconds from the first publish), and the
    spans over 2 s in which the subscriber received nothing: a loss inside a silence is a
    stuck stream, one outside it a hole in what the serving holder owed."""
    at = sorted(times[k] - start for k in lost if k in times)
    spans, first = [], at[0]
    for a, b in zip(at, at[1:] + [None]):
        if b is None or b - a > 1.0:
            spans.append(f"+{first:.1f}..+{a:.1f}s")
            first = b
    got = sorted(x.at - start for x in s.log)
    silent = [f"+{a:.1f}..+{b:.1f}s" for a, b in zip(got, got[1:]) if b - a > 2.0]
    if got:
        silent.append(f"last delivery +{got[-1]:.1f}s")
    events = [f"+{t - start:.1f}s {what}" for t, what in s.events]
    return (f"  {s.name}: {len(lost)} lost, published {', '.join(spans[:8])}{' ...' if len(spans) > 8 else ''}\n"
            f"    received nothing {', '.join(silent[-12:])}\n"
            f"    the SDK's reopens ({s.reconnects}): {'; '.join(events[-12:]) or 'none'}")


def report(producers, subs: list[DurableSubscriber]) -> tuple[list[str], dict[str, tuple[bool, str]]]:
    """The table's lines and the targets."""
    acked, maybe = owed(producers, subs)
    examples = []
    rows = [("subscription", "served by", "role", "owed", "received", "lost", "dup after ack", "redeliv",
             "reorder", "acked again by client", "stream breaks")]
    lost = dup = reorder = 0
    times = {(p.id, seq): x.at for p in producers for seq, x in p.sent.items()}
    start = min(times.values(), default=0.0)
    losses: list[str] = []
    for s in subs:
        [r] = checker.check(acked, {s.name: s.filter}, {s.name: [x.d for x in s.log]}, maybe)
        d = len(r.duplicated) + s.after_ack
        lost, dup, reorder = lost + len(r.lost), dup + d, reorder + len(r.reordered)
        examples += [f"  {s.name}: {a[0]}:{a[1]} then {b[0]}:{b[1]}" for a, b in r.reordered[:3]]
        if r.lost:
            losses.append(where_lost(s, r.lost, times, start))
        rows.append((s.name, s.agent, s.role, str(r.expected), str(r.received), str(len(r.lost)), str(d),
                     str(r.redelivered), str(len(r.reordered)), str(s.acked_again), str(s.breaks)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["", "Durable subscriptions (everything acked is owed: no window around a kill):"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    if examples:
        lines += ["Reordered (an earlier message of the key after a later one, neither a redelivery):", *examples]
    if losses:
        lines += ["Where the lost messages were published, and the subscriber's silences:", *losses]
    ok = bool(acked) and all(s.opened for s in subs)
    # Order is measured, not a target, as for the named subscriptions (report.py): around a
    # relay's restart the data plane hands the agents themselves some messages out of order,
    # and a holder logs what it receives in arrival order.
    lines.append(f"  [measured] durable: order per key: {reorder} reordered"
                 f"{' (the named subscriptions: see the reorder column above)' if reorder else ''}")
    targets = {"durable: 0 lost": (ok and lost == 0, str(lost)),
               "durable: 0 duplicates after ack": (dup == 0, str(dup))}
    return lines, targets
