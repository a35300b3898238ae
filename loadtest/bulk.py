"""The paper's experiment (Li et al., section 4; docs/papers.md, "LBDD"), on one machine.

    python -m loadtest.bulk [--payload-mb 64] [--rate-mbit 20] [--modes p2p,lbdd,striped] [--out out/bulk]

Twelve hosts, each a network namespace on one bridge (`loadtest.netns`) with the
paper's address suffixes (.74 is the publisher) in 198.18.0.0/24, each running its own
agent, with its upload shaped by tbf so the network, not Python, is the bottleneck.
Membership and the matcher run in the root namespace on the bridge address. One
publisher sends a bulk payload to 11 subscribers, once per dissemination mode:

- p2p: the publisher's agent sends every copy (the paper's point-to-point);
- lbdd: copies go down the plain LBDD tree (`--dissemination lbdd --stripes 1`);
- striped: LBDD with the payload's slices striped over `--stripes` salted trees.

A mode whose agent flags do not exist is skipped with a message. Per mode the table
shows the completion time (publish start -> last subscriber holds the whole payload,
SHA-256 checked), the distribution rate (payload bits per subscriber per second), the
speedup over p2p measured in the same run, the ideal bounds (tree N/2, swarm N, and
these trees' own: N / copies the busiest node sends), the publisher's share of the bytes
sent (kernel interface counters on the bridge side of each veth -- independent of our
code -- and the agents' `echelon_relay_sent_bytes_total` beside them), the tree depth
(`core.lbdd.build_tree` over the agents' keys), and CPU per service process. A sweep
over 2..11 subscribers with a smaller payload draws the paper's Fig. 2 (distribution
rate) and Fig. 3 (publisher's network load) into `--out`.

The payload is a stream of `--chunk-mb` messages (the paper's 8 GB too was a stream of
slices), which the agents slice again. One 8 GiB message, cut through with every agent's
peak memory, is `loadtest.bulk_scale` (on loopback: at 20 Mbit/s it would take hours).

Defaults, and why:
- 20 Mbit/s per upload: point-to-point then measures within ~5% of N*F/u (the rest is
  TCP/gRPC overhead) and the striped mode, which moves the most bytes per second through
  Python (about 11 * 13 Mbit/s relayed and delivered), keeps every service process under
  10% of a core and all of them together near one of the machine's two cores. At 40
  Mbit/s it would need about 1.8 cores for the services alone, shared with whatever
  else runs, and Python would become the limit.
- 64 MiB main payload, 4 MiB sweep: point-to-point is the slow mode, 11 * 64 MiB at
  20 Mbit/s is 4.7 minutes, and the whole default run (three modes, ten sweep points
  each) stays near 15 minutes. `--payload-mb 256` reproduces "a few hundred MB" in about
  35 minutes.
- 100 ms uplink queue (tbf latency), heartbeats every 0.5 s, and every host with
  net.ipv4.tcp_notsent_lowat = 128 KiB. With the kernel's default (no bound on unsent
  data in a socket) a relay stream at p2p's 1/11 share of 20 Mbit/s holds many seconds
  of data in its socket; gRPC's keepalive ping (5 s timeout) waits behind it, the
  stream breaks and resends its window, and the sender reports the peer suspect (2
  breaks and 2 false suspicions in one p2p round; none with the bound, at the same
  speed). With 0.2 s beats (suspect after 1 s) an agent was once declared dead in a
  striped run at 40 Mbit/s and its subscriber never completed. All are flags; broken
  streams and view changes during a transfer are reported in the table.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import click

from echelon.launch import stop_processes
from echelon.v1 import membership_pb2 as mpb
from loadtest import bulk_report
from loadtest.bulk_client import SCHEMA, payload_sha256
from loadtest.bulk_cluster import (Cluster, Endpoint, Mode, agent_flags, agent_options, cpu_busy, cpu_times, modes,
                                   scrape_relay, tree_stats, uplink_drops)
from loadtest.netns import Network, NetnsError, Unsupported, check_available, wait_until

PAPER_SUFFIXES = (74, 97, 234, 90, 98, 64, 61, 184, 72, 88, 44, 68)  # publisher first
MB = 1 << 20


@dataclass
class Round:
    """One transfer: a payload from the publisher to `subscribers` hosts, in one mode."""

    mode: str
    subscribers: int
    size: int
    rate_mbit: float
    seconds: float | None = None
    verified: int = 0  # subscribers holding the exact payload
    duplicates: int = 0
    reordered: int = 0
    host_tx: dict[str, int] = field(default_factory=dict)  # address -> bytes sent (interface)
    relay_tx: dict[str, float] = field(default_factory=dict)  # address -> echelon_relay_sent_bytes_total
    drops: int = 0  # packets the uplinks' qdiscs dropped (full queues)
    link_breaks: int = 0  # relay streams that broke (and resent their window)
    publisher: str = ""
    depth: int = 0  # of stripe 0's tree, the plain LBDD tree
    depths: list[int] = field(default_factory=list)  # of every stripe's tree
    root_copies: float = 0.0  # copies of each slice the publisher sends, averaged over the stripe schedule
    busiest_copies: float = 0.0  # the same for the node sending the most
    incidents: list[str] = field(default_factory=list)  # view changes seen mid-transfer
    cpu_busy: float | None = None  # share of the machine's CPU time busy over the transfer (shared machine)
    cpu: dict[str, float] = field(default_factory=dict)  # service id -> cores used over the transfer
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.seconds is not None and self.verified == self.subscribers and not self.errors

    @property
    def rate(self) -> float | None:
        """Distribution rate: payload Mbit/s per subscriber."""
        return self.size * 8 / self.seconds / 1e6 if self.seconds else None

    @property
    def pub_share(self) -> float | None:
        total = sum(self.host_tx.values())
        return self.host_tx.get(self.publisher, 0) / total if total else None

    @property
    def pub_relay_share(self) -> float | None:
        total = sum(self.relay_tx.values())
        return self.relay_tx.get(self.publisher, 0) / total if total else None

    @property
    def pub_load(self) -> float | None:
        """The publisher's uplink utilisation over the transfer (the paper's Fig. 3)."""
        if not self.seconds:
            return None
        return self.host_tx.get(self.publisher, 0) * 8 / (self.rate_mbit * 1e6 * self.seconds)

    @property
    def wire_copies(self) -> float:
        return sum(self.host_tx.values()) / self.size


@dataclass
class Settings:
    rate_mbit: float
    chunk: int
    window: int
    seed: int
    log_dir: Path


def run_round(net: Network, cluster: Cluster, s: Settings, n: int, size: int, tag: str) -> Round:
    pub_host, sub_hosts = net.hosts[0], net.hosts[1:1 + n]
    pub_agent, sub_agents = cluster.agent(pub_host), [cluster.agent(h) for h in sub_hosts]
    r = Round(cluster.mode.name, n, size, s.rate_mbit, publisher=pub_host.address,
              **tree_stats(pub_agent, sub_agents, cluster.stripes))
    topic = f"bulk-{tag}"
    # Generous: three times the point-to-point bound, plus start-up.
    timeout = 3 * n * size * 8 / (s.rate_mbit * 1e6) + 90
    asyncio.run(_create_topic(cluster.membership, topic))
    client = [sys.executable, "-m", "loadtest.bulk_client"]
    common = ["--topic", topic, "--size", str(size), "--chunk", str(s.chunk), "--timeout", f"{timeout:.0f}"]
    endpoints: list[Endpoint] = []
    try:
        subs = [Endpoint(net, h, [*client, "sub", "--agent", cluster.agent(h).address, *common],
                         s.log_dir / f"{tag}-sub-{h.index}.err") for h in sub_hosts]
        endpoints += subs
        wait_until(lambda: all(e.event("ready") or e.proc.poll() is not None for e in subs), 60, 0.1,
                   "subscribers ready")
        if not all(e.event("ready") for e in subs):
            raise RuntimeError(f"a subscriber failed to open its subscription (logs {s.log_dir}/{tag}-sub-*.err)")
        subscribed = {a.address for a in sub_agents}
        cluster.wait_view(lambda v: {m.address for m in v.members if topic in m.subscribes} >= subscribed, 30,
                          f"{n} agents advertising {topic}")
        time.sleep(2 * cluster.beat_interval)  # the view reaches every agent
        agents = [cluster.agent(h) for h in net.hosts]
        before, relay_before = {h.address: net.counters(h) for h in net.hosts}, scrape_relay(agents)
        cpu_before, procs_before = cpu_times(), cluster.cpu_seconds()
        drops_before, breaks_before = uplink_drops(net), cluster.link_breaks()
        t0 = time.monotonic()
        pub = Endpoint(net, pub_host, [*client, "pub", "--agent", pub_agent.address, *common,
                                       "--window", str(s.window), "--seed", str(s.seed)],
                       s.log_dir / f"{tag}-pub.err")
        endpoints.append(pub)
        # Stalled: no progress for three times what one chunk takes to reach everyone point-to-point.
        _wait_transfer(cluster, endpoints, timeout + 30, max(60.0, 3 * n * s.chunk * 8 / (s.rate_mbit * 1e6)), r)
        r.cpu_busy = cpu_busy(cpu_before, cpu_times())
        r.drops = uplink_drops(net) - drops_before
        r.link_breaks = cluster.link_breaks() - breaks_before
        wall = time.monotonic() - t0
        r.cpu = {k: (v - procs_before.get(k, 0.0)) / wall for k, v in cluster.cpu_seconds().items()}
        after, relay_after = {h.address: net.counters(h) for h in net.hosts}, scrape_relay(agents)
        r.host_tx = {a: after[a]["tx_bytes"] - before[a]["tx_bytes"] for a in before}
        r.relay_tx = {a: relay_after[a] - relay_before[a] for a in relay_before}
        _judge(r, pub, subs, payload_sha256(s.seed, size, s.chunk))
    except (TimeoutError, RuntimeError) as e:
        r.errors.append(str(e))
    finally:
        stop_processes([e.proc for e in endpoints])
    return r


def _wait_transfer(cluster: Cluster, endpoints: list[Endpoint], timeout: float, stall: float, r: Round) -> None:
    """Wait for every endpoint to exit, at most `timeout` seconds, or until no subscriber
    has reported progress for `stall` seconds. Meanwhile watch the view: an agent
    suspected or declared dead mid-transfer is an incident, reported with the result."""
    start = cluster.agents()
    deadline = time.monotonic() + timeout
    seen, moved, next_look = None, time.monotonic(), 0.0
    while not all(e.proc.poll() is not None for e in endpoints):
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"the transfer did not finish within {timeout:.0f}s")
        lines = tuple(len(e.events) for e in endpoints)  # progress and done lines
        if lines != seen:
            seen, moved = lines, now
        elif now - moved > stall:
            raise TimeoutError(f"no subscriber made progress for {stall:.0f}s")
        if now >= next_look:
            next_look = now + 2.0
            for agent, (inc, state) in cluster.agents().items():
                if agent in start and (inc, state) != start[agent]:
                    name = mpb.MemberState.Name(state).removeprefix("MEMBER_STATE_").lower()
                    bumped = f" (incarnation +{inc - start[agent][0]})" if inc != start[agent][0] else ""
                    r.incidents.append(f"{agent} {name}{bumped}")
                    start[agent] = (inc, state)
        time.sleep(0.1)


def _judge(r: Round, pub: Endpoint, subs: list[Endpoint], expected_sha: str) -> None:
    start, pub_done = pub.event("start"), pub.event("done")
    if not start or not pub_done:
        r.errors.append(f"publisher did not finish (exit {pub.proc.returncode})")
        return
    r.errors += pub_done.get("errors", [])
    lasts = []
    for e in subs:
        d = e.event("done") or {}
        r.duplicates += d.get("duplicates", 0)
        r.reordered += d.get("reordered", 0)
        if d.get("complete") and d.get("sha256") == expected_sha:
            r.verified += 1
            lasts.append(d["last"])
        else:
            r.errors.append(f"{e.host.address}: {d.get('chunks', 0)} chunks, "
                            f"{'hash mismatch' if d.get('complete') else 'incomplete'}")
    if r.verified == len(subs):
        r.seconds = max(lasts) - start["t"]


async def _create_topic(membership: str, topic: str) -> None:
    from echelon.client import Client

    async with Client(membership) as c:
        await c.create_topic(topic, SCHEMA)


@dataclass
class Experiment:
    payload: int
    rate_mbit: float
    subscribers: int = 11
    modes: list[Mode] = field(default_factory=list)
    sweep: bool = True
    sweep_payload: int = 4 * MB
    chunk: int = 4 * MB
    window: int = 32 * MB
    seed: int = 1
    out: Path = Path("out/bulk")
    subnet: str | None = None
    beat_interval: float = 0.5
    queue_ms: float = 100.0
    notsent_lowat: int = 128 << 10  # bytes; 0 keeps the kernel's default
    log: callable = print

    def run(self) -> dict:
        """Every mode's main round and sweep; results as plain data (also written to out)."""
        options = agent_options()
        results: dict = {"settings": {"payload": self.payload, "rate_mbit": self.rate_mbit,
                                      "subscribers": self.subscribers, "chunk": self.chunk, "window": self.window,
                                      "sweep_payload": self.sweep_payload if self.sweep else None},
                         "main": [], "sweep": [], "skipped": {}}
        self.out.mkdir(parents=True, exist_ok=True)
        hosts = self.subscribers + 1
        with Network(hosts, suffixes=PAPER_SUFFIXES[:hosts] if hosts <= 12 else None, subnet=self.subnet) as net:
            for h in net.hosts:
                net.shape(h, rate_mbit=self.rate_mbit, latency_ms=self.queue_ms)
                if self.notsent_lowat:
                    net.sysctl(h, "net.ipv4.tcp_notsent_lowat", self.notsent_lowat)
            self.log(f"{hosts} hosts in {net.net} (publisher {net.hosts[0].address}), uploads shaped to "
                     f"{self.rate_mbit:g} Mbit/s (tbf, {self.queue_ms:g} ms queue); membership and matcher on "
                     f"{net.gateway}; heartbeats every {self.beat_interval:g} s")
            for mode in self.modes:
                flags, reason = agent_flags(mode, options)
                if reason:
                    self.log(f"[yellow]skipping {mode.name}: {reason}[/]")
                    results["skipped"][mode.name] = reason
                    continue
                log_dir = self.out / "logs" / mode.name
                cluster = Cluster(net, mode, flags, log_dir, self.beat_interval)
                settings = Settings(self.rate_mbit, self.chunk, self.window, self.seed, log_dir)
                try:
                    t0 = time.monotonic()
                    cluster.start()
                    self.log(f"{mode.name}: cluster serving in {time.monotonic() - t0:.1f}s "
                             f"(agent flags: {' '.join(flags) or 'none'})")
                    plan = [("main", self.subscribers, self.payload)]
                    if self.sweep:
                        plan += [("sweep", n, self.sweep_payload) for n in range(2, self.subscribers + 1)]
                    fresh = True
                    for kind, n, size in plan:
                        if not fresh or cluster.crashed():
                            # A failed round may leave copies in flight, an exited agent holes:
                            # the next round starts on a new cluster.
                            self.log(f"[yellow]{mode.name}: restarting the cluster (exited: "
                                     f"{', '.join(cluster.crashed()) or 'none'}; logs in {log_dir})[/]")
                            cluster.stop()
                            cluster.start()
                        r = run_round(net, cluster, settings, n, size, kind if kind == "main" else f"sweep-{n}")
                        self.log(f"{mode.name}: {size / MB:g} MiB to {n} subscribers: {_brief(r)}")
                        results[kind].append(r)
                        fresh = r.ok
                finally:
                    cluster.stop()
        return results


