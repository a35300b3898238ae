"""Where an agent sends its copies: the LBDD trees of its own view (LBDD section 3,
docs/papers.md, "LBDD"), striped for bulk payloads.

Node keys are the agents' advertised addresses (`host:port`); the view maps member id
<-> key. A topic's tree spans the alive agents whose `subscribes` holds the topic. Every
relay rebuilds the tree from the frame's source key, the event's topic and the copy's
stripe, so no routing table travels; `Buckets` is built once per (source, topic, stripe,
peer table) and routes once per destination set.

A destination alive but not (yet) advertised as a subscriber of the topic -- its
subscription is registered on the matchers a heartbeat before its `subscribes` reaches
this view, as at every agent (re)start -- is sent a copy directly: it never joins the
tree, so the path to every advertised subscriber depends on the view alone, not on which
other destinations a message has. (When it joined the tree, two consecutive messages of
a producer, one for it and one not, took different paths from a relay whose view differed
from the root's, and the later overtook the earlier: reordered at restarts: docs/guarantees.md, "Order".)

Stripes. One tree caps the speedup of a bulk transfer at N / (largest out-degree): the
paper's 12 hosts have a node with 4 children. So a large payload's slices travel on S
trees: stripe 0 is the plain LBDD tree; stripe s > 0 is the LBDD tree over the same
nodes with every key salted as `key + "#s"` (the source's too), which reshuffles digests,
buckets and so every node's out-degree. Each slice carries its stripe; the root picks
it by `schedule`: greedily, slice after slice, the stripe that keeps the largest upload
load (copies sent, counted only into subtrees holding a destination) of any node
smallest. Over S = 8 random salted trees that gives most agents a turn at leading, and
the busiest node sends about 1.1-2 copies of the payload instead of 4 (docs/papers.md, "LBDD":
a swarm's bound is one copy each). S = 1 is plain LBDD. Small events always use stripe 0,
so a producer's events to one agent all follow one path (FIFO); a striped payload is
fenced by the sender instead (see dataplane).

Small topics. On a topic with at most `direct_upto` subscribing agents, stripe 0 is a star:
every node sends each destination its copy itself. LBDD's own tree over so few agents may
already be a star (the root's out-degree reaches n there), so no node sends more copies
than the tree may have it send, and each copy skips the relay hops the tree puts on most
paths (docs/performance.md, "Bytes per useful delivery"). Small events and every
payload's head travel on stripe 0, so they keep one path per destination; a bulk payload's
other slices still spread over the salted trees. The rule depends on the view alone, like
the trees, so FIFO holds as the module says. 0 turns it off (the paper's trees).

Bucket hints. Agents the routing plan hints (weight > 0) are leaves of every tree: they
join LEAF_BUCKET, the last bucket, so they relay nothing (core/lbdd.py says exactly how
the buckets change). `update` takes the hinted ids with the view.

A destination that this node's tree does not place below it (the views differ for a
moment, or this node is not in the tree) is sent directly: nothing falls between two
views. Along tree edges bucket numbers strictly increase and direct copies carry only
their own destination, so no copy ever loops.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from echelon.core import lbdd
from echelon.v1 import membership_pb2 as mpb

SCHEDULE_LENGTH = 128  # slices in one period of a stripe schedule
DIRECT_UPTO = 4  # subscribing agents on a topic up to which stripe 0 is a star (module doc)
MAX_CACHED = 4096  # routes per peer table; past it the cache starts over


def salted(key: str, stripe: int) -> str:
    """The node key of `key` in stripe `stripe`'s tree."""
    return key if stripe == 0 else f"{key}#{stripe}"


def hinted(plan: mpb.RoutingPlan | None) -> frozenset[str]:
    """The agents a routing plan moves to the leaves: bucket hints with weight > 0."""
    return frozenset(h.member_id for h in plan.bucket_hints if h.weight > 0) if plan else frozenset()


