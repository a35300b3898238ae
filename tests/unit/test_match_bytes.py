"""What the publishing agent sends the matcher of each event (agent/dispatch.py
`for_matching`): the root's bytes without the id and the publish time. The oracle is upb:
the cut bytes parse to the event with those two fields cleared, whatever its attributes,
ordering key and producer id; bytes not laid out as the root writes them go whole."""

from __future__ import annotations

import random

import pytest

from echelon.agent.dispatch import for_matching
from echelon.contract.wire import attributes_to_pb
from echelon.v1 import common_pb2 as pb


def event(rng: random.Random) -> pb.Event:
    attrs = {"s": rng.choice(["", "0é", "x" * 200]), "f": rng.uniform(-1e9, 1e9), "i": rng.randrange(-(1 << 62), 1 << 62)}
    e = pb.Event(topic=rng.choice(["t", "ñ" * 70]), ordering_key=rng.choice(["", "k"]),
                 id=pb.MessageId(producer_id=rng.choice(["", "p", "q" * 200]), sequence=rng.randrange(1 << 40)),
                 publish_time_unix_nanos=rng.choice([0, 1, rng.randrange(1 << 63)]))
    for k, v in attributes_to_pb(dict(rng.sample(sorted(attrs.items()), rng.randrange(4)))).items():
        e.attributes[k].CopyFrom(v)
    return e


@pytest.mark.parametrize("shared", [False, True])  # one publish time for the batch: the quick path
def test_the_matcher_copy_is_the_event_without_its_id_and_publish_time(shared):
    rng = random.Random(5)
    events = [event(rng) for _ in range(500)]
    if shared:
        for e in events:
            e.publish_time_unix_nanos = 1764284000123456789
    encoded = [e.SerializeToString() for e in events]
    cut = for_matching(events, encoded)
    shorter = 0
    for e, data, got in zip(events, encoded, cut):
        want = pb.Event()
        want.CopyFrom(e)
        want.ClearField("publish_time_unix_nanos")
        if len(e.id.SerializeToString()) < 0x80:
            want.ClearField("id")
        assert pb.Event.FromString(got) == want
        shorter += len(got) < len(data)
    assert shorter > 400  # the cut happened, not only the fallback


def test_bytes_not_laid_out_as_the_root_writes_them_go_whole():
    e = pb.Event(topic="t", id=pb.MessageId(producer_id="p", sequence=1), publish_time_unix_nanos=7)
    odd = pb.Event(topic="t", publish_time_unix_nanos=7).SerializeToString() + \
        pb.Event(id=e.id).SerializeToString()  # id last, time not at the end
    assert for_matching([e], [odd]) == [odd]
