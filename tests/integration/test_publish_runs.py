"""A Publish stream read in runs (agent/publish_reader.py), through a real agent: single-
event requests of a pipelining client are merged into batches, and the acks still come as
each request asked: one PublishAck per request (fields at the top level) unless it set
`coalesce_acks`, a batch request's in one message, a sliced payload's once; every event
published once, in order, whatever the mix on the stream."""

from __future__ import annotations

import collections

import grpc

from echelon.agent import publish_reader
from echelon.contract.wire import attributes_to_pb
from echelon.v1 import pubsub_pb2 as ppb
from echelon.v1 import pubsub_pb2_grpc as pgrpc


def single(seq: int, producer: str = "p", coalesce: bool = False, level=ppb.ACK_LEVEL_DELIVERED):
    return ppb.PublishRequest(topic="t", attributes=attributes_to_pb({"n": seq}), producer_id=producer, sequence=seq,
                              ack_level=level, coalesce_acks=coalesce)


async def test_runs_of_single_requests_are_acked_as_each_request_asked(cluster, monkeypatch):
    runs = collections.Counter()  # run sizes, to see that runs formed at all
    flush = publish_reader._flush
    monkeypatch.setattr(publish_reader, "_flush", lambda run, answers: runs.update([len(run)]) or flush(run, answers))
    await cluster.client(0).create_topic("t")
    got = []
    sub = cluster.client(1).subscribe("t", "")
    await sub.start()
    # What each request must be answered with, in order: ("one", seq) a PublishAck of its own;
    # ("list", seqs) acks in `acks`, possibly spread over consecutive messages (coalesce_acks).
    requests, expect = [], []
    for s in range(1, 41):
        requests.append(single(s))
        expect.append(("one", [s]))
    batch = ppb.PublishRequest(producer_id="p", ack_level=ppb.ACK_LEVEL_DELIVERED,
                               batch=[single(s) for s in range(41, 51)])
    requests.append(batch)
    expect.append(("batch", list(range(41, 51))))
    requests += [single(s, coalesce=True) for s in range(51, 91)]
    expect.append(("list", list(range(51, 91))))
    sliced = [ppb.PublishRequest(topic="t", producer_id="p", sequence=91, slice_index=i, slice_count=2,
                                 payload_size=8, payload=b"abcd", ack_level=ppb.ACK_LEVEL_DELIVERED)
              for i in range(2)]
    sliced[0].attributes["n"].int_value = 91
    requests += sliced
    expect.append(("one", [91]))
    for s in range(92, 111):  # another producer, then back, at another ack level: runs break there
        producer = "q" if s % 7 else "p"
        requests.append(single(s, producer, level=ppb.ACK_LEVEL_ACCEPTED if s > 100 else ppb.ACK_LEVEL_DELIVERED))
        expect.append(("one", [s]))
    async with grpc.aio.insecure_channel(cluster.agent_nodes[0].address) as ch:
        acks = [a async for a in pgrpc.PubSubStub(ch).Publish(iter(requests))]
    assert all(a.code == 0 for m in acks for a in (m.acks or (m,))), acks
    messages = collections.deque(acks)
    for kind, seqs in expect:
        if kind == "one":
            m = messages.popleft()
            assert not m.acks and m.sequence == seqs[0] and m.producer_id, (kind, seqs, m)
            continue
        if kind == "batch":
            m = messages.popleft()
            assert [a.sequence for a in m.acks] == seqs and not m.sequence
            continue
        listed = []
        while len(listed) < len(seqs):
            m = messages.popleft()
            assert len(m.acks) and not m.sequence
            listed += [a.sequence for a in m.acks]
        assert listed == seqs
    assert not messages
    assert max(runs) > 1  # the single requests did go in runs

    while len(got) < 110:
        m = await sub.next(timeout=20)
        got.append(m.attributes["n"])
        await m.ack()
    assert sorted(got) == list(range(1, 111))  # each once (a duplicate would take another's place)
    await sub.close()


async def test_a_pipelining_client_whose_acks_settle_at_once_is_read_in_runs(cluster, monkeypatch):
    """At ACCEPTED each ack is due as soon as its run is admitted, so while the client keeps
    writing, few of its requests await acks: the requests' spacing (BURST), not only acks in
    flight, marks it as pipelining: its runs grow to tens of requests."""
    runs = collections.Counter()
    flush = publish_reader._flush
    monkeypatch.setattr(publish_reader, "_flush", lambda run, answers: runs.update([len(run)]) or flush(run, answers))
    await cluster.client(0).create_topic("t")
    requests = [single(s, coalesce=True, level=ppb.ACK_LEVEL_ACCEPTED) for s in range(1, 2001)]
    async with grpc.aio.insecure_channel(cluster.agent_nodes[0].address) as ch:
        acks = [a for m in [m async for m in pgrpc.PubSubStub(ch).Publish(iter(requests))] for a in m.acks]
    assert [a.sequence for a in acks] == list(range(1, 2001)) and all(a.code == 0 for a in acks)
    assert sum(n * k for n, k in runs.items()) == 2000
    # Waiting on acks in flight alone, such runs were of 4-6 requests (mean about 5.5).
    assert 2000 / sum(runs.values()) >= 10, sorted(runs.items())
