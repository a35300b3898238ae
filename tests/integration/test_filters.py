"""Filters through real agents and a real matcher: the caps refuse oversized filters with
INVALID_ARGUMENT (RESOURCE_EXHAUSTED past the agent's receive limit) and change nothing; an `or` filter is one subscription, several matcher
entries, and each event is delivered to it once."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from echelon.client import DELIVERED, errors
from echelon.client import subscription as client_subscription
from echelon.contract.filters import DEFAULT_LIMITS, Filter, FilterLimits, Op, Predicate, parse, term_ids
from echelon.contract.wire import filter_to_pb
from echelon.v1 import common_pb2 as pb
from tests.harness import wait_for
from loadtest.checker import drain

SCHEMA = ["Symbol:string:8", "High:float:0:500", "Volume:int:0:310000000"]
SHORT = 300  # characters: a refusal quotes an excerpt, never the filter


def _attacks():
    """(name, filter as text or a Filter): the hostile-clients issue's filters, each form."""
    yield "100,000 clauses (1.7 MB of text)", " or ".join(['Symbol != "x"'] * 100_000)
    yield "a million predicates (text)", " and ".join(["High > 1"] * 1_000_000)
    yield "a million predicates (structured)", _repeated(Predicate("High", Op.GT, 1), 1_000_000)
    yield "an 8 MiB string operand (text)", 'Symbol != "' + "x" * (8 << 20) + '"'
    yield "an 8 MiB string operand (structured)", Filter((Predicate("Symbol", Op.NE, "x" * (8 << 20)),))
    yield "a 2 KiB operand past max_length 8", 'Symbol != "' + "x" * 2048 + '"'
    yield "128 terms", " and ".join(f"(High > {i} or Volume < {i})" for i in range(7))
    yield "nesting 100 deep", "(" * 100 + "High > 1" + ")" * 100


class _Encoded(Filter):
    """A Filter whose structured form is given as made: the SDK would take seconds to
    build a million predicates one by one, and only the bytes on the wire matter here."""

    def __init__(self, encoded: pb.Filter):
        object.__setattr__(self, "predicates", ())
        object.__setattr__(self, "encoded", encoded)


def _repeated(p: Predicate, n: int) -> _Encoded:
    one = filter_to_pb(Filter((p,))).SerializeToString()  # one `predicates` field: repeated, it parses as n
    return _Encoded(pb.Filter.FromString(one * n))


async def test_oversized_filters_are_refused_invalid_argument_changing_nothing(cluster, monkeypatch):
    monkeypatch.setattr(client_subscription, "filter_to_pb",
                        lambda f: f.encoded if isinstance(f, _Encoded) else filter_to_pb(f))
    c = cluster.client(1)
    await c.create_topic("quotes", SCHEMA)
    rows = []
    for name, flt in _attacks():
        started = time.perf_counter()
        with pytest.raises(errors.EchelonError) as err:
            await c.subscribe("quotes", flt, name="bad").start()
        rows.append((name, err.value.code.name, time.perf_counter() - started, len(err.value.message)))
        # Past the agent's receive limit gRPC core refuses the request before it is read
        # (docs/security.md, "The agent's receive limit"); under it the filter's caps do.
        size = len(flt.encode()) if isinstance(flt, str) else len(
            (flt.encoded if isinstance(flt, _Encoded) else filter_to_pb(flt)).SerializeToString())
        expected = grpc.StatusCode.RESOURCE_EXHAUSTED if size > cluster.agent_nodes[1].server.receive_bytes \
            else grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.code == expected, (name, err.value.code, err.value.message[:SHORT])
        assert len(err.value.message) < SHORT, (name, err.value.message[:SHORT])
        assert all(a.subs == {} for a in cluster.agent_nodes) and len(cluster.matcher_nodes[0].tier.store) == 0
    print("\nattack                                      status            seconds  message chars")
    for name, code, seconds, chars in rows:
        print(f"{name:43} {code:17} {seconds:7.3f}  {chars}")
    # An operator's limits, where the agent keeps them, apply to every kind of subscription.
    for agent in cluster.agent_nodes:  # a durable subscription is served by its holder, maybe another agent
        agent.subscriptions.filter_limits = FilterLimits(max_predicates=2)
    for durable in (False, True):
        with pytest.raises(errors.InvalidArgument, match="more than 2 predicates"):
            await c.subscribe("quotes", "High > 1 and High < 9 and Volume > 3", name="bad", durable=durable).start()
    for agent in cluster.agent_nodes:
        agent.subscriptions.filter_limits = DEFAULT_LIMITS
    # The agent still serves an honest subscriber.
    async with c.subscribe("quotes", "High > 1") as honest:
        await cluster.client(0).publisher(ack_level=DELIVERED).publish("quotes", {"High": 2.0})
        assert (await honest.next(timeout=5)).attributes == {"High": 2.0}


