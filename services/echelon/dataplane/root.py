"""The root of a data plane's trees: the publishing agent (or a router rooting a region)
sends a matched batch down its LBDD trees (LBDD section 3.2; docs/event-path.md, step 3), and
reports each message delivered once every destination holds it.

Small events to one target share a frame; each is serialized once (`encode`: the event
and its payload as the bytes every relay forwards unchanged). A payload above the slice
size goes as slices, each forwarded the moment it is cut or read, striped over S trees
(`trees`), and handed to the local subscriptions slice by slice (`slices`). One job and
one future per run of messages (a frame flush, a sliced payload), not per event.

Order (FIFO per producer while the view is stable). Along one tree the path from the
root to an agent is fixed and every hop is FIFO, so a producer's small events (always
stripe 0) arrive in order. A sliced payload is offered to the subscriptions when its
slice 0 arrives, which always travels on stripe 0: so after every earlier small event,
and after an earlier payload's head (its other slices follow in the subscription's
order: a subscription streams one payload at a time). If message B uses every stripe
that an earlier message A still in flight uses, then on each of A's stripes B's slice
arrives after A's slices, so B completes after A: no wait is needed. Otherwise the root
fences: it waits until such predecessors are acknowledged (`_fence`). Consecutive bulk
messages use the same schedule prefix and so never wait; a small event right after a
striped payload waits for it.

Order across a view change. When the view changes, a message still in flight may be
stuck behind a relay that has not seen the change yet (it re-routes when it does), while
the root's next message takes a new path around it and could overtake it. So the root
fences there too: after `on_view`, a producer's next message leaves only once every
message of that producer sent on the old view is acknowledged (held by its
destinations), or FENCE_SECONDS have passed: a destination may acknowledge late on
purpose (a named subscription keeps a frame until its consumer settles it: agent/
subscriptions.py), and publishing must not stop for a consumer. Publishing pauses for
about the time the slowest relay takes to catch up.
Within one view the tree does not depend on a message's destinations (a destination not
yet advertised as a subscriber gets a direct copy, `trees`), so consecutive messages take
one path to each destination at every node whose view did not change between them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from itertools import repeat
from typing import TYPE_CHECKING

from echelon.dataplane.holds import Hold, Job
from echelon.dataplane.slices import STREAM_WINDOW, PayloadReader, cut, slice_count, slice_event
from echelon.contract.errors import Unavailable
from echelon.contract.wire import length_delimited, varints
from echelon.v1 import common_pb2 as pb
from echelon.v1 import relay_pb2 as rpb
from echelon.v1 import tags

# The longest a fence waits for what was sent on the old view (the root's here, a relay's
# in dissemination.py): a stalled link, or a consumer holding its acks, must not stop
# publishing for longer. Fences are per root and first stripe, so no two wait on each other.
FENCE_SECONDS = 2.0

if TYPE_CHECKING:
    from echelon.dataplane.dissemination import DataPlane

FRAME_BYTES = 1 << 20  # a root frame of small events is closed past this size (events and destinations)
PAYLOAD_TAG = tags.Event.payload


class Root:
    """A data plane's messages as their root: sent down the trees, fenced for order,
    reported delivered."""

    def __init__(self, plane: DataPlane):
        self.plane = plane
        self.id = plane.id
        self.node = plane.node
        self.trees = plane.trees
        self.local_window = max(1, STREAM_WINDOW // plane.slice_bytes)  # slices ahead of the local subscriptions
        self._open: dict[str, _Producer] = {}  # the root's messages not yet acknowledged

    def on_view(self) -> None:
        """After `trees.update`: fence every producer's messages in flight (the view
        changed under them, see "Order across a view change")."""
        for p in self._open.values():
            p.barrier = [f for f in p.open if not f.done()]

    def _root_job(self, producers, stripes: frozenset[int], hold: Hold | None = None) -> tuple[Job, asyncio.Future]:
        """One job and one future for a run of the root's messages (all the small events of
        one frame flush, or one sliced payload), open under each of their producers for
        `_fence`: per run, not per event (the per-event job and closure were 11% of the
        publishing agent's CPU). A destination of `hold` dropped on the way (no route: no
        router of this region, a member gone from the view) fails the future: a DELIVERED
        ack must not claim what nobody will deliver (docs/guarantees.md)."""
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
            if future.done():
                return
            if hold is not None and hold.lost:
                future.set_exception(Unavailable(f"{hold.lost} destinations of this run could not be served (no "
                                                 f"router of this region, or their member left): not delivered"))
                future.exception()  # read by a DELIVERED ack; at ACCEPTED nobody asks (no warning then)
            else:
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
                    _, late = await asyncio.wait(behind, timeout=FENCE_SECONDS)
                    if late:
                        self.plane.fence_timeouts += 1
                continue
            if stripes == _STRIPE0 and not p.striped:
                return  # the common case, O(1): small events after small events
            # A failed message (a payload its publisher abandoned) is done before its job: its
            # order no longer matters, and waiting on it would never end.
            behind = [f for f, s in p.open.items() if not s <= stripes and not f.done()]
            if not behind:
                return
            await asyncio.wait(behind)

    async def publish(self, items: list[tuple[pb.Event, bytes, list[str]]], ack_may_wait: bool = False,
                      encoded: list[bytes] | None = None, producers: list[str] | None = None) -> list[asyncio.Future]:
        """Send a matched batch as the root: (event without payload, payload, destination ids);
        `encoded`: each message's bytes made already (`encode_all`, the dispatcher's), else
        made here;
        `producers`: each event's producer, when the caller knows them (else read off the events).

        A payload is bytes, or a `slices.PayloadReader` (cut through as it arrives).
        Returns one future per event, done when every destination holds it; the small
        events of one frame flush share one future (a run). Local delivery of a payload
        above the slice size is done here, slice by slice; of the rest, the caller's.
        Waits while a link has a window queued (backpressure). `ack_may_wait`: no publisher
        waits on these alone, the small events' frames may have their acks delayed (relay.py).
        """
        futures: list[asyncio.Future] = []
        run = _Run(ack_may_wait)
        me, open_, limit = self.id, self._open, self.plane.slice_bytes
        checked = None  # a producer found not fenced since the last await (the next event's, mostly)
        for i, (event, payload, dests) in enumerate(items):
            if (payload.__class__ is not bytes or len(payload) > limit) and self.sliced(payload):
                await self._flush(run, futures)
                futures.append(await self._publish_large(event, payload, [d for d in dests if d != me], me in dests))
                checked = None
                continue
            producer = producers[i] if producers else event.id.producer_id
            if producer is not checked:
                p = open_.get(producer)
                if p is not None and (p.striped or p.barrier):
                    # Striped predecessors, or some sent on an older view, in flight: flush what
                    # is queued (order), then wait.
                    await self._flush(run, futures)
                    await self._fence(producer, _STRIPE0)
                checked = producer
                run.producers.add(producer)
            # The bytes themselves as the message (`DataPlane.forward`): no RelayMessage per event.
            data = encoded[i] if encoded else encode(event, payload)
            targets = [d for d in dests if d != me] if me in dests else dests
            run.small.append((data, event.topic, targets, run.hold))
            # Its whole size, attributes and destinations too: a frame stays under the
            # receivers' receive limit (agent/server.py `receive_limit`).
            run.bytes += len(data) + 32 * len(targets)
            if run.bytes >= FRAME_BYTES:
                await self._flush(run, futures)
                checked = None
        await self._flush(run, futures)
        return futures

    def sliced(self, payload) -> bool:
        """Does this payload go as slices (and so is delivered locally by `publish`)?"""
        return isinstance(payload, PayloadReader) or len(payload) > self.plane.slice_bytes

    async def _flush(self, run: "_Run", futures: list[asyncio.Future]) -> None:
        """Send a run of small events and open its one job: the run's future, once per event."""
        if not run.small:
            return
        job, future = self._root_job(run.producers, _STRIPE0, run.hold)
        # The root forwards what it publishes once, so its messages need no lookup and no
        # `covered`: one hold for the whole run. Its count goes up once per (frame, message)
        # and down as each frame settles (a re-route counts its new frames before the old
        # one lets go), so it reaches zero when every copy of the run is acknowledged.
        sent = self.plane.forward(self.id, self.node.address, run.small, run.ack_may_wait)
        job.wait(run.hold)
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
        count = slice_count(size, self.plane.slice_bytes)
        schedule = self.trees.schedule(event.topic, remote) if remote else (0,)
        producer = event.id.producer_id
        # Slice 0 (the head: subscribers get the message from it on) always takes tree 0, the
        # small events' tree, so it arrives after every earlier small event (FIFO, module doc).
        used = frozenset(schedule[:count]) | _STRIPE0
        await self._fence(producer, used)
        job, future = self._root_job((producer,), used)
        pieces = payload.slices(self.plane.slice_bytes) if isinstance(payload, PayloadReader) else cut(payload,
                                                                                              self.plane.slice_bytes)
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
                sent = self.plane.forward(self.id, self.node.address, [(msg, event.topic, remote, hold)]) if remote else {}
                job.wait(hold)
                if local:
                    mine = self.plane.deliver_here(msg, msg.event)
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
                self.plane.forward(self.id, self.node.address, [(end, event.topic, remote, Hold())])
            if local:
                self.plane.deliver_here(end, end.event)
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


