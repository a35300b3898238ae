"""core/durability.py against brute-force oracles, and the store's log on a tmp dir."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from types import SimpleNamespace

from echelon.agent.durable.upkeep import flush_loop
from echelon.agent.durable.store import Store
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
    if bound.policy in (Policy.REJECT_PUBLISH, Policy.LAG):  # kept: LAG holds the publishers back instead
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
    assert expired(rows, now_ns=100, max_age_ns=50, max_bytes=0, total=15) == 1  # the owed one stops the sweep
    assert expired(rows, now_ns=100, max_age_ns=0, max_bytes=5, total=15) == 1
    assert expired([(10, 5, False), (20, 5, False)], now_ns=100, max_age_ns=0, max_bytes=5, total=10) == 1
    assert expired([(90, 5, False)], now_ns=100, max_age_ns=50, max_bytes=100, total=5) == 0
    # It reads no further than the first event it keeps (the log is read lazily).
    read = []
    lazy = (read.append(t) or (t, 5, False) for t in (10, 20, 90, 91, 92))
    assert expired(lazy, now_ns=100, max_age_ns=50, max_bytes=0, total=25) == 2 and read == [10, 20, 90]
    for rows in itertools.product([(1, 4, False), (1, 4, True), (99, 4, False)], repeat=3):
        n = expired(list(rows), now_ns=100, max_age_ns=50, max_bytes=6, total=12)
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


def test_store_replace_keeps_what_this_process_received_after_the_copy(tmp_path):
    store = Store(tmp_path)
    store.append(event(1, 10), ["a"])  # from the process before the restart
    store.append(event(2, 20), ["a"])  # acked elsewhere while this copy was away: not in the copy
    # Received by this process while it synced: 7 before the copy was asked for, which its
    # holder (behind this agent in the tree) did not have yet; 4 late (parked for this
    # agent while it was down); 6 after the copy.
    store.append(event(7, 70), ["a"])
    store.append(event(4, 40), ["a"])
    store.append(event(6, 60), ["a"])
    store.replace("a", [event(3, 30), event(4, 40), event(5, 50)], keep={("p", 7), ("p", 4), ("p", 6)})
    assert [e.id.sequence for e in store.backlog("a")] == [3, 4, 5, 7, 6]
    store.append(event(8, 80), ["a"])  # after the sync: served after everything above
    assert [e.id.sequence for e in store.backlog("a")] == [3, 4, 5, 7, 6, 8]
    store.replace("a", [event(6, 60)], keep=set())  # a second copy: only what it holds
    assert [e.id.sequence for e in store.backlog("a")] == [6]


def test_store_retention(tmp_path):
    store = Store(tmp_path)
    for i in range(1, 5):
        store.append(event(i, i), ["a"])
    store.ack("a", "t", [("p", 1), ("p", 2), ("p", 4)])
    rows = store.retained("t")
    assert [(pos, owed) for pos, _, _, owed in rows] == [(1, False), (2, False), (3, True), (4, False)]
    store.drop_events("t", 4)  # the owed one stays, and whatever is not past the bound
    assert [pos for pos, *_ in store.retained("t")] == [3]
    assert store.logged_bytes("t") == store.db.execute("SELECT size FROM events").fetchone()[0]


def test_the_retention_sweep_reads_what_it_lets_go_not_the_whole_log(tmp_path):
    """Every agent sweeps its log every second. Over a log where nothing is due, a sweep
    must cost as much for 6,000 events as for 300 (counted in SQLite VM steps, not time):
    it used to read the whole log, and at 10x the chaos workload that grew to most of an
    agent's event loop within minutes, its subscriptions fell behind past their backlog
    bound and were closed. What is due still goes, owed events stay."""
    from types import SimpleNamespace

    from echelon.agent.durable.upkeep import expire_retention

    def sweep_steps(n: int, now_ns: int) -> tuple[Store, int]:
        store = Store(tmp_path / str(n))
        for i in range(1, n + 1):
            ev = pb.Event(id=pb.MessageId(producer_id="p", sequence=i), topic="t", publish_time_unix_nanos=i,
                          payload=b"x")
            store.append(ev, ["a"] if i % 7 == 0 else [])  # every 7th still owed
        store.commit()
        expired_counter = SimpleNamespace(n=0, inc=lambda k: setattr(expired_counter, "n", expired_counter.n + k))
        d = SimpleNamespace(store=store, host=SimpleNamespace(membership=SimpleNamespace(topics={})),
                            defaults=SimpleNamespace(retention_seconds=1, retention_bytes=1 << 30),
                            retention_expired=expired_counter)
        expire_retention(d, now_ns)  # the first sums the log's bytes (once per process)
        steps = []
        store.db.set_progress_handler(lambda: steps.append(1), 100)
        expire_retention(d, now_ns)
        store.db.set_progress_handler(None, 100)
        return store, len(steps), expired_counter.n

    # Nothing due (every event younger than the 1 s retention): the cost must not grow with the log.
    _, small, gone = sweep_steps(300, now_ns=0)
    assert gone == 0
    _, large, gone = sweep_steps(6000, now_ns=0)
    assert gone == 0
    assert large <= small + 5, (small, large)
    # Due: the events older than a second go, up to the first one a backlog owes (7).
    store, _, gone = sweep_steps(20, now_ns=1_000_000_000 + 10)
    assert gone == 6 and [pos for pos, *_ in store.retained("t")][:2] == [7, 8]
    assert store.logged_bytes("t") == store.db.execute("SELECT SUM(size) FROM events").fetchone()[0]


def test_store_flush_fsyncs_only_after_changes(tmp_path):
    """The periodic fsync runs only when something was written since the last one (an
    agent with no durable subscription does no fsync at all)."""
    store = Store(tmp_path, "batch")

    def tick():  # what durable/upkeep.py flush_loop does every period
        if store.dirty():
            store.flush()

    tick()
    assert store.flushes == 0
    store.append(event(1, 10), ["a"])
    tick()
    tick()
    assert store.flushes == 1
    store.ack("a", "t", [("p", 1)])
    tick()
    assert store.flushes == 2
    store.close()


async def test_flush_loop_wakes_for_commits_only(tmp_path):
    """The `batch` fsync loop fsyncs a commit (a grouped append, committed at the end of its
    tick) and then waits for the next commit, not for a timer: an agent that writes nothing
    does no periodic work (it woke every 10 ms before)."""
    store = Store(tmp_path, "batch")
    flushes = []
    task = asyncio.create_task(flush_loop(SimpleNamespace(store=store, flushes=SimpleNamespace(
        inc=lambda: flushes.append(1))), 0.005))

    async def until(cond):
        deadline = time.monotonic() + 20
        while not cond():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)

    def waiting():  # parked on the commit event, no timer pending
        return bool(store.committed._waiters) and not store.committed.is_set()

    try:
        await until(waiting)
        assert store.flushes == 0
        store.append(event(1, 10), ["a"])  # grouped: committed by call_soon at the end of this tick
        await until(lambda: store.flushes == 1)
        await until(waiting)
        store.ack("a", "t", [("p", 1)])  # committed at once
        await until(lambda: store.flushes == 2)
        await until(waiting)
        assert len(flushes) == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        store.close()
