"""core/cib.py against brute force: a region's subscriptions change at random (agents'
full states, additions, replacements, removals, an agent leaving), the CIB_SET / CIB_CLEAR
they return are applied at a host router, with streams lost and full states sent again;
at every step the host's bit for the region equals "some subscription of the region
matches the event", and before a complete summary (or after a lost stream) it is set."""

from __future__ import annotations

import random

from echelon.contract.filters import parse
from echelon.contract.wire import attributes_to_pb
from echelon.core.cib import Subgroups, Summaries

TEXTS = ["x < 10", "x >= 50", "x >= 20 and x < 30", "y = 3", "", "x = 7 and y = 1", "y > 5"]
TOPICS = ["a", "b"]
PARSED = {t.encode(): parse(t) for t in TEXTS}


def key(topic: str, text: str):
    return topic, text.encode()


def exprs(keys):
    return {k: PARSED.get(k[1]) or parse(k[1].decode()) for k in keys}


def test_the_hosts_bit_equals_brute_force_through_random_changes_and_resets():
    rng = random.Random(3)
    for trial in range(12):
        region = Subgroups()
        host = Summaries()
        wire = Summaries(wire=True)  # the router's: attributes as received
        truth: dict[str, dict[str, tuple]] = {}  # agent -> id -> key
        connected = False

        def send(appeared, emptied):
            if connected:
                for h in (host, wire):
                    h.set("r0", exprs(appeared))
                    h.clear("r0", emptied)

        for step in range(120):
            agent = f"a{rng.randrange(4)}"
            op = rng.random()
            if op < 0.15:  # an agent's full state
                subs = {f"{agent}/{i}": key(rng.choice(TOPICS), rng.choice(TEXTS)) for i in range(rng.randrange(4))}
                truth[agent] = dict(subs)
                send(*region.replace(agent, subs))
            elif op < 0.55:  # added or replaced
                subs = {f"{agent}/{rng.randrange(6)}": key(rng.choice(TOPICS), rng.choice(TEXTS))}
                truth.setdefault(agent, {}).update(subs)
                send(*region.put(agent, subs))
            elif op < 0.8:
                ids = [f"{agent}/{rng.randrange(6)}" for _ in range(2)]
                for i in ids:
                    truth.get(agent, {}).pop(i, None)
                send(*region.drop(agent, ids))
            elif op < 0.85:
                truth.pop(agent, None)
                send(*region.forget(agent))
            elif op < 0.93:  # a new stream: the full state, complete
                connected = True
                for h in (host, wire):
                    h.replace("r0", "R", exprs(region.groups()), True)
            else:  # the stream ended
                connected = False
                for h in (host, wire):
                    h.lost("r0")
            held = {k for subs in truth.values() for k in subs.values()}
            assert set(region.groups()) == held
            if not connected:
                assert not host.known("R")
            else:
                assert host.keys("R") == held
            for _ in range(5):
                topic = rng.choice(TOPICS)
                event = {"x": rng.randrange(60), "y": rng.randrange(8)}
                want = any(k[0] == topic and PARSED[k[1]].matches(event) for k in held)
                got = host.wants("R", topic, event)
                assert wire.wants("R", topic, attributes_to_pb(event)) == got
                assert got == want if connected else got, (trial, step, topic, event)


def test_an_incomplete_summary_or_an_unknown_region_gets_everything():
    host = Summaries()
    assert host.wants("R", "a", {"x": 1})  # nothing heard from R
    host.replace("r0", "R", exprs([key("a", "x > 5")]), False)
    assert host.wants("R", "a", {"x": 1})  # R's router has not heard every agent yet
    host.replace("r0", "R", exprs([key("a", "x > 5")]), True)
    assert not host.wants("R", "a", {"x": 1}) and host.wants("R", "a", {"x": 9}) and not host.wants("R", "b", {"x": 9})
    # A second router of R, complete too: the union of both is used (neither may miss).
    host.replace("r1", "R", exprs([key("a", "x < 2")]), True)
    assert host.wants("R", "a", {"x": 1})
    host.lost("r0")
    host.lost("r1")
    assert host.wants("R", "b", {"x": 1})


def test_a_filter_moved_to_another_group_clears_the_old_one_and_sets_the_new():
    g = Subgroups()
    assert g.put("a", {"s": key("t", "x < 1")}) == ({key("t", "x < 1")}, set())
    assert g.put("b", {"s2": key("t", "x < 1")}) == (set(), set())  # the same group: nothing to send
    assert g.put("a", {"s": key("t", "x > 1")}) == ({key("t", "x > 1")}, set())
    assert g.drop("b", ["s2"]) == (set(), {key("t", "x < 1")})
    assert g.forget("a") == (set(), {key("t", "x > 1")})
    assert g.groups() == []