def encode(event: pb.Event, payload: bytes, data: bytes | None = None) -> bytes:
    """A whole message's `encoded_event`: the event (no payload) and its payload, serialized
    once (`data`: the event's bytes when the dispatcher has them, they went to the matcher
    too). Two serialized messages side by side parse as one merged message, so the payload
    is appended as its own field rather than copied into the event first."""
    if data is None:
        data = event.SerializeToString()
    return data + length_delimited(PAYLOAD_TAG, payload) if payload else data


def encode_all(encoded: list[bytes], payloads: list) -> list[bytes]:
    """`encode` of a batch's events (serialized: `encoded`) with their payloads, put together
    in C when every payload is bytes of 1 to 4,095 bytes (the common case: no Python call
    per event); an event whose payload is not bytes (a payload still arriving) is its bytes
    alone, as for an empty payload."""
    if set(map(type, payloads)) == _BYTES:
        lengths = list(map(len, payloads))
        if min(lengths) > 0 and max(lengths) < _SHORT_PAYLOAD:
            return list(map(b"".join, zip(encoded, repeat(_PAYLOAD_TAG), varints(lengths), payloads)))
    return [encode(None, p, data) if p.__class__ is bytes else data for data, p in zip(encoded, payloads)]


_SHORT_PAYLOAD = 4096  # below it, a payload's length is one table look-up (wire.varints)
_PAYLOAD_TAG = bytes((PAYLOAD_TAG,))
_BYTES = {bytes}


class _Run:
    """The root's small events queued for one frame flush, their producers and their one hold."""

    __slots__ = ("small", "producers", "bytes", "ack_may_wait", "hold")

    def __init__(self, ack_may_wait: bool = False):
        self.ack_may_wait = ack_may_wait
        self.clear()

    def clear(self) -> None:
        # (a whole message's bytes: the event and its payload, topic, destinations, the run's hold)
        self.small: list[tuple[bytes, str, list[str], Hold]] = []
        self.producers: set[str] = set()
        self.bytes = 0
        self.hold = Hold()


class _Producer:
    """A producer's messages in flight from this root, how many of them are striped, and
    those in flight when the view last changed (the next message waits for them)."""

    __slots__ = ("open", "striped", "barrier")

    def __init__(self):
        self.open: dict[asyncio.Future, frozenset[int]] = {}
        self.striped = 0
        self.barrier: list[asyncio.Future] = []
