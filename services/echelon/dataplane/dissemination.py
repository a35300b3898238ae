"""The agent's data plane: LBDD dissemination with aggregated acks and path update
(LBDD sections 3.3-3.4; docs/event-path.md, docs/guarantees.md).

Roles. The publishing agent is the root of the topic's tree (`trees.Trees`; its side is
root.py): it sends a copy only to its targets whose subtree holds a destination, and
each copy carries the destination ids of that subtree. A relay (this module's
`receive`) computes its own targets from its own view and does the same with what it
received. In p2p mode the root sends every copy itself. A whole message travels as the
root's bytes (`RelayMessage.encoded_event`): a relay keys its hold and routes it by the
id and topic at the front of those bytes (`frames.peek`), forwards the bytes as they
came, and decodes them only to deliver the message here. Frames leave as bytes put
together per target (`frames.OutFrame`), parsed back only to be re-routed.

Holds (holds.py): acks aggregate up the tree. A node keeps every message it forwards in
a `Hold`, keyed by (root, its id's bytes) for a whole message and (root, producer,
sequence, slice index) for a slice, until each copy it produced is acknowledged; it
acknowledges an incoming frame only once it has delivered locally and every hold the
frame touched is settled. So an ack at the root means the whole subtree has the message.

Path update (Algorithm 3). When a target leaves the view, its link is closed and every
unacknowledged frame on it comes back as not delivered, at once and in order, before
anything is routed on the new view (so a re-routed copy is not overtaken by a newer
message on the same path: FIFO holds across the update); the node re-routes the
destinations those frames still owed (minus the ones gone from the view) over its new
view and sends them to its new targets. If the failed node was a relay, its orphaned
children are among those destinations and get the message again from someone else. A
destination DEAD in the view is parked instead (parking.py) until it is back.

Duplicates. A hold remembers the destinations it already took on (`covered`); a second
copy of a message or slice (a re-route, a resend after a broken stream) is forwarded
only to destinations not yet covered, and its ack waits for the first copy's hold. Local
delivery is deduplicated per message id (the agent's DedupWindow), slices per (message,
index) (`slices.Streams`). A slice for this node is acknowledged once every local
subscription stream wrote it: the local part of the slice's hold. Holds are per root:
within one root's tree every copy a node receives names only destinations in higher
buckets than its own (buckets do not depend on the view), so no two holds can wait on
each other; a client's retry through another agent is another root, hence another hold.

The agent sees all of it through `Host` only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from typing import Callable, Protocol

from echelon.dataplane.frames import OutFrame, destinations, id_key, key_of, peek, slice_body, whole_tail
from echelon.dataplane.holds import Hold, Job, forget_settled
from echelon.dataplane.parking import PARK_BYTES, PARK_MESSAGES, PARK_SECONDS, Parked, Parking
from echelon.dataplane.root import FENCE_SECONDS, Root
from echelon.dataplane.slices import Streams
from echelon.dataplane.trees import Trees
from echelon.v1 import common_pb2 as pb
from echelon.v1 import relay_pb2 as rpb

log = logging.getLogger("echelon.dataplane.dissemination")

MAX_HOLDS = 65_536  # settled holds a relay remembers to suppress duplicate forwarding
# Of slices, apart: a duplicate slice is a re-sent unacknowledged frame, so it is among the
# last windows' worth (8 stripes x 8 MiB = 1,024 slices of 64 KiB); remembering as many
# slice holds as event holds would make an agent's memory grow with the payload size
# (docs/performance.md, bulk memory). One forgotten anyway costs a redundant copy only.
MAX_SLICE_HOLDS = 4_096
# A relay's ack waits this long at most for a destination absent from its view (`_park`): a
# view rebuilt by restarted membership replicas can take seconds to hold every member again.
HOLD_SECONDS = 15.0


class Host(Protocol):
    """What the data plane needs of its agent, and nothing more (linkset.PlaneHost)."""

    id: str
    address: str
    metrics: object  # counters: copies (labelled "as"), rerouted, lost, parked, unparked
    dedup: object  # `key in dedup`: a message id (its bytes: frames.id_key) already delivered here
    stopping: bool  # from then on nothing is acknowledged or re-routed

    def link(self, member) -> object:
        """The `links.Link` to a member (made on first use)."""

    def deliver_local(self, events: list[pb.Event], encoded: list[bytes] | None = None) -> int:
        """Offer whole events (a frame's, in order) to the local subscriptions, once per
        message id; `encoded`: their bytes as received (b"": none), sent on as they are."""

    def open_stream(self, head: pb.Event, size: int) -> list:
        """Offer a sliced payload to the local subscriptions (slices.Streams)."""

    def local_full(self) -> list:
        """The holds of local subscriptions past their bound the last deliveries went to."""


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
        # The dedup window knows a message by its id's bytes (delivery.py); Streams by (producer, sequence).
        self.streams = Streams(node.open_stream, lambda key: id_key(*key) in node.dedup,
                               lambda key: node.dedup.forget(id_key(*key)))
        self._as_root = node.metrics.copies.labels("root")
        self._as_relay = node.metrics.copies.labels("relay")
        # Frames not yet settled: each message's hold (to re-route it), and those distinct.
        self._sent: dict[asyncio.Future, tuple[OutFrame, list[Hold], list[Hold]]] = {}
        self.parking = Parking(park_seconds, park_messages, park_bytes)
        self.root = Root(self)
        # The relay's fences across a view change (`on_view`), per root: the frames of the
        # first stripe relayed on the old view still unacknowledged, and the frames of the
        # first stripe received since, held back until those settle.
        self._shape: tuple | None = None
        self._behind: dict[str, set[asyncio.Future]] = {}
        self._fenced: dict[str, deque[tuple[rpb.RelayFrame, Callable[[], None]]]] = {}
        self._lifting: dict[str, asyncio.Task] = {}
        self.fence_timeouts = 0  # fences (the root's and this relay's) lifted by FENCE_SECONDS, not by their acks

    @property
    def parked_count(self) -> int:
        return self.parking.count

    @property
    def parked_bytes(self) -> int:
        return self.parking.bytes

    # -- holds -----------------------------------------------------------------------

    def _hold(self, key: tuple, sliced: bool = False) -> Hold:
        holds, bound = (self.slice_holds, MAX_SLICE_HOLDS) if sliced else (self.holds, MAX_HOLDS)
        hold = holds.get(key)
        if hold is None:
            hold = holds[key] = Hold()
            if len(holds) > bound + (bound >> 4):
                forget_settled(holds, bound)
        return hold

    # -- sending ---------------------------------------------------------------------

    def forward(self, source: str, source_key: str, items, ack_may_wait: bool = False) -> dict[str, OutFrame]:
        """Route (message, its topic, destinations, hold) items from this node and send the frames.
        A message is a RelayMessage, or the bytes of a whole one's event (the root's, or as
        a relay received them: no RelayMessage built per event).

        Returns the frames sent, by target. Each hold's pending count covers its frames.
        `ack_may_wait`: the frames' receivers may delay their acks (relay.py).
        """
        per_target: dict[str, tuple[OutFrame, list[Hold]]] = {}
        route = self.trees.route
        # Destination lists are shared by the messages for the same agents (the root's:
        # dispatch.py; a relay's: `receive`): each routed once, each route's targets and their
        # destinations' bytes made once. Every list and route is kept so that its id is not
        # reused meanwhile.
        by_list: dict[tuple, tuple] = {}
        by_route: dict[int, tuple] = {}
        for msg, topic, dests, hold in items:
            if msg.__class__ is bytes:
                data, stripe = msg, 0
            else:
                data, stripe = msg.encoded_event, msg.stripe
            known = by_list.get((id(dests), topic, stripe))
            if known is None:
                routed = route(source_key, topic, stripe, dests)
                known = by_route.get(id(routed))
                if known is None:  # per target of the route: where its messages and holds go
                    sinks = []
                    for target, ds in routed[0].items():
                        entry = per_target.get(target)
                        if entry is None:
                            entry = per_target[target] = (OutFrame(source, source_key, ack_may_wait), [])
                        sinks.append((entry[0], entry[1].append, ds, whole_tail(ds)))
                    known = by_route[id(routed)] = (routed, sinks)
                by_list[id(dests), topic, stripe] = (*known, dests)
            lost = known[0][1]
            if lost:
                hold.lost += self._park(source, source_key, rpb.RelayMessage(encoded_event=data) if msg is data
                                        else msg, topic, lost, hold if source != self.id else None)
            if data:  # a whole message: its bytes as they came (no re-encoding)
                for frame, held, _, tail in known[1]:
                    frame.add_whole(tail, data)
                    frame.ordered = True  # a whole message goes on the first stripe
                    held(hold)
            elif known[1]:
                body = slice_body(msg)
                for frame, held, ds, _ in known[1]:
                    frame.add_message(destinations(ds), body)
                    if not stripe:
                        frame.ordered = True
                    held(hold)
        for target, (frame, holds) in per_target.items():
            self._send(target, frame, holds)
        return {t: f for t, (f, _) in per_target.items()}

    def _send(self, target: str, frame: OutFrame, holds: list[Hold]) -> None:
        # Each distinct hold counts the frame once (holds.py): most frames carry one or a few.
        distinct = holds[:1] if holds.count(holds[0]) == len(holds) else list(dict.fromkeys(holds))
        for h in distinct:
            h.pending += 1
        member = self.trees.table.members[target]  # route() only names members of the view
        future = self.node.link(member).send(frame)
        (self._as_root if frame.source == self.id else self._as_relay).inc()
        self._sent[future] = (frame, holds, distinct)
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

    def _settled(self, frame: OutFrame, holds: list[Hold], distinct: list[Hold], future: asyncio.Future) -> None:
        ok = not future.cancelled() and future.result()
        if not ok:
            if self.node.stopping:
                return  # never settle: nothing is acknowledged upstream that did not arrive
            # Path update: the target left the view with this frame unacknowledged.
            messages = frame.messages
            self.node.metrics.rerouted.inc(len(messages))
            self.forward(frame.source, frame.source_key,
                          [(m, event_of(m).topic, list(m.destinations), h) for m, h in zip(messages, holds)])
        for h in distinct:
            h.release()

    # -- parking: destinations whose member is DEAD here --------------------------------

    def _park(self, source: str, source_key: str, msg: rpb.RelayMessage, topic: str, lost: list[str],
              hold: Hold | None = None) -> int:
        """Park the destinations DEAD here, or absent from the view (a view rebuilt by
        restarted membership replicas, or one that has not learned of them yet: parking.py);
        returns how many are dropped instead (counted).

        `hold`: a relay's, for the frame that brought the message. A destination absent from
        this relay's view was alive in the root's, which sent it here: the frame's ack waits
        until it is sent on (or dropped), so the root's fence across a view change keeps
        waiting for it and a later message of the producer cannot overtake it on another
        path (docs/guarantees.md, "Order"). Views converge within seconds: past
        HOLD_SECONDS (a member removed from the view for good) the ack goes, the message
        stays parked. One DEAD here is not waited for (parking.py)."""
        dropped = 0
        entries: dict[bool, Parked] = {}
        for d in lost:
            if self.node.stopping or not self.trees.waits_for(d):
                dropped += 1  # LEFT: nobody to wait for
                continue
            waits = hold is not None and d not in self.trees.dead
            entry = entries.get(False)
            if waits:  # one entry per destination: each releases the hold once (`_let_go`)
                entry = Parked(time.monotonic(), source, source_key, msg, topic, msg.ByteSize(), hold)
            elif entry is None:
                entry = entries[False] = Parked(time.monotonic(), source, source_key, msg, topic, msg.ByteSize())
            if self.parking.park(d, entry):
                self.node.metrics.parked.inc()
                if waits:
                    hold.pending += 1
            else:
                dropped += 1
        if dropped:
            self.node.metrics.lost.inc(dropped)
        return dropped

    def on_view(self) -> None:
        """After `trees.update`: if the trees changed, the root fences its producers'
        messages in flight (root.py) and this node as a relay fences too; the parked messages
        of members ALIVE again are sent, those of members that left or vanished from the view
        dropped. A view that leaves the trees as they were (a topic, a matcher, a member's
        state that routes nothing) fences nothing: every message keeps its path, and a
        fence would wait for acks that a named subscription's consumer may hold for long."""
        shape = (self.trees.table, getattr(self.trees, "hinted", None))
        if shape != self._shape:
            self._shape = shape
            self.root.on_view()
            self._fence()
        for member_id in [m for m in self.parking.members() if m in self.trees.dead]:
            self._let_go(self.parking.parked[member_id])  # DEAD now: its messages wait, the acks do not
        for member_id in [m for m in self.parking.members() if m not in self.trees.dead]:
            if not self.trees.alive(member_id) and not self.trees.waits_for(member_id):
                self._drop_parked(self.parking.take(member_id))
                continue
            if not self.trees.alive(member_id):
                continue  # absent from the view: it waits, bounded by the parking's time
            entries = self.parking.take(member_id)
            self.node.metrics.unparked.inc(len(entries))
            run: list = []
            for e in entries:  # in arrival order, one forward per run of one root's messages
                if run and (run[-1].source, run[-1].source_key) != (e.source, e.source_key):
                    self._send_parked(member_id, run)
                    run = []
                run.append(e)
            if run:
                self._send_parked(member_id, run)

    def _send_parked(self, member_id: str, entries: list[Parked]) -> None:
        first = entries[0]
        self.forward(first.source, first.source_key, [(e.msg, e.topic, [member_id], e.hold or Hold())
                                                      for e in entries])
        self._let_go(entries)  # a waiting hold now waits for the copy just sent

    @staticmethod
    def _let_go(entries) -> None:
        for e in entries:
            if e.hold is not None:
                hold, e.hold = e.hold, None
                hold.release()

    def expire(self, now: float | None = None) -> None:
        """Drop (and count as lost) what was parked longer than `park_seconds`."""
        now = time.monotonic() if now is None else now
        self._let_go(self.parking.holding(now - HOLD_SECONDS))
        for member_id, old in self.parking.expire(now).items():
            log.warning("%d messages parked for %s expired: it did not come back within %.0f s",
                        len(old), member_id, self.parking.seconds)
            self._drop_parked(old)

    def _drop_parked(self, entries) -> None:
        if entries:
            self.node.metrics.lost.inc(len(entries))
            self._let_go(entries)

    # -- the relay's fence -------------------------------------------------------------

    def _fence(self) -> None:
        """The routes changed: a frame relayed from now on may take another path than one
        relayed before it and still on its way, and overtake it (a producer's order, which
        the root's own fence keeps only for the root's routes: root.py). So frames received
        from now on wait, in order, until those relayed on the old view are acknowledged
        (re-routed ones included), for at most FENCE_SECONDS (a stalled link must not stop
        this relay for longer: docs/guarantees.md, "Order").

        Only what sets the order is fenced: per root, the frames carrying a message of the
        first stripe (a whole message, or a sliced payload's head; the other slices join
        the stream their head opened, in any order). So no two fences wait on each other:
        within one root's first-stripe tree copies go only toward higher buckets, which do
        not depend on the view (the module doc), and a wait follows such a copy; two relays
        re-routing toward each other after a crash do so in different roots' or stripes'
        trees, which they no longer hold up."""
        behind: dict[str, list[asyncio.Future]] = {}
        for f, entry in self._sent.items():
            frame = entry[0]
            if frame.source != self.id and frame.ordered and not f.done():
                behind.setdefault(frame.source, []).append(f)
        loop = asyncio.get_running_loop() if behind else None
        for source, futures in behind.items():
            self._behind.setdefault(source, set()).update(futures)
            if source not in self._lifting:
                self._lifting[source] = loop.create_task(self._lift(source), name=f"relay-fence-{source}")

    async def _lift(self, source: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FENCE_SECONDS
        try:
            while (behind := [f for f in self._behind.get(source, ()) if not f.done()]) and loop.time() < deadline:
                await asyncio.wait(behind, timeout=deadline - loop.time())
            if behind:
                self.fence_timeouts += 1
                log.warning("relay fence for %s lifted after %gs with %d frames of the old view unacknowledged",
                            source, FENCE_SECONDS, len(behind))
        finally:
            self._behind.pop(source, None)
            del self._lifting[source]
            fenced = self._fenced.pop(source, deque())
            while fenced:
                if source in self._lifting:  # a new fence went up meanwhile: the rest waits for it
                    self._fenced.setdefault(source, deque()).extend(fenced)
                    break
                self._receive(*fenced.popleft())

    # -- receiving -------------------------------------------------------------------

    def receive(self, frame: rpb.RelayFrame, ack: Callable[[], None]) -> None:
        """Deliver and forward one incoming frame; call `ack()` when its subtree holds it.
        While the relay's fence is up for its root (`_fence`), a frame of the first stripe
        waits its turn."""
        source = frame.source
        if (source in self._lifting or source in self._fenced) and any(m.stripe == 0 for m in frame.messages):
            self._fenced.setdefault(source, deque()).append((frame, ack))
            return
        self._receive(frame, ack)

    def _receive(self, frame: rpb.RelayFrame, ack: Callable[[], None]) -> None:
        if self.node.stopping:
            return  # leaving: the sender re-routes once we are out of its view
        me, source = self.id, frame.source
        job = Job(ack)
        items, touched, local, encoded = [], [], [], []
        holds, decode = self.holds, pb.Event.FromString
        # Per destination set of this frame: its whole messages' one hold (their copies go in
        # the same frames; holds.py) and whether this node is among them.
        groups: dict = {}
        for msg in frame.messages:
            dests = msg.destinations
            data = msg.encoded_event
            if data:
                if len(dests) <= 1:
                    gkey = dests[0] if dests else me  # none named: this node alone (relay.proto)
                    if gkey == me:
                        # The common case, kept short: a whole message for this node alone, delivered
                        # with the rest of the frame (its bytes too: sent on to subscribers as they
                        # came). It waits for an earlier copy's hold, if one forwarded.
                        ev = decode(data)
                        if holds:  # an earlier copy's hold, by its key (`key_of`: the front alone)
                            hold = holds.get((source, key_of(data, ev)))
                            if hold is not None:
                                touched.append(hold)
                        local.append(ev)
                        encoded.append(data)
                        continue
                else:
                    gkey = tuple(dests)
                # A whole message to forward: keyed and routed off its bytes' front (`peek`),
                # forwarded as those bytes, decoded only to be delivered here too.
                front = peek(data)
                ev = None if front is not None else decode(data)
                key, topic = front if ev is None else (ev.id.SerializeToString(), ev.topic)
                key = (source, key)
                group = groups.get(gkey)
                if group is None:
                    ds = (gkey,) if gkey.__class__ is str else gkey
                    group = groups[gkey] = (Hold([d for d in ds if d != me]), me in ds)
                    touched.append(group[0])
                hold, mine = group
                first = holds.get(key)
                if first is None:
                    holds[key] = hold
                    if hold.covered:
                        items.append((data, topic, hold.covered, hold))
                else:  # a second copy: only to those the first did not cover, and its ack waits for the first's
                    fresh = [d for d in hold.covered if d not in first.covered]
                    if fresh:
                        first = holds[key] = Hold([*first.covered, *fresh], first)
                        items.append((data, topic, fresh, first))
                    touched.append(first)
                if mine:
                    local.append(ev or decode(data))
                    encoded.append(data)
                continue
            ev = event_of(msg)
            key = (source, ev.id.producer_id, ev.id.sequence, msg.slice_index)
            sliced = msg.slice_count > 1
            if msg.aborted:  # its slices' holds must not stop a retry of the publish being forwarded
                for i in range(msg.slice_count):
                    self.slice_holds.pop((source, ev.id.producer_id, ev.id.sequence, i), None)
            if len(dests) == 1 and dests[0] == me:
                # A leaf's copy forwards nothing: no hold of its own (the common case), but
                # it waits for an earlier copy's hold, if one forwarded.
                hold = (self.slice_holds if sliced else self.holds).get(key)
                if hold is not None:
                    touched.append(hold)
                mine = self.deliver_here(msg, ev, local, encoded)
                if mine is not None:
                    touched.append(mine)
                continue
            hold = self._hold(key, sliced)
            fresh = [d for d in dests if d != me and d not in hold.covered]
            if fresh:
                hold.covered = [*hold.covered, *fresh]
                items.append((msg, ev.topic, fresh, hold))
            touched.append(hold)
            if me in dests:
                mine = self.deliver_here(msg, ev, local, encoded)
                if mine is not None:
                    touched.append(mine)
        if local:
            self.node.deliver_local(local, encoded)
        if items:
            self.forward(frame.source, frame.source_key, items, frame.ack_may_wait)
        if len(holds) > MAX_HOLDS + (MAX_HOLDS >> 4):  # once sent, this frame's are in flight: kept
            forget_settled(holds, MAX_HOLDS)
        touched += self.node.local_full()  # lagging subscriptions here: acked once they have room
        for hold in touched:
            job.wait(hold)
        job.arm()

    def deliver_here(self, msg: rpb.RelayMessage, event: pb.Event, local: list[pb.Event] | None = None,
                     encoded: list[bytes] | None = None) -> Hold | None:
        """Local delivery. A slice's: a hold that settles once the local subscriptions
        wrote it; a whole event is delivered at once (no hold: the small events' path), or
        queued in `local` (its bytes in `encoded`) to go with the rest of its frame (one
        filter pass, delivery.py), which goes first when a slice comes (FIFO)."""
        if msg.slice_count <= 1 and not msg.aborted:
            if local is None:
                self.node.deliver_local([event], [msg.encoded_event])
            else:
                local.append(event)
                encoded.append(msg.encoded_event)
            return None
        if local:
            self.node.deliver_local(local, encoded)
            local.clear()
            encoded.clear()
        hold = Hold()
        self.streams.add(msg, hold)
        return hold

    # -- the root (root.py) ----------------------------------------------------------

    async def publish(self, items: list[tuple[pb.Event, bytes, list[str]]], ack_may_wait: bool = False,
                      encoded: list[bytes] | None = None, producers: list[str] | None = None) -> list[asyncio.Future]:
        """Send a matched batch as the root (`Root.publish`)."""
        return await self.root.publish(items, ack_may_wait, encoded, producers)

    def sliced(self, payload) -> bool:
        """Does this payload go as slices (and so is delivered locally by `publish`)?"""
        return self.root.sliced(payload)


def event_of(msg: rpb.RelayMessage) -> pb.Event:
    """A relay message's event, decoded from its bytes if it is a whole message."""
    return pb.Event.FromString(msg.encoded_event) if msg.encoded_event else msg.event