def _brief(r: Round) -> str:
    seen = f" (mid-transfer: {', '.join(r.incidents)})" if r.incidents else ""
    if not r.ok:
        return f"[red]FAILED[/] {'; '.join(r.errors[:3])}{seen}"
    return f"{r.seconds:.1f}s, {r.rate:.1f} Mbit/s per subscriber, {r.verified}/{r.subscribers} verified{seen}"


@click.command()
@click.option("--payload-mb", type=click.FloatRange(0.01, 100_000), default=64, show_default=True,
              help="Bulk payload of the main run, MiB.")
@click.option("--rate-mbit", type=click.FloatRange(0.1, 10_000), default=20, show_default=True,
              help="Upload rate of every host (tbf), Mbit/s.")
@click.option("--subscribers", type=click.IntRange(1, 200), default=11, show_default=True)
@click.option("--modes", "mode_names", default="p2p,lbdd,striped", show_default=True,
              help="Comma list of p2p, lbdd, striped.")
@click.option("--stripes", type=click.IntRange(1, 64), default=8, show_default=True,
              help="Stripes (trees) of the striped mode.")
@click.option("--slice-bytes", type=click.IntRange(1024), default=65536, show_default=True,
              help="LBDD slice size, passed to the agents.")
@click.option("--chunk-mb", type=click.FloatRange(0.001, 48), default=4, show_default=True,
              help="Bytes per published message (the payload is a stream of them), MiB.")
