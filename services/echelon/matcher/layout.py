"""The zones a matcher tier uses for one topic, and one layout's placement and indexes.

Every matcher computes the same zones from the same inputs (its view of the alive
matchers, the topics, the adopted routing plan), so no coordinator is needed:

- The plan names zones for the topic: those zones. Members (owner, replicas) the view
  does not hold alive are left out; a zone left with none goes to the alive matcher at
  crc32("topic/zone") mod M among the M alive matchers sorted by id, the "new owner"
  that recovers it from the mirrors (Meghdoot 4.3).
- Otherwise, a topic with a schema gets the default plan: its space cut into M slices of
  equal width along the lowest dimension that can be cut (dimension 0, the l axis of
  its first attribute, unless that attribute's domain is one value), slice k owned by
  matcher (k + crc32(topic)) mod M, so topics start on different matchers. It is a
  bootstrap: correct, but balanced only if subscriptions spread along that axis; the
  routing job (or anyone through Control.PushPlan) replaces it with zones split by
  subscription load (core.can.split).
- A schemaless topic has a 0-dimensional space: one match-all zone, "all", held by the
  matcher at crc32(topic) mod M and the next one as its replica, each with a CDM index
  (which needs no schema).

Holders of a subscription (its targets): the members of the zone holding its point and
of the zone holding its mirror (core.can). When those are the same matchers (one
matcher owning several zones of a plan, or the single schemaless zone), the next alive
matcher after the primary zone's owner, in sorted order, holds one more copy, so losing
any one matcher never loses a subscription.

A layout is named by a key: a digest of the topic, its schema, the zones with their
members, and the alive matchers with their process lifetimes (runtime.member.lifetime:
a restarted matcher is empty, so it must be refilled: a new layout). Not their SWIM
incarnations: a matcher that refutes a suspicion (a peer call to it timed out on a busy
machine, say) keeps every copy it holds, and a new layout for it would restart the
handoff of the whole tier each time, so that a loaded tier never settles.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from operator import methodcaller
from typing import Iterable, Mapping, Sequence

import numpy as np

from echelon.core.can import Zone, ZoneMap
from echelon.core.cdm import CountingIndex, Entry
from echelon.contract.filters import Filter
from echelon.contract.schema import AttrType, Schema
from echelon.core.space import Point, Space, value_key
from echelon.contract.wire import value_field


STRING_KEYS = 65536  # string values whose keys a layout remembers for routing
SMALL = 8  # batches up to this size are routed in Python: numpy's cost per call is larger then


@dataclass(frozen=True, eq=False)
class Copy:
    """One subscription as matchers hold it; `wire` is its protobuf form, kept for forwarding."""

    id: str
    agent: str
    topic: str
    version: int
    filter: Filter
    wire: object = None


def _crc(s: str) -> int:
    return zlib.crc32(s.encode())


def default_zones(topic: str, space: Space, matchers: Sequence[str]) -> tuple[list[Zone], str]:
    """The zones of a topic no plan names: (zones, source); see the module doc."""
    m, h = sorted(matchers), _crc(topic)
    if not space.dims:
        replicas = (m[(h + 1) % len(m)],) if len(m) > 1 else ()
        return [Zone("all", (), (), m[h % len(m)], replicas)], "schemaless"
    for d in range(space.dims):
        lo, hi = space.low[d], space.high[d]
        cuts = sorted({lo + (hi - lo) * k / len(m) for k in range(1, len(m))} - {lo, hi})
        if hi > lo:
            bounds = [lo, *(c for c in cuts if lo < c < hi), hi]
            zones = []
            for k in range(len(bounds) - 1):
                low = space.low[:d] + (bounds[k],) + space.low[d + 1:]
                high = space.high[:d] + (bounds[k + 1],) + space.high[d + 1:]
                zones.append(Zone(f"d{k}", low, high, m[(k + h) % len(m)]))
            return zones, "default"
    return [Zone("d0", space.low, space.high, m[h % len(m)])], "default"  # every domain is one value


def effective_zones(topic: str, space: Space, plan_zones: Sequence[Zone], matchers: Sequence[str]) -> list[Zone]:
    """The plan's zones with members that are not alive left out (and replaced when none is)."""
    alive, order = set(matchers), sorted(matchers)
    out = []
    for z in plan_zones:
        members = [p for p in z.members if p in alive]
        if not members:
            members = [order[_crc(f"{topic}/{z.id}") % len(order)]]
        out.append(Zone(z.id, z.low, z.high, members[0], tuple(members[1:])))
    return out