async def test_an_or_filter_is_one_subscription_delivered_each_event_once(cluster):
    c0, c1 = cluster.client(0), cluster.client(1)
    await c0.create_topic("quotes", SCHEMA)
    text = 'Symbol in ("aapl", "msft") or High > 100 or not Volume < 1000'
    store = cluster.matcher_nodes[0].tier.store
    sub = c1.subscribe("quotes", text, name="either")
    await sub.start()
    sid = f"{cluster.agent_nodes[1].config.id}/either"
    await wait_for(lambda: set(store.copies) == set(term_ids(sid, 4)), what="one matcher entry per term")
    events = [
        {"Symbol": "aapl", "High": 150.0, "Volume": 5000},  # every term: delivered once
        {"Symbol": "ibm", "High": 1.0, "Volume": 10},  # none
        {"Symbol": "ibm", "High": 1.0, "Volume": 2000},  # the last term only
        {"Symbol": "msft", "High": 1.0},  # the second term only (no Volume: `not Volume < 1000` is unknown)
        {"Symbol": "ibm", "High": 101.0},  # the third term only
    ]
    expected = [e for e in events if parse(text).matches(e)]
    pub = c0.publisher(ack_level=DELIVERED)
    # Read while they are out: a DELIVERED publish to a named subscription with its client
    # attached waits for that client's ack (docs/guarantees.md).
    out = [pub.publish_nowait("quotes", e) for e in events]
    got = [await sub.next(timeout=10) for _ in expected]
    for m in got:
        await m.ack()
    await asyncio.gather(*out)
    got += await drain(sub)  # and nothing more
    assert [m.attributes for m in got] == expected and len(expected) == 4
    # The named subscription comes back with a narrower filter: the extra entries go.
    await sub.close()
    narrower = c1.subscribe("quotes", 'Symbol = "aapl" or High > 400', name="either")
    await narrower.start()
    await wait_for(lambda: set(store.copies) == set(term_ids(sid, 2)), what="the stale terms removed")
    await narrower.close()
    await c1.unsubscribe("either")
    await wait_for(lambda: not store.copies, what="every entry removed with the subscription")


async def test_a_durable_subscription_keeps_its_or_filter(tmp_path):
    """Its record holds the normal form (`any_of`); opened again with the same text it is
    the same filter, and each event is delivered once."""
    from echelon.v1 import membership_pb2 as mpb
    from tests.harness import Cluster

    cluster = Cluster(agents=0, matchers=1)
    await cluster.start()
    try:
        for i in range(2):
            await cluster.add_agent(i, data_dir=str(tmp_path / f"agent-{i}"))
        await wait_for(lambda: all(len(a.membership.alive(mpb.ROLE_AGENT)) == 2 for a in cluster.agent_nodes),
                       what="both agents see each other")
        c0, c1 = cluster.client(0), cluster.client(1)
        await c0.create_topic("quotes", SCHEMA)
        text = 'Symbol = "aapl" or (High > 100 and not Volume between 0 and 10)'
        sub = c1.subscribe("quotes", text, name="keeper", durable=True)
        await sub.start()
        events = [{"Symbol": "aapl", "High": 200.0, "Volume": 50}, {"Symbol": "ibm", "High": 200.0, "Volume": 5},
                  {"Symbol": "ibm", "High": 200.0, "Volume": 50}, {"Symbol": "aapl"}]
        pub = c0.publisher(ack_level=DELIVERED)
        for e in events:
            await pub.publish("quotes", e)
        got = await drain(sub)
        assert [m.attributes for m in got] == [e for e in events if parse(text).matches(e)] and len(got) == 3
        await sub.close()
        again = c1.subscribe("quotes", text, name="keeper", durable=True)
        await again.start()  # the same filter: no "exists with another filter"
        await again.close()
        with pytest.raises(errors.FailedPrecondition, match="another filter"):
            await c1.subscribe("quotes", 'Symbol = "aapl"', name="keeper", durable=True).start()
    finally:
        await cluster.stop()


async def test_a_matcher_takes_one_conjunction_per_entry(cluster):
    """The agent registers each term on its own; a disjunction sent as one entry is refused."""
    from echelon.v1 import matcher_pb2 as xpb
    from echelon.v1 import matcher_pb2_grpc as xgrpc

    await cluster.client(0).create_topic("quotes", SCHEMA)
    entry = xpb.Subscription(id="agent-0/both", agent="agent-0", topic="quotes",
                             filter=filter_to_pb(parse('Symbol = "a" or High > 1')))
    async with grpc.aio.insecure_channel(cluster.matcher_nodes[0].address) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await xgrpc.MatcherStub(ch).Register(xpb.RegisterRequest(subscriptions=[entry]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "one conjunction" in err.value.details()
    assert len(cluster.matcher_nodes[0].tier.store) == 0


async def test_an_operator_sets_the_filter_caps_with_limits():
    """`--limits filter_max_predicates=...` is the agents' cap for every identity: a filter
    one predicate past it is refused INVALID_ARGUMENT naming the cap, one at it is served."""
    from echelon.runtime.auth import AuthConfig
    from echelon.runtime.limits import parse_limits
    from tests.harness import Cluster

    cluster = Cluster(agents=1, auth=AuthConfig(limits=parse_limits("filter_max_predicates=3,filter_max_bytes=64")))
    await cluster.start()
    try:
        c = cluster.client(0)
        await c.create_topic("quotes", SCHEMA)
        at_cap = 'Symbol = "a" and High > 1 and Volume < 5'
        async with c.subscribe("quotes", at_cap):
            pass
        with pytest.raises(errors.InvalidArgument, match="more than 3 predicates"):
            await c.subscribe("quotes", at_cap + " and High < 9").start()
        with pytest.raises(errors.InvalidArgument, match="64"):
            await c.subscribe("quotes", 'Symbol prefix "' + "x" * 80 + '"').start()
        assert not cluster.agent_nodes[0].subscriptions.subs
    finally:
        await cluster.stop()
