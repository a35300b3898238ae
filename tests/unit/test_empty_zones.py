"""Zones promised empty (services/echelon/matcher/empty.py) on test_matcher_tier's in-memory
network, which interleaves every call at random.

- An entry whose other zones are all promised empty answers with no matcher-to-matcher
  message, and suggests itself; one that does not hold the subscriptions' zone asks.
- The oracle: registrations (and removals) race a stream of events into zones promised
  empty; every answer holds every subscription acknowledged before the event was sent,
  and nothing not registered (or removed and acknowledged) by then: brute force.
- A holder that crashed after promising a zone empty: a registration into that zone is
  acknowledged only once the promise has ended, so the next event waits for the zone's
  recovery and matches it, never skips it.
"""

from __future__ import annotations

import asyncio
import random

from echelon.contract.filters import parse
from echelon.contract.schema import Attribute, AttrType, Schema
from echelon.matcher.layout import Copy
from echelon.matcher.tier import Tier
from tests.unit.test_matcher_tier import Net, Reference, Wire

SCHEMA = Schema((Attribute("x", AttrType.INT, 0, 99),))  # default zones d0 d1 d2 along x (3 matchers)
LONG = 30.0  # a lease that outlives each test: promises end only when revoked


class Counted(Wire):
    """The in-memory wire, counting zone matches sent to another matcher."""

    sent = 0

    async def match_zones(self, *args, **kwargs):
        Counted.sent += 1
        return await super().match_zones(*args, **kwargs)


class CountingNet(Net):
    def transport(self, me: str) -> Wire:
        return Counted(self, me)


async def cluster(seed: int, lease: float = LONG) -> CountingNet:
    net = CountingNet(seed, lease)
    net.topics["t"] = SCHEMA
    for i in range(3):
        await net.add(f"m{i}")
    await net.settle("t")
    return net


def owner(net: Net, zone: str) -> Tier:
    return net.cores[net.cores["m0"].layouts.topics["t"].active.members[zone][0]]


async def promised(net: Net, zones: set[str], entries: list[str] | None = None, left: float = 0.0) -> None:
    """Until each entry holds a promise (its peers' Sync answers), at least `left` seconds
    from its end, for each of `zones` it does not hold itself."""
    loop = asyncio.get_running_loop()
    for _ in range(400):
        if all(all(L.promised.get(z, 0.0) > loop.time() + left for z in zones - set(L.index))
               for m in entries or net.cores if (L := net.cores[m].layouts.topics["t"].active)):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no promise of empty zones {zones}")


async def stop(net: Net) -> None:
    for core in net.cores.values():
        await core.stop()


def test_an_entry_holding_every_nonempty_zone_sends_no_peer_message():
    async def run():
        net = await cluster(1)
        ref = Reference()
        top = owner(net, "d2")
        subs = [Copy(f"a/s{i}", "a", "t", 1, parse(f"x >= {70 + i}")) for i in range(20)]  # all in d2
        await net.cores["m0"].register(subs)
        ref.subs.update((c.id, c) for c in subs)
        others = sorted(m for m in net.cores if m != top.me)
        await promised(net, {"d0", "d1"})
        events = [("t", {"x": x}) for x in range(0, 100, 3)]  # each meets d0 and up to its own zone
        want = [ref.expect("t", e) for _, e in events]
        assert sum(map(len, want)) > 100
        Counted.sent = 0
        weights: dict[str, int] = {}
        assert await top.match(events, False, None, weights) == want
        assert Counted.sent == 0  # d0 and d1 promised empty, d2 local
        assert set(weights) == {top.me}  # and it is the entry it suggests
        for m in others:  # another entry asks d2's holder, once per batch, and suggests it
            weights = {}
            assert await net.cores[m].match(events, True, None, weights) == [set(w.values()) for w in want]
            assert max(weights, key=weights.__getitem__) == top.me
        assert Counted.sent == len(others)
        await stop(net)

    asyncio.run(run())