def layout_key(topic: str, schema: Schema, zones: Iterable[Zone], matchers: Mapping[str, int]) -> str:
    text = repr((topic, schema, [(z.id, z.low, z.high, z.members) for z in zones], sorted(matchers.items())))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


class Layout:
    """One topic's zones at one matcher: where each copy it holds belongs, and a counting
    index (CDM) per zone this matcher is a member of, over the zone's primary copies.

    Placement follows `core.can.ZoneMap` (section 3.3: the zone holding the point; 4.3:
    the mirror at the zone holding the reflection), done for a batch in one numpy pass;
    only a reflection that stays in its primary zone goes through `ZoneMap.add`, which
    moves it out. `ready` is set once every copy held at adoption is placed (tier.py fills
    a new layout in slices, so a million copies never stall the event loop)."""

    def __init__(self, topic: str, schema: Schema, zones: Sequence[Zone], me: str, matchers: Mapping[str, int],
                 source: str, space: Space | None = None):
        self.topic, self.me, self.source, self.schema = topic, me, source, schema
        self.space = space if space is not None else Space.of(schema)
        self.key = layout_key(topic, schema, zones, matchers)
        self.lifetimes = dict(matchers)
        self.order = sorted(matchers)
        self.map = ZoneMap(self.space, zones)  # geometry only: it holds no subscription
        self.zones = list(zones)
        self.members = {z.id: z.members for z in zones}
        self.others = sorted({m for z in zones for m in z.members} - {me})  # the other matchers it routes to
        self.index = {z.id: CountingIndex() for z in zones if me in z.members}
        self.primary: dict[str, str] = {}
        self.mirror: dict[str, str] = {}
        self.ready = False
        # The entry's promises (empty.py): zone -> expiry, and zone -> when last revoked.
        self.promised: dict[str, float] = {}
        self.revoked: dict[str, float] = {}
        self._extra: dict[tuple[str, str], tuple[str, ...]] = {}
        self._ids = [z.id for z in zones]
        self._lo = np.array([z.low for z in zones], dtype=np.float64).reshape(len(zones), -1)
        self._hi = np.array([z.high for z in zones], dtype=np.float64).reshape(len(zones), -1)
        low, top = np.asarray(self.space.low), np.asarray(self.space.high)
        # Only dimensions some zone cuts tell zones apart.
        self._cols = np.flatnonzero(np.any((self._lo > low) | (self._hi < top), axis=0))
        cut = sorted({int(c) // 2 for c in self._cols})  # the attributes of those dimensions
        self._route_attrs = [(i, self.space.attributes[i]) for i in cut]
        self._route_cols = np.array([c for i in cut for c in (2 * i, 2 * i + 1)], dtype=np.int64)
        cols, low, top = self._route_cols, self.space.low, self.space.high
        # For small batches: each zone's (lo, hi, top) per routed column, as Python floats.
        self._route_zones = [(z, list(zip(self._lo[j, cols].tolist(), self._hi[j, cols].tolist(),
                                          [float(top[c]) for c in cols])))
                             for j, z in enumerate(self._ids)]
        self._route_ends = [(float(low[2 * i]), float(top[2 * i + 1])) for i in cut]
        self._string_keys: dict[str, float] = {}
        self._fields = {a.name: value_field(a) for a in schema.attributes}
        # One routed string attribute (the default plan's, a plan cut along a symbol): the
        # zones each value's region meets, kept as a row of the (events, zones) table.
        one = len(self._route_attrs) == 1 and self._route_attrs[0][1].type is AttrType.STRING
        self._met: dict[str, bytes] | None = {} if one else None

    def reads(self) -> dict[str, str]:
        """The event attributes this layout's routing and this matcher's indexes use (all
        an entry or holder reads of an event), each with its Value field (wire.attributes_read)."""
        names = {attr.name for _, attr in self._route_attrs}
        for index in self.index.values():
            names.update(index.attributes())
        fields = self._fields
        return {name: fields.get(name) or value_field(None) for name in names}

    def placed(self, sid: str) -> bool:
        return sid in self.primary

    def _locate(self, points: np.ndarray) -> np.ndarray:
        """The zone (position) holding each point: lo <= p < hi, closed at the domain's top."""
        c = self._cols
        lo, hi, top = self._lo[None, :, c], self._hi[None, :, c], np.asarray(self.space.high)[c]
        step = max(1, (1 << 22) // max(1, self._lo[:, c].size))
        out = []
        for i in range(0, len(points), step):
            p = points[i:i + step, None, c]
            inside = np.all((lo <= p) & ((p < hi) | ((p == hi) & (hi == top))), axis=2)
            if not inside.any(axis=1).all():
                raise ValueError("a point lies outside the space")
            out.append(np.argmax(inside, axis=1))
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def primaries(self, points: Sequence[Point]) -> set[str]:
        """The zones holding these subscription points (where `add` indexes them)."""
        if len(self._ids) == 1 or not points:
            return {self._ids[0]} if points else set()
        pts = np.array(points, dtype=np.float64).reshape(len(points), -1)
        return {self._ids[j] for j in set(self._locate(pts).tolist())}

    def add(self, copies: Iterable[Copy], points: Mapping[str, Point]) -> None:
        """Place copies (primary and mirror zone) and index the primaries of this matcher's zones."""
        copies = list(copies)
        for c in copies:
            if c.id in self.primary:
                self.remove(c.id)
        if not copies:
            return
        pts = np.array([points[c.id] for c in copies], dtype=np.float64).reshape(len(copies), -1)
        if len(self._ids) == 1:
            prim = mirr = np.zeros(len(copies), dtype=np.int64)
        else:
            prim = self._locate(pts)
            mirr = self._locate(pts.reshape(len(copies), -1, 2)[:, :, ::-1].reshape(len(copies), -1))
            for j in np.flatnonzero(mirr == prim):  # the reflection stays in the zone: moved out
                sid = copies[j].id
                _, m = self.map.add(sid, points[sid])
                self.map.remove(sid)
                mirr[j] = self._ids.index(m)
        by_zone: dict[str, list[Entry]] = {}
        for c, p, m in zip(copies, prim.tolist(), mirr.tolist()):
            zone = self.primary[c.id] = self._ids[p]
            self.mirror[c.id] = self._ids[m]
            if zone in self.index:
                by_zone.setdefault(zone, []).append(Entry(c.id, c.agent, c.filter))
        for zone, subs in by_zone.items():
            self.index[zone].insert_many(subs)

    def remove(self, sid: str) -> None:
        zone = self.primary.pop(sid, None)
        self.mirror.pop(sid, None)
        if zone in self.index:
            self.index[zone].delete(sid)

    def targets(self, sid: str) -> tuple[str, ...]:
        """The matchers that must hold `sid` in this layout (see the module doc)."""
        primary, mirror = self.primary[sid], self.mirror[sid]
        pair = (primary, mirror)
        out = self._extra.get(pair)
        if out is None:
            p, m = self.members[primary], self.members[mirror]
            out = tuple(dict.fromkeys((*p, *m)))
            if set(m) <= set(p):
                i = self.order.index(p[0]) if p[0] in self.order else 0
                nxt = [x for x in self.order[i + 1:] + self.order[:i] if x not in p]
                out += tuple(nxt[:1])
            self._extra[pair] = out
        return out

    def holds(self, sid: str) -> bool:
        return self.me in self.targets(sid)

    def zones_of(self, sid: str) -> tuple[str, str]:
        return self.primary[sid], self.mirror[sid]

    def route(self, events: Sequence[Mapping[str, object]]) -> dict[str, list[int]]:
        """Section 3.4: for each zone, the events whose affected region it intersects.

        `ZoneMap.affected` for a whole batch at once: the affected region of event point
        (c1, c1, ..., cn, cn) is [L1, c1] x [c1, H1] x ...; a zone [lo, hi) (closed at the
        top of the domain) meets it iff lo <= b and (a < hi, or a == hi == top). Only the
        attributes some zone cuts are keyed: on the others every zone meets every region."""
        if len(self._ids) == 1 or not events:
            return {self._ids[0]: list(range(len(events)))} if events else {}
        if len(events) <= SMALL:
            return self._route_small(events)
        return self._groups(self._hit(events) if self._met is None else self._hit_kept(events))

    def _hit(self, events: Sequence[Mapping[str, object]]) -> np.ndarray:
        """(events, zones): does zone j meet event i's affected region (see `route`)."""
        ep = np.empty((len(events), 2 * len(self._route_attrs)), dtype=np.float64)
        for j, (i, attr) in enumerate(self._route_attrs):
            ep[:, 2 * j], ep[:, 2 * j + 1] = self._keys(i, attr, list(map(methodcaller("get", attr.name), events)))
        cols = self._route_cols
        low, top = np.asarray(self.space.low)[cols], np.asarray(self.space.high)[cols]
        a, b = np.empty_like(ep), np.empty_like(ep)
        a[:, 0::2], a[:, 1::2] = low[0::2], ep[:, 0::2]
        b[:, 0::2], b[:, 1::2] = ep[:, 1::2], top[1::2]
        lo, hi = self._lo[None, :, cols], self._hi[None, :, cols]
        step = max(1, (1 << 22) // max(1, lo.size))  # events per pass: bounded temporaries
        return np.concatenate([np.all((lo <= b[i:i + step, None]) & ((a[i:i + step, None] < hi) | (
            (a[i:i + step, None] == hi) & (hi == top))), axis=2) for i in range(0, len(ep), step)])

    def _hit_kept(self, events: Sequence[Mapping[str, object]]) -> np.ndarray:
        """`_hit` from the rows kept per string value (looked up in C); only values not
        kept (new strings, values of another kind) go through `_hit`."""
        met = self._met
        values = list(map(methodcaller("get", self._route_attrs[0][1].name), events))
        rows = list(map(met.get, values))  # only strings are kept, so other values miss
        if None in rows:
            if len(met) > STRING_KEYS:
                met.clear()
            missed = [n for n, row in enumerate(rows) if row is None]
            for n, row in zip(missed, self._hit([events[n] for n in missed])):
                rows[n] = row.tobytes()
                if type(values[n]) is str:
                    met[values[n]] = rows[n]
        return np.frombuffer(b"".join(rows), dtype=bool).reshape(len(events), len(self._ids))

    def _groups(self, hit: np.ndarray) -> dict[str, list[int]]:
        """Per zone met, its events' positions."""
        out: dict[str, list[int]] = {}
        if hit.all(axis=0).sum() == hit.any(axis=0).sum():  # each zone met by all or none: one list each
            return {self._ids[j]: list(range(len(hit))) for j in np.flatnonzero(hit[0])}
        for j in np.flatnonzero(hit.any(axis=0)):
            out[self._ids[j]] = np.flatnonzero(hit[:, j]).tolist()
        return out

    def _route_small(self, events: Sequence[Mapping[str, object]]) -> dict[str, list[int]]:
        """`route` in Python, the same comparisons on the same float64 values."""
        keys = [self._keys(i, attr, list(map(methodcaller("get", attr.name), events))) for i, attr in self._route_attrs]
        regions = []  # per event, (a, b) per routed column, as in `route`
        for n in range(len(events)):
            ab = []
            for (c_lo, c_hi), (low, top) in zip(keys, self._route_ends):
                ab += [(low, float(c_hi[n])), (float(c_lo[n]), top)]
            regions.append(ab)
        out: dict[str, list[int]] = {}
        for zone, bounds in self._route_zones:
            hit = [n for n, ab in enumerate(regions)
                   if all(lo <= b and (a < hi or (a == hi and hi == top)) for (a, b), (lo, hi, top) in zip(ab, bounds))]
            if hit:
                out[zone] = hit
        return out

    def _keys(self, i: int, attr, values: list) -> tuple[list[float], list[float]]:
        """Attribute i's (c, c) pair of each event point; (L_i, H_i) when unset or unusable.
        String keys are remembered (a topic's symbols repeat; bounded)."""
        low, high = self.space.low[2 * i], self.space.high[2 * i + 1]
        known = self._string_keys
        if len(known) > STRING_KEYS:
            known.clear()
        keys = list(map(known.get, values))  # in C; only strings are known, so other values miss
        if None in keys:
            for n, k in enumerate(keys):
                v = values[n]
                if k is None and v is not None:
                    k = keys[n] = value_key(attr, v)
                    if type(v) is str:
                        known[v] = k
        if None not in keys:
            return keys, keys
        return [low if k is None else k for k in keys], [high if k is None else k for k in keys]
