"""A router's side of OctopiA's control plane between regions (core/cib.py for the rules;
router.proto `Control`; docs/event-path.md, "Regions that stand alone").

- In: each agent of this router's region sends its subscriptions (SUB / UNSUB) and its
  advertisements (ADV / UNADV), its full state first: the region's subgroup
  (`Subgroups`) and the region's advertisements. Each router of another region that has
  this router as its secondary (OctopiA's region of the publisher, `core/scot.py`
  `ilinks`) sends its region's advertisements (ADV / UNADV): the SRT. Each secondary router
  of this one answers this region's advertisements with its region's overlapping groups
  (CIB_SET / CIB_CLEAR, its full state first): `Summaries`.
- Out, to the secondary routers and to the routers whose secondary this router is
  (`dataplane.control.ControlLinks`, one stream each, the full state first): this region's
  advertisements (ADV / UNADV), and to each the groups of this region that overlap the
  advertisements it sent here (CIB_SET when a group starts to overlap one, CIB_CLEAR when
  it stops; each names the advertisements it answers), so a region that publishes
  nothing a group overlaps is sent nothing of it.
- The summary is *complete* while every live agent of the region has sent its full state
  to this router (an agent that joins is heard a moment after it sees the router: the
  summary is incomplete meanwhile, and complete again, each time sent in full). While
  it is incomplete the receivers send this region every event (core/cib.py).

Every message is validated whole before anything of it is applied: INVALID_ARGUMENT for a
malformed one, PERMISSION_DENIED under mTLS when the certificate does not name the sender
with the role its kind needs (an agent for SUB / UNSUB and ADV / UNADV of its own region,
a router for CIB_SET / CIB_CLEAR and ADV / UNADV of another region).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

import grpc

from echelon.contract.errors import InvalidArgument, PermissionDenied
from echelon.contract.transport import require_member
from echelon.contract.wire import filter_from_pb, filter_from_request
from echelon.contract.filters import Expression
from echelon.core.cib import Key, Subgroups, Summaries, answer
from echelon.dataplane.control import ControlLinks, chunks
from echelon.v1 import common_pb2 as pb
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import router_pb2 as opb

log = logging.getLogger("echelon.router.control")

_AGENT_KINDS = (opb.CONTROL_KIND_SUB, opb.CONTROL_KIND_UNSUB)
_ROUTER_KINDS = (opb.CONTROL_KIND_CIB_SET, opb.CONTROL_KIND_CIB_CLEAR)
_ADV_KINDS = (opb.CONTROL_KIND_ADV, opb.CONTROL_KIND_UNADV)


def key_of(topic: str, f: pb.Filter) -> Key:
    return topic, f.SerializeToString(deterministic=True)


def subgroup_of(k: Key) -> opb.Subgroup:
    return opb.Subgroup(topic=k[0], filter=pb.Filter.FromString(k[1]))


def advertisement_of(k: Key) -> opb.Advertisement:
    return opb.Advertisement(topic=k[0], bounds=pb.Filter.FromString(k[1]))


def expression_of(k: Key) -> Expression:
    return filter_from_pb(pb.Filter.FromString(k[1]))


class Stream:
    """One incoming Control stream: who sends it, and a full state still arriving in parts."""

    def __init__(self) -> None:
        self.sender: str | None = None
        self.role: str | None = None
        self.region = ""
        self.staged: dict[int, tuple[dict, dict]] = {}  # kind -> a full state's (entries, advertisements) so far


class RouterControl:
    def __init__(self, me: str, region: str, membership: Callable[[], object],
                 dial: Callable[[str], grpc.aio.Channel], overlay: Callable[[], object] | None = None,
                 mode: str = "scot"):
        """`overlay()`: the router's `router.overlay.Overlay` (positions in the SCOT); without
        it (a test of the barrier alone) there are no links to other regions. `mode`: "scot",
        or "tid", the PADRES baseline of OctopiA's experiments (module doc of `peers`)."""
        if mode not in ("scot", "tid"):
            raise ValueError(f"control {mode!r}: scot or tid")
        self.me, self.region, self._membership, self._overlay, self.mode = me, region, membership, overlay, mode
        self.applied_ns = 0  # wall clock of the last control message applied (the experiments' delays)
        self.adv_applied_ns = 0  # the same, of the last ADV / UNADV
        self.subgroups = Subgroups()
        self.advertised = Subgroups()  # this region's advertisements, by agent (keyed by themselves)
        self.srt: dict[str, dict[Key, Expression]] = {}  # far router -> its region's advertisements
        self.sent: dict[str, set[Key]] = {}  # far router -> the groups its current stream was sent
        self._exprs: dict[Key, Expression] = {}  # a group's filter, decoded once
        self.summaries = Summaries(wire=True)  # `wants` reads an event's attributes as received
        self.waiting: set[str] | None = None  # agents the complete summary waits for (None: no view yet)
        self.heard: set[str] = set()  # agents whose full state arrived (maybe before this router's first view)
        self.complete = False
        self.current: dict[str, Stream] = {}  # sender -> its newest stream
        self.counts: Counter = Counter()  # control messages written, by kind name
        self.links = ControlLinks(dial, lambda pid: lambda: self._full(pid),
                                  lambda pid: lambda keys: self._delta(pid, keys), self.counts)

    @property
    def membership(self):
        return self._membership()

    def wants(self, region: str, topic: str, attributes) -> bool:
        """Region `region`'s bit of an event's CIV here (core/cib.py). TID's tables are
        measured, not routed by: each router there answers for its own subscribers only."""
        return self.mode == "tid" or self.summaries.wants(region, topic, attributes)

    # -- out ---------------------------------------------------------------------------

    def _expr(self, k: Key) -> Expression:
        e = self._exprs.get(k)
        if e is None:
            e = self._exprs[k] = expression_of(k)
        return e

    def _answer(self, pid: str, keys) -> set[Key]:
        """Of the groups `keys` still held, those overlapping `pid`'s advertisements."""
        count = self.subgroups.count
        return answer({k: self._expr(k) for k in keys if k in count}, self.srt.get(pid, {}))

    def _full(self, pid: str) -> list[opb.ControlMessage]:
        out = chunks(opb.CONTROL_KIND_ADV, self.me, self.region, "advertisements",
                     [advertisement_of(k) for k in self.advertised.groups()])
        groups = self._answer(pid, self.subgroups.groups())
        self.sent[pid] = groups
        cib = chunks(opb.CONTROL_KIND_CIB_SET, self.me, self.region, "subgroups",
                     [subgroup_of(k) for k in groups], complete=self.complete)
        cib[-1].advertisements.extend(advertisement_of(k) for k in self.srt.get(pid, {}))
        return out + cib

    def _delta(self, pid: str, keys: set) -> list[opb.ControlMessage]:
        """Keys marked: ("a", k) this region's advertisement k, ("g", k) its group k, ("s", k)
        `pid`'s advertisement k (added or withdrawn)."""
        ads = [k for t, k in keys if t == "a"]
        groups = {k for t, k in keys if t == "g"}
        srt_keys = [k for t, k in keys if t == "s"]
        srt = self.srt.get(pid, {})
        sent = self.sent.setdefault(pid, set())
        if srt_keys:
            # Advertisements came: the groups not sent yet may overlap them. Some went: the
            # groups sent on their topics are asked again against those that stay.
            came = {k: srt[k] for k in srt_keys if k in srt}
            groups |= answer({k: self._expr(k) for k in self.subgroups.count if k not in sent}, came)
            gone = {k[0] for k in srt_keys if k not in srt}
            groups |= {k for k in sent if k[0] in gone}
        want = self._answer(pid, groups)
        add, remove = want - sent, (groups & sent) - want
        sent |= add
        sent -= remove
        out = []
        m = self._message(opb.CONTROL_KIND_ADV, advertisements=[advertisement_of(k) for k in ads
                                                                 if k in self.advertised.count])
        m += self._message(opb.CONTROL_KIND_UNADV, advertisements=[advertisement_of(k) for k in ads
                                                                   if k not in self.advertised.count])
        # The answers name the advertisements (so the host routes by them from here); TID
        # routes by nothing and sends a subscription on its own, as PADRES does.
        answered = srt_keys if self.mode == "scot" else []
        m += self._message(opb.CONTROL_KIND_CIB_SET, subgroups=[subgroup_of(k) for k in add],
                           advertisements=[advertisement_of(k) for k in answered if k in srt])
        m += self._message(opb.CONTROL_KIND_CIB_CLEAR, subgroups=[subgroup_of(k) for k in remove],
                           advertisements=[advertisement_of(k) for k in answered if k not in srt])
        out.extend(m)
        return out

    def _message(self, kind: int, **fields) -> list[opb.ControlMessage]:
        if not any(fields.values()):
            return []
        return [opb.ControlMessage(kind=kind, sender=self.me, region=self.region, **fields)]

    def _changed(self, appeared: set, emptied: set) -> None:
        for k in emptied:  # decoded again if it comes back: the cache holds live groups only
            self._exprs.pop(k, None)
        self.links.changed([("g", k) for k in appeared | emptied])

    def _advertised(self, appeared: set, emptied: set) -> None:
        if emptied:  # withdrawn: an answer to them may be stale if they come back
            self.summaries.unanswer(emptied)
        self.links.changed([("a", k) for k in appeared | emptied])

    def peers(self) -> set[str]:
        """The routers this one exchanges advertisements and answers with: its secondary
        router in each other region, and those whose secondary it is (the same ones when
        every region has as many routers). TID (PADRES with tree identifiers, the paper's
        baseline): every other router, of every region, unclustered -- an advertisement
        is flooded to every router (over these one-hop streams its tree is a star, so no
        duplicates), and a subscription goes to the host of every advertisement it
        overlaps, from the router its subscriber sent it to."""
        ov = self._overlay() if self._overlay else None
        if ov is None or ov.scot is None or ov.here is None:
            return set()
        if self.mode == "tid":
            return set(ov.at.values()) - {self.me}
        scot, (a, c) = ov.scot, ov.here
        out = {ov.at[p] for p in scot.ilinks(a, c)}
        out |= {ov.at[(b, o)] for o in range(scot.regions) if o != c for b in range(scot.sizes[o])
                if scot.ilink(b, o, c) == (a, c)}
        return out

    def on_view(self) -> None:
        view = self.membership
        agents = {m.id for m in view.alive(mpb.ROLE_AGENT) if m.region == self.region}
        self.waiting = agents - self.heard
        for m in view.members.values():
            if m.role != mpb.ROLE_AGENT:
                continue
            if m.state == mpb.MEMBER_STATE_LEFT and m.id in self.subgroups.by_agent:
                self._changed(*self.subgroups.forget(m.id))
            # A dead agent's producers are gone with it (UNADV). Forgetting is always safe: an
            # event of an advertisement not held here goes to every region.
            if m.state in (mpb.MEMBER_STATE_DEAD, mpb.MEMBER_STATE_LEFT) and m.id in self.advertised.by_agent:
                self._advertised(*self.advertised.forget(m.id))
        peers = self.peers()
        self.links.keep(m for m in view.alive(mpb.ROLE_ROUTER) if m.id in peers)
        for pid in [p for p in self.sent if p not in self.links.links]:
            del self.sent[pid]
        self._check_complete()

    def _check_complete(self) -> None:
        complete = self.waiting is not None and not self.waiting
        if complete != self.complete:
            self.complete = complete
            log.info("router %s: its summary of region %s is %s", self.me, self.region,
                     "complete" if complete else f"incomplete until {len(self.waiting)} agents have sent theirs")
            self.links.resend()

    async def close(self) -> None:
        await self.links.close()

    # -- in ----------------------------------------------------------------------------

    def receive(self, stream: Stream, m: opb.ControlMessage, context) -> None:
        """Validate `m` whole, then apply it (module doc). A refused first message leaves
        no trace either: its stream does not become its sender's newest, whose end would
        drop what the sender's live stream holds."""
        first, newest = stream.sender is None, self.current.get(m.sender)
        try:
            self._receive(stream, m, context)
        except BaseException:
            if first and stream.sender is not None:
                stream.sender, stream.role, stream.region = None, None, ""
                if newest is None:
                    self.current.pop(m.sender, None)
                else:
                    self.current[m.sender] = newest
            raise
        self.applied_ns = time.time_ns()
        if m.kind in _ADV_KINDS:
            self.adv_applied_ns = self.applied_ns

    def _receive(self, stream: Stream, m: opb.ControlMessage, context) -> None:
        if m.kind in _AGENT_KINDS:
            role = "agent"
        elif m.kind in _ROUTER_KINDS:
            role = "router"
        elif m.kind in _ADV_KINDS:
            # An agent's of this region, or a host router's of another. TID: also a router's
            # of this region, told by its stream: an agent's stream begins with its SUBs.
            if stream.role is not None:
                role = stream.role
            else:
                role = "router" if m.region != self.region or self.mode == "tid" else "agent"
        else:
            raise InvalidArgument(f"control message kind {m.kind} is not one of SUB, UNSUB, ADV, UNADV, "
                                  f"CIB_SET, CIB_CLEAR")
        if not m.sender:
            raise InvalidArgument("control message without a sender")
        if stream.sender is None:
            require_member(context, m.sender, role, "Router.Control")
            known = self.membership.members.get(m.sender)
            if known is not None and known.role != (mpb.ROLE_AGENT if role == "agent" else mpb.ROLE_ROUTER):
                raise PermissionDenied(f"Router.Control: {m.sender} is not a member of role {role}")
            if role == "agent" and m.region != self.region:
                raise InvalidArgument(f"SUB / UNSUB from region {m.region!r}: this router serves {self.region!r}")
            if role == "router" and (not m.region or m.region == self.region and self.mode != "tid"):
                raise InvalidArgument(f"CIB_SET / CIB_CLEAR from region {m.region!r}: only from another region "
                                      f"than {self.region!r}")
            if known is not None and known.region != m.region:
                raise InvalidArgument(f"{m.sender} joined region {known.region!r}, not {m.region!r}")
            stream.sender, stream.role, stream.region = m.sender, role, m.region
            self.current[m.sender] = stream
        elif (m.sender, role, m.region) != (stream.sender, stream.role, stream.region):
            raise InvalidArgument("a control stream carries one sender's messages of one role and region")
        if any(k != m.kind for k in stream.staged) or stream.staged and not m.full:
            raise InvalidArgument("a change inside a full state's parts")
        if m.kind == opb.CONTROL_KIND_SUB:
            if m.advertisements:
                raise InvalidArgument("SUB carries subscriptions only")
            subs = self._subscriptions(m)
            self._stage_or_apply(stream, m, subs, {}, lambda s, _: self._changed(*self.subgroups.put(m.sender, s)),
                                 lambda s, g, _: self._agent_full(s, g))
        elif m.kind == opb.CONTROL_KIND_UNSUB:
            if m.subscriptions or m.subgroups or m.full or m.advertisements:
                raise InvalidArgument("UNSUB carries ids only")
            if any(not i for i in m.ids):
                raise InvalidArgument("UNSUB: an empty subscription id")
            self._changed(*self.subgroups.drop(m.sender, m.ids))
        elif m.kind in _ADV_KINDS:
            if m.ids or m.subscriptions or m.subgroups:
                raise InvalidArgument("ADV / UNADV carry advertisements only")
            if m.complete:
                raise InvalidArgument("`complete` belongs to CIB_SET")
            ads = self._advertisements(m)
            if m.kind == opb.CONTROL_KIND_UNADV:
                if m.full or m.last:
                    raise InvalidArgument("UNADV is never part of a full state")
                if role == "agent":
                    self._advertised(*self.advertised.drop(m.sender, ads))
                else:
                    mine = self.srt.get(m.sender, {})
                    gone = [k for k in ads if k in mine]
                    for k in gone:
                        del mine[k]
                    self._srt_changed(m.sender, gone)
            elif role == "agent":
                self._stage_or_apply(stream, m, {}, ads,
                                     lambda _, a: self._advertised(*self.advertised.put(m.sender, {k: k for k in a})),
                                     lambda s, _, a: self._advertised(*self.advertised.replace(s.sender,
                                                                                                {k: k for k in a})))
            else:
                self._stage_or_apply(stream, m, {}, ads, lambda _, a: self._srt_put(m.sender, a),
                                     lambda s, _, a: self._srt_replace(s.sender, a))
        else:
            groups = self._subgroups(m)
            answered = self._advertisements(m)
            if m.kind == opb.CONTROL_KIND_CIB_SET:
                self._stage_or_apply(stream, m, groups, answered,
                                     lambda g, a: self.summaries.set(m.sender, g, a),
                                     lambda s, g, a: self.summaries.replace(m.sender, s.region, g, m.complete, a))
            elif m.full:
                raise InvalidArgument("CIB_CLEAR is never part of a full state")
            else:
                self.summaries.clear(m.sender, groups, answered)

    def _srt_put(self, sender: str, ads: dict) -> None:
        mine = self.srt.setdefault(sender, {})
        new = [k for k in ads if k not in mine]
        mine.update(ads)
        self._srt_changed(sender, new)

    def _srt_replace(self, sender: str, ads: dict) -> None:
        old = self.srt.get(sender, {})
        self.srt[sender] = dict(ads)
        self._srt_changed(sender, set(old) ^ set(ads))

    def _srt_changed(self, sender: str, keys) -> None:
        if keys:
            self.links.changed([("s", k) for k in keys], only=sender)

    def _stage_or_apply(self, stream: Stream, m, entries: dict, ads: dict, apply, replace) -> None:
        if not m.full:
            if m.last or m.complete:
                raise InvalidArgument("`last` and `complete` belong to a full state's parts")
            apply(entries, ads)
            return
        if m.complete and not m.last:
            raise InvalidArgument("`complete` is set on a full state's last part")
        staged = stream.staged.get(m.kind, ({}, {}))
        staged = ({**staged[0], **entries}, {**staged[1], **ads})
        stream.staged[m.kind] = staged
        if m.last:
            del stream.staged[m.kind]
            replace(stream, *staged)

    def _agent_full(self, stream: Stream, subs: dict) -> None:
        self._changed(*self.subgroups.replace(stream.sender, subs))
        self.heard.add(stream.sender)
        if self.waiting is not None:
            self.waiting.discard(stream.sender)
            self._check_complete()

    def _subscriptions(self, m: opb.ControlMessage) -> dict[str, Key]:
        if m.ids or m.subgroups:
            raise InvalidArgument("SUB carries subscriptions only")
        out = {}
        for k, s in enumerate(m.subscriptions):
            if not s.id or not s.topic:
                raise InvalidArgument(f"subscription {k}: id and topic are required")
            if s.agent != m.sender:
                raise InvalidArgument(f"subscription {s.id!r} names agent {s.agent!r}: an agent sends its own only")
            _check(s.filter, f"subscription {s.id!r}")
            out[s.id] = key_of(s.topic, s.filter)
        return out

    def _subgroups(self, m: opb.ControlMessage) -> dict:
        if m.ids or m.subscriptions:
            raise InvalidArgument("CIB_SET / CIB_CLEAR carry subgroups only")
        return _keyed("subgroup", [(g.topic, g.filter) for g in m.subgroups])

    def _advertisements(self, m: opb.ControlMessage) -> dict[Key, Expression]:
        return _keyed("advertisement", [(a.topic, a.bounds) for a in m.advertisements])

    def ended(self, stream: Stream) -> None:
        """An agent's subscriptions and advertisements stay (it sends its full state again
        on its next stream; LEFT: forgotten); a router's summary and advertisements are
        dropped: they may go stale from here on."""
        if stream.sender is not None and self.current.get(stream.sender) is stream:
            del self.current[stream.sender]
            if stream.role == "router":
                self.summaries.lost(stream.sender)
                self._srt_changed(stream.sender, list(self.srt.pop(stream.sender, {})))


def _keyed(what: str, entries: list[tuple[str, pb.Filter]]) -> dict[Key, Expression]:
    """(topic, filter) entries, each checked, by key."""
    out = {}
    for k, (topic, f) in enumerate(entries):
        if not topic:
            raise InvalidArgument(f"{what} {k}: a topic is required")
        _check(f, f"{what} {k}")
        out[key_of(topic, f)] = filter_from_pb(f)
    return out


def _check(f: pb.Filter, what: str) -> None:
    try:
        filter_from_request(f, "")
    except InvalidArgument as e:
        raise InvalidArgument(f"{what}: {e.message}") from None
    except ValueError as e:  # too large
        raise InvalidArgument(f"{what}: {e}") from None
