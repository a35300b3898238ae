"""OctopiA's advertisements on the routers' control plane (router/control.py, core/cib.py)
against brute force, without gRPC: the routers' own `_full` / `_delta` / `receive` with
one FIFO queue per directed link, delivered in a random interleaving, streams reset at
random (the receiver ends the old stream, the sender starts again with its full state).

Agents advertise and withdraw topics (their producers come and go), move their
advertisements to another router of their region (their host broker changed), and
subscribe and unsubscribe at random. Checked:

- at every step, a subscription that has been held since the start is never missed: a
  host router's bit for its region is set for every event it matches, whatever the
  advertisements' churn (the safety of answering only advertised topics);
- once the queues are empty: a host's bit equals "some subscription of the region
  matches" for the events of the topics its region advertises, and a host holds only the
  groups that overlap its region's advertisements (none for a topic nobody there
  publishes: OctopiA's SRT saving)."""

from __future__ import annotations

import random

from echelon.contract.filters import parse
from echelon.contract.wire import attributes_to_pb, filter_to_pb
from echelon.core.scot import Scot
from echelon.dataplane.control import AgentFeed
from echelon.router.control import RouterControl, Stream
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import membership_pb2 as mpb

REGIONS = ("eu", "us", "ap")
TOPICS = ("a", "b", "c")
TEXTS = ["x < 10", "x >= 50", "x >= 20 and x < 30", "y = 3", "", "x = 7 and y = 1"]


class View:
    def __init__(self, members):
        self.members = {m.id: m for m in members}

    def alive(self, role):
        return [m for m in self.members.values() if m.role == role and m.state == mpb.MEMBER_STATE_ALIVE]


class Overlay:
    def __init__(self, routers: dict[str, tuple[int, int]], me: str):
        sizes = [0] * len(REGIONS)
        for a, c in routers.values():
            sizes[c] = max(sizes[c], a + 1)
        self.scot, self.here = Scot(tuple(sizes)), routers[me]
        self.at = {p: r for r, p in routers.items()}


class Plain:
    def auth_context(self):
        return {}


class Links:
    """A stand-in for ControlLinks: the keys marked per peer, sent when the test pumps."""

    def __init__(self, net: "Net", me: str):
        self.net, self.me, self.links = net, me, {}

    def keep(self, peers):
        self.links = {m.id: set() for m in peers}

    def changed(self, keys, only=None):
        for pid, dirty in self.links.items():
            if only is None or pid == only:
                dirty.update(keys)

    def resend(self, only=None):
        for pid in self.links:
            if only is None or pid in only:
                self.net.reset(self.me, pid)


class Net:
    def __init__(self, rng: random.Random, routers_per_region: int):
        self.rng = rng
        pos = {f"r-{reg}-{a}": (a, c) for c, reg in enumerate(REGIONS) for a in range(routers_per_region)}
        self.agents = {f"g-{reg}-{k}": reg for reg in REGIONS for k in range(2)}
        members = [mpb.Member(id=r, role=mpb.ROLE_ROUTER, region=r.split("-")[1], state=mpb.MEMBER_STATE_ALIVE)
                   for r in pos]
        members += [mpb.Member(id=g, role=mpb.ROLE_AGENT, region=reg, state=mpb.MEMBER_STATE_ALIVE)
                    for g, reg in self.agents.items()]
        view = View(members)
        self.queues: dict[tuple[str, str], list] = {}
        self.streams: dict[tuple[str, str], Stream] = {}
        self.routers: dict[str, RouterControl] = {}
        for r in pos:
            rc = RouterControl(r, r.split("-")[1], lambda: view, None, lambda r=r: Overlay(pos, r))
            rc.links = Links(self, r)
            self.routers[r] = rc
        self.feeds: dict[str, AgentFeed] = {}
        self.subs: dict[str, dict[str, xpb.Subscription]] = {g: {} for g in self.agents}
        for g, reg in self.agents.items():
            feed = AgentFeed(g, reg, lambda g=g: self.subs[g], None)
            feed.links = Links(self, g)
            feed.links.links = {r: set() for r in pos if r.split("-")[1] == reg}
            feed.host = sorted(feed.links.links)[int(g[-1]) % routers_per_region]  # its events' router
            self.feeds[g] = feed
        for rc in self.routers.values():
            rc.on_view()
        for sender in [*self.feeds, *self.routers]:
            for pid in self.link_peers(sender):
                self.reset(sender, pid)

    def link_peers(self, sender):
        return list((self.feeds.get(sender) or self.routers[sender]).links.links)

    def reset(self, sender: str, pid: str) -> None:
        """The stream sender -> pid starts again: what was in flight is lost, the full state first."""
        old = self.streams.get((sender, pid))
        if old is not None:
            self.routers[pid].ended(old)
        self.streams[sender, pid] = Stream()
        owner = self.feeds.get(sender) or self.routers[sender]
        owner.links.links[pid] = set()
        full = owner._full(pid)
        self.queues[sender, pid] = list(full)

    def pump(self) -> None:
        """Each link's marked keys become its messages (as ControlLink does when woken)."""
        for sender in [*self.feeds, *self.routers]:
            owner = self.feeds.get(sender) or self.routers[sender]
            for pid, dirty in owner.links.links.items():
                if dirty:
                    keys = set(dirty)
                    dirty.clear()
                    out = owner._delta(pid, keys)
                    self.queues.setdefault((sender, pid), []).extend(out)

    def step(self) -> bool:
        self.pump()
        busy = [k for k, q in self.queues.items() if q]
        if not busy:
            return False
        sender, pid = self.rng.choice(busy)
        m = self.queues[sender, pid].pop(0)
        self.routers[pid].receive(self.streams[sender, pid], m, Plain())
        return True

    def settle(self) -> None:
        for _ in range(100_000):
            if not self.step():
                return
        raise AssertionError("did not settle")