class PeerTable:
    """One view's agents: id <-> key, and which of them subscribe to each topic."""

    def __init__(self, members: Iterable[mpb.Member]):
        self.members = {m.id: m for m in members}
        self.key = {i: m.address for i, m in self.members.items()}
        self.fingerprint = frozenset((i, m.address, tuple(m.subscribes)) for i, m in self.members.items())
        self._subscribers: dict[str, frozenset[str]] = {}

    def subscribers(self, topic: str) -> frozenset[str]:
        s = self._subscribers.get(topic)
        if s is None:
            s = self._subscribers[topic] = frozenset(i for i, m in self.members.items() if topic in m.subscribes)
        return s


class _Tree:
    """One stripe's Buckets plus the way back from salted keys to member ids."""

    __slots__ = ("buckets", "ids")

    def __init__(self, buckets: lbdd.Buckets, ids: dict[str, str]):
        self.buckets = buckets
        self.ids = ids


class Trees:
    """Routing decisions of one agent over its current peer table."""

    def __init__(self, self_id: str, self_key: str, mode: str = "lbdd", stripes: int = 1,
                 max_degree: int | None = None, direct_upto: int = DIRECT_UPTO):
        if mode not in ("lbdd", "p2p"):
            raise ValueError(f"dissemination {mode!r}: lbdd or p2p")
        if stripes < 1:
            raise ValueError("stripes must be >= 1")
        if max_degree is not None and max_degree < 2:
            raise ValueError(f"max_degree {max_degree}: at least 2")
        if direct_upto < 0:
            raise ValueError(f"direct_upto {direct_upto}: at least 0")
        # A star must not break the out-degree bound either; every agent must use the same
        # value, as for max_degree.
        self.direct_upto = direct_upto if max_degree is None else min(direct_upto, max_degree)
        # LBDD's out-degree bound (core/lbdd.py); every agent must use the same value to
        # derive the same tree. Off by default, as in the paper.
        self.max_degree = max_degree
        self.self_id = self_id
        self.self_key = self_key
        self.mode = mode
        self.stripes = stripes if mode == "lbdd" else 1
        self.table = PeerTable(())
        self.dead: frozenset[str] = frozenset()  # agents DEAD in the view: their messages are parked
        self.left: frozenset[str] = frozenset()  # agents that LEFT: nothing waits for them
        self.hinted: frozenset[str] = frozenset()  # agents the plan moves to the leaves
        self._trees: dict[tuple, _Tree] = {}
        self._routes: dict[tuple, tuple[dict[str, list[str]], list[str]]] = {}
        self._schedules: dict[tuple, tuple[int, ...]] = {}

    def update(self, members: Iterable[mpb.Member], dead: Iterable[str] = (), hinted: Iterable[str] = (),
               left: Iterable[str] = ()) -> bool:
        """Algorithm 3's trigger: a new view (`members` alive, `dead` the DEAD ones, `left`
        the ones that LEFT) or new bucket hints. Returns True if the peer table or the hints changed."""
        self.dead, self.left = frozenset(dead), frozenset(left)
        table = PeerTable(members)
        hinted = frozenset(hinted)
        if table.fingerprint == self.table.fingerprint and hinted == self.hinted:
            return False
        self.table, self.hinted = table, hinted
        self._trees.clear()
        self._routes.clear()
        self._schedules.clear()
        return True

    def alive(self, member_id: str) -> bool:
        return member_id in self.table.members

    def waits_for(self, member_id: str) -> bool:
        """Is a destination not alive here worth parking for? DEAD, or absent from the view
        (parking.py); not one that LEFT."""
        return member_id not in self.left

    def star(self, topic: str, stripe: int) -> bool:
        """Does `stripe` of `topic` go straight to each destination (p2p, or a small topic's
        stripe 0: the module doc)?"""
        return self.mode == "p2p" or (stripe == 0 and len(self.table.subscribers(topic)) <= self.direct_upto)

    def _tree(self, source_key: str, topic: str, stripe: int) -> _Tree:
        k = (source_key, topic, stripe)
        tree = self._trees.get(k)
        if tree is None:
            key = self.table.key
            ids = {salted(key[i], stripe): i for i in self.table.subscribers(topic)}
            leaves = [salted(key[i], stripe) for i in self.hinted if i in key]
            tree = self._trees[k] = _Tree(lbdd.buckets(salted(source_key, stripe), ids, leaves, self.max_degree), ids)
        return tree

    def route(self, source_key: str, topic: str, stripe: int,
              destinations: Sequence[str]) -> tuple[dict[str, list[str]], list[str]]:
        """This node's copies for `destinations`: ({target id: destination ids behind it}, lost).

        `lost` are destinations no longer in the view (failed or left): nobody to send to.
        This node itself is never a target; the caller delivers locally.
        """
        ck = (source_key, topic, stripe, tuple(destinations))
        hit = self._routes.get(ck)
        if hit is not None:
            return hit
        members = self.table.members
        alive = [d for d in destinations if d in members and d != self.self_id]
        lost = [d for d in destinations if d not in members and d != self.self_id]
        out: dict[str, list[str]] = {}
        if self.star(topic, stripe):
            out = {d: [d] for d in alive}
        elif alive:
            tree = self._tree(source_key, topic, stripe)
            key = self.table.key
            wanted = {salted(key[d], stripe): d for d in alive if salted(key[d], stripe) in tree.ids}
            covered: set[str] = set()
            for head, ds in tree.buckets.route(salted(self.self_key, stripe), wanted).items():
                out[tree.ids[head]] = sorted(wanted[d] for d in ds)
                covered.update(ds)
            for d in alive:
                if salted(key[d], stripe) not in covered:  # not advertised, or not below us in our view: directly
                    out.setdefault(d, []).append(d)
        if len(self._routes) >= MAX_CACHED:
            self._routes.clear()
        result = self._routes[ck] = (out, lost)
        return result

    def schedule(self, topic: str, destinations: Sequence[str]) -> tuple[int, ...]:
        """The root's stripe for slice i is `schedule[i % len(schedule)]` (see the module doc)."""
        if self.stripes == 1:
            return (0,)
        ck = (topic, tuple(destinations))
        hit = self._schedules.get(ck)
        if hit is not None:
            return hit
        loads = [self._loads(topic, s, destinations) for s in range(self.stripes)]
        acc: dict[str, int] = {}
        top = 0  # the largest accumulated load
        order = []
        for _ in range(SCHEDULE_LENGTH):
            best, best_top = 0, None
            for s, load in enumerate(loads):
                t = max(top, max((acc.get(n, 0) + c for n, c in load.items()), default=0))
                if best_top is None or t < best_top:
                    best, best_top = s, t
            for n, c in loads[best].items():
                acc[n] = acc.get(n, 0) + c
            top = best_top
            order.append(best)
        if len(self._schedules) >= MAX_CACHED:
            self._schedules.clear()
        result = self._schedules[ck] = tuple(order)
        return result

    def _loads(self, topic: str, stripe: int, destinations: Sequence[str]) -> dict[str, int]:
        """Copies each node sends of one slice on `stripe`, this node as the root."""
        members = self.table.members
        alive = [d for d in destinations if d in members and d != self.self_id]
        if self.star(topic, stripe):
            return {self.self_id: len(alive)} if alive else {}
        tree = self._tree(self.self_key, topic, stripe)
        parent = tree.buckets.tree().parent
        key, ids = self.table.key, tree.ids
        loads: dict[str, int] = {}
        marked: set[str] = set()
        for d in alive:
            k = salted(key[d], stripe)
            if k not in ids:  # not advertised: a copy straight from here
                loads[self.self_id] = loads.get(self.self_id, 0) + 1
                continue
            while k in parent and k not in marked:  # walk up to the first marked node
                marked.add(k)
                p = parent[k]
                n = ids.get(p, self.self_id)  # the source is the only node outside `ids`
                loads[n] = loads.get(n, 0) + 1
                k = p
        return loads