def test_registrations_racing_events_into_empty_zones_equal_brute_force():
    for seed in range(4):
        asyncio.run(race(seed))


async def race(seed: int) -> None:
    rng = random.Random(seed)
    net = await cluster(seed)
    seed_subs = [Copy(f"a/top{i}", "a", "t", 1, parse(f"x >= {80 + i}")) for i in range(5)]
    await net.cores["m1"].register(seed_subs)
    registered = {c.id: c for c in seed_subs}  # registration started, removal not acknowledged
    acked = dict(registered)  # acknowledged, and no removal started
    copies = dict(registered)  # every one ever registered
    await promised(net, {"d0", "d1"})
    grants_before = sum(c.empty.revocations for c in net.cores.values())
    done = asyncio.Event()
    clock = iter(range(2, 10**6))

    async def registrar():
        for i in range(30):
            entry = net.cores[rng.choice(sorted(net.cores))]
            if acked and rng.random() < 0.25:
                sid = rng.choice(sorted(acked))
                del acked[sid]
                await entry.remove([sid], next(clock))
                del registered[sid]
                continue
            k = rng.randrange(0, 66)  # the point's l in d0 or d1: zones promised empty
            c = Copy(f"b/s{i}", "b", "t", next(clock), parse(rng.choice([f"x >= {k}", f"x <= {k}",
                                                                          f"x between {k} and {k + 20}"])))
            registered[c.id] = copies[c.id] = c
            await entry.register([c])
            acked[c.id] = c
        done.set()

    checked = 0

    async def publisher():
        nonlocal checked
        while not done.is_set():
            entry = net.cores[rng.choice(sorted(net.cores))]
            e = {"x": rng.randrange(0, 100)}
            floor = {s for s, c in acked.items() if c.filter.matches(e)}
            gone = set(copies) - set(registered)  # removals acknowledged before the event
            got = set((await entry.match([("t", e)]))[0])
            ceiling = {s for s, c in copies.items() if c.filter.matches(e)} - gone
            floor &= set(acked)  # a removal started meanwhile may drop it
            assert floor <= got <= ceiling, (e, floor - got, got - ceiling)
            checked += 1

    async def syncer():  # Sync rounds back to back: their promises race the revocations
        while not done.is_set():
            for core in net.cores.values():
                core.barrier.moved()
            await asyncio.sleep(0)

    await asyncio.gather(registrar(), publisher(), publisher(), syncer())
    assert checked > 30
    assert sum(c.empty.revocations for c in net.cores.values()) > grants_before  # promises were revoked
    ref = Reference()
    ref.subs = acked
    for m, core in net.cores.items():
        events = [("t", {"x": x}) for x in range(100)]
        assert await core.match(events) == [ref.expect("t", e) for _, e in events], m
    await stop(net)


def test_a_registration_into_a_crashed_holders_promised_zone_waits_for_the_promise_to_end():
    async def run():
        net = await cluster(5, lease=0.5)
        top = owner(net, "d2")
        await net.cores["m0"].register([Copy("a/top", "a", "t", 1, parse("x >= 90"))])
        victim = owner(net, "d0")
        entry = next(c for c in net.cores.values() if c not in (victim,) and "d0" not in c.layouts.topics["t"]
                     .active.index)
        await promised(net, {"d0"}, [entry.me], left=0.3)
        registrar = next(c for c in net.cores.values() if c is not victim)
        await net.cores.pop(victim.me).stop()  # crashed; the others' views still hold it
        sub = Copy("b/low", "b", "t", 2, parse("x <= 5"))  # primary in d0, mirror elsewhere
        await registrar.register([sub])  # acknowledged (a mirror holder has it)...
        task = asyncio.create_task(entry.match([("t", {"x": 3})]))
        await asyncio.sleep(0.05)
        assert not task.done()  # ...only after the promise ended: the entry waits for d0's holder
        await net.publish()
        assert (await task)[0] == {"b/low": "b"}
        assert top.me in net.cores
        await stop(net)

    asyncio.run(run())
