"""A router's side of OctopiA's control plane between regions (core/cib.py for the rules;
router.proto `Control`; docs/event-path.md, "Regions that stand alone").

- In: each agent of this router's region sends its subscriptions (SUB / UNSUB, its full
  state first): the region's subgroup (`Subgroups`). Each router of another region sends
  its region's groups (CIB_SET / CIB_CLEAR, its full state first): `Summaries`.
- Out: this region's groups to every live router of the other regions
  (`dataplane.control.ControlLinks`): the full state on each new stream, then the groups
  that appeared (CIB_SET) or emptied (CIB_CLEAR).
- The summary is *complete* while every live agent of the region has sent its full state
  to this router (an agent that joins is heard a moment after it sees the router: the
  summary is incomplete meanwhile, and complete again, each time sent in full). While
  it is incomplete the receivers send this region every event (core/cib.py).

Every message is validated whole before anything of it is applied: INVALID_ARGUMENT for a
malformed one, PERMISSION_DENIED under mTLS when the certificate does not name the sender
with the role its kind needs (an agent for SUB / UNSUB, a router for CIB_SET / CIB_CLEAR).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from echelon.contract.errors import InvalidArgument, PermissionDenied
from echelon.contract.transport import require_member
from echelon.contract.wire import filter_from_pb, filter_from_request
from echelon.core.cib import Key, Subgroups, Summaries
from echelon.dataplane.control import ControlLinks, chunks
from echelon.v1 import common_pb2 as pb
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import router_pb2 as opb

log = logging.getLogger("echelon.router.control")

_AGENT_KINDS = (opb.CONTROL_KIND_SUB, opb.CONTROL_KIND_UNSUB)
_ROUTER_KINDS = (opb.CONTROL_KIND_CIB_SET, opb.CONTROL_KIND_CIB_CLEAR)


def key_of(topic: str, f: pb.Filter) -> Key:
    return topic, f.SerializeToString(deterministic=True)


def subgroup_of(k: Key) -> opb.Subgroup:
    return opb.Subgroup(topic=k[0], filter=pb.Filter.FromString(k[1]))


class Stream:
    """One incoming Control stream: who sends it, and a full state still arriving in parts."""

    def __init__(self) -> None:
        self.sender: str | None = None
        self.role: str | None = None
        self.region = ""
        self.staged: dict | None = None


class RouterControl:
    def __init__(self, me: str, region: str, membership: Callable[[], object],
                 dial: Callable[[str], grpc.aio.Channel]):
        self.me, self.region, self._membership = me, region, membership
        self.subgroups = Subgroups()
        self.summaries = Summaries(wire=True)  # `wants` reads an event's attributes as received
        self.waiting: set[str] | None = None  # agents the complete summary waits for (None: no view yet)
        self.heard: set[str] = set()  # agents whose full state arrived (maybe before this router's first view)
        self.complete = False
        self.current: dict[str, Stream] = {}  # sender -> its newest stream
        self.links = ControlLinks(dial, lambda _: self._full, lambda _: self._delta)

    @property
    def membership(self):
        return self._membership()

    def wants(self, region: str, topic: str, attributes) -> bool:
        """Region `region`'s bit of an event's CIV here (core/cib.py)."""
        return self.summaries.wants(region, topic, attributes)

    # -- out ---------------------------------------------------------------------------

    def _full(self) -> list[opb.ControlMessage]:
        return chunks(opb.CONTROL_KIND_CIB_SET, self.me, self.region, "subgroups",
                      [subgroup_of(k) for k in self.subgroups.groups()], complete=self.complete)

    def _delta(self, keys: set) -> list[opb.ControlMessage]:
        now = [k for k in keys if k in self.subgroups.count]
        gone = [k for k in keys if k not in self.subgroups.count]
        out = []
        for kind, ks in ((opb.CONTROL_KIND_CIB_SET, now), (opb.CONTROL_KIND_CIB_CLEAR, gone)):
            if ks:
                out.append(opb.ControlMessage(kind=kind, sender=self.me, region=self.region,
                                              subgroups=[subgroup_of(k) for k in ks]))
        return out

    def _changed(self, appeared: set, emptied: set) -> None:
        self.links.changed(appeared | emptied)

    def on_view(self) -> None:
        view = self.membership
        agents = {m.id for m in view.alive(mpb.ROLE_AGENT) if m.region == self.region}
        self.waiting = agents - self.heard
        for m in view.members.values():
            if m.role == mpb.ROLE_AGENT and m.state == mpb.MEMBER_STATE_LEFT and m.id in self.subgroups.by_agent:
                self._changed(*self.subgroups.forget(m.id))
        self.links.keep(m for m in view.alive(mpb.ROLE_ROUTER) if m.region != self.region)
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
        """Validate `m` whole, then apply it (module doc)."""
        if m.kind in _AGENT_KINDS:
            role = "agent"
        elif m.kind in _ROUTER_KINDS:
            role = "router"
        else:
            raise InvalidArgument(f"control message kind {m.kind} is not one of SUB, UNSUB, CIB_SET, CIB_CLEAR")
        if not m.sender:
            raise InvalidArgument("control message without a sender")
        if stream.sender is None:
            require_member(context, m.sender, role, "Router.Control")
            known = self.membership.members.get(m.sender)
            if known is not None and known.role != (mpb.ROLE_AGENT if role == "agent" else mpb.ROLE_ROUTER):
                raise PermissionDenied(f"Router.Control: {m.sender} is not a member of role {role}")
            if role == "agent" and m.region != self.region:
                raise InvalidArgument(f"SUB / UNSUB from region {m.region!r}: this router serves {self.region!r}")
            if role == "router" and (not m.region or m.region == self.region):
                raise InvalidArgument(f"CIB_SET / CIB_CLEAR from region {m.region!r}: only from another region "
                                      f"than {self.region!r}")
            if known is not None and known.region != m.region:
                raise InvalidArgument(f"{m.sender} joined region {known.region!r}, not {m.region!r}")
            stream.sender, stream.role, stream.region = m.sender, role, m.region
            self.current[m.sender] = stream
        elif (m.sender, role, m.region) != (stream.sender, stream.role, stream.region):
            raise InvalidArgument("a control stream carries one sender's messages of one role and region")
        if stream.staged is not None and not m.full:
            raise InvalidArgument("a change inside a full state's parts")
        if m.kind == opb.CONTROL_KIND_SUB:
            subs = self._subscriptions(m)
            self._stage_or_apply(stream, m, subs, lambda s: self._changed(*self.subgroups.put(m.sender, s)),
                                 self._agent_full)
        elif m.kind == opb.CONTROL_KIND_UNSUB:
            if m.subscriptions or m.subgroups or m.full:
                raise InvalidArgument("UNSUB carries ids only")
            if any(not i for i in m.ids):
                raise InvalidArgument("UNSUB: an empty subscription id")
            self._changed(*self.subgroups.drop(m.sender, m.ids))
        else:
            groups = self._subgroups(m)
            if m.kind == opb.CONTROL_KIND_CIB_SET:
                self._stage_or_apply(stream, m, groups, lambda g: self.summaries.set(m.sender, g),
                                     lambda s, g: self.summaries.replace(m.sender, s.region, g, m.complete))
            elif m.full:
                raise InvalidArgument("CIB_CLEAR is never part of a full state")
            else:
                self.summaries.clear(m.sender, groups)

    def _stage_or_apply(self, stream: Stream, m, entries: dict, apply, replace) -> None:
        if not m.full:
            if m.last or m.complete:
                raise InvalidArgument("`last` and `complete` belong to a full state's parts")
            apply(entries)
            return
        if m.complete and not m.last:
            raise InvalidArgument("`complete` is set on a full state's last part")
        stream.staged = {**(stream.staged or {}), **entries}
        if m.last:
            staged, stream.staged = stream.staged, None
            replace(stream, staged)

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
        out = {}
        for k, g in enumerate(m.subgroups):
            if not g.topic:
                raise InvalidArgument(f"subgroup {k}: a topic is required")
            _check(g.filter, f"subgroup {k}")
            out[key_of(g.topic, g.filter)] = filter_from_pb(g.filter)
        return out

    def ended(self, stream: Stream) -> None:
        """An agent's subscriptions stay (it sends its full state again on its next stream;
        LEFT: forgotten); a router's summary is dropped: it may go stale from here on."""
        if stream.sender is not None and self.current.get(stream.sender) is stream:
            del self.current[stream.sender]
            if stream.role == "router":
                self.summaries.lost(stream.sender)


def _check(f: pb.Filter, what: str) -> None:
    try:
        filter_from_request(f, "")
    except InvalidArgument as e:
        raise InvalidArgument(f"{what}: {e.message}") from None
    except ValueError as e:  # too large
        raise InvalidArgument(f"{what}: {e}") from None
