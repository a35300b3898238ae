"""The chunk API end to end on real agents (tests/harness.py): a payload published from an
iterator reaches subscribers that read it as chunks and subscribers that take it whole,
on the publishing agent and on others, in order with the small events around it (also
when those go in batches); a
publisher that stops mid-payload makes the subscribers raise DataLoss at once, not
after the idle timeout; `echelon pub --payload-file` / `echelon sub --out` round-trip a
file."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys

import pytest

from echelon.client import DELIVERED
from echelon.client.errors import DataLoss, InvalidArgument
from echelon.contract.wire import attributes_to_pb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc
from tests.harness import Cluster, wait_for

SIZE = 5 * (1 << 20) + 7  # two client slices, 81 relay slices of 64 KiB


def payload(size: int = SIZE) -> bytes:
    return bytes((i * 7 + i // 251) % 256 for i in range(256)) * (size // 256) + b"x" * (size % 256)


async def pieces(data: bytes, n: int = 100_003, fail_when=None):
    """`data` in pieces of `n`; with `fail_when`, fails once it is true, before the end."""
    for i in range(0, len(data), n):
        if fail_when is not None and i + n >= len(data):
            await wait_for(fail_when, what="the payload has started")
            raise RuntimeError("the source failed")
        yield data[i:i + n]
        await asyncio.sleep(0)


async def read(msg) -> bytes:
    out = bytearray()
    async for chunk in msg.chunks():
        out += chunk
    return bytes(out)


@pytest.fixture
async def cluster():
    c = await Cluster(agents=3).start()
    try:
        await c.client(0).create_topic("files", ["name:string"])
        yield c
    finally:
        await c.stop()


async def test_a_streamed_publish_reaches_chunk_readers_and_whole_readers_in_order(cluster):
    data = payload()
    subs = [cluster.client(0).subscribe("files", "", max_whole=0),  # on the publishing agent itself
            cluster.client(1).subscribe("files", "", max_whole=0),
            cluster.client(2).subscribe("files", "")]  # whole: below the default max_whole
    for s in subs:
        await s.start()
    await wait_for(lambda: all(len(a.plane.trees.table.subscribers("files")) == 3 for a in cluster.agent_nodes),
                   what="every agent sees the three subscribers")
    async with cluster.client(0).publisher(ack_level=DELIVERED) as pub:
        first = await pub.publish("files", {"name": "before"})
        result = await pub.publish_stream("files", {"name": "big"}, pieces(data), size=len(data))
        after = await pub.publish("files", {"name": "after"})
    assert (first.destinations, result.destinations, after.destinations) == (3, 3, 3)
    assert first.sequence < result.sequence < after.sequence
    for i, s in enumerate(subs):
        names = []
        for _ in range(3):
            m = await s.next(timeout=20)
            names.append(m.attributes["name"])
            if m.attributes["name"] == "big":
                assert m.streamed == (i < 2) and m.payload_size == len(data)
                got = await read(m)
                assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest(), f"subscriber {i}"
                if i == 2:
                    assert m.payload == data
            await m.ack()
        assert names == ["before", "big", "after"], f"subscriber {i}"
        await s.close()
    assert all(len(a.plane.streams) == 0 for a in cluster.agent_nodes)


async def test_batches_and_a_sliced_payload_queued_together_arrive_in_order(cluster):
    """Batching meets slices: small events queued around a payload above the
    client's slice size go in `batch` requests, the payload's slices alone on the same
    Publish stream (one unit at the agent); with the small events and the payload's head
    waiting together in a subscription's backlog, credits for all of them at once (one
    cumulative ack) send the small ones in a batch and the payload alone (a head and its
    chunks), in publish order."""
    data = payload(9 << 20)  # three client slices of 4 MiB
    subs = [cluster.client(0).subscribe("files", "", max_whole=0, max_outstanding=64),
            cluster.client(1).subscribe("files", "", max_whole=0, max_outstanding=64),
            cluster.client(2).subscribe("files", "", max_outstanding=64)]
    for s in subs:
        await s.start()
    await wait_for(lambda: all(len(a.plane.trees.table.subscribers("files")) == 3 for a in cluster.agent_nodes),
                   what="every agent sees the three subscribers")
    names = [f"a{i}" for i in range(40)] + ["big"] + [f"b{i}" for i in range(40)]

    async def receive(i, s):  # while the payload flows: it is bigger than the windows hold unread
        got = []
        for _ in names:
            m = await s.next(timeout=20)
            got.append(m.attributes["name"])
            if m.attributes["name"] == "big":
                assert m.streamed == (i < 2), f"subscriber {i}"
                assert hashlib.sha256(await read(m)).digest() == hashlib.sha256(data).digest(), f"subscriber {i}"
            await m.ack()
        return got

    def queued():  # every subscription's backlog holds the small events and the payload's head
        backlogs = [sub.backlog for a in cluster.agent_nodes for sub in a.subscriptions.subs.values()]
        return len(backlogs) == 3 and all(len(b) >= 41 and any(p.stream is not None for p in b) for b in backlogs)

    async with cluster.client(0).publisher(ack_level=DELIVERED) as pub:
        await asyncio.gather(*[pub.publish_nowait("files", {"name": f"p{i}"}) for i in range(64)])
        held = [[await s.next(timeout=20) for _ in range(64)] for s in subs]  # no credit left
        before = [pub.publish_nowait("files", {"name": n}) for n in names[:40]]
        big = pub.publish_nowait("files", {"name": "big"}, payload=data)
        after = [pub.publish_nowait("files", {"name": n}) for n in names[41:]]
        await wait_for(queued, what="the small events and the payload's head wait in every backlog")
        for m in [m for ms in held for m in ms]:
            await m.ack()  # queued, then written as one ack per stream: 64 credits at once
        readers = [asyncio.create_task(receive(i, s)) for i, s in enumerate(subs)]
        results = await asyncio.gather(*before, big, *after)
    assert [r.destinations for r in results] == [3] * len(names)
    assert [r.sequence for r in results] == sorted(r.sequence for r in results)
    for i, got in enumerate(await asyncio.gather(*readers)):
        assert got == names, f"subscriber {i}"
    for s in subs:
        await s.close()
    assert all(len(a.plane.streams) == 0 for a in cluster.agent_nodes)


async def test_a_publisher_that_stops_mid_payload_ends_it_for_every_subscriber_at_once(cluster):
    data = payload()
    subs = [cluster.client(i).subscribe("files", "", max_whole=0) for i in (1, 2)]
    for s in subs:
        await s.start()
    await wait_for(lambda: all(len(a.plane.trees.table.subscribers("files")) == 2 for a in cluster.agent_nodes),
                   what="every agent sees the two subscribers")
    def started():  # slice 0 reached the subscribers' agents
        return all(len(cluster.agent_nodes[i].plane.streams) == 1 for i in (1, 2))

    async with cluster.client(0).publisher(ack_level=DELIVERED) as pub:
        with pytest.raises(RuntimeError, match="source failed"):
            await pub.publish_stream("files", {"name": "big"}, pieces(data, fail_when=started), size=len(data))
        with pytest.raises(InvalidArgument, match="carried"):  # the source lied about its size: refused here
            await pub.publish_stream("files", {"name": "short"}, pieces(data[:1000]), size=2000)
        # The same producer goes on: its failed payload no longer fences its next message
        # (the root's fence waited for it forever while its late slices were in flight).
        ok = await asyncio.wait_for(pub.publish("files", {"name": "next"}), 20)
    assert ok.destinations == 2
    for s in subs:
        m = await s.next(timeout=20)
        assert m.attributes["name"] == "big"
        with pytest.raises(DataLoss, match="stream ended mid-payload"):
            await asyncio.wait_for(read(m), 20)  # well before slices.IDLE_SECONDS
        await m.ack()
        m = await s.next(timeout=20)  # the subscription goes on with the next message
        assert m.attributes["name"] == "next"
        await m.ack()
        await s.close()
    assert sum(a.metrics.bulk_aborted._value.get() for a in cluster.agent_nodes) == 2


async def test_cli_publishes_a_file_and_writes_it_out_streamed(cluster, tmp_path):
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    src.write_bytes(os.urandom(SIZE))
    agent0, agent1 = cluster.agent_nodes[0].address, cluster.agent_nodes[1].address
    sub = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "echelon", "sub", "--agent", agent1, "--topic", "files", "--count", "1",
        "--out", str(dst), "--json", stdout=asyncio.subprocess.PIPE)
    try:
        await wait_for(lambda: len(cluster.agent_nodes[0].plane.trees.table.subscribers("files")) == 1,
                       what="the CLI's subscription is in the publisher's view")
        pub = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "echelon", "pub", "--agent", agent0, "--topic", "files", "--attr", "name=f",
            "--payload-file", str(src), "--delivered", "--json", stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(pub.communicate(), 60)
        assert pub.returncode == 0, out
        line, _ = await asyncio.wait_for(sub.communicate(), 60)
    finally:
        if sub.returncode is None:
            sub.kill()
            await sub.wait()
    got = json.loads(line)
    assert got["payload_bytes"] == SIZE and got["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    assert dst.read_bytes() == src.read_bytes() and not (tmp_path / "out.bin.part").exists()


async def test_bad_slices_are_refused_in_the_ack_and_the_stream_goes_on(cluster):
    """Slices out of order, or a header that does not add up: INVALID_ARGUMENT in that
    message's ack, even at ACCEPTED (it was dispatched before its last slice was read);
    the next message on the same stream is published."""
    sub = cluster.client(1).subscribe("files", "", max_whole=0)
    await sub.start()
    await wait_for(lambda: len(cluster.agent_nodes[0].plane.trees.table.subscribers("files")) == 1,
                   what="the subscription is in the publisher's view")
    attrs = attributes_to_pb({"name": "x"})

    def req(seq, index, count, size, data=b"a" * 100_000):
        r = ppb.PublishRequest(topic="files", producer_id="p", sequence=seq, slice_index=index, slice_count=count,
                               payload_size=size, payload=data, ack_level=ppb.ACK_LEVEL_ACCEPTED)
        if index == 0:
            for k, v in attrs.items():
                r.attributes[k].CopyFrom(v)
        return r

    requests = [req(1, 0, 3, 300_000), req(1, 2, 3, 300_000),  # slice 1 skipped
                req(2, 0, 2, 0),  # no payload at all in two slices
                req(3, 0, 2, 200_000), req(3, 1, 2, 200_000)]  # fine
    call = pgrpc.PubSubStub(cluster.client(0)._conn.channel()).Publish(iter(requests))
    acks = [a async for a in call]
    assert [(a.sequence, a.code) for a in acks] == [(1, 3), (2, 3), (3, 0)], acks
    assert "out of order" in acks[0].error and "payload_size" in acks[1].error
    m = await sub.next(timeout=20)
    if m.sequence == 1:  # its head went out before the bad slice came (or not: the abort may come first)
        with pytest.raises(DataLoss):
            await read(m)
        await m.ack()
        m = await sub.next(timeout=20)
    assert m.sequence == 3 and await read(m) == b"a" * 200_000
    await m.ack()
    await sub.close()
