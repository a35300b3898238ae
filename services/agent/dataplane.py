"""The agent's data plane: LBDD dissemination with aggregated acks and path update
(LBDD sections 3.3-3.4; DESIGN.md "The path of one event", "Guarantees").

Roles. The publishing agent is the root of the topic's tree (`trees.Trees`): it sends a
copy only to its targets whose subtree holds a destination, and each copy carries the
destination ids of that subtree. A relay computes its own targets from its own view and
does the same with what it received. In p2p mode the root sends every copy itself.
Small events to one target share a frame; a payload above the slice size goes as slices,
each forwarded the moment it arrives, striped over S trees (`trees`), and handed to the
local subscriptions slice by slice: no agent holds a whole payload (`slices`).

Holds: acks aggregate up the tree. A node keeps every message it forwards in a `Hold`,
keyed by (root, producer, sequence, slice index), until each copy it produced is acknowledged;
it acknowledges an incoming frame only once it has delivered locally and every hold the
frame touched is settled. So an ack at the root means the whole subtree has the message.

Path update (Algorithm 3). When a target leaves the view, its link is closed and every
unacknowledged frame on it comes back as not delivered, at once and in order, before
anything is routed on the new view (so a re-routed copy is not overtaken by a newer
message on the same path: FIFO holds across the update); the node re-routes the
destinations those frames still owed (minus the ones gone from the view) over its new
view and sends them to its new targets. If the failed node was a relay, its orphaned
children are among those destinations and get the message again from someone else.

Parking. A destination whose member is DEAD in this node's view is not dropped: the
message is parked for it here (bounded: `park_seconds`, `park_messages`, `park_bytes`).
The ack upstream does not wait for it (acks mean "every destination in the view holds
it", so a DELIVERED publish or a full window never waits on a dead member; a parked
message is this node's to keep, as a frame is until acked). When the same member id
is ALIVE again (a live agent that was falsely declared dead, or partitioned, and
rejoined with a higher incarnation) the parked messages are sent to it in arrival order;
past the bounds, or when the member LEFT or vanished from the view, they are dropped and
counted (`echelon_agent_destinations_lost_total`). A restarted process (same id, new
process) gets them too, but its subscriptions are new and take only messages published
after they were opened (subscriptions.py): at-least-once covers the subscriptions that
survive, and a rejoining node is sent no duplicate of what it delivered before it crashed.

Duplicates. A hold remembers the destinations it already took on (`covered`); a second
copy of a message or slice (a re-route, a resend after a broken stream) is forwarded
only to destinations not yet covered, and its ack waits for the first copy's hold. Local
delivery is deduplicated per message id (the agent's DedupWindow), slices per (message,
index) (`slices.Streams`). A slice for this node is acknowledged once every local
subscription stream wrote it: the local part of the slice's hold. Holds are per root: within one root's tree every copy a node
receives names only destinations in higher buckets than its own (buckets do not depend
on the view), so no two holds can wait on each other; a client's retry through another
agent is another root, hence another hold.

Order (FIFO per producer while the view is stable). Along one tree the path from the
root to an agent is fixed and every hop is FIFO, so a producer's small events (always
stripe 0) arrive in order. A sliced payload is offered to the subscriptions when its
slice 0 arrives, which always travels on stripe 0: so after every earlier small event,
and after an earlier payload's head (its other slices follow in the subscription's
order: a subscription streams one payload at a time). If message B uses every stripe
that an earlier message A still in flight uses, then on each of A's stripes B's slice
arrives after A's slices, so B completes after A: no wait is needed. Otherwise the root fences: it waits until such predecessors are acknowledged
(`_fence`). Consecutive bulk messages use the same schedule prefix and so never wait; a
small event right after a striped payload waits for it.

Order across a view change. When the view changes, a message still in flight may be
stuck behind a relay that has not seen the change yet (it re-routes when it does), while
the root's next message takes a new path around it and could overtake it. So the root
fences there too: after `on_view`, a producer's next message leaves only once every
message of that producer sent on the old view is acknowledged (held by its
destinations). Publishing pauses for about the time the slowest relay takes to catch up.
Within one view the tree does not depend on a message's destinations (a destination not
yet advertised as a subscriber gets a direct copy, `trees`), so consecutive messages take
one path to each destination at every node whose view did not change between them.

Why one module past 400 lines: holds, frames, the path update and parking are one
bookkeeping (a parked destination is a re-route that waits; a frame settles holds that
the root's fences and a relay's acks both read); split apart, each part would reach
into the others' state. The agent sees it through `Host` only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from typing import Callable, Protocol

from echelon.agent.slices import STREAM_WINDOW, PayloadReader, Streams, cut, slice_count, slice_event
from echelon.agent.trees import Trees
from echelon.v1 import common_pb2 as pb
from echelon.v1 import relay_pb2 as rpb

log = logging.getLogger("echelon.agent.dataplane")

FRAME_BYTES = 1 << 20  # a root frame of small events is closed past this size
MAX_HOLDS = 65_536  # settled holds a relay remembers to suppress duplicate forwarding
# Of slices, apart: a duplicate slice is a re-sent unacknowledged frame, so it is among the
# last windows' worth (8 stripes x 8 MiB = 1,024 slices of 64 KiB); remembering 65,536
# slice holds would cost ~45 MiB per agent for nothing (measured: an agent's peak RSS crept
# up with the payload size until 4 GiB). One forgotten anyway costs a redundant copy only.
MAX_SLICE_HOLDS = 4_096
PARK_SECONDS = 30.0  # a DEAD member's messages wait this long for it to come back
PARK_MESSAGES = 50_000  # parked (message, destination) pairs per node
PARK_BYTES = 64 << 20


class Hold:
    """One message (or slice) this node is responsible for until its copies are acked."""

    __slots__ = ("covered", "pending", "waiters")

    def __init__(self):
        self.covered: set[str] = set()
        self.pending = 0  # frames carrying it, not yet acknowledged
        self.waiters: list[Job] = []

    def release(self) -> None:
        self.pending -= 1
        if self.pending == 0 and self.waiters:
            waiters, self.waiters = self.waiters, []
            for job in waiters:
                job.tick()


class Job:
    """Waits for a set of holds to settle, then calls `done` once."""

    __slots__ = ("count", "done")

    def __init__(self, done: Callable[[], None]):
        self.count = 1  # the arming guard
        self.done = done

    def wait(self, hold: Hold) -> None:
        if hold.pending:
            self.count += 1
            hold.waiters.append(self)

    def tick(self) -> None:
        self.count -= 1
        if self.count == 0:
            self.done()

    arm = tick


class Host(Protocol):
    """What the data plane needs of its agent, and nothing more (linkset.PlaneHost)."""

    id: str
    address: str
    metrics: object  # counters: copies (labelled "as"), rerouted, lost, parked, unparked
    dedup: object  # `key in dedup`: a message id already delivered here
    stopping: bool  # from then on nothing is acknowledged or re-routed

    def link(self, member) -> object:
        """The `links.Link` to a member (made on first use)."""

    def deliver_local(self, events: list[pb.Event]) -> int:
        """Offer whole events (a frame's, in order) to the local subscriptions, once per message id."""

    def open_stream(self, head: pb.Event, size: int) -> list:
        """Offer a sliced payload to the local subscriptions (slices.Streams)."""


class DataPlane:
    """What the agent sends where, and when it may acknowledge; the host does the I/O."""

    def __init__(self, node: Host, trees: Trees, slice_bytes: int = 65536, park_seconds: float = PARK_SECONDS,
                 park_messages: int = PARK_MESSAGES, park_bytes: int = PARK_BYTES):
        self.node = node
        self.id = node.id
        self.trees = trees
        self.slice_bytes = slice_bytes
        self.holds: OrderedDict[tuple, Hold] = OrderedDict()
        self.slice_holds: OrderedDict[tuple, Hold] = OrderedDict()
        self.streams = Streams(node.open_stream, lambda key: key in node.dedup, node.dedup.forget)
        self.local_window = max(1, STREAM_WINDOW // slice_bytes)  # slices ahead of the local subscriptions
        self._as_root = node.metrics.copies.labels("root")
        self._as_relay = node.metrics.copies.labels("relay")
        self._open: dict[str, _Producer] = {}  # the root's messages not yet acknowledged
        self._sent: dict[asyncio.Future, tuple[rpb.RelayFrame, list[Hold]]] = {}  # frames not yet settled
        self.park_seconds = park_seconds
        self.park_messages = park_messages
        self.park_bytes = park_bytes
        self.parked: dict[str, deque[_Parked]] = {}  # member id -> its parked messages, oldest first
        self.parked_count = 0
        self.parked_bytes = 0

    # -- holds -----------------------------------------------------------------------

    def _hold(self, key: tuple, sliced: bool = False) -> Hold:
        holds, bound = (self.slice_holds, MAX_SLICE_HOLDS) if sliced else (self.holds, MAX_HOLDS)
        hold = holds.get(key)
        if hold is None:
            hold = holds[key] = Hold()
            while len(holds) > bound:
                oldest = next(iter(holds.values()))
                if oldest.pending:
                    break  # still in flight: the table is bounded by the windows anyway
                holds.popitem(last=False)
        return hold

    # -- sending ---------------------------------------------------------------------

    def _forward(self, source: str, source_key: str, items) -> dict[str, rpb.RelayFrame]:
        """Route (message, its topic, destinations, hold) items from this node and send the frames.

        Returns the frames sent, by target. Each hold's pending count covers its frames.
        """
        per_target: dict[str, tuple[rpb.RelayFrame, list[Hold]]] = {}
        for msg, topic, dests, hold in items:
            routes, lost = self.trees.route(source_key, topic, msg.stripe, dests)
            if lost:
                self._park(source, source_key, msg, topic, lost)
            for target, ds in routes.items():
                entry = per_target.get(target)
                if entry is None:
                    entry = per_target[target] = (rpb.RelayFrame(source=source, source_key=source_key), [])
                if msg.encoded_event:  # a whole message: its bytes as they came (no re-encoding)
                    entry[0].messages.add(destinations=ds, encoded_event=msg.encoded_event)
                else:
                    entry[0].messages.add(destinations=ds, slice_index=msg.slice_index, slice_count=msg.slice_count,
                                          payload_size=msg.payload_size, stripe=msg.stripe,
                                          aborted=msg.aborted).event.CopyFrom(msg.event)  # half the cost of event=
                entry[1].append(hold)
        for target, (frame, holds) in per_target.items():
            self._send(target, frame, holds)
        return {t: f for t, (f, _) in per_target.items()}

    def _send(self, target: str, frame: rpb.RelayFrame, holds: list[Hold]) -> None:
        for h in holds:
            h.pending += 1
        member = self.trees.table.members[target]  # route() only names members of the view
        future = self.node.link(member).send(frame)
        (self._as_root if frame.source == self.id else self._as_relay).inc()
        self._sent[future] = (frame, holds)
        future.add_done_callback(self._settle)

    def settle(self, futures) -> None:
        """Settle frames of a link just abandoned (its peer left the view) now, in order:
        their re-routed copies go out before anything routed on the new view."""
        for future in futures:
            self._settle(future)

    def _settle(self, future: asyncio.Future) -> None:
        entry = self._sent.pop(future, None)
        if entry is not None:  # settled once: by `settle`, or by the done callback
            self._settled(*entry, future)

    def _settled(self, frame: rpb.RelayFrame, holds: list[Hold], future: asyncio.Future) -> None:
        ok = not future.cancelled() and future.result()
        if not ok:
            if self.node.stopping:
                return  # never settle: nothing is acknowledged upstream that did not arrive
            # Path update: the target left the view with this frame unacknowledged.
            self.node.metrics.rerouted.inc(len(frame.messages))
            self._forward(frame.source, frame.source_key,
                          [(m, event_of(m).topic, list(m.destinations), h) for m, h in zip(frame.messages, holds)])
        for h in holds:
            h.release()

    # -- parking: destinations whose member is DEAD here --------------------------------

    def _park(self, source: str, source_key: str, msg: rpb.RelayMessage, topic: str, lost: list[str]) -> None:
        dropped = 0
        size = 0
        now = time.monotonic()
        for d in lost:
            if d not in self.trees.dead or self.node.stopping:
                dropped += 1  # LEFT, or never in the view: nobody to wait for
                continue
            size = size or msg.ByteSize()
            if self.parked_count >= self.park_messages or self.parked_bytes + size > self.park_bytes:
                dropped += 1
                continue
            self.parked.setdefault(d, deque()).append(_Parked(now, source, source_key, msg, topic, size))
            self.parked_count += 1
            self.parked_bytes += size
            self.node.metrics.parked.inc()
        if dropped:
            self.node.metrics.lost.inc(dropped)

    def _unpark(self, member_id: str) -> deque[_Parked]:
        entries = self.parked.pop(member_id, deque())
        self.parked_count -= len(entries)
        self.parked_bytes -= sum(e.size for e in entries)
        return entries

    def on_view(self) -> None:
        """After `trees.update`: fence every producer's messages in flight (the view
        changed under them, see "Order" in the module doc); send the parked messages of
        members ALIVE again, drop those of members that left or vanished from the view."""
        for p in self._open.values():
            p.barrier = [f for f in p.open if not f.done()]
        for member_id in [m for m in self.parked if m not in self.trees.dead]:
            entries = self._unpark(member_id)
            if not self.trees.alive(member_id):
                self._drop_parked(entries)
                continue
            self.node.metrics.unparked.inc(len(entries))
            run: list = []
            for e in entries:  # in arrival order, one _forward per run of one root's messages
                if run and (run[-1].source, run[-1].source_key) != (e.source, e.source_key):
                    self._send_parked(member_id, run)
                    run = []
                run.append(e)
            if run:
                self._send_parked(member_id, run)

    def _send_parked(self, member_id: str, entries: list[_Parked]) -> None:
        first = entries[0]
        self._forward(first.source, first.source_key, [(e.msg, e.topic, [member_id], Hold()) for e in entries])

    def expire(self, now: float | None = None) -> None:
        """Drop (and count as lost) what was parked longer than `park_seconds`."""
        now = time.monotonic() if now is None else now
        for member_id in list(self.parked):
            queue = self.parked[member_id]
            old = []
            while queue and now - queue[0].at >= self.park_seconds:
                old.append(queue.popleft())
            if old:
                self.parked_count -= len(old)
                self.parked_bytes -= sum(e.size for e in old)
                log.warning("%d messages parked for %s expired: it did not come back within %.0f s",
                            len(old), member_id, self.park_seconds)
                self._drop_parked(old)
            if not queue:
                del self.parked[member_id]

    def _drop_parked(self, entries) -> None:
        if entries:
            self.node.metrics.lost.inc(len(entries))

    # -- receiving -------------------------------------------------------------------

    def receive(self, frame: rpb.RelayFrame, ack: Callable[[], None]) -> None:
        """Deliver and forward one incoming frame; call `ack()` when its subtree holds it."""
        if self.node.stopping:
            return  # leaving: the sender re-routes once we are out of its view
        me, source = self.id, frame.source
        job = Job(ack)
        items, touched, local = [], [], []
        for msg in frame.messages:
            ev = event_of(msg)
            key = (source, ev.id.producer_id, ev.id.sequence, msg.slice_index)
            sliced = msg.slice_count > 1
            if msg.aborted:  # its slices' holds must not stop a retry of the publish being forwarded
                for i in range(msg.slice_count):
                    self.slice_holds.pop((source, ev.id.producer_id, ev.id.sequence, i), None)
            dests = msg.destinations
            if len(dests) == 1 and dests[0] == me:
                # A leaf's copy forwards nothing: no hold of its own (the common case), but
                # it waits for an earlier copy's hold, if one forwarded.
                hold = (self.slice_holds if sliced else self.holds).get(key)
                if hold is not None:
                    touched.append(hold)
                mine = self._deliver(msg, ev, local)
                if mine is not None:
                    touched.append(mine)
                continue
            hold = self._hold(key, sliced)
            fresh = [d for d in dests if d != me and d not in hold.covered]
            if fresh:
                hold.covered.update(fresh)
                items.append((msg, ev.topic, fresh, hold))
            touched.append(hold)
            if me in dests:
                mine = self._deliver(msg, ev, local)
                if mine is not None:
                    touched.append(mine)
        if local:
            self.node.deliver_local(local)
        if items:
            self._forward(frame.source, frame.source_key, items)
        for hold in touched:
            job.wait(hold)
        job.arm()

    def _deliver(self, msg: rpb.RelayMessage, event: pb.Event, local: list[pb.Event] | None = None) -> Hold | None:
        """Local delivery. A slice's: a hold that settles once the local subscriptions
        wrote it; a whole event is delivered at once (no hold: the small events' path), or
        queued in `local` to go with the rest of its frame (one filter pass, delivery.py),
        which goes first when a slice comes (FIFO)."""
        if msg.slice_count <= 1 and not msg.aborted:
            if local is None:
                self.node.deliver_local([event])
            else:
                local.append(event)
            return None
        if local:
            self.node.deliver_local(local)
            local.clear()
        hold = Hold()
        self.streams.add(msg, hold)
        return hold

    # -- the root --------------------------------------------------------------------

    def _root_job(self, producers, stripes: frozenset[int]) -> tuple[Job, asyncio.Future]:
        """One job and one future for a run of the root's messages (all the small events of
        one frame flush, or one sliced payload), open under each of their producers for
        `_fence`: per run, not per event (the per-event job and closure were 11% of the
        publishing agent's CPU)."""
        future = asyncio.get_running_loop().create_future()
        opened = []
        for producer in producers:
            p = self._open.get(producer)
            if p is None:
                p = self._open[producer] = _Producer()
            p.open[future] = stripes
            if stripes != _STRIPE0:
                p.striped += 1
            opened.append((producer, p))

        def done():
            for producer, p in opened:
                if p.open.pop(future) != _STRIPE0:
                    p.striped -= 1
                if not p.open and self._open.get(producer) is p:
                    del self._open[producer]
            if not future.done():
                future.set_result(True)

        return Job(done), future

    async def _fence(self, producer: str, stripes: frozenset[int]) -> None:
        """Keep FIFO per producer across trees (see the module doc): before a message on
        `stripes` leaves, wait until no earlier message of `producer` still in flight
        travels on a stripe outside `stripes`; after a view change, until every message of
        `producer` sent on the old view is acknowledged."""
        while (p := self._open.get(producer)) is not None:
            if p.barrier:
                behind, p.barrier = [f for f in p.barrier if not f.done()], []
                if behind:
                    await asyncio.wait(behind)
                continue
            if stripes == _STRIPE0 and not p.striped:
                return  # the common case, O(1): small events after small events
            # A failed message (a payload its publisher abandoned) is done before its job: its
            # order no longer matters, and waiting on it would never end.
            behind = [f for f, s in p.open.items() if not s <= stripes and not f.done()]
            if not behind:
                return
            await asyncio.wait(behind)

    async def publish(self, items: list[tuple[pb.Event, bytes, list[str]]]) -> list[asyncio.Future]:
        """Send a matched batch as the root: (event without payload, payload, destination ids).

        A payload is bytes, or a `slices.PayloadReader` (cut through as it arrives).
        Returns one future per event, done when every destination holds it; the small
        events of one frame flush share one future (a run). Local delivery of a payload
        above the slice size is done here, slice by slice; of the rest, the caller's.
        Waits while a link has a window queued (backpressure).
        """
        futures: list[asyncio.Future] = []
        run = _Run()
        for event, payload, dests in items:
            producer = event.id.producer_id
            remote = [d for d in dests if d != self.id]
            if self.sliced(payload):
                await self._flush(run, futures)
                futures.append(await self._publish_large(event, payload, remote, self.id in dests))
                continue
            p = self._open.get(producer)
            if p is not None and (p.striped or p.barrier):
                # Striped predecessors, or some sent on an older view, in flight: flush what
                # is queued (order), then wait.
                await self._flush(run, futures)
                await self._fence(producer, _STRIPE0)
            run.add(rpb.RelayMessage(encoded_event=encode(event, payload)), event.topic, remote, producer,
                    len(payload) + 64)
            if run.bytes >= FRAME_BYTES:
                await self._flush(run, futures)
        await self._flush(run, futures)
        return futures

    def sliced(self, payload) -> bool:
        """Does this payload go as slices (and so is delivered locally by `publish`)?"""
        return isinstance(payload, PayloadReader) or len(payload) > self.slice_bytes

    async def _flush(self, run: "_Run", futures: list[asyncio.Future]) -> None:
        """Send a run of small events and open its one job: the run's future, once per event."""
        if not run.small:
            return
        job, future = self._root_job(run.producers, _STRIPE0)
        # The root forwards what it publishes once, so its messages need no lookup and no
        # `covered`: one hold for the whole run. Its count goes up once per (frame, message)
        # and down as each frame settles (a re-route counts its new frames before the old
        # one lets go), so it reaches zero when every copy of the run is acknowledged.
        hold = Hold()
        sent = self._forward(self.id, self.node.address, [(m, t, d, hold) for m, t, d in run.small])
        job.wait(hold)
        job.arm()
        futures.extend([future] * len(run.small))
        run.clear()
        await self._room(sent)

    async def _room(self, targets) -> None:
        for target in targets:
            member = self.trees.table.members.get(target)
            if member is not None:
                await self.node.link(member).room()

    async def _publish_large(self, event: pb.Event, payload: bytes | PayloadReader, remote: list[str],
                             local: bool) -> asyncio.Future:
        """Cut a payload into slices and send each down its stripe's tree as it is cut;
        `local`: hand them to this node's subscriptions too, at most `local_window`
        slices ahead of the slowest (back-pressure, as the links' windows for the rest).
        A reader's error (the client's stream ended mid-payload, bad slices) fails the
        future; the destinations drop the partial payload after `slices.IDLE_SECONDS`."""
        size = len(payload)
        count = slice_count(size, self.slice_bytes)
        schedule = self.trees.schedule(event.topic, remote) if remote else (0,)
        producer = event.id.producer_id
        # Slice 0 (the head: subscribers get the message from it on) always takes tree 0, the
        # small events' tree, so it arrives after every earlier small event (FIFO, module doc).
        used = frozenset(schedule[:count]) | _STRIPE0
        await self._fence(producer, used)
        job, future = self._root_job((producer,), used)
        pieces = payload.slices(self.slice_bytes) if isinstance(payload, PayloadReader) else cut(payload,
                                                                                              self.slice_bytes)
        behind: deque[Hold] = deque()  # local slices not yet written out by every local subscription
        i = 0
        try:
            async for chunk in pieces:
                if self.node.stopping:
                    return future
                msg = rpb.RelayMessage(event=slice_event(event, chunk, i), slice_index=i, slice_count=count,
                                       payload_size=size, stripe=schedule[i % len(schedule)] if i else 0)
                i += 1
                hold = Hold()
                sent = self._forward(self.id, self.node.address, [(msg, event.topic, remote, hold)]) if remote else {}
                job.wait(hold)
                if local:
                    mine = self._deliver(msg, msg.event)
                    job.wait(mine)
                    behind.append(mine)
                    await self._local_room(behind)
                await self._room(sent)
        except Exception as e:  # noqa: BLE001 - the reader's error is this publish's outcome
            if not future.done():
                future.set_exception(e)
                future.add_done_callback(asyncio.Future.exception)  # its publisher may be gone: no warning
            # The destinations end it now rather than wait for slices that will not come.
            end = rpb.RelayMessage(event=slice_event(event, b"", 1), slice_index=count, slice_count=count,
                                   payload_size=size, aborted=True)
            if remote:
                self._forward(self.id, self.node.address, [(end, event.topic, remote, Hold())])
            if local:
                self._deliver(end, end.event)
        job.arm()
        return future

    async def _local_room(self, behind: deque[Hold]) -> None:
        while behind and not behind[0].pending:
            behind.popleft()
        if len(behind) > self.local_window:
            done = asyncio.get_running_loop().create_future()
            job = Job(lambda: done.done() or done.set_result(None))
            job.wait(behind[0])
            job.arm()
            await done


_STRIPE0 = frozenset((0,))


def encode(event: pb.Event, payload: bytes) -> bytes:
    """A whole message's `encoded_event`: the event (no payload) and its payload, serialized
    once. Two serialized messages side by side parse as one merged message, so the payload
    is appended as its own field rather than copied into the event first."""
    data = event.SerializeToString()
    return data + pb.Event(payload=payload).SerializeToString() if payload else data


def event_of(msg: rpb.RelayMessage) -> pb.Event:
    """A relay message's event, decoded from its bytes if it is a whole message."""
    return pb.Event.FromString(msg.encoded_event) if msg.encoded_event else msg.event


class _Parked:
    """One message waiting for one DEAD destination to come back."""

    __slots__ = ("at", "source", "source_key", "msg", "topic", "size")

    def __init__(self, at: float, source: str, source_key: str, msg: rpb.RelayMessage, topic: str, size: int):
        self.at, self.source, self.source_key, self.msg, self.topic, self.size = at, source, source_key, msg, topic, size


class _Run:
    """The root's small events queued for one frame flush, and their producers."""

    __slots__ = ("small", "producers", "bytes")

    def __init__(self):
        self.clear()

    def add(self, msg: rpb.RelayMessage, topic: str, remote: list[str], producer: str, size: int) -> None:
        self.small.append((msg, topic, remote))
        self.producers.add(producer)
        self.bytes += size

    def clear(self) -> None:
        self.small: list[tuple[rpb.RelayMessage, str, list[str]]] = []
        self.producers: set[str] = set()
        self.bytes = 0


class _Producer:
    """A producer's messages in flight from this root, how many of them are striped, and
    those in flight when the view last changed (the next message waits for them)."""

    __slots__ = ("open", "striped", "barrier")

    def __init__(self):
        self.open: dict[asyncio.Future, frozenset[int]] = {}
        self.striped = 0
        self.barrier: list[asyncio.Future] = []
