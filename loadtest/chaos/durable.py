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
from loadtest.chaos.workload import CREDITS, FILTERS, TOPIC, Received


MAX_BACKLOG = 1_000_000


class DurableSubscriber:
    def __init__(self, name: str, agent: str, addresses: list[str], text: str, role: str, tls=None,
                 token: str = ""):
        self.name, self.agent, self.text, self.role = name, agent, text, role
        self.filter = parse(text)
        self.client = Client(addresses, tls=tls, token=token)
        self.log: list[Received] = []
        self.opened: list[float] = []
        self.breaks = 0
        self.acked_again = 0
        self.stopping = False
        self._handed: set[tuple[str, int]] = set()
        self._acked: set[tuple[str, int]] = set()
        self.after_ack = 0  # handed to us again after we acked it

    async def run(self) -> None:
        while not self.stopping:
            # A bound above the run's volume: a drop (DROP_OLDEST, counted) would be a chosen loss.
            sub = self.client.subscribe(TOPIC, self.text, name=self.name, max_outstanding=CREDITS,
                                        durable=Durable(max_messages=MAX_BACKLOG, max_bytes=1 << 30))
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
                self.acked_again += sub.acked_redeliveries
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
    while time.monotonic() < deadline:
        if all({k for k, a in acked.items() if s.filter.matches(a)} <= {(x.d.producer, x.d.sequence) for x in s.log}
               for s in subs):
            return
        await asyncio.sleep(1.0)


def report(producers, subs: list[DurableSubscriber]) -> tuple[list[str], dict[str, tuple[bool, str]]]:
    """The table's lines and the targets."""
    acked, maybe = owed(producers, subs)
    examples = []
    rows = [("subscription", "served by", "role", "owed", "received", "lost", "dup after ack", "redeliv",
             "reorder", "acked again by client", "stream breaks")]
    lost = dup = reorder = 0
    for s in subs:
        [r] = checker.check(acked, {s.name: s.filter}, {s.name: [x.d for x in s.log]}, maybe)
        d = len(r.duplicated) + s.after_ack
        lost, dup, reorder = lost + len(r.lost), dup + d, reorder + len(r.reordered)
        examples += [f"  {s.name}: {a[0]}:{a[1]} then {b[0]}:{b[1]}" for a, b in r.reordered[:3]]
        rows.append((s.name, s.agent, s.role, str(r.expected), str(r.received), str(len(r.lost)), str(d),
                     str(r.redelivered), str(len(r.reordered)), str(s.acked_again), str(s.breaks)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["", "Durable subscriptions (everything acked is owed: no window around a kill):"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    if examples:
        lines += ["Reordered (an earlier message of the key after a later one, neither a redelivery):", *examples]
    ok = bool(acked) and all(s.opened for s in subs)
    # Order is measured, not a target, as for the named subscriptions (report.py): around a
    # relay's restart the data plane hands the agents themselves some messages out of order,
    # and a holder logs what it receives in arrival order.
    lines.append(f"  [measured] durable: order per key: {reorder} reordered"
                 f"{' (the named subscriptions: see the reorder column above)' if reorder else ''}")
    targets = {"durable: 0 lost": (ok and lost == 0, str(lost)),
               "durable: 0 duplicates after ack": (dup == 0, str(dup))}
    return lines, targets
