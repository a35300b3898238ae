"""The three systems behind one small interface: start, subscribe (deliveries go to
`sink(sub, event_id, sent_ns)`), publishers whose `send(ids)` returns once the batch is
acknowledged (Echelon: at the publisher's ack level) or flushed (NATS: PING/PONG after
the publishes; Redis: the pipeline's replies), and the pids of the servers we started.

Echelon: `echelon.launch` on loopback, 4 agents, 3 matchers (3 membership replicas);
publishers on agent-0, subscriptions dealt over agents 1-3. NATS: nats-server with one
connection per publisher and per subscriber agent, a subject per symbol (`ev.s07`); at
20% the connection takes `ev.>` and filters by Price for its whole group in the client; in
the range workload every subscriber takes `ev.>` and filters by Price and Volume itself, as
the application it stands for would (counted: `filtered`; `_Peer.filtering`). Redis:
redis-server pub/sub, the same channels (PSUBSCRIBE `ev.*` and client filtering where NATS
filters; in the range workload a connection per subscriber, as Redis sends one copy per
connection). Echelon's publishers are the
SDK's, or (modes `raw-*`, `rawc-*`) the generated stubs' (raw.py), or (`node-*`, `nodec-*`)
a Node client written from protos/ (node.py, loadtest/node/); `*c-*`: with `coalesce_acks`;
`zbatch-*`: the SDK's batches with `compress=True`, publisher and subscribers (their streams
compressed both ways: client/compressed.py), against batch-* for the bytes and the CPU
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable

from loadtest.bench_events.workload import NATS_DATA, PAYLOAD, POOL, SCHEMA, TOPIC, Pool, Sub

Sink = Callable[[int, int, int], None]
SUB_AGENTS = 3  # subscribers are dealt over this many agents / connections


def pool_index(event_id: int) -> int:
    """Events have ids >= 0; a warm-up event for pool entry k has id -(k+1)."""
    return event_id % POOL if event_id >= 0 else -event_id - 1


def missing_peers() -> list[str]:
    return [b for b in ("nats-server", "redis-server") if shutil.which(b) is None]


async def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{proc.args[0]} not listening on {port} after {timeout:.0f}s")
        await asyncio.sleep(0.05)


class Echelon:
    name = "echelon"

    def __init__(self, log_dir: Path, tls: bool = False, base_port: int = 0):
        self.tls = tls  # every process and client over mTLS (loadtest.bench_tls)
        # The LBDD trees hang on the members' addresses (dataplane/trees.py): the same ports
        # every run, the same trees. Taken (another cluster there): free ports, and the rows say so.
        self.base_port = base_port
        self.pinned = False
        self.log_dir = log_dir / ("echelon-tls" if tls else "echelon")
        self.subs, self.tasks = [], []
        self.clients: list = []
        self.overflowed = 0  # subscriptions the agents closed as slow consumers (open_subs)

    async def start(self, attempts: int = 3) -> None:
        """Start the cluster; again on fresh ports if one was taken between being picked
        and bound (other programs share this machine's loopback)."""
        from echelon.client import Client
        from echelon.launch import Cluster, Loopback

        for attempt in range(attempts):
            port = self.base_port if attempt == 0 else 0
            self.cluster = Cluster(agents=4, matchers=3, placement=Loopback(base_port=port),
                                   log_dir=self.log_dir / f"start-{attempt}", tls=self.tls)
            try:
                await self.cluster.start()
                self.pinned = bool(port)
                break
            except RuntimeError:  # a process exited at start (its log says why): the cluster stopped it all
                if attempt == attempts - 1:
                    raise
        agents = self.cluster.agent_addresses()
        self.admin = Client(agents[0], tls=self.cluster.client_tls)
        await self.admin.create_topic(TOPIC, SCHEMA)
        self.sub_clients = [Client(a, tls=self.cluster.client_tls) for a in agents[1:1 + SUB_AGENTS]]
        self.plain_clients, self.zclients = self.sub_clients, None  # the subscribers' clients, plain and `compress`
        self.opened = None  # what open_subs was given: a mode of the other kind opens them again (for_mode)

    async def for_mode(self, mode: str) -> bool:
        """The subscriptions on clients of `mode`'s kind: compressed streams (zbatch-*) or
        plain; True when they were opened again (the caller warms them up)."""
        from echelon.client import Client

        compress = mode.startswith("z")
        if compress == (self.sub_clients is self.zclients) or self.opened is None:
            return False
        if compress and self.zclients is None:
            self.zclients = [Client(a, tls=self.cluster.client_tls, compress=True)
                             for a in self.cluster.agent_addresses()[1:1 + SUB_AGENTS]]
        await self.close_subs()
        self.sub_clients = self.zclients if compress else self.plain_clients
        await self.open_subs(*self.opened)
        return True

    def pids(self) -> dict[str, int]:
        return {p.id: p.pid for p in self.cluster.processes if p.pid}

    def publishing_pid(self) -> int:
        return self.cluster.process("agent-0").pid

    async def open_subs(self, subs: list[Sub], pool: Pool, sink: Sink) -> None:
        from echelon.client.errors import ResourceExhausted

        self.opened = (subs, pool, sink)

        async def drain(s, slot, sub):
            while True:
                try:
                    # The batch API (client/subscription.py): what has arrived, settled in one call.
                    async for batch in sub.batches():
                        for m in batch:
                            event_id, sent = PAYLOAD.unpack(m.payload)
                            sink(s.index, event_id, sent)
                        await sub.ack(batch)
                    return
                except ResourceExhausted:
                    # A slow consumer: its backlog on the agent passed the bound (an ACCEPTED
                    # publisher at saturation outruns 10 deliveries per event) and the agent
                    # closed it. Counted (the cell's `overflowed`) and subscribed again, as an
                    # application would; what it missed meanwhile is missing from the cell.
                    self.overflowed += 1
                    sub = self.subs[slot] = await self._subscribe(s)

        for s in subs:
            sub = await self._subscribe(s)
            self.subs.append(sub)
            self.tasks.append(asyncio.create_task(drain(s, len(self.subs) - 1, sub)))

    async def _subscribe(self, s: Sub):
        sub = self.sub_clients[s.index % SUB_AGENTS].subscribe(TOPIC, s.echelon_filter(), max_outstanding=1024)
        await sub.start()
        return sub

    async def close_subs(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await asyncio.gather(*(s.close() for s in self.subs), return_exceptions=True)
        self.subs, self.tasks = [], []

    async def publishers(self, n: int, mode: str, pool: Pool) -> list[Callable]:
        """`mode`: 'batch-DELIVERED', 'single-ACCEPTED', ...: publish_batch() per batch,
        or publish() per event (as publish_nowait: the same request, many in flight)."""
        from echelon.client import AckLevel, Client

        how, level = mode.split("-")
        if how in ("raw", "rawc"):  # the generated stubs, one event per request (raw.py)
            return self._raw_publishers(n, AckLevel[level].value, how == "rawc", pool)
        if how in ("node", "nodec"):  # a client in another language, one event per request (node.py)
            return await self._node_publishers(n, AckLevel[level].value, how == "nodec", pool)
        attrs = [pool.attributes(i) for i in range(POOL)]
        sends = []
        for _ in range(n):
            # zbatch: batch over streams compressed both ways (client/compressed.py)
            client = Client(self.cluster.agent_addresses()[0], tls=self.cluster.client_tls, compress=how == "zbatch")
            pub = client.publisher(ack_level=AckLevel[level])
            self.clients.append(client)

            if how in ("batch", "zbatch"):
                async def send(ids, pub=pub):
                    now = time.perf_counter_ns()
                    await pub.publish_batch(TOPIC, [(attrs[pool_index(i)], PAYLOAD.pack(i, now)) for i in ids])
            else:
                async def send(ids, pub=pub):
                    await asyncio.gather(*(pub.publish_nowait(TOPIC, attrs[pool_index(i)],
                                                              PAYLOAD.pack(i, time.perf_counter_ns())) for i in ids))
            sends.append(send)
        return sends

    def _raw_publishers(self, n: int, level: int, coalesce: bool, pool: Pool) -> list[Callable]:
        from loadtest.bench_events.raw import RawPublisher, attributes

        if self.tls:
            raise ValueError("the raw-stub publisher speaks plaintext only")
        attrs = [attributes(pool.attributes(i)) for i in range(POOL)]
        sends = []
        for _ in range(n):
            pub = RawPublisher(self.cluster.agent_addresses()[0], level, coalesce)
            self.clients.append(pub)

            async def send(ids, pub=pub):
                await pub.send(TOPIC, [(attrs[pool_index(i)], PAYLOAD.pack(i, time.perf_counter_ns())) for i in ids])
            sends.append(send)
        return sends

    async def _node_publishers(self, n: int, level: int, coalesce: bool, pool: Pool) -> list[Callable]:
        from loadtest.bench_events.node import NodePublisher, missing

        if self.tls:
            raise ValueError("the Node publisher speaks plaintext only")
        if why := missing():
            raise RuntimeError(why)
        entries = [pool.attributes(i) for i in range(POOL)]
        sends = []
        for _ in range(n):
            pub = NodePublisher(self.cluster.agent_addresses()[0], level, coalesce, entries, TOPIC)
            self.clients.append(pub)
            await pub.start()  # connected before a cell's clock starts

            async def send(ids, pub=pub):
                await pub.send([(i, pool_index(i)) for i in ids])
            sends.append(send)
        return sends

    async def close_publishers(self) -> None:
        await asyncio.gather(*(c.close() for c in self.clients), return_exceptions=True)
        self.clients = []

    def client_pids(self) -> list[int]:
        """Publishers in processes of their own (node.py): the load generator's too."""
        return [p for c in self.clients if (p := getattr(c, "pid", lambda: None)()) is not None]

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.admin.close()
        clients = [*getattr(self, "plain_clients", []), *(getattr(self, "zclients", None) or [])]
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
        self.cluster.stop()


class _Peer:
    """A peer broker we start on a free loopback port and stop by its pid."""

    name = ""
    proc: subprocess.Popen

    def __init__(self, log_dir: Path):
        from echelon.launch import free_ports

        self.port, self.extra_port = free_ports(2)
        self.log = log_dir / f"{self.name}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.conns: list = []
        self.tasks: list[asyncio.Task] = []
        self.filtered = 0  # messages a subscriber received to filter in the client (every symbol's)

    def argv(self) -> list[str]:
        raise NotImplementedError

    async def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        await _wait_port(self.port, self.proc)

    def pids(self) -> dict[str, int]:
        return {self.name: self.proc.pid}

    def local(self, subs: list[Sub]) -> list[list[Sub]]:
        return [[s for s in subs if s.index % SUB_AGENTS == c] for c in range(SUB_AGENTS)]

    @staticmethod
    def filtering(group: list[Sub]) -> list[list[Sub]]:
        """Who filters a subject's events in the client, together. At 20% one filter per
        connection serves its whole group (a demultiplexer the peers are given for free).
        In the range workload each subscriber is an application of its own, as Echelon's
        subscriptions are: it takes every event and filters it itself."""
        return [[s] for s in group] if group and group[0].volume is not None else [group]

    async def stop(self) -> None:
        from echelon.launch import stop_process

        stop_process(self.proc)


class Nats(_Peer):
    name = "nats"

    def argv(self) -> list[str]:
        return ["nats-server", "-a", "127.0.0.1", "-p", str(self.port), "-m", str(self.extra_port)]

    async def _connect(self):
        import nats

        nc = await nats.connect(f"nats://127.0.0.1:{self.port}", allow_reconnect=False)
        self.conns.append(nc)
        return nc

    async def open_subs(self, subs: list[Sub], pool: Pool, sink: Sink) -> None:
        self.sub_conns = []
        for group in self.local(subs):
            nc = await self._connect()
            self.sub_conns.append(nc)
            limits = {"pending_msgs_limit": 1_000_000, "pending_bytes_limit": 512 << 20}
            if group and group[0].symbol is not None:  # 2%: the subject says it all
                for s in group:
                    async def cb(msg, index=s.index):
                        event_id, sent, _, _ = NATS_DATA.unpack(msg.data)
                        sink(index, event_id, sent)
                    await nc.subscribe(f"ev.{s.symbol}", cb=cb, **limits)
            elif group:  # 20% and the range workload: every event, filtered here
                for together in self.filtering(group):
                    async def cb(msg, together=together):
                        event_id, sent, price, volume = NATS_DATA.unpack(msg.data)
                        self.filtered += 1
                        for s in together:
                            if s.lo <= price < s.hi and (s.volume is None or volume >= s.volume):
                                sink(s.index, event_id, sent)
                    await nc.subscribe("ev.>", cb=cb, **limits)
            await nc.flush()

    async def close_subs(self) -> None:
        for nc in self.sub_conns:
            with contextlib.suppress(Exception):
                await nc.close()
            self.conns.remove(nc)

    async def publishers(self, n: int, mode: str, pool: Pool) -> list[Callable]:
        subjects = [f"ev.{s}" for s in pool.symbols]
        self.pub_conns = [await self._connect() for _ in range(n)]
        sends = []
        for nc in self.pub_conns:
            async def send(ids, nc=nc):
                for i in ids:
                    k = pool_index(i)
                    data = NATS_DATA.pack(i, time.perf_counter_ns(), pool.prices[k], pool.volume(k))
                    await nc.publish(subjects[k], data)
                await nc.flush()
            sends.append(send)
        return sends

    async def close_publishers(self) -> None:
        for nc in self.pub_conns:
            with contextlib.suppress(Exception):
                await nc.close()
            self.conns.remove(nc)

    async def stop(self) -> None:
        for nc in self.conns:
            with contextlib.suppress(Exception):
                await nc.close()
        await super().stop()


class Redis(_Peer):
    name = "redis"

    def argv(self) -> list[str]:
        return ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
                "--protected-mode", "no", "--client-output-buffer-limit", "pubsub 0 0 0"]

    def _client(self):
        import redis.asyncio as aioredis

        r = aioredis.Redis(host="127.0.0.1", port=self.port)
        self.conns.append(r)
        return r

    async def open_subs(self, subs: list[Sub], pool: Pool, sink: Sink) -> None:
        self.pubsubs = []
        for local in self.local(subs):  # a connection per subscriber agent, or per subscriber (filtering)
            for group in (self.filtering(local) if local and local[0].symbol is None else [local]):
                if not group:
                    continue
                ps = self._client().pubsub()
                self.pubsubs.append(ps)
                by_channel: dict[bytes, list[int]] = {}
                if group[0].symbol is not None:
                    for s in group:
                        by_channel.setdefault(f"ev.{s.symbol}".encode(), []).append(s.index)
                    await ps.subscribe(*by_channel)
                else:
                    await ps.psubscribe("ev.*")
                self.tasks.append(asyncio.create_task(self._read(ps, group, by_channel, sink)))

    async def _read(self, ps, group: list[Sub], by_channel: dict[bytes, list[int]], sink: Sink) -> None:
        async for msg in ps.listen():
            if msg["type"] == "message":
                event_id, sent, _, _ = NATS_DATA.unpack(msg["data"])
                for index in by_channel.get(msg["channel"], ()):
                    sink(index, event_id, sent)
            elif msg["type"] == "pmessage":
                event_id, sent, price, volume = NATS_DATA.unpack(msg["data"])
                self.filtered += 1
                for s in group:
                    if s.lo <= price < s.hi and (s.volume is None or volume >= s.volume):
                        sink(s.index, event_id, sent)

    async def close_subs(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks = []
        for ps in self.pubsubs:
            with contextlib.suppress(Exception):
                await ps.aclose()

    async def publishers(self, n: int, mode: str, pool: Pool) -> list[Callable]:
        channels = [f"ev.{s}" for s in pool.symbols]
        sends = []
        for _ in range(n):
            r = self._client()

            async def send(ids, r=r):
                pipe = r.pipeline(transaction=False)
                for i in ids:
                    k = pool_index(i)
                    pipe.publish(channels[k], NATS_DATA.pack(i, time.perf_counter_ns(), pool.prices[k], pool.volume(k)))
                await pipe.execute()
            sends.append(send)
        return sends

    async def close_publishers(self) -> None:
        pass  # their connections close with stop()

    async def stop(self) -> None:
        for r in self.conns:
            with contextlib.suppress(Exception):
                await r.aclose()
        await super().stop()


MODES = {"echelon": ["batch-DELIVERED", "zbatch-DELIVERED", "batch-ACCEPTED", "single-DELIVERED", "single-ACCEPTED", "raw-DELIVERED",
                     "rawc-DELIVERED", "node-DELIVERED", "nodec-DELIVERED"],
         "nats": ["publish+flush"], "redis": ["pipeline"]}
NODE_MODES = ("node-DELIVERED", "nodec-DELIVERED")  # need node and loadtest/node's packages (node.py)
SYSTEMS = {"echelon": Echelon, "nats": Nats, "redis": Redis}
