"""The workload every system gets, and what is measured around a cell.

Events: `Symbol` (one of 50, uniform), `Price` (uniform in [0, 100)), and a 16-byte
payload (event id, send time in ns). A pool of POOL events is drawn once and cycled
with fresh ids, so the expected receivers of every event are known without filtering
on the hot path. Subscriptions: at 2% `Symbol = "s07"` (one per symbol, so every event
has exactly one receiver with 50 subscriptions); at 20% `Price >= lo and Price < lo+20`
(lo spread over [0, 80)): each event matches about 20% of them. The range workload ("2r",
what content-based routing is for: no subject can say it) adds `Volume` (uniform integer
in [0, 1000)) to the events, and each subscription holds a range over two attributes,
`Price >= lo and Price < lo+10 and Volume >= 800` (10% of Price times 20% of Volume: 2%
combined); NATS and Redis subscribers take every symbol's subject and filter in the client.

Measures, taken around each cell on the processes we started: CPU seconds from
/proc/<pid>/stat (utime + stime), and bytes on the wire as the sum of tcp_info
`bytes_sent` (`ss -tinpH`) over every TCP socket owned by those processes and by the
load generator (each byte counted once, at its sender; loopback's interface counters
would count the other engineers' traffic on this shared machine).
"""

from __future__ import annotations

import os
import random
import re
import struct
import subprocess
from array import array
from collections import Counter
from dataclasses import dataclass, field

SYMBOLS = [f"s{i:02d}" for i in range(50)]
POOL = 1 << 16  # events before one repeats: more than a compressed stream's window holds (docs/compression.md)
PAYLOAD = struct.Struct("<qq")  # event id, send time (perf_counter_ns, same process)
NATS_DATA = struct.Struct("<qqdi")  # id, send time, Price, Volume (a NATS/Redis subscriber filters on them)
SCHEMA = ["Symbol:string", "Price:float:0:100", "Volume:int:0:999"]
RANGE = "2r"  # the range workload's selectivity label
RANGE_WIDTH, VOLUME_MIN = 10.0, 800  # Price window and Volume floor of its subscriptions
TOPIC = "bench"


@dataclass(frozen=True)
class Sub:
    index: int
    symbol: str | None  # 2%: Symbol = symbol
    lo: float = 0.0  # 20% and 2r: lo <= Price < hi
    hi: float = 0.0
    volume: int | None = None  # 2r: and Volume >= volume

    def matches(self, symbol: str, price: float, volume: int = 0) -> bool:
        if self.symbol is not None:
            return symbol == self.symbol
        return self.lo <= price < self.hi and (self.volume is None or volume >= self.volume)

    def echelon_filter(self) -> str:
        if self.symbol is not None:
            return f'Symbol = "{self.symbol}"'
        volume = "" if self.volume is None else f" and Volume >= {self.volume}"
        return f"Price >= {self.lo!r} and Price < {self.hi!r}{volume}"


def subscriptions(selectivity: int | str, n: int) -> list[Sub]:
    """n subscriptions each matching `selectivity` percent (2 or 20) of the events, or
    (RANGE) 2% by a range over two attributes."""
    if selectivity == 2:
        return [Sub(i, SYMBOLS[i % len(SYMBOLS)]) for i in range(n)]
    if selectivity == 20:
        return [Sub(i, None, round(i * 80.0 / n, 1), round(i * 80.0 / n, 1) + 20.0) for i in range(n)]
    if selectivity == RANGE:
        span = 100.0 - RANGE_WIDTH
        return [Sub(i, None, round(i * span / n, 1), round(i * span / n, 1) + RANGE_WIDTH, VOLUME_MIN)
                for i in range(n)]
    raise ValueError(f"selectivity {selectivity}: 2, 20 or {RANGE}")


@dataclass
class Pool:
    """POOL events and, for each, the subscriptions it matches."""

    symbols: list[str]
    prices: list[float]
    receivers: list[tuple[int, ...]]
    volumes: list[int] | None = None  # the range workload's events carry Volume

    @classmethod
    def draw(cls, subs: list[Sub], seed: int = 12) -> "Pool":
        rnd = random.Random(seed)
        symbols = [rnd.choice(SYMBOLS) for _ in range(POOL)]
        prices = [rnd.uniform(0.0, 100.0) for _ in range(POOL)]
        volumes = [rnd.randrange(1000) for _ in range(POOL)] if any(s.volume is not None for s in subs) else None
        receivers = [tuple(s.index for s in subs if s.matches(symbols[i], prices[i], volumes[i] if volumes else 0))
                     for i in range(POOL)]
        return cls(symbols, prices, receivers, volumes)

    def attributes(self, i: int) -> dict:
        """Event i's attributes (the SDK's form)."""
        out = {"Symbol": self.symbols[i], "Price": self.prices[i]}
        if self.volumes is not None:
            out["Volume"] = self.volumes[i]
        return out

    def volume(self, i: int) -> int:
        return self.volumes[i] if self.volumes is not None else 0

    def expected(self, first: int, last: int) -> int:
        """Useful deliveries of events first..last-1."""
        return sum(len(self.receivers[i % POOL]) for i in range(first, last))


