"""The sending side of the routers' `Control` streams (router.proto; core/cib.py;
docs/event-path.md, "Regions that stand alone"): an agent's subscriptions to the routers
of its region, a router's region summary to the routers of the other regions.

One stream per peer. Each (re)opened stream first carries the sender's full state
(`full()`), then the changes since (`delta(keys)` of the keys marked changed), so a
receiver that restarted, or a stream that broke and lost what was in flight, is made
exact again by the next stream. A stream that fails is re-opened after a pause, while
the peer is in the view (`ControlLinks.keep`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable

import grpc

from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import router_pb2 as opb

log = logging.getLogger("echelon.dataplane.control")

METHOD = "/echelon.v1.Router/Control"
RETRY = 0.2  # first pause before a stream is opened again (doubling up to MAX_RETRY)
MAX_RETRY = 2.0
CHUNK = 1000  # entries per message of a full state (gRPC's message size bound)

Full = Callable[[], list[opb.ControlMessage]]
Delta = Callable[[set], list[opb.ControlMessage]]


def chunks(kind: int, sender: str, region: str, field: str, entries: list, **flags) -> list[opb.ControlMessage]:
    """A full state as messages of at most CHUNK entries, the last one marked `last`."""
    parts = [entries[i:i + CHUNK] for i in range(0, len(entries), CHUNK)] or [[]]
    out = []
    for k, part in enumerate(parts):
        m = opb.ControlMessage(kind=kind, sender=sender, region=region, full=True, last=k == len(parts) - 1,
                               **flags)
        getattr(m, field).extend(part)
        out.append(m)
    return out


def kind_name(kind: int) -> str:
    """"adv", "sub", "cib_set", ...: a control message kind as Describe reports it."""
    return opb.ControlKind.Name(kind).removeprefix("CONTROL_KIND_").lower()


class ControlLink:
    def __init__(self, channel: grpc.aio.Channel, peer: str, full: Full, delta: Delta,
                 counts: Counter | None = None):
        self.channel, self.peer, self.full, self.delta = channel, peer, full, delta
        self.counts = Counter() if counts is None else counts  # messages written, by kind (shared by the links)
        self.dirty: set = set()
        self.again = False  # send the full state again on the open stream
        self.wake = asyncio.Event()
        self.opened = 0  # streams opened (each began with the full state)
        self.sent = 0  # messages written
        self.task = asyncio.create_task(self._run(), name=f"control-{peer}")

    def changed(self, keys: Iterable) -> None:
        self.dirty.update(keys)
        self.wake.set()

    def resend(self) -> None:
        self.again = True
        self.wake.set()

    async def _run(self) -> None:
        delay = RETRY
        while True:
            call = self.channel.stream_unary(METHOD, request_serializer=opb.ControlMessage.SerializeToString,
                                             response_deserializer=opb.ControlReply.FromString)()
            reply = asyncio.ensure_future(self._reply(call))  # done only when the receiver ends it
            try:
                # The full state covers every change made so far: none is sent twice.
                self.dirty.clear()
                self.again = False
                self.wake.clear()
                self.opened += 1
                for m in self.full():
                    await call.write(m)
                    self._count(m)
                delay = RETRY
                while True:
                    await self._wait(reply)
                    self.wake.clear()
                    if self.again:
                        self.again, self.dirty = False, set()
                        out = self.full()
                    else:
                        keys, self.dirty = self.dirty, set()
                        out = self.delta(keys)
                    for m in out:
                        await call.write(m)
                        self._count(m)
            except Exception as e:  # noqa: BLE001 - whatever ended it, the next stream starts over
                level = log.warning if isinstance(e, grpc.aio.AioRpcError) and e.code() in (
                    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED) else log.info
                level("control stream to %s ended (%s): opened again with the full state in %.1f s",
                      self.peer, e, delay)
            finally:
                reply.cancel()
                call.cancel()
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY)

    def _count(self, m: opb.ControlMessage) -> None:
        self.sent += 1
        self.counts[kind_name(m.kind)] += 1

    @staticmethod
    async def _reply(call):
        return await call

    async def _wait(self, reply: asyncio.Future) -> None:
        """Until there is something to send; raises if the receiver ended the stream."""
        if not self.wake.is_set():
            waker = asyncio.ensure_future(self.wake.wait())
            try:
                await asyncio.wait({reply, waker}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waker.cancel()
        if reply.done():
            reply.result()  # the error, if refused
            raise ConnectionError("the receiver ended the control stream")

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


class ControlLinks:
    """A link per peer, kept to the peers given (`keep`): a peer that left loses its link,
    one back under another address or lifetime gets a new one (a new full state)."""

    def __init__(self, dial: Callable[[str], grpc.aio.Channel], full: Callable[[str], Full],
                 delta: Callable[[str], Delta], counts: Counter | None = None):
        self.dial, self.full, self.delta = dial, full, delta
        self.counts = Counter() if counts is None else counts
        self.links: dict[str, tuple[tuple, ControlLink, grpc.aio.Channel]] = {}

    def keep(self, peers: Iterable[mpb.Member]) -> None:
        want = {m.id: (m.address, m.incarnation) for m in peers}
        for pid in [p for p, (k, _, _) in self.links.items() if want.get(p) != k]:
            self._drop(pid)
        for pid, key in want.items():
            if pid not in self.links:
                ch = self.dial(key[0])
                self.links[pid] = (key, ControlLink(ch, pid, self.full(pid), self.delta(pid), self.counts), ch)

    def _drop(self, pid: str) -> None:
        _, link, ch = self.links.pop(pid)
        link.task.cancel()
        asyncio.ensure_future(ch.close())

    def changed(self, keys: Iterable, only: str | None = None) -> None:
        """Mark `keys` to be sent on every link (`only`: on the link to that peer)."""
        keys = list(keys)
        if keys:
            for pid, (_, link, _) in self.links.items():
                if only is None or pid == only:
                    link.changed(keys)

    def resend(self, only: Iterable[str] | None = None) -> None:
        """The full state again on every link (`only`: on the links to those peers)."""
        for pid, (_, link, _) in self.links.items():
            if only is None or pid in only:
                link.resend()

    async def close(self) -> None:
        for pid in list(self.links):
            self._drop(pid)


class AgentFeed:
    """An agent's subscriptions (`subscriptions()`: id -> the registration sent to the
    matchers) to every live router of its region, and its advertisements (the topics its
    producers publish: `producing`) to its host router only (the one its events for other
    regions go through, `host`; the others are sent an empty advertisement state): SUB then
    ADV with the full state, then SUB / UNSUB for the ids registered, replaced or removed
    and ADV / UNADV for the topics whose first producer came or whose last one went."""

    def __init__(self, me: str, region: str, subscriptions: Callable[[], dict[str, xpb.Subscription]],
                 dial: Callable[[str], grpc.aio.Channel]):
        self.me, self.region, self.subscriptions = me, region, subscriptions
        self.producers: Counter[str] = Counter()  # topic -> Publish streams that published on it
        self.host: str | None = None
        self.incarnation: int | None = None  # this agent's, as last seen in the view
        self.links = ControlLinks(dial, lambda pid: lambda: self._full(pid),
                                  lambda pid: lambda keys: self._delta(pid, keys))

    def producing(self, topic: str, n: int) -> None:
        """A Publish stream published on `topic` for the first time (n = 1), or ended (-1)."""
        self.producers[topic] += n
        if self.producers[topic] <= 0:
            del self.producers[topic]
            self.links.changed([("adv", topic)], only=self.host)
        elif self.producers[topic] == n:
            self.links.changed([("adv", topic)], only=self.host)

    def hosted_by(self, router: str | None) -> None:
        """The router this agent's events for other regions go through now (gateway.py):
        the advertisements move to it."""
        if router != self.host:
            old, self.host = self.host, router
            self.links.resend({old, router})

    def _full(self, pid: str) -> list[opb.ControlMessage]:
        topics = sorted(self.producers) if pid == self.host else []
        return (chunks(opb.CONTROL_KIND_SUB, self.me, self.region, "subscriptions",
                       list(self.subscriptions().values()))
                + chunks(opb.CONTROL_KIND_ADV, self.me, self.region, "advertisements",
                         [opb.Advertisement(topic=t) for t in topics]))

    def _delta(self, pid: str, keys: set) -> list[opb.ControlMessage]:
        ids = {k for k in keys if isinstance(k, str)}
        topics = sorted(k[1] for k in keys if not isinstance(k, str)) if pid == self.host else []
        subs = self.subscriptions()
        present = [subs[i] for i in sorted(ids) if i in subs]
        gone = sorted(i for i in ids if i not in subs)
        out = []
        for i in range(0, len(present), CHUNK):
            out.append(opb.ControlMessage(kind=opb.CONTROL_KIND_SUB, sender=self.me, region=self.region,
                                          subscriptions=present[i:i + CHUNK]))
        for i in range(0, len(gone), CHUNK):
            out.append(opb.ControlMessage(kind=opb.CONTROL_KIND_UNSUB, sender=self.me, region=self.region,
                                          ids=gone[i:i + CHUNK]))
        for kind, ts in ((opb.CONTROL_KIND_ADV, [t for t in topics if t in self.producers]),
                         (opb.CONTROL_KIND_UNADV, [t for t in topics if t not in self.producers])):
            if ts:
                out.append(opb.ControlMessage(kind=kind, sender=self.me, region=self.region,
                                              advertisements=[opb.Advertisement(topic=t) for t in ts]))
        return out

    def on_view(self, membership) -> None:
        """The routers of this agent's region (joined region: the matcher tiers' regions).
        Back from DEAD (a new incarnation of this agent): the routers forgot its
        advertisements, so each is sent the full state again."""
        me = membership.members.get(self.me)
        incarnation = me.incarnation if me is not None else None
        if incarnation != self.incarnation and self.incarnation is not None and incarnation is not None:
            self.links.resend()
        if incarnation is not None:
            self.incarnation = incarnation
        self.links.keep(m for m in membership.alive(mpb.ROLE_ROUTER) if m.region == self.region)

    def changed(self, ids: Iterable[str]) -> None:
        self.links.changed(ids)

    async def close(self) -> None:
        await self.links.close()