def sub(agent: str, k: int, topic: str, text: str) -> xpb.Subscription:
    return xpb.Subscription(id=f"{agent}/{k}", agent=agent, topic=topic, filter=filter_to_pb(parse(text)))


def truth(net: Net, region: str, topic: str, event: dict) -> bool:
    return any(s.topic == topic and parse_cached(s) .matches(event)
               for g, subs in net.subs.items() if net.agents[g] == region for s in subs.values())


_parsed: dict[bytes, object] = {}


def parse_cached(s: xpb.Subscription):
    from echelon.contract.wire import filter_from_pb

    b = s.filter.SerializeToString(deterministic=True)
    if b not in _parsed:
        _parsed[b] = filter_from_pb(s.filter)
    return _parsed[b]


EVENTS = [{"x": x, "y": y} for x in (0, 7, 25, 55, 90) for y in (1, 3, 8)]
WIRE = [attributes_to_pb(e) for e in EVENTS]


def test_advertisements_answered_by_overlapping_groups_equal_brute_force_and_never_miss():
    rng = random.Random(29)
    for trial in range(6):
        net = Net(rng, routers_per_region=1 + trial % 2)
        # Subscriptions held from the start to the end: never missed at any step.
        stable = {}
        for g in net.agents:
            s = sub(g, 0, rng.choice(TOPICS), rng.choice(TEXTS))
            net.subs[g][s.id] = s
            stable[g] = s
            net.feeds[g].links.changed([s.id])
        net.settle()
        for step in range(150):
            g = rng.choice(list(net.agents))
            feed = net.feeds[g]
            op = rng.random()
            if op < 0.3:  # a producer comes, or goes
                t = rng.choice(TOPICS)
                if feed.producers.get(t) and rng.random() < 0.5:
                    feed.producing(t, -1)
                else:
                    feed.producing(t, 1)
            elif op < 0.55:
                s = sub(g, rng.randrange(1, 5), rng.choice(TOPICS), rng.choice(TEXTS))
                net.subs[g][s.id] = s
                feed.links.changed([s.id])
            elif op < 0.7:
                i = f"{g}/{rng.randrange(1, 5)}"
                net.subs[g].pop(i, None)
                feed.links.changed([i])
            elif op < 0.74:  # the agent's events go through another router of its region from here
                feed.hosted_by(rng.choice(sorted(feed.links.links)))
            elif op < 0.8:  # a stream reset, agent's or router's
                sender = rng.choice([*net.feeds, *net.routers])
                peers = net.link_peers(sender)
                if peers:
                    net.reset(sender, rng.choice(peers))
            for _ in range(rng.randrange(8)):
                net.step()
            # Never missed: a stable subscription of region R, and any host router of another region.
            for r, rc in net.routers.items():
                for g, s in stable.items():
                    reg = net.agents[g]
                    if reg == rc.region:
                        continue
                    for e, w in zip(EVENTS, WIRE):
                        if parse_cached(s).matches(e):
                            assert rc.wants(reg, s.topic, w), (trial, step, r, g, s.topic, e)
            if step % 25 == 24:
                net.settle()
                for r, rc in net.routers.items():
                    advertised = {k[0] for k in rc.advertised.count}
                    for reg in REGIONS:
                        if reg == rc.region:
                            continue
                        # Stored: only the far region's groups on topics this region publishes.
                        assert {k[0] for k in rc.summaries.keys(reg)} <= advertised, (trial, step, r, reg)
                        for t in advertised:
                            for e, w in zip(EVENTS, WIRE):
                                assert rc.wants(reg, t, w) == truth(net, reg, t, e), (trial, step, r, reg, t, e)
                    held = {k for reg in REGIONS for k in rc.summaries.keys(reg)}
                    assert all(k[0] in advertised for k in held)
                    # The decoded filters kept are those of live groups: churn does not grow it.
                    assert set(rc._exprs) <= set(rc.subgroups.count), (trial, step, r)