@dataclass
class Received:
    """What the subscribers got in one cell: latencies (ns), useful deliveries, and per
    subscription the ids (kept for the oracle check, Echelon only)."""

    latencies: array = field(default_factory=lambda: array("q"))
    useful: int = 0
    ids: dict[int, list[int]] | None = None
    last_ns: int = 0

    def record(self, sub: int, event_id: int, sent_ns: int, now_ns: int) -> None:
        self.latencies.append(now_ns - sent_ns)
        self.useful += 1
        self.last_ns = now_ns
        if self.ids is not None:
            self.ids.setdefault(sub, []).append(event_id)


def oracle(pool: Pool, first: int, last: int, subs: list[Sub], ids: dict[int, list[int]]) -> dict:
    """Brute force: each subscription's received ids against the events (first..last-1)
    whose attributes satisfy its predicate: missing, extra, duplicated."""
    missing = extra = dup = 0
    for s in subs:
        want = {i for i in range(first, last)
                if s.matches(pool.symbols[i % POOL], pool.prices[i % POOL], pool.volume(i % POOL))}
        got = ids.get(s.index, [])
        seen = set(got)
        dup += len(got) - len(seen)
        missing += len(want - seen)
        extra += len(seen - want)
    return {"missing": missing, "extra": extra, "duplicated": dup}


def percentile(sorted_ns: list[int], q: float) -> float | None:
    """q-quantile in ms (nearest rank) of sorted latencies in ns; None without any."""
    if not sorted_ns:
        return None
    k = min(len(sorted_ns) - 1, max(0, int(round(q * len(sorted_ns))) - 1))
    return sorted_ns[k] / 1e6


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_USERS = re.compile(r"pid=(\d+)")
_SENT = re.compile(r"bytes_sent:(\d+)")


def cpu_waiting() -> float | None:
    """Seconds some runnable task of this machine has waited for a core (the kernel's
    pressure stall information, /proc/pressure/cpu `some`), None where the kernel has none.
    Over a cell, divided by its wall time: the share of the cell during which the machine
    was short of cores, whoever's work it was (a latency measured then is mostly a queue
    for a core)."""
    try:
        with open("/proc/pressure/cpu") as f:
            some = f.readline().split()
    except OSError:
        return None
    return int(some[-1].partition("=")[2]) / 1e6 if some and some[0] == "some" else None


def tcp_bytes_sent(pids: set[int]) -> int:
    """Sum of tcp_info bytes_sent over the TCP sockets owned by `pids`."""
    return sum(tcp_bytes_by_hop({p: "" for p in pids}).values())


_ADDRESSES = re.compile(r"^\S+\s+\d+\s+\d+\s+(\S+)\s+(\S+)")


def tcp_sockets(roles: dict[int, str]) -> dict[tuple[str, str], tuple[str, str, int]]:
    """tcp_info bytes_sent of each TCP socket owned by the pids of `roles`: (local, peer) ->
    (the sender's role, the receiver's, bytes sent), the receiver found by the other end of
    the connection (a socket of ours whose local address is this one's peer); "other" when
    no process of `roles` holds that end."""
    out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, timeout=20).stdout
    sockets: list[tuple[str, str, str | None, int]] = []  # (local, peer, owner's role, bytes sent)
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):  # a socket line; its tcp_info follows
            addresses = _ADDRESSES.match(line)
            owner = next((roles[int(p)] for p in _USERS.findall(line) if int(p) in roles), None)
            sockets.append((*addresses.groups(), owner, 0) if addresses else ("", "", owner, 0))
        elif sockets and sockets[-1][2] is not None and (m := _SENT.search(line)):
            sockets[-1] = (*sockets[-1][:3], int(m.group(1)))
    at = {local: role for local, _, role, _ in sockets if role is not None}
    return {(local, peer): (role, at.get(peer, "other"), sent) for local, peer, role, sent in sockets
            if role is not None}


def hop_bytes(now: dict[tuple[str, str], tuple[str, str, int]],
              since: dict[tuple[str, str], tuple[str, str, int]] | None = None) -> Counter:
    """Bytes sent by hop (sender's role, receiver's) by the sockets of `now` (tcp_sockets),
    less what each had sent at `since`: per socket, so a connection that closed in between
    counts nothing rather than less than nothing (its last count is gone with it)."""
    hops: Counter = Counter()
    for key, (role, peer_role, sent) in now.items():
        before = since.get(key) if since else None
        hops[(role, peer_role)] += sent - before[2] if before is not None and before[2] <= sent else sent
    return hops


def tcp_bytes_by_hop(roles: dict[int, str]) -> Counter:
    """tcp_info bytes_sent over the TCP sockets owned by the pids of `roles`, by hop (tcp_sockets)."""
    return hop_bytes(tcp_sockets(roles))