@click.option("--window-mb", type=click.FloatRange(0.001, 48), default=32, show_default=True,
              help="Bytes the publisher keeps unacknowledged (DELIVERED), MiB.")
@click.option("--sweep/--no-sweep", default=True, show_default=True,
              help="Also run 2..N subscribers with --sweep-mb and plot Fig. 2 and Fig. 3.")
@click.option("--sweep-mb", type=click.FloatRange(0.01, 100_000), default=4, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("out/bulk"),
              show_default=True)
@click.option("--subnet", default=None, help="A /24 of 198.18.0.0/15 (default: the first free one).")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--beat-interval", type=click.FloatRange(0.05, 10), default=0.5, show_default=True,
              help="Heartbeat interval of every service (the detector suspects after 5 beats of silence).")
@click.option("--queue-ms", type=click.FloatRange(1, 10_000), default=100, show_default=True,
              help="Uplink queue of each host, in ms at the rate (tbf latency).")
@click.option("--notsent-lowat-kb", type=click.IntRange(0, 1 << 20), default=128, show_default=True,
              help="Hosts' net.ipv4.tcp_notsent_lowat, KiB (0: the kernel's default, unlimited).")
@click.option("--report-only", is_flag=True, help="Print the tables and draw the plots of --out/results.json again.")
def main(payload_mb, rate_mbit, subscribers, mode_names, stripes, slice_bytes, chunk_mb, window_mb, sweep, sweep_mb,
         out, subnet, seed, beat_interval, queue_ms, notsent_lowat_kb, report_only) -> None:
    """Reproduce (and beat) the paper's bulk distribution experiment in network namespaces."""
    console = bulk_report.console
    if report_only:
        results = _load(out / "results.json")
    else:
        try:
            check_available()
        except Unsupported as e:
            console.print(f"[red]cannot create network namespaces here: {e}[/]")
            sys.exit(2)
        chunk = int(chunk_mb * MB)
        exp = Experiment(int(payload_mb * MB), rate_mbit, subscribers,
                         modes(_names(mode_names), stripes, slice_bytes), sweep, int(sweep_mb * MB), chunk,
                         max(chunk, int(window_mb * MB)), seed, out, subnet, beat_interval, queue_ms,
                         notsent_lowat_kb << 10, console.print)
        started = time.monotonic()
        try:
            results = exp.run()
        except (NetnsError, Unsupported) as e:
            console.print(f"[red]network setup failed: {e}[/]")
            sys.exit(2)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted: namespaces, qdiscs and processes removed[/]")
            sys.exit(130)
        results["elapsed"] = time.monotonic() - started
        results["labels"] = {m.name: m.label for m in exp.modes}
        (out / "results.json").write_text(json.dumps(_plain(results), indent=1))
    bulk_report.report(results, out)
    failed = [r for r in results["main"] + results["sweep"] if not r.ok]
    sys.exit(1 if failed or not results["main"] else 0)


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _load(path: Path) -> dict:
    """results.json back into Rounds (the derived fields are recomputed)."""
    data = json.loads(path.read_text())
    names = {f.name for f in fields(Round)}
    rounds = {k: [Round(**{a: v for a, v in x.items() if a in names}) for x in data[k]] for k in ("main", "sweep")}
    return {**data, **rounds}


def _plain(results: dict) -> dict:
    conv = lambda r: {**asdict(r), "rate_mbit_per_subscriber": r.rate, "publisher_share": r.pub_share,  # noqa: E731
                      "publisher_load": r.pub_load, "ok": r.ok}
    return {**results, "main": [conv(r) for r in results["main"]], "sweep": [conv(r) for r in results["sweep"]]}


if __name__ == "__main__":
    main()
