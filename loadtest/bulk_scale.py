"""Bulk at the paper's scale: one payload of LBDD's size (8 GB) to 11 subscribers, with
the peak memory of every agent (LBDD section 4; docs/performance.md, "Bulk payloads").

    python -m loadtest.bulk_scale [--size-mb 8192] [--agents 12] [--subscribers 11] [--out out/bulk-scale]

Every process on loopback (`echelon.launch.Loopback`), no traffic shaping: the netns
experiment (`loadtest.bulk`) shapes each upload to 20 Mbit/s so the network is the
bottleneck, which for 8 GB would take hours; here Python is the bottleneck and the
question is memory, not the distribution rate. One publisher process publishes the
payload as one event from a generator (`Publisher.publish_stream`: never held whole);
each subscriber process (one per agent other than the publisher's) reads it with
`msg.chunks()` into a streaming SHA-256 and stores nothing. The payload is a pure
function of (seed, size) (`payload_chunks`), so the orchestrator computes the expected
digest on its own.

Reported per run: completion time (publish start -> the last subscriber holds the whole
payload, SHA-256 checked; and the DELIVERED ack), throughput, and every process's peak
RSS (`VmHWM` in /proc/<pid>/status: the kernel's high-water mark of resident memory,
independent of our code), beside its RSS before the payload. The CI check
(tests/integration/test_bulk_memory.py) runs two sizes through one cluster and checks
the agents' peaks against a constant bound.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click

from echelon.client import DELIVERED, Client
from echelon.launch import Cluster, Loopback

MB = 1 << 20
BLOCK = 1 * MB  # the generator's piece: a random block with the piece's index in front


def payload_chunks(seed: int, size: int):
    """The payload, piece by piece: block i is `i` (8 bytes) + a fixed random block."""
    block = random.Random(seed).randbytes(BLOCK)
    for i in range(-(-size // BLOCK)):
        n = min(BLOCK, size - i * BLOCK)
        yield (i.to_bytes(8, "big") + block[8:])[:n]


def payload_sha256(seed: int, size: int) -> str:
    h = hashlib.sha256()
    for piece in payload_chunks(seed, size):
        h.update(piece)
    return h.hexdigest()


def vm_kib(pid: int, field_name: str) -> int:
    """A `Vm*` line of /proc/<pid>/status, in KiB (0 if the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def emit(**kw) -> None:
    print(json.dumps(kw), flush=True)


# -- the two ends, each its own process ------------------------------------------------------


async def subscribe(agent: str, topic: str, timeout: float) -> None:
    async with Client(agent) as c, c.subscribe(topic, "", max_whole=0, max_outstanding=4) as sub:
        emit(event="ready")
        while (msg := await sub.next(timeout=timeout)).attributes.get("name") != "bulk":
            await msg.ack()  # the orchestrator's probes
        h = hashlib.sha256()
        size = 0
        async for chunk in msg.chunks():
            h.update(chunk)
            size += len(chunk)
        await msg.ack()
        emit(event="done", t=time.time(), bytes=size, sha256=h.hexdigest(), streamed=msg.streamed)


async def publish(agent: str, topic: str, seed: int, size: int) -> None:
    async with Client(agent) as c:
        pub = c.publisher(ack_level=DELIVERED)
        emit(event="start", t=time.time())
        result = await pub.publish_stream(topic, {"name": "bulk"}, payload_chunks(seed, size), size)
        emit(event="done", t=time.time(), destinations=result.destinations)
        await pub.close()


@click.group()
def ends() -> None:
    """The subscriber and publisher processes (run by the orchestrator)."""


@ends.command("sub")
@click.option("--agent", required=True)
@click.option("--topic", required=True)
@click.option("--timeout", default=3600.0)
def sub_cmd(agent, topic, timeout):
    asyncio.run(subscribe(agent, topic, timeout))


@ends.command("pub")
@click.option("--agent", required=True)
@click.option("--topic", required=True)
@click.option("--seed", default=1)
@click.option("--size", type=int, required=True)
def pub_cmd(agent, topic, seed, size):
    asyncio.run(publish(agent, topic, seed, size))


# -- the orchestrator --------------------------------------------------------------------------


@dataclass
class Run:
    size: int
    seconds: float = 0.0  # publish start -> last subscriber done
    ack_seconds: float = 0.0  # publish start -> DELIVERED ack
    verified: int = 0  # subscribers whose SHA-256 matched
    subscribers: int = 0
    errors: list[str] = field(default_factory=list)
    peak_kib: dict[str, int] = field(default_factory=dict)  # process id -> VmHWM after the run
    before_kib: dict[str, int] = field(default_factory=dict)  # process id -> VmRSS before the run

    @property
    def ok(self) -> bool:
        return not self.errors and self.verified == self.subscribers

    @property
    def agent_peak_mib(self) -> float:
        return max(v for k, v in self.peak_kib.items() if k.startswith("agent")) / 1024

    def row(self) -> str:
        mbps = self.size / MB / self.seconds if self.seconds else 0
        return (f"| {self.size / MB:,.0f} MiB | {self.subscribers} | {self.verified} | {self.seconds:,.1f} s | "
                f"{self.ack_seconds:,.1f} s | {mbps:,.1f} MiB/s | {self.agent_peak_mib:,.0f} MiB |")


class Bench:
    """A loopback cluster, a topic, a subscriber per agent but the publisher's; runs payloads."""

    def __init__(self, agents: int = 12, subscribers: int = 11, out: Path = Path("out/bulk-scale"),
                 agent_flags: tuple[str, ...] = (), seed: int = 1, timeout: float = 3600.0, log=print):
        if not 1 <= subscribers <= agents - 1:
            raise ValueError(f"subscribers {subscribers}: 1 to agents - 1")
        self.agents, self.subscribers, self.out, self.seed, self.timeout, self.log = \
            agents, subscribers, Path(out), seed, timeout, log
        self.cluster = Cluster(agents=agents, matchers=1, memberships=1, placement=Loopback(base_port=0),
                               log_dir=self.out / "logs", extra={"agent": list(agent_flags)})
        self.round = 0

    async def __aenter__(self) -> "Bench":
        await self.cluster.start()
        async with Client(self.cluster.agent_addresses()[0]) as c:
            await c.create_topic("bulk", ["name:string"])
        return self

    async def __aexit__(self, *exc) -> None:
        self.cluster.stop()

    def agent_pids(self) -> dict[str, int]:
        return {p.id: p.pid for p in self.cluster.by_role("agent") if p.pid}

    async def run(self, size: int) -> Run:
        """One payload of `size` bytes from agent 0's publisher to a subscriber on agents 1..n."""
        self.round += 1
        run = Run(size, subscribers=self.subscribers)
        addresses = self.cluster.agent_addresses()
        run.before_kib = {k: vm_kib(pid, "VmRSS") for k, pid in self.agent_pids().items()}
        want = await asyncio.to_thread(payload_sha256, self.seed, size)
        me = [sys.executable, "-m", "loadtest.bulk_scale"]
        subs = [await asyncio.create_subprocess_exec(*me, "sub", "--agent", addresses[i], "--topic", "bulk",
                                                     "--timeout", str(self.timeout), stdout=asyncio.subprocess.PIPE)
                for i in range(1, self.subscribers + 1)]
        pub = None
        try:
            for p in subs:  # every subscription open before the payload starts
                line = await asyncio.wait_for(p.stdout.readline(), 60)
                if json.loads(line or b"{}").get("event") != "ready":
                    raise RuntimeError(f"a subscriber did not start: {line!r}")
            await self._settle(addresses)
            pub = await asyncio.create_subprocess_exec(*me, "pub", "--agent", addresses[0], "--topic", "bulk",
                                                       "--seed", str(self.seed), "--size", str(size),
                                                       stdout=asyncio.subprocess.PIPE)
            start = json.loads(await asyncio.wait_for(pub.stdout.readline(), 60))["t"]
            results = await asyncio.wait_for(asyncio.gather(*(p.stdout.readline() for p in subs)), self.timeout)
            done = []
            for i, line in enumerate(results, 1):
                r = json.loads(line or b"{}")
                if r.get("event") != "done":
                    run.errors.append(f"subscriber on agent-{i}: no result ({line!r})")
                elif r["sha256"] != want or r["bytes"] != size:
                    run.errors.append(f"subscriber on agent-{i}: {r['bytes']} bytes, sha256 {r['sha256'][:12]}")
                else:
                    run.verified += 1
                    done.append(r["t"])
            ack = json.loads(await asyncio.wait_for(pub.stdout.readline(), 120) or b"{}")
            if ack.get("event") != "done" or ack.get("destinations") != self.subscribers:
                run.errors.append(f"publisher: {ack}")
            else:
                run.ack_seconds = ack["t"] - start
            run.seconds = max(done, default=start) - start
        finally:
            for p in [*subs, *([pub] if pub else [])]:
                if p.returncode is None:
                    p.kill()
                await p.wait()
        run.peak_kib = {k: vm_kib(pid, "VmHWM") for k, pid in self.agent_pids().items()}
        self.log(f"{size / MB:,.0f} MiB: {run.verified}/{run.subscribers} verified in {run.seconds:.1f} s; "
                 f"agents' peak RSS {run.agent_peak_mib:.0f} MiB; errors {run.errors}")
        return run

    async def _settle(self, addresses: list[str], timeout: float = 60.0) -> None:
        """Until a probe published on agent 0 reaches every subscriber's agent (DELIVERED):
        the subscriptions are on the matchers and in the publisher's agent's view."""
        deadline = time.monotonic() + timeout
        async with Client(addresses[0]) as c:
            pub = c.publisher(ack_level=DELIVERED)
            while (got := (await pub.publish("bulk", {"name": "probe"})).destinations) < self.subscribers:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"probes reach {got} of {self.subscribers} subscribers after {timeout} s")
                await asyncio.sleep(0.2)
            await pub.close()


