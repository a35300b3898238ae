"""The LBDD data plane with real agents on loopback: 1 publisher and 8 subscriber agents.

Every subscriber must get every message of a mixed stream (small events and a multi-MB
payload) exactly once and in order; the root must send only what its tree prescribes;
killing an inner relay mid-transfer must lose and duplicate nothing; p2p still works.

The trees hang on the agents' addresses (dataplane/trees.py), so the agents bind pinned
ports: drawn ports gave, now and then, a tree without relays (all 8 subscribers in one
bucket, the root sending to everyone), where the tree assertions below prove nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess

import pytest
import pytest_asyncio
from prometheus_client import generate_latest

from echelon.client import DELIVERED
from echelon.core import lbdd
from echelon.dataplane import dissemination
from echelon.dataplane import root as root_module
from tests.harness import Cluster, free_layout, wait_for

SUBSCRIBERS = range(1, 9)
TOPIC = "t"
# Port layouts for agents 0-8, tried in order (another run of this file may hold one). Each
# gives the stripe-0 tree the same shape: LEVELS, so the root has 2 targets and relays below
# it (test_every_pinned_layout_gives_a_tree_with_relays).
LAYOUTS = tuple(tuple(range(base, base + 9)) for base in (23060, 23210, 23300, 23410, 23540, 23800))
LEVELS = [2, 2, 4]  # members per non-empty bucket, nearest the root first


def keys(ports) -> list[str]:
    return [f"127.0.0.1:{p}" for p in ports]


def test_every_pinned_layout_gives_a_tree_with_relays():
    for ports in LAYOUTS:
        root, *members = keys(ports)
        assert [len(level) for level in lbdd.buckets(root, members).members] == LEVELS, ports


class Collector:
    """Reads one subscription, acks everything, keeps (producer, sequence, digest) in arrival order."""

    def __init__(self, sub):
        self.sub = sub
        self.got: list[tuple[str, int, str]] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self):
        async for m in self.sub:
            self.got.append((m.producer_id, m.sequence, hashlib.md5(m.payload).hexdigest()))
            await m.ack()


async def start(agent_kwargs: dict) -> tuple[Cluster, dict[int, Collector]]:
    ports = free_layout(LAYOUTS)
    if ports is None:
        pytest.skip("every pinned port layout is in use (other runs of this file)")
    cluster = await Cluster(agents=9, agent_kwargs=agent_kwargs, agent_ports=ports).start()
    try:
        await cluster.client(0).create_topic(TOPIC)
        collectors = {}
        for i in SUBSCRIBERS:
            sub = cluster.client(i).subscribe(TOPIC, "", max_outstanding=1000)
            await sub.start()
            collectors[i] = Collector(sub)
        ids = {cluster.agent_nodes[i].config.id for i in SUBSCRIBERS}
        # Every agent's peer table lists the 8 subscribers: they all compute the same trees.
        await wait_for(lambda: all(a.plane.trees.table.subscribers(TOPIC) == ids for a in cluster.agent_nodes),
                       what="every peer table lists the subscribers")
    except BaseException:
        await cluster.stop()
        raise
    return cluster, collectors


@pytest_asyncio.fixture
async def lbdd_cluster(request):
    cluster, collectors = await start(getattr(request, "param", {}))
    try:
        yield cluster, collectors
    finally:
        for c in collectors.values():
            c.task.cancel()
        await cluster.stop()


def mixed_stream(big: bytes, n: int = 60) -> list[tuple[dict, bytes]]:
    small = [({"i": i}, bytes([i % 256]) * (i * 37 % 500)) for i in range(n)]
    return small[: n // 2] + [({"i": -1}, big)] + small[n // 2:]


def publish(cluster, stream) -> tuple[asyncio.Future, list[tuple[str, int, str]]]:
    """Publish a stream from agent 0 at DELIVERED: (all acks, what every subscriber must get)."""
    pub = cluster.client(0).publisher(ack_level=DELIVERED)
    acks = asyncio.gather(*(pub.publish_nowait(TOPIC, a, payload=p) for a, p in stream))
    return acks, [(pub.producer_id, seq, hashlib.md5(p).hexdigest()) for seq, (_, p) in enumerate(stream, 1)]


async def publish_all(cluster, collectors, stream) -> tuple[list, dict[int, list]]:
    acks, want = publish(cluster, stream)
    assert [r.destinations for r in await acks] == [len(SUBSCRIBERS)] * len(stream)
    return want, await received_all(collectors, want)


async def received_all(collectors, want, which=SUBSCRIBERS, settle: float = 0.3):
    await wait_for(lambda: all(len(collectors[i].got) >= len(want) for i in which), timeout=15,
                   what="every subscriber has the whole stream")
    await asyncio.sleep(settle)  # a duplicate would arrive now
    return {i: collectors[i].got for i in which}


def sent_bytes(agent) -> dict[str, float]:
    return {s.labels["peer"]: s.value for m in agent.registry.collect() if m.name == "echelon_relay_sent_bytes"
            for s in m.samples if s.name.endswith("_total")}


@pytest.mark.parametrize("lbdd_cluster", [{}], indirect=True)
async def test_mixed_stream_reaches_every_subscriber_once_in_order(lbdd_cluster):
    cluster, collectors = lbdd_cluster
    big = bytes(range(256)) * (12 * 1024)  # 3 MiB: 48 slices, striped over 8 trees
    want, got = await publish_all(cluster, collectors, mixed_stream(big))
    for i, messages in got.items():
        assert messages == want, f"agent-{i}"
    # The subscribers carried most of the payload: the root sent far fewer than 8 copies.
    root = cluster.agent_nodes[0]
    assert sum(sent_bytes(root).values()) < 3 * len(big)
    assert len(root.plane.streams) == 0
    for a in cluster.agent_nodes:
        assert len(a.plane.streams) == 0 and a.metrics.duplicates._value.get() == 0
    if shutil.which("promtool"):  # the data plane's series, with values, pass the linter
        for a in (root, cluster.agent_nodes[1]):
            body = generate_latest(a.registry)
            for name in ("echelon_relay_sent_bytes_total", "echelon_link_enqueued_total",
                         "echelon_link_dequeued_total", "echelon_link_queue_length", "echelon_agent_copies_sent_total"):
                assert name.encode() in body
            check = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
            assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()


@pytest.mark.parametrize("lbdd_cluster", [{"stripes": 1}], indirect=True)
async def test_root_sends_only_to_its_tree_targets(lbdd_cluster):
    cluster, collectors = lbdd_cluster
    root = cluster.agent_nodes[0]
    big = os.urandom(2 << 20)  # incompressible: the links compress (docs/compression.md)
    await publish_all(cluster, collectors, mixed_stream(big, n=20))

    by_key = {a.address: a.config.id for a in cluster.agent_nodes}
    tree = lbdd.build_tree(root.address, [cluster.agent_nodes[i].address for i in SUBSCRIBERS])
    targets = {by_key[k] for k in tree.children[root.address]}
    assert len(targets) == LEVELS[0]  # the pinned tree: a root sending to everyone fails below
    sent = sent_bytes(root)
    assert set(sent) == targets  # no copy to anyone else
    for t in targets:  # and about one copy of the stream each
        assert len(big) < sent[t] < 1.1 * len(big)
    # Every inner node forwards to its own children only, once each.
    for a in cluster.agent_nodes[1:]:
        kids = {by_key[k] for k in tree.children[a.address]}
        assert set(sent_bytes(a)) == kids, a.config.id
        assert a.metrics.copies.labels("root")._value.get() == 0
    # One copy per subscriber in all, the root sending only its targets' share.
    total = sum(sum(sent_bytes(a).values()) for a in cluster.agent_nodes)
    assert 8 * len(big) < total < 1.1 * 8 * len(big)
    assert sum(sent.values()) / total == pytest.approx(len(targets) / 8, abs=0.02)


def received_bytes(agent) -> float:
    return sum(s.value for m in agent.registry.collect() if m.name == "echelon_relay_received_bytes"
               for s in m.samples if s.name.endswith("_total"))


@pytest.mark.parametrize("lbdd_cluster", [{"stripes": 1}, {"stripes": 8}], indirect=True)
async def test_killing_an_inner_relay_mid_transfer_loses_and_duplicates_nothing(lbdd_cluster, monkeypatch):
    cluster, collectors = lbdd_cluster
    # Fences lift by the acks they wait for, not by their bound (a stalled link's): with the
    # bound out of reach, two fences waiting on each other (relays re-routing toward each
    # other after the crash: dataplane/dissemination.py `_fence`) would hold the DELIVERED
    # acks past the 15 s below.
    monkeypatch.setattr(dissemination, "FENCE_SECONDS", 60.0)
    monkeypatch.setattr(root_module, "FENCE_SECONDS", 60.0)
    root = cluster.agent_nodes[0]
    subscribers = [cluster.agent_nodes[i] for i in SUBSCRIBERS]
    trees = root.plane.trees
    ids = [a.config.id for a in subscribers]
    if trees.stripes == 1:
        # The inner node with the largest subtree.
        tree = lbdd.build_tree(root.address, [a.address for a in subscribers])
        by_key = {a.address: a for a in subscribers}
        victim = by_key[max(tree.parent, key=lambda k: len(tree.subtree(k)))]
        assert len(tree.subtree(victim.address)) > 1  # the pinned tree has relays
    else:
        # The subscriber that relays the most copies over the striped trees.
        load = dict.fromkeys(ids, 0)
        for s in trees.schedule(TOPIC, ids):
            for n, c in trees._loads(TOPIC, s, ids).items():
                load[n] = load.get(n, 0) + c
        victim = subscribers[ids.index(max(ids, key=load.get))]
    survivors = [i for i in SUBSCRIBERS if cluster.agent_nodes[i] is not victim]

    big = os.urandom(16 << 20)  # 16 MiB: 256 slices, incompressible (the links compress)
    acks, want = publish(cluster, mixed_stream(big, n=200))
    # Checked every loop turn: a link sends the frames queued behind a write as one message
    # (up to 1 MB, links.py), so 20 ms apart the victim went from < 1/8 to > 1/2 once.
    await wait_for(lambda: received_bytes(victim) > len(big) // 8, timeout=10, interval=0,
                   what="the victim is mid-transfer")
    assert received_bytes(victim) < len(big) * 3 // 4
    await cluster.crash(victim)
    await asyncio.wait_for(acks, 15)  # DELIVERED: every surviving destination holds every message

    for i, messages in (await received_all(collectors, want, survivors)).items():
        assert sorted(messages) == sorted(want), f"agent-{i} lost messages"
        assert len(messages) == len(set(messages)), f"agent-{i} got duplicates"
    # Path update: whoever held frames for the victim re-routed them.
    assert sum(a.metrics.rerouted._value.get() for a in cluster.agent_nodes if a is not victim) > 0
    assert [a.config.id for a in cluster.agent_nodes if a is not victim and a.plane.fence_timeouts] == []


@pytest.mark.parametrize("lbdd_cluster", [{"dissemination": "p2p"}], indirect=True)
async def test_p2p_mode_sends_every_copy_from_the_root(lbdd_cluster):
    cluster, collectors = lbdd_cluster
    root = cluster.agent_nodes[0]
    big = os.urandom(1 << 20)
    want, got = await publish_all(cluster, collectors, mixed_stream(big, n=20))
    for i, messages in got.items():
        assert messages == want, f"agent-{i}"
    sent = sent_bytes(root)
    assert set(sent) == {cluster.agent_nodes[i].config.id for i in SUBSCRIBERS}
    assert all(v > len(big) for v in sent.values())
    assert all(sum(sent_bytes(a).values()) == 0 for a in cluster.agent_nodes[1:])


@pytest.mark.parametrize("direct_upto", [4, 0])
async def test_a_small_topics_events_go_straight_to_each_subscribers_agent(direct_upto):
    """Three subscribing agents: with the default `direct_upto` the publishing agent sends
    each of them its copy itself and nobody relays; with 0, exactly the LBDD tree's inner
    nodes relay (the tree over these ports, computed here, is the oracle)."""
    cluster = await Cluster(agents=4, agent_kwargs={"direct_upto": direct_upto}).start()
    try:
        await cluster.client(0).create_topic(TOPIC)
        collectors = {}
        for i in (1, 2, 3):
            sub = cluster.client(i).subscribe(TOPIC, "", max_outstanding=1000)
            await sub.start()
            collectors[i] = Collector(sub)
        ids = {cluster.agent_nodes[i].config.id for i in (1, 2, 3)}
        await wait_for(lambda: all(a.plane.trees.table.subscribers(TOPIC) == ids for a in cluster.agent_nodes),
                       what="every peer table lists the subscribers")
        pub = cluster.client(0).publisher(ack_level=DELIVERED)
        stream = [({"i": i}, bytes(100)) for i in range(50)]
        acks = await asyncio.gather(*(pub.publish_nowait(TOPIC, a, payload=p) for a, p in stream))
        assert [r.destinations for r in acks] == [3] * len(stream)
        want = [(pub.producer_id, seq, hashlib.md5(p).hexdigest()) for seq, (_, p) in enumerate(stream, 1)]
        got = await received_all(collectors, want, which=(1, 2, 3))
        assert all(messages == want for messages in got.values())
        root, *others = cluster.agent_nodes
        tree = lbdd.build_tree(root.address, [a.address for a in others])
        by_key = {a.address: a.config.id for a in others}
        relays = {by_key[k] for k, kids in tree.children.items() if kids and k != root.address}
        forwarded = {a.config.id for a in others if sum(sent_bytes(a).values()) > 0}
        if direct_upto:
            assert set(sent_bytes(root)) == ids and forwarded == set()
        else:
            assert set(sent_bytes(root)) == {by_key[k] for k in tree.children[root.address]}
            assert forwarded == relays, relays
    finally:
        await cluster.close_clients()
        await cluster.stop()
