"""OctopiA's control plane over a SCOT: advertisements kept to the publisher's region,
subscriptions broadcast in their host cluster, CIB_SET and the SCB, and notification
routing from those tables (OctopiA sections IV-C, V, VI, VII-A; docs/papers.md, "OctopiA").

Each broker B(a, c) keeps two tables:

- SRT, advertisements by id with their last hop and CIV. At the publisher's host broker
  the CIV is in the advertisement context: the host cluster's bit (the context bit) and
  one bit per secondary target cluster (STC). At a secondary broker -- the host's
  neighbour over an iLink, B(a, c') -- the CIV is in the subscription context: the
  sending cluster's bit and the SCB, this cluster's bit, set while a subscription of
  this cluster overlaps the advertisement.
- PRT, subscriptions by id with their last hop (None: a local subscriber). A
  subscription is broadcast over the aLinks of its host cluster only (no iLink), so the
  PRTs of cluster c together are c's *subgroup*, and every broker of c holds all of it.

Messages: ADV from the host to its secondary brokers (an advertisement tree of length 1,
no duplicates to discard); SUB along the cluster's tree; CIB_SET from a secondary broker
whose SCB turns on to the host, which sets that cluster's bit. CIB_SET carries the
subscription that caused it (the paper's rule); the host keeps only the bit.

Beyond the paper, which leaves removal out: UNSUB walks the same tree, and a secondary
broker whose last overlapping subscription leaves turns its SCB off and sends CIB_CLEAR;
UNADV removes the advertisement from the region. Links are FIFO, so a CIB_CLEAR never
overtakes the CIB_SET before it. And a view change (`ControlPlane.reindex`): positions
move, so each host re-sends its advertisements to its new secondary brokers, which
answer every such ADV (CIB_SET or CIB_CLEAR); the host's CIV stays a superset until then.

Routing a notification (SNR): at each broker, match the event against the PRT (exact);
deliver to the local subscribers that match, forward down the last hops of the matching
entries (reverse path forwarding along subscription trees, never back where it came
from); the host broker also sends one copy over the iLink into every STC of its
advertisement's CIV (`core/scot.py` `snr`). The copy that enters an STC is routed there by
that cluster's PRTs. So an event enters exactly the clusters holding a subscription that
overlaps its publisher's advertisement, and is delivered to exactly the subscriptions it
matches.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from echelon.contract.filters import Expression, overlaps
from echelon.contract.schema import Schema
from echelon.core.scot import Router, Scot, Send, snr

Overlap = Callable[["Advertisement", "Subscription"], bool]


@dataclass(frozen=True)
class Advertisement:
    id: str
    filter: Expression
    host: Router  # the publisher's host broker


@dataclass(frozen=True)
class Subscription:
    id: str
    filter: Expression
    host: Router  # the subscriber's host broker


class Kind(enum.Enum):
    ADV = "adv"
    UNADV = "unadv"
    SUB = "sub"
    UNSUB = "unsub"
    CIB_SET = "cib_set"
    CIB_CLEAR = "cib_clear"


@dataclass(frozen=True)
class Message:
    kind: Kind
    src: Router
    dst: Router
    adv: Advertisement | None = None
    sub: Subscription | None = None
    answer: bool = False  # ADV re-sent after a view change: answered CIB_SET or CIB_CLEAR either way


@dataclass
class SrtEntry:
    adv: Advertisement
    last_hop: Router | None  # None at the host broker
    civ: int  # advertisement context at the host, subscription context at a secondary broker


@dataclass
class PrtEntry:
    sub: Subscription
    last_hop: Router | None  # None: the subscriber is hosted here


@dataclass(frozen=True)
class Route:
    """What one broker does with one notification."""

    delivered: tuple[str, ...]  # ids of the local subscriptions it matches
    alinks: tuple[Router, ...]  # next brokers in this cluster (subscription trees)
    ilinks: tuple[Send, ...]  # copies into secondary target clusters (host broker only)


@dataclass
class Broker:
    """B(a, c)'s tables and its handlers; each returns the messages to send. `scanned`
    counts the table entries the last call matched against (a cost model's input)."""

    scot: Scot
    here: Router
    overlap: Overlap
    srt: dict[str, SrtEntry] = field(default_factory=dict)
    prt: dict[str, PrtEntry] = field(default_factory=dict)
    scanned: int = 0

    @property
    def bit(self) -> int:
        return 1 << self.here[1]

    def _secondaries(self) -> list[Router]:
        return self.scot.ilinks(*self.here)

    def _tree(self, but: Router | None) -> list[Router]:
        return [r for r in self.scot.alink(*self.here) if r != but]

    def _scb(self, adv: Advertisement) -> bool:
        self.scanned += len(self.prt)
        return any(self.overlap(adv, e.sub) for e in self.prt.values())

    # -- advertisements (section V) ------------------------------------------------------

    def advertise(self, adv: Advertisement) -> list[Message]:
        """A publisher hosted here advertises: CIV with the context bit only, then ADV to
        every secondary broker (the publisher's region)."""
        if adv.host != self.here:
            raise ValueError(f"advertisement {adv.id} is hosted by {adv.host}, not {self.here}")
        self.scanned = 0
        self.srt[adv.id] = SrtEntry(adv, None, self.bit)
        return [Message(Kind.ADV, self.here, r, adv=adv) for r in self._secondaries()]

    def unadvertise(self, adv_id: str) -> list[Message]:
        self.scanned = 0
        e = self.srt.pop(adv_id, None)
        if e is None or e.last_hop is not None:
            return []
        return [Message(Kind.UNADV, self.here, r, adv=e.adv) for r in self._secondaries()]

    # -- subscriptions (section VI) ------------------------------------------------------

    def subscribe(self, sub: Subscription) -> list[Message]:
        if sub.host != self.here:
            raise ValueError(f"subscription {sub.id} is hosted by {sub.host}, not {self.here}")
        self.scanned = 0
        return self._store(sub, None)

    def unsubscribe(self, sub_id: str) -> list[Message]:
        self.scanned = 0
        e = self.prt.get(sub_id)
        if e is None or e.last_hop is not None:
            return []
        return self._drop(sub_id, None)

    def _store(self, sub: Subscription, came: Router | None) -> list[Message]:
        """Save in the PRT, send on along the cluster's tree, and a CIB_SET for every
        secondary advertisement this subscription is the first to overlap."""
        self.prt[sub.id] = PrtEntry(sub, came)
        out = [Message(Kind.SUB, self.here, r, sub=sub) for r in self._tree(came)]
        for e in self.srt.values():
            if e.last_hop is None or e.civ & self.bit:
                continue
            self.scanned += 1
            if self.overlap(e.adv, sub):
                e.civ |= self.bit
                out.append(Message(Kind.CIB_SET, self.here, e.last_hop, adv=e.adv, sub=sub))
        return out

    def _drop(self, sub_id: str, came: Router | None) -> list[Message]:
        e = self.prt.pop(sub_id, None)
        if e is None:
            return []
        out = [Message(Kind.UNSUB, self.here, r, sub=e.sub) for r in self._tree(came)]
        for a in self.srt.values():
            if a.last_hop is None or not a.civ & self.bit:
                continue
            self.scanned += 1
            if self.overlap(a.adv, e.sub) and not self._scb(a.adv):
                a.civ &= ~self.bit
                out.append(Message(Kind.CIB_CLEAR, self.here, a.last_hop, adv=a.adv, sub=e.sub))
        return out

    # -- one message from a neighbour ----------------------------------------------------

    def handle(self, m: Message) -> list[Message]:
        if m.dst != self.here:
            raise ValueError(f"message for {m.dst} handled at {self.here}")
        self.scanned = 0
        if m.kind is Kind.ADV:
            scb = self.bit if self._scb(m.adv) else 0
            self.srt[m.adv.id] = SrtEntry(m.adv, m.src, (1 << m.src[1]) | scb)
            if scb or m.answer:
                return [Message(Kind.CIB_SET if scb else Kind.CIB_CLEAR, self.here, m.src, adv=m.adv)]
            return []
        if m.kind is Kind.UNADV:
            self.srt.pop(m.adv.id, None)
            return []
        if m.kind is Kind.SUB:
            return self._store(m.sub, m.src)
        if m.kind is Kind.UNSUB:
            return self._drop(m.sub.id, m.src)
        e = self.srt.get(m.adv.id)
        if e is None or e.last_hop is not None:
            return []  # unadvertised meanwhile
        if m.kind is Kind.CIB_SET:
            e.civ |= 1 << m.src[1]
        else:
            e.civ &= ~(1 << m.src[1])
        return []

    # -- a view change (Echelon's: positions are places among a region's live routers) ----

    def _toward(self, host: Router) -> Router | None:
        """The aLink neighbour on the way to `host` in this cluster's tree (None: here)."""
        if host == self.here:
            return None
        first = {r: r for r in self.scot.alink(*self.here)}
        frontier = list(first)
        while host not in first:
            nxt = []
            for b in frontier:
                for r in self.scot.alink(*b):
                    if r not in first and r != self.here:
                        first[r] = first[b]
                        nxt.append(r)
            if not nxt:
                raise ValueError(f"{host} is not in the cluster of {self.here}")
            frontier = nxt
        return first[host]

    def rehome(self, scot: Scot, here: Router, subs: Mapping[str, Subscription],
               advs: Mapping[str, Advertisement]) -> list[Message]:
        """Move to position `here` of a new overlay. `subs` / `advs`: every surviving
        subscription and advertisement with its host's new position. The PRT keeps its
        cluster's survivors with last hops re-derived from the new tree (a last hop is the
        neighbour toward the host). Entries held for other clusters' advertisements are
        dropped; each advertisement hosted here keeps its CIV, a superset while the
        re-sent ADVs' answers (always one each) come back and make it exact, so no cluster
        misses an event meanwhile."""
        self.scot, self.here, self.scanned = scot, here, 0
        self.prt = {i: PrtEntry(subs[i], self._toward(subs[i].host)) for i in self.prt if i in subs}
        out = []
        srt = {}
        for i, e in self.srt.items():
            if e.last_hop is None and i in advs:
                srt[i] = SrtEntry(advs[i], None, e.civ | self.bit)
                out += [Message(Kind.ADV, here, r, adv=advs[i], answer=True) for r in self._secondaries()]
        self.srt = srt
        return out

    # -- notifications (section VII-A) ---------------------------------------------------

    def route(self, adv_id: str, event: Mapping[str, object], came: Router | None = None) -> Route:
        """SNR at this broker for an event of advertisement `adv_id`, arrived from `came`
        (None: published here; a broker of another cluster: entered over an iLink)."""
        self.scanned = len(self.prt)
        matched = [e for e in self.prt.values() if e.sub.filter.matches(event)]
        delivered = tuple(sorted(e.sub.id for e in matched if e.last_hop is None))
        alinks = tuple(sorted({e.last_hop for e in matched if e.last_hop is not None and e.last_hop != came}))
        ilinks: tuple[Send, ...] = ()
        a = self.srt.get(adv_id)
        if came is None and a is not None and a.last_hop is None:
            ilinks = tuple(snr(self.scot, self.here, a.civ & ~self.bit))
        return Route(delivered, alinks, ilinks)


def exact_overlap(schema: Schema) -> Overlap:
    """The overlap test of the filters' own semantics (`contract/filters.py` `overlaps`)."""
    return lambda adv, sub: overlaps(adv.filter, sub.filter, schema)


class ControlPlane:
    """Every broker of a SCOT and a FIFO queue per directed link: the whole overlay in
    one process, for the tests and the simulators. `pick` chooses which non-empty link
    delivers next (default: the oldest), so a test can interleave links at random while
    each link stays FIFO."""

    def __init__(self, scot: Scot, overlap: Overlap):
        self.scot = scot
        self.brokers = {r: Broker(scot, r, overlap) for r in scot.routers()}
        self.queues: dict[tuple[Router, Router], list[Message]] = {}
        self.order: list[tuple[Router, Router]] = []
        self.sent: dict[Kind, int] = {k: 0 for k in Kind}

    def post(self, messages: list[Message]) -> None:
        for m in messages:
            key = (m.src, m.dst)
            if key not in self.queues or not self.queues[key]:
                self.order.append(key)
            self.queues.setdefault(key, []).append(m)
            self.sent[m.kind] += 1

    def step(self, pick: Callable[[int], int] | None = None) -> bool:
        """Deliver one message; False when every queue is empty."""
        if not self.order:
            return False
        i = pick(len(self.order)) if pick else 0
        key = self.order[i]
        q = self.queues[key]
        m = q.pop(0)
        if not q:
            self.order.pop(i)
        self.post(self.brokers[m.dst].handle(m))
        return True

    def settle(self, pick: Callable[[int], int] | None = None, limit: int = 10_000_000) -> None:
        for _ in range(limit):
            if not self.step(pick):
                return
        raise RuntimeError("control plane did not settle")

    def reindex(self, scot: Scot, where: Mapping[Router, Router]) -> None:
        """A view change: the broker at old position p moves to `where[p]`; a broker not in
        `where` is gone, with the subscriptions and advertisements it hosted (their agents
        issue them again at another router). Call it once the plane is quiet (in the
        services, a link's stream resends what was in flight)."""
        def moved(x):
            return type(x)(x.id, x.filter, where[x.host])

        subs, advs = {}, {}
        for b in self.brokers.values():
            subs.update({i: moved(e.sub) for i, e in b.prt.items() if e.sub.host in where})
            advs.update({i: moved(e.adv) for i, e in b.srt.items() if e.adv.host in where})
        if sorted(where.values()) != sorted(scot.routers()) or not set(where) <= set(self.brokers):
            raise ValueError("every position of the new overlay needs a surviving broker (a joining "
                             "router first copies its cluster's PRT)")
        self.scot = scot
        self.queues, self.order = {}, []
        old, self.brokers = self.brokers, {}
        for p, q in where.items():
            self.brokers[q] = old[p]
            self.post(old[p].rehome(scot, q, subs, advs))

    def publish(self, adv: Advertisement, event: Mapping[str, object]) -> tuple[list[str], int, set[int]]:
        """Route one event of `adv` hop by hop: (subscription ids delivered, in the order
        reached; inter-broker messages; clusters entered over an iLink)."""
        delivered: list[str] = []
        messages = 0
        entered: set[int] = set()
        stack: list[tuple[Router, Router | None]] = [(adv.host, None)]
        while stack:
            here, came = stack.pop()
            r = self.brokers[here].route(adv.id, event, came)
            delivered.extend(r.delivered)
            stack.extend((nxt, here) for nxt in r.alinks)
            for s in r.ilinks:
                entered.add(s.to[1])
                stack.append((s.to, here))
            messages += len(r.alinks) + len(r.ilinks)
        return delivered, messages, entered