TABLE_HEAD = ("| payload | subscribers | verified | completion | DELIVERED ack | throughput | max agent peak RSS |\n"
              "|---|---|---|---|---|---|---|")


def peaks_table(runs: list[Run]) -> str:
    """Every agent's RSS before and peak after each run, MiB."""
    ids = sorted(runs[0].peak_kib, key=lambda k: int(k.rsplit("-", 1)[1]))
    head = "| agent | " + " | ".join(f"before {r.size / MB:,.0f} MiB | peak after" for r in runs) + " |"
    lines = [head, "|---|" + "---|---|" * len(runs)]
    for k in ids:
        role = " (publisher's)" if k == ids[0] else ""
        lines.append(f"| {k}{role} | " + " | ".join(f"{r.before_kib.get(k, 0) / 1024:.0f} | "
                                                  f"{r.peak_kib.get(k, 0) / 1024:.0f}" for r in runs) + " |")
    return "\n".join(lines)


async def main_async(sizes: list[int], agents: int, subscribers: int, out: Path, agent_flags: tuple[str, ...]):
    out.mkdir(parents=True, exist_ok=True)
    async with Bench(agents, subscribers, out, agent_flags) as bench:
        runs = [await bench.run(size) for size in sizes]
    table = "\n".join([TABLE_HEAD, *(r.row() for r in runs), "", peaks_table(runs)])
    print(table)
    (out / "results.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps([asdict(r) for r in runs], indent=1))
    return runs


@click.command()
@click.option("--size-mb", "sizes", multiple=True, type=click.IntRange(1), default=[8192], show_default=True,
              help="Payload size in MiB (repeat for several runs in one cluster).")
@click.option("--agents", default=12, show_default=True)
@click.option("--subscribers", default=11, show_default=True)
@click.option("--agent-flag", "agent_flags", multiple=True, help="Extra agent flag, e.g. --agent-flag=--stripes=1")
@click.option("--out", default="out/bulk-scale", type=click.Path(file_okay=False, path_type=Path))
def main(sizes, agents, subscribers, agent_flags, out) -> None:
    """Run payloads of the given sizes through a loopback cluster; print the table."""
    runs = asyncio.run(main_async([s * MB for s in sizes], agents, subscribers, out, tuple(agent_flags)))
    sys.exit(0 if all(r.ok for r in runs) else 1)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("sub", "pub"):
        ends()
    else:
        main()
