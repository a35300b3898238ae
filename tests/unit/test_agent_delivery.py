"""Local delivery's filter check (agent/delivery.py): a frame's events matched through
the compiled filters or the CDM index give what brute force says, once per message id,
in order per subscription, as the subscriptions and their filters change."""

import random

import pytest
from prometheus_client import CollectorRegistry

from echelon.agent import delivery
from echelon.agent.delivery import LocalDelivery
from echelon.agent.metrics import AgentMetrics
from echelon.agent.subscriptions import Subscription
from echelon.contract.filters import parse
from echelon.contract.wire import attributes_to_pb
from echelon.v1 import common_pb2 as pb

SYMBOLS = ["a", "b", "c", "d"]


def _filter(rnd: random.Random):
    return parse(rnd.choice([f'Symbol = "{rnd.choice(SYMBOLS)}"', f"Price >= {rnd.randint(0, 90)}",
                             f'Price < {rnd.randint(0, 90)} and Symbol != "a"',
                             f'Symbol prefix "{rnd.choice(SYMBOLS)}"', "", "Price between 10 and 20", "Missing = 1",
                             # disjunctions: an event satisfying several terms is offered once
                             f'Symbol in ("a", "b") or Price > {rnd.randint(50, 90)}',
                             'not (Symbol = "a" or Price < 50)',
                             '(Symbol = "a" or Symbol = "b") and (Price < 10 or Price > 90)']))


def _event(rnd: random.Random, seq: int, topic: str = "t") -> pb.Event:
    attrs = {"Symbol": rnd.choice(SYMBOLS), "Price": rnd.choice([rnd.uniform(0, 100), rnd.randint(0, 100)])}
    if rnd.random() < 0.1:
        del attrs["Price"]
    return pb.Event(id=pb.MessageId(producer_id="p", sequence=seq), topic=topic, attributes=attributes_to_pb(attrs),
                    publish_time_unix_nanos=2**62)


@pytest.mark.parametrize("compiled_subs,encoded", [(delivery.COMPILED_SUBS, False), (0, False),
                                                   (delivery.COMPILED_SUBS, True)])
def test_frames_match_brute_force(monkeypatch, compiled_subs, encoded):
    """As it is, and with every topic past COMPILED_SUBS (matched through the index);
    `encoded`: the events come with their bytes (relayed), which the backlog keeps."""
    monkeypatch.setattr(delivery, "COMPILED_SUBS", compiled_subs)
    rnd = random.Random(5)
    subs: dict[str, Subscription] = {}
    closed = []
    d = LocalDelivery(lambda: subs, AgentMetrics(CollectorRegistry()), closed.append)
    want: dict[str, list[int]] = {}
    data: dict[int, bytes] = {}  # each event's bytes as relayed
    seq = 0
    for round_ in range(40):
        # Subscriptions come, go and change their filter between frames (the index follows).
        for _ in range(rnd.randint(0, 6)):
            name = f"s{rnd.randint(0, 30)}"
            if name in subs and rnd.random() < 0.3:
                del subs[name]
                want.pop(name, None)
            elif name in subs:
                subs[name].filter = _filter(rnd)
            else:
                subs[name] = Subscription(f"a/{name}", name, rnd.choice(["t", "t", "u"]), _filter(rnd), 10**6)
        frame = []
        for _ in range(rnd.choice([1, 2, 5, 40, 150])):
            seq += 1
            frame.append(_event(rnd, seq, rnd.choice(["t", "t", "u"])))
        frame += rnd.sample(frame, min(3, len(frame)))  # copies of message ids: delivered once
        for e in {e.id.sequence: e for e in frame}.values():
            for s in subs.values():
                if s.topic == e.topic and s.filter.matches({k: getattr(v, v.WhichOneof("kind"))
                                                            for k, v in e.attributes.items()}):
                    want.setdefault(s.name, []).append(e.id.sequence)
        data.update({e.id.sequence: e.SerializeToString() for e in frame})
        d.deliver_many(frame, [data[e.id.sequence] for e in frame] if encoded else None)
        for s in subs.values():
            got = [p.event.id.sequence for p in s.backlog]
            # the bytes as they came (a map's entries need not serialize twice in one order)
            assert [p.data for p in s.backlog] == [data.get(i, b"") if encoded else b"" for i in got]
            assert got == want.get(s.name, []), (round_, s.name, str(s.filter))
    assert any(i.index is not None for i in d._indexes.values()) == (compiled_subs == 0), \
        "the index is used past COMPILED_SUBS only"
    assert not closed


def test_small_frames_are_compiled():
    subs = {"s": Subscription("a/s", "s", "t", parse('Symbol = "a"'), 10)}
    d = LocalDelivery(lambda: subs, AgentMetrics(CollectorRegistry()), lambda s: None)
    d.deliver_many([_event(random.Random(1), 1)])
    assert [i.index for i in d._indexes.values()] == [None]


def test_many_predicates_go_to_the_index(monkeypatch):
    """Past COMPILED_PREDICATES over all terms, even a few subscriptions are indexed (compiling
    costs twice the index's build), and a disjunction is still offered each event once."""
    monkeypatch.setattr(delivery, "COMPILED_PREDICATES", 3)
    subs = {"s": Subscription("a/s", "s", "t", parse('Symbol in ("a", "b") or Price >= 0 or Symbol prefix ""'), 10)}
    d = LocalDelivery(lambda: subs, AgentMetrics(CollectorRegistry()), lambda s: None)
    frame = [pb.Event(id=pb.MessageId(producer_id="p", sequence=i), topic="t", publish_time_unix_nanos=2**62,
                      attributes=attributes_to_pb({"Symbol": "a", "Price": 1.0})) for i in range(3)]
    d.deliver_many(frame)
    assert [i.index is not None for i in d._indexes.values()] == [True]
    assert [p.event.id.sequence for p in subs["s"].backlog] == [0, 1, 2]  # every term matched: once each
