"""core/durability.py against brute-force oracles, and the store's log on a tmp dir."""

from __future__ import annotations

import itertools
import random

from echelon.agent.store import Store
from echelon.core.durability import Bound, Policy, admit, expired, holders, idle
from echelon.v1 import common_pb2 as pb


def test_holders_are_deterministic_distinct_and_move_little():
    agents = [f"agent-{i}" for i in range(8)]
    names = [f"sub-{i}" for i in range(400)]
    for name in names:
        h = holders(name, agents, 2)
        assert len(set(h)) == 2 and h == holders(name, list(reversed(agents)), 2)
    # Rendezvous hashing: removing an agent moves only the names it held.
    moved = [n for n in names if holders(n, agents, 2) != holders(n, agents[:-1], 2)]
    assert all("agent-7" in holders(n, agents, 2) for n in moved)
    first = [holders(n, agents, 1)[0] for n in names]
    assert min(first.count(a) for a in agents) > 400 / 8 / 3  # spread


def brute_admit(bound: Bound, sizes: list[int], extra_unmovable: tuple[int, int], size: int):
    """Try evicting 0..len(sizes) oldest: the fewest that make room."""
    um, ub = extra_unmovable
    if bound.policy is Policy.REJECT_PUBLISH:
        return True, 0
    for k in range(len(sizes) + 1) if bound.policy is Policy.DROP_OLDEST else [0]:
        m, b = len(sizes) - k + um, sum(sizes[k:]) + ub
        if m + 1 <= bound.max_messages and b + size <= bound.max_bytes:
            return True, k
    return False, 0


def test_admit_matches_brute_force():
    rng = random.Random(7)
    for _ in range(3000):
        policy = rng.choice(list(Policy))
        bound = Bound(rng.randint(1, 6), rng.randint(1, 60), policy)
        sizes = [rng.randint(1, 15) for _ in range(rng.randint(0, 6))]
        unmovable = (rng.randint(0, 2), rng.randint(0, 10))
        size = rng.randint(1, 20)
        got = admit(bound, sizes, len(sizes) + unmovable[0], sum(sizes) + unmovable[1], size)
        want = brute_admit(bound, sizes, unmovable, size)
        assert (got.keep, got.evict) == want, (bound, sizes, unmovable, size)


def test_expired_keeps_owed_and_order():
    rows = [(10, 5, False), (20, 5, True), (30, 5, False)]
    assert expired(rows, now_ns=100, max_age_ns=50, max_bytes=0) == 1  # the owed one stops the sweep
    assert expired(rows, now_ns=100, max_age_ns=0, max_bytes=5) == 1
    assert expired([(10, 5, False), (20, 5, False)], now_ns=100, max_age_ns=0, max_bytes=5) == 1
    assert expired([(90, 5, False)], now_ns=100, max_age_ns=50, max_bytes=100) == 0
    for rows in itertools.product([(1, 4, False), (1, 4, True), (99, 4, False)], repeat=3):
        n = expired(list(rows), now_ns=100, max_age_ns=50, max_bytes=6)
        assert not any(owed for _, _, owed in rows[:n])


def test_idle():
    assert idle(0, 11_000_000_000, 10, attached=False)
    assert not idle(0, 11_000_000_000, 10, attached=True)
    assert not idle(0, 11_000_000_000, 0, attached=False)
    assert not idle(2_000_000_000, 11_000_000_000, 10, attached=False)


def event(seq: int, t: int, topic: str = "t") -> pb.Event:
    return pb.Event(id=pb.MessageId(producer_id="p", sequence=seq), topic=topic, publish_time_unix_nanos=t,
                    payload=b"x" * seq)


def test_store_log_acks_seek_and_reopen(tmp_path):
    store = Store(tmp_path, "always")
    for i in range(1, 6):
        store.append(event(i, i * 10), ["a", "b"])
    store.append(event(3, 30), ["a"])  # again: logged once
    store.ack("a", "t", [("p", 1), ("p", 2)])
    assert [e.id.sequence for e in store.backlog("a")] == [3, 4, 5]
    assert [e.id.sequence for e in store.backlog("b")] == [1, 2, 3, 4, 5]
    store.put_record("a", b"rec")
    store.close()
    store = Store(tmp_path, "batch")  # reopened: everything committed is there
    assert store.records() == {"a": b"rec"}
    assert [e.id.sequence for e in store.backlog("a")] == [3, 4, 5]
    assert [e.id.sequence for e in store.seek("a", "t", lambda e: True, time_ns=20)] == [2, 3, 4, 5]
    assert [e.id.sequence for e in store.seek("a", "t", lambda e: e.id.sequence % 2, key=("p", 1))] == [1, 3, 5]
    assert store.seek("a", "t", lambda e: True, key=("p", 99)) is None
    assert [e.id.sequence for e in store.backlog("a")] == [1, 3, 5]  # the failed seek changed nothing
    store.flush()
    store.close()


def test_store_replace_keeps_what_arrived_meanwhile_after_the_copy(tmp_path):
    store = Store(tmp_path)
    store.append(event(1, 10), ["a"])
    store.append(event(2, 20), ["a"])  # acked elsewhere while this copy was away: not in the copy
    since = store.next_pos()
    store.append(event(4, 40), ["a"])  # arrived while adopting (late: parked for this agent)
    store.append(event(6, 60), ["a"])  # arrived while adopting, not in the copy
    store.replace("a", [event(3, 30), event(4, 40), event(5, 50)], since)
    assert [e.id.sequence for e in store.backlog("a")] == [3, 4, 5, 6]


def test_store_retention(tmp_path):
    store = Store(tmp_path)
    for i in range(1, 5):
        store.append(event(i, i), ["a"])
    store.ack("a", "t", [("p", 1), ("p", 2), ("p", 4)])
    rows = store.retained("t")
    assert [(pos, owed) for pos, _, _, owed in rows] == [(1, False), (2, False), (3, True), (4, False)]
    store.drop_events("t", 4)  # the owed one stays, and whatever is not past the bound
    assert [pos for pos, *_ in store.retained("t")] == [3]


def test_store_flush_fsyncs_only_after_changes(tmp_path):
    """The periodic fsync runs only when something was written since the last one (an
    agent with no durable subscription does no fsync at all)."""
    store = Store(tmp_path, "batch")
    store.flush()
    assert store.flushes == 0
    store.append(event(1, 10), ["a"])
    store.flush()
    store.flush()
    assert store.flushes == 1
    store.ack("a", "t", [("p", 1)])
    store.flush()
    assert store.flushes == 2
    store.close()
