"""OctopiA's control-plane experiments (OctopiA section VIII, "Publisher Scalability" and
"Subscriber Scalability"; docs/papers.md, "OctopiA"): SCOT with OctopiA's control plane
(`core/scot_control.py`, the code the routers are to run) beside the paper's baseline,
PADRES with tree identifiers (TID) on the same SCOT left unclustered, in one
discrete-event simulation on the same workload.

The paper's setting: a SCOT of a 14-broker tree x 5 clusters (70 brokers); advertisements
from 100 to 500 (publisher scalability), then 100 advertisements and 500 to 5,000
subscriptions (subscriber scalability), publishers and subscribers on random brokers, 2%
selectivity. Here: publisher p advertises `Symbol = s(p mod 50) and Volume between 0 and
10^6`, a subscriber `Symbol = s and Volume > v` for a random one of the 50 symbols, so a
subscription overlaps exactly 2% of the advertisements, by the filters' own overlap test.

TID (the paper's [20]): an advertisement is flooded over the whole overlay; a broker keeps
the first copy (advertisement, last hop) in its SRT and forwards it on every other link;
every later copy is a duplicate, discarded after costing a message. A subscription is
matched against the SRT at every broker it reaches and follows each overlapping
advertisement's tree back to its root, bound to those trees' identifiers; each broker
keeps (subscription, last hop) in its PRT. An advertisement that arrives after a
subscription it overlaps draws the subscription toward its root, as PADRES does.

Model (what is simplified, said here): every broker is one FIFO server; handling a
message costs `base` plus `per_entry` for every table entry it is matched against (the
entries the handler scans: the SRT for a subscription, the PRT for an advertisement; a
TID duplicate costs `base`); every link adds `latency`. Advertisements arrive every
`adv_gap` s, subscriptions every `sub_gap` s, at random brokers. Figures, as the paper's:
the average SRT and PRT size over the brokers; inter-broker messages (IMs) per
advertisement and per subscription; advertisement delay (issue to the last broker that
stores it) and subscription delay (issue to the last message it causes being handled).
The binary-heap tree of `core/scot.py` (7 inner brokers, 7 edge) stands for the paper's
Fig. 10 tree (4 inner, 10 edge): the same size, a similar diameter.

Oracle: after the run, events of sampled advertisements are routed hop by hop through
both systems' tables and delivered exactly to the subscriptions that match them.

Run: python -m loadtest.octopia_control_sim [--subscribers 500,1000,2000,5000]
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import click
from rich.console import Console
from rich.table import Table

from echelon.contract.filters import Filter, Op, Predicate, overlaps
from echelon.contract.schema import Attribute, AttrType, Schema
from echelon.core.scot import Router, Scot
from echelon.core.scot_control import Advertisement, ControlPlane, Kind, Subscription

SCHEMA = Schema((Attribute("Symbol", AttrType.STRING), Attribute("Volume", AttrType.INT, 0, 1_000_000)))
SYMBOLS = 50  # 100 advertisements over 50 symbols: each subscription overlaps 2 (2%)

PAPER = {"srt_lower": 93.0, "adv_ims_fewer_x": 98.9, "adv_delay_lower": 63.5, "prt_higher": 33.0,
         "sub_ims_tid_fewer": 32.7, "sub_delay_lower": 33.0}


@dataclass
class Setting:
    t: int = 14
    regions: int = 5
    advertisements: tuple[int, ...] = (100, 200, 300, 400, 500)
    publishers: int = 100  # advertisements in place for the subscriber sweep
    subscribers: tuple[int, ...] = (500, 1000, 2000, 3000, 4000, 5000)
    base: float = 0.5e-3  # s to handle one message
    per_entry: float = 20e-6  # s per table entry matched against
    latency: float = 0.2e-3  # s per link
    adv_gap: float = 0.05  # s between advertisements
    sub_gap: float = 0.01  # s between subscriptions
    seed: int = 1


def symbol(i: int) -> str:
    return f"S{i % SYMBOLS:03d}"


def advertisement(p: int, host: Router) -> Advertisement:
    f = Filter((Predicate("Symbol", Op.EQ, symbol(p)), Predicate("Volume", Op.BETWEEN, 0, 1_000_000)))
    return Advertisement(f"a{p}", f, host)


def subscription(i: int, rng: random.Random, host: Router) -> Subscription:
    f = Filter((Predicate("Symbol", Op.EQ, symbol(rng.randrange(SYMBOLS))),
                Predicate("Volume", Op.GT, rng.randrange(0, 1_000_000))))
    return Subscription(f"s{i}", f, host)


def cached_overlap() -> Callable[[Advertisement, Subscription], bool]:
    memo: dict[tuple[str, str], bool] = {}

    def overlap(a: Advertisement, s: Subscription) -> bool:
        key = (a.id, s.id)
        if key not in memo:
            memo[key] = overlaps(a.filter, s.filter, SCHEMA)
        return memo[key]

    return overlap


# -- the TID baseline ------------------------------------------------------------------

@dataclass(frozen=True)
class TidMessage:
    kind: Kind  # ADV or SUB
    src: Router
    dst: Router
    adv: Advertisement | None = None
    sub: Subscription | None = None
    tids: tuple[str, ...] = ()  # SUB: the advertisement trees it follows


@dataclass
class TidBroker:
    scot: Scot
    here: Router
    overlap: Callable[[Advertisement, Subscription], bool]
    srt: dict[str, tuple[Advertisement, Router | None]] = field(default_factory=dict)
    prt: dict[tuple[str, Router | None], dict[str, Subscription]] = field(default_factory=dict)  # (sub, hop) -> tids
    subs: dict[str, Subscription] = field(default_factory=dict)
    duplicates: int = 0
    scanned: int = 0

    def neighbours(self) -> list[Router]:
        return self.scot.alink(*self.here) + self.scot.ilinks(*self.here)

    def advertise(self, adv: Advertisement) -> list[TidMessage]:
        self.scanned = 0
        return self._adv(adv, None)

    def subscribe(self, sub: Subscription) -> list[TidMessage]:
        self.scanned = len(self.srt)
        tids = tuple(a for a, (adv, _) in self.srt.items() if self.overlap(adv, sub))
        return self._sub(sub, None, tids)

    def handle(self, m: TidMessage) -> list[TidMessage]:
        self.scanned = 0
        if m.kind is Kind.ADV:
            if m.adv.id in self.srt:
                self.duplicates += 1
                return []
            return self._adv(m.adv, m.src)
        self.scanned = len(self.srt)  # matched against the SRT at every hop
        return self._sub(m.sub, m.src, m.tids)

    def _adv(self, adv: Advertisement, came: Router | None) -> list[TidMessage]:
        self.srt[adv.id] = (adv, came)
        out = [TidMessage(Kind.ADV, self.here, r, adv=adv) for r in self.neighbours() if r != came]
        self.scanned += len(self.prt)
        wanted = {}
        for (sid, _), tids in self.prt.items():  # subscriptions already here join the new tree
            if self.overlap(adv, self.subs[sid]):
                tids[adv.id] = self.subs[sid]
                wanted[sid] = self.subs[sid]
        if came is not None:
            out += [TidMessage(Kind.SUB, self.here, came, sub=s, tids=(adv.id,)) for s in wanted.values()]
        return out

    def _sub(self, sub: Subscription, came: Router | None, tids: tuple[str, ...]) -> list[TidMessage]:
        self.subs[sub.id] = sub
        self.prt.setdefault((sub.id, came), {}).update({t: sub for t in tids})
        onward: dict[Router, list[str]] = {}
        for t in tids:
            adv, hop = self.srt[t]
            if hop is not None:
                onward.setdefault(hop, []).append(t)
        return [TidMessage(Kind.SUB, self.here, r, sub=sub, tids=tuple(ts)) for r, ts in onward.items()]

    def route(self, tid: str, event) -> tuple[list[str], list[Router]]:
        delivered, nxt = [], set()
        for (sid, hop), tids in self.prt.items():
            if tid in tids and tids[tid].filter.matches(event):
                (delivered.append(sid) if hop is None else nxt.add(hop))
        return delivered, sorted(nxt)


class TidPlane:
    def __init__(self, scot: Scot, overlap):
        self.scot = scot
        self.brokers = {r: TidBroker(scot, r, overlap) for r in scot.routers()}

    def publish(self, adv: Advertisement, event) -> tuple[list[str], int]:
        delivered, messages, stack = [], 0, [adv.host]
        while stack:
            d, nxt = self.brokers[stack.pop()].route(adv.id, event)
            delivered += d
            messages += len(nxt)
            stack += nxt
        return delivered, messages


# -- the timed run ----------------------------------------------------------------------

@dataclass
class Op_:
    at: float
    kind: str  # "adv" or "sub"
    item: Advertisement | Subscription


@dataclass
class Tally:
    """Per issued advertisement or subscription: IMs and the delays measured."""

    ims: dict[str, int] = field(default_factory=dict)
    issued: dict[str, float] = field(default_factory=dict)
    done: dict[str, float] = field(default_factory=dict)  # last broker storing (adv) / last message handled (sub)

    def delay(self, ids) -> float:
        ds = [self.done[i] - self.issued[i] for i in ids]
        return sum(ds) / len(ds) if ds else 0.0

    def per(self, ids) -> float:
        return sum(self.ims.get(i, 0) for i in ids) / len(ids) if ids else 0.0


def run(s: Setting, system: str, ops: list[Op_], overlap) -> tuple[object, Tally]:
    """Issue `ops` into a fresh `system` ("octopia" or "tid") and run until quiet."""
    scot = Scot.uniform(s.t, s.regions)
    plane = ControlPlane(scot, overlap) if system == "octopia" else TidPlane(scot, overlap)
    brokers = plane.brokers
    free = {r: 0.0 for r in brokers}
    tally = Tally()
    heap: list = []
    seq = 0
    for op in ops:
        heapq.heappush(heap, (op.at, seq, op, op.item.id))
        seq += 1
    while heap:
        at, _, m, key = heapq.heappop(heap)
        if isinstance(m, Op_):
            b = brokers[m.item.host]
            tally.issued[key] = at
            start = max(at, free[b.here])
            out = b.advertise(m.item) if m.kind == "adv" else b.subscribe(m.item)
        else:
            b = brokers[m.dst]
            start = max(at, free[b.here])
            dup = getattr(b, "duplicates", 0)
            out = b.handle(m)
            if getattr(b, "duplicates", 0) != dup:  # a TID duplicate: a lookup, discarded, stores nothing
                free[b.here] = start + s.base
                continue
        end = start + s.base + s.per_entry * b.scanned
        free[b.here] = end
        # Each message is charged to the advertisement or subscription whose call caused it.
        tally.done[key] = max(tally.done.get(key, 0.0), end)
        tally.ims[key] = tally.ims.get(key, 0) + len(out)
        for x in out:
            heapq.heappush(heap, (end + s.latency, seq, x, key))
            seq += 1
    return plane, tally


def srt_size(plane) -> float:
    return sum(len(b.srt) for b in plane.brokers.values()) / len(plane.brokers)


def prt_size(plane) -> float:
    return sum(len(b.prt) for b in plane.brokers.values()) / len(plane.brokers)


def publisher_sweep(s: Setting) -> list[dict]:
    rows = []
    for n in s.advertisements:
        rng = random.Random(s.seed)
        scot = Scot.uniform(s.t, s.regions)
        routers = scot.routers()
        ops = [Op_(k * s.adv_gap, "adv", advertisement(k, rng.choice(routers))) for k in range(n)]
        row = {"advertisements": n}
        for system in ("tid", "octopia"):
            plane, tally = run(s, system, ops, cached_overlap())
            ids = [o.item.id for o in ops]
            row[system] = {"srt": srt_size(plane), "ims": tally.per(ids), "delay": tally.delay(ids)}
        rows.append(row)
    return rows


def subscriber_workload(s: Setting, n: int) -> tuple[list[Op_], list[Advertisement]]:
    rng = random.Random(s.seed)
    routers = Scot.uniform(s.t, s.regions).routers()
    advs = [advertisement(p, rng.choice(routers)) for p in range(s.publishers)]
    ops = [Op_(k * s.adv_gap, "adv", a) for k, a in enumerate(advs)]
    t0 = len(advs) * s.adv_gap + 1.0
    ops += [Op_(t0 + k * s.sub_gap, "sub", subscription(k, rng, rng.choice(routers))) for k in range(n)]
    return ops, advs


def subscriber_sweep(s: Setting, check_events: int = 0) -> tuple[list[dict], dict]:
    rows, oracle = [], {}
    for n in s.subscribers:
        ops, advs = subscriber_workload(s, n)
        subs = [o.item for o in ops if o.kind == "sub"]
        row = {"subscribers": n}
        planes = {}
        for system in ("tid", "octopia"):
            plane, tally = run(s, system, ops, cached_overlap())
            planes[system] = plane
            ids = [x.id for x in subs]
            row[system] = {"prt": prt_size(plane), "ims": tally.per(ids), "delay": tally.delay(ids)}
        rows.append(row)
        if check_events and n == s.subscribers[-1]:
            oracle = check(planes, advs, subs, check_events, s.seed)
    return rows, oracle


def check(planes, advs, subs, events: int, seed: int) -> dict:
    """Route `events` events of random advertisements through both systems' tables:
    deliveries against brute force (every subscription's filter on the event)."""
    rng = random.Random(seed + 1)
    out = {"events": 0, "deliveries": 0, "octopia_exact": True, "tid_exact": True, "octopia_ims": 0, "tid_ims": 0}
    for _ in range(events):
        adv = rng.choice(advs)
        event = {"Symbol": adv.filter.predicates[0].value, "Volume": rng.randrange(0, 1_000_001)}
        expect = sorted(x.id for x in subs if x.filter.matches(event))
        got_o, ims_o, _ = planes["octopia"].publish(adv, event)
        got_t, ims_t = planes["tid"].publish(adv, event)
        out["events"] += 1
        out["deliveries"] += len(expect)
        out["octopia_exact"] &= sorted(got_o) == expect
        out["tid_exact"] &= sorted(got_t) == expect
        out["octopia_ims"] += ims_o
        out["tid_ims"] += ims_t
    return out


def pct_lower(octopia: float, tid: float) -> float:
    return 100 * (1 - octopia / tid) if tid else 0.0


def tables(pub: list[dict], sub: list[dict], s: Setting) -> list[Table]:
    t1 = Table(title="Publisher scalability: OctopiA (SCOT clusters) vs TID (PADRES, unclustered SCOT); "
                     "paper's figures in brackets")
    for col in ("advertisements", "SRT TID", "SRT OctopiA", "SRT lower by", "IMs/adv TID", "IMs/adv OctopiA",
                "OctopiA fewer", "adv delay TID ms", "adv delay OctopiA ms", "adv delay lower by"):
        t1.add_column(col, justify="right")
    for r in pub:
        o, t = r["octopia"], r["tid"]
        t1.add_row(str(r["advertisements"]), f"{t['srt']:.1f}", f"{o['srt']:.1f}",
                   f"{pct_lower(o['srt'], t['srt']):.1f}% [{PAPER['srt_lower']}%]",
                   f"{t['ims']:.1f}", f"{o['ims']:.2f}", f"{t['ims'] / o['ims']:.1f}x [{PAPER['adv_ims_fewer_x']}x]",
                   f"{1e3 * t['delay']:.2f}", f"{1e3 * o['delay']:.2f}",
                   f"{pct_lower(o['delay'], t['delay']):.1f}% [{PAPER['adv_delay_lower']}%]")
    t2 = Table(title=f"Subscriber scalability, {s.publishers} advertisements: OctopiA vs TID; paper's figures "
                     "in brackets")
    for col in ("subscribers", "PRT TID", "PRT OctopiA", "OctopiA PRT higher by", "IMs/sub TID", "IMs/sub OctopiA",
                "TID IMs fewer by", "sub delay TID ms", "sub delay OctopiA ms", "sub delay lower by"):
        t2.add_column(col, justify="right")
    for r in sub:
        o, t = r["octopia"], r["tid"]
        t2.add_row(str(r["subscribers"]), f"{t['prt']:.1f}", f"{o['prt']:.1f}",
                   f"{100 * (o['prt'] / t['prt'] - 1):.1f}% [{PAPER['prt_higher']}%]",
                   f"{t['ims']:.2f}", f"{o['ims']:.2f}",
                   f"{pct_lower(t['ims'], o['ims']):.1f}% [{PAPER['sub_ims_tid_fewer']}%]",
                   f"{1e3 * t['delay']:.2f}", f"{1e3 * o['delay']:.2f}",
                   f"{pct_lower(o['delay'], t['delay']):.1f}% [{PAPER['sub_delay_lower']}%]")
    return [t1, t2]


def sensitivity(s: Setting, per_entry_us: tuple[float, ...], subscribers: int = 1000) -> Table:
    """The two delay figures as the cost per table entry varies (the sizes and message
    counts do not depend on the cost model)."""
    t = Table(title=f"Delays against the cost per table entry ({1e3 * s.base} ms per message, "
                    f"{s.publishers} advertisements, {subscribers} subscriptions)")
    for col in ("us per entry", "adv delay TID ms", "adv delay OctopiA ms", "lower by", "sub delay TID ms",
                "sub delay OctopiA ms", "lower by"):
        t.add_column(col, justify="right")
    for us in per_entry_us:
        c = Setting(**{**s.__dict__, "per_entry": us / 1e6, "subscribers": (subscribers,)})
        ops, _ = subscriber_workload(c, subscribers)
        adv_ids = [o.item.id for o in ops if o.kind == "adv"]
        sub_ids = [o.item.id for o in ops if o.kind == "sub"]
        d = {}
        for system in ("tid", "octopia"):
            _, tally = run(c, system, ops, cached_overlap())
            d[system] = (tally.delay(adv_ids), tally.delay(sub_ids))
        t.add_row(f"{us:g}", f"{1e3 * d['tid'][0]:.2f}", f"{1e3 * d['octopia'][0]:.2f}",
                  f"{pct_lower(d['octopia'][0], d['tid'][0]):.1f}% [{PAPER['adv_delay_lower']}%]",
                  f"{1e3 * d['tid'][1]:.2f}", f"{1e3 * d['octopia'][1]:.2f}",
                  f"{pct_lower(d['octopia'][1], d['tid'][1]):.1f}% [{PAPER['sub_delay_lower']}%]")
    return t


def parse_ints(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r}: comma-separated whole numbers") from None
    if not out or any(x < 1 for x in out):
        raise click.BadParameter(f"{text!r}: at least one, each >= 1")
    return out


@click.command()
@click.option("--advertisements", default="100,200,300,400,500", show_default=True)
@click.option("--subscribers", default="500,1000,2000,3000,4000,5000", show_default=True)
@click.option("--base-ms", default=0.5, type=click.FloatRange(0.0, 100.0), show_default=True,
              help="Handling one message, ms.")
@click.option("--per-entry-us", default=20.0, type=click.FloatRange(0.0, 1e4), show_default=True,
              help="Matching against one table entry, us.")
@click.option("--latency-ms", default=0.2, type=click.FloatRange(0.0, 1e3), show_default=True)
@click.option("--check-events", default=200, type=click.IntRange(0, 100_000), show_default=True,
              help="Events routed through both systems' tables against brute force.")
@click.option("--sensitivity", "costs_text", default="", show_default=True,
              help="Comma-separated us per entry: also print both delays for each (e.g. 0,5,20,50).")
@click.option("--seed", default=1, show_default=True)
def main(advertisements, subscribers, base_ms, per_entry_us, latency_ms, check_events, costs_text, seed) -> None:
    """The control-plane figures of OctopiA section VIII beside the paper's."""
    try:
        costs = tuple(float(x) for x in costs_text.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"{costs_text!r}: comma-separated numbers", param_hint="--sensitivity") from None
    if any(not c >= 0 for c in costs):
        raise click.BadParameter(f"{costs_text!r}: costs >= 0", param_hint="--sensitivity")
    s = Setting(advertisements=parse_ints(advertisements), subscribers=parse_ints(subscribers),
                base=base_ms / 1e3, per_entry=per_entry_us / 1e6, latency=latency_ms / 1e3, seed=seed)
    pub = publisher_sweep(s)
    sub, oracle = subscriber_sweep(s, check_events)
    console = Console(width=220)
    for t in tables(pub, sub, s):
        console.print(t)
    console.print(f"cost model: {base_ms} ms per message + {per_entry_us} us per table entry matched, "
                  f"{latency_ms} ms per link; {s.t} x {s.regions} brokers")
    if costs:
        console.print(sensitivity(s, costs))
    if oracle:
        console.print(f"oracle: {oracle['events']} events, {oracle['deliveries']} deliveries; OctopiA exact: "
                      f"{oracle['octopia_exact']}, TID exact: {oracle['tid_exact']}; notification IMs "
                      f"OctopiA {oracle['octopia_ims']}, TID {oracle['tid_ims']}")
        if not (oracle["octopia_exact"] and oracle["tid_exact"]):
            raise SystemExit("a delivery set differs from brute force")


if __name__ == "__main__":
    main()
