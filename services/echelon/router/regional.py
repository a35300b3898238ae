"""A router matching the events sent to its region (docs/event-path.md, "The path of one
event across regions"; dataplane/tiers.py).

A publishing agent's tier names only the agents of the regions it serves; every other
region gets the event through the routers as the pseudo-destination `@<region>`. The
router of that region that receives it asks its own region's matcher tier, as an agent
would, and the LBDD tree is rooted over the answer's agents of its region. So a publish
never waits on a matcher outside the region whose subscriptions it is matched against.

Frames are matched in the order they came (FIFO per publisher, as the relays keep it), the
ones queued while a batch is out together as the next batch: a frame behind one still being
matched waits. No answer (the tier
unreachable): the frame is retried and stays unacknowledged, so the publisher's window
and its `DELIVERED` ack wait; nothing is dropped. While the tier has no live matcher at all
(every one DEAD in the view), the region is treated as a DEAD destination: the frames are
acknowledged at once and wait here, matched when a matcher is back, dropped and counted past
`hold_seconds`. An event that matches nobody here is
acknowledged at once and counted (`echelon_router_unmatched_total`).

A sliced payload's slices must all reach the same agents: the answer for its first slice
is kept (by publisher and message id) and reused for the rest.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable

import grpc

from echelon.contract.errors import Unavailable
from echelon.dataplane.dissemination import event_of
from echelon.dataplane.tiers import is_pseudo, tiers
from echelon.v1 import common_pb2 as pb
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import relay_pb2 as rpb

log = logging.getLogger("echelon.router.regional")

MATCH_METHOD = "/echelon.v1.Matcher/Match"
RETRY = 0.2  # between rounds over the tier's matchers
TIMEOUT = 10.0  # one answer
SLICED = 1024  # answers kept for sliced payloads still arriving
TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
BATCH = 512  # events per Match batch, at most (about: whole frames)


class RegionMatch:
    def __init__(self, membership: Callable[[], object], region: str, local: Callable[[str], bool],
                 unmatched, lost, stopping: Callable[[], bool], hold_seconds: float = 30.0):
        """`region`: the router's joined region (its tier: tiers.py); `local(agent)`: is the
        agent one this router roots trees for; `unmatched`, `lost`: the counters;
        `hold_seconds`: how long frames wait for a tier that is all DEAD (then dropped)."""
        self.membership = membership
        self.region = region
        self.local = local
        self.unmatched = unmatched
        self.lost = lost
        self.stopping = stopping
        self.hold_seconds = hold_seconds
        # (frame, deliver, release: the early ack, when it came)
        self.queue: deque[tuple[rpb.RelayFrame, Callable, Callable[[], None], float]] = deque()
        self._task: asyncio.Task | None = None
        self._stream = None
        self._matcher: str | None = None
        self._channel = None
        self._ids = itertools.count(1)
        self._rr = 0
        self._sliced: OrderedDict[tuple, list[str]] = OrderedDict()

    @property
    def busy(self) -> bool:
        return bool(self.queue)

    def submit(self, frame: rpb.RelayFrame, deliver: Callable[[rpb.RelayFrame], None],
               release: Callable[[], None] = lambda: None) -> None:
        """Resolve `frame`'s pseudo-destinations, then `deliver(frame)`, behind earlier frames.
        `release()`: acknowledge it before, as for a DEAD destination, while the region's
        tier has no live matcher (the frame waits, bounded by `hold_seconds`)."""
        self.queue.append((frame, deliver, release, time.monotonic()))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="region-match")

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
        self._close_stream()

    async def _run(self) -> None:
        while self.queue and not self.stopping():
            # The frames queued meanwhile go as one Match batch (as the agents' dispatcher
            # batches): one answer's wait per batch, not per frame.
            frames, events = [], 0
            for frame, deliver, _, _ in self.queue:
                frames.append((frame, deliver))
                events += len(frame.messages)
                if events >= BATCH:
                    break
            try:
                resolved = await self._resolve([f for f, _ in frames])
            except (Unavailable, grpc.aio.AioRpcError, asyncio.InvalidStateError, asyncio.TimeoutError) as e:
                # Retried whatever the code: the frames stay unacknowledged (held, not lost).
                transient = not isinstance(e, grpc.aio.AioRpcError) or e.code() in TRANSIENT
                (log.info if transient else log.warning)("matching in region %s failed (%s): retrying",
                                                         self.region, e)
                self._close_stream()
                if not self._matchers():
                    self._hold()
                await asyncio.sleep(RETRY)
                continue
            for (_, deliver), out in zip(frames, resolved):
                self.queue.popleft()
                deliver(out)

    def _hold(self) -> None:
        """The tier is all DEAD: its region is served by nobody, as a DEAD agent is not. The
        frames waiting are acknowledged now, so other regions' publishers do not wait on
        this region's matchers; those waiting past `hold_seconds` are dropped and counted."""
        for _, _, release, _ in self.queue:
            release()
        old = time.monotonic() - self.hold_seconds
        while self.queue and self.queue[0][3] < old:
            frame = self.queue.popleft()[0]
            self.lost.inc(sum(len(m.destinations) for m in frame.messages))
            log.warning("region %s: a frame waited %.0f s for a matcher of its tier: dropped", self.region,
                        self.hold_seconds)

    async def _resolve(self, frames: list[rpb.RelayFrame]) -> list[rpb.RelayFrame]:
        todo: list[tuple[int, int, tuple | None]] = []  # (frame, message) to match, and its slice key
        events: list[pb.Event] = []
        answers: dict[tuple[int, int], list[str]] = {}
        for f, frame in enumerate(frames):
            for i, msg in enumerate(frame.messages):
                if not any(map(is_pseudo, msg.destinations)):
                    continue
                ev = event_of(msg)
                sliced = msg.slice_count > 1 or msg.aborted
                key = (frame.source, ev.id.producer_id, ev.id.sequence) if sliced else None
                if key is not None and key in self._sliced:
                    answers[f, i] = self._sliced[key]
                    continue
                if msg.aborted:
                    answers[f, i] = []  # nothing of it was sent here: nothing to end
                    continue
                todo.append((f, i, key))
                # Attributes only: the matchers never need the payload.
                events.append(pb.Event(id=ev.id, topic=ev.topic, attributes=ev.attributes))
        if events:
            results = await self._match(events)
            for (f, i, key), result in zip(todo, results):
                agents = [a.agent for a in result.agents if self.local(a.agent)]
                answers[f, i] = agents
                if key is not None:
                    self._sliced[key] = agents
                    while len(self._sliced) > SLICED:
                        self._sliced.popitem(last=False)
        out = []
        for f, frame in enumerate(frames):
            o = rpb.RelayFrame(source=frame.source, source_key=frame.source_key, ack_may_wait=frame.ack_may_wait)
            for i, msg in enumerate(frame.messages):
                if (f, i) not in answers:
                    o.messages.add().CopyFrom(msg)
                    continue
                named = [d for d in msg.destinations if not is_pseudo(d)]
                dests = named + [a for a in answers[f, i] if a not in named]
                if not dests:
                    self.unmatched.inc()
                    continue
                m = o.messages.add()
                m.CopyFrom(msg)
                m.ClearField("destinations")
                m.destinations.extend(dests)
            out.append(o)
        return out

    def _matchers(self) -> list[mpb.Member]:
        m = self.membership()
        return tiers(m).matchers(m.alive(mpb.ROLE_MATCHER), self.region)

    async def _match(self, events: list[pb.Event]) -> list[xpb.MatchResult]:
        """One batch on the long-lived Match stream to a matcher of this region's tier."""
        matchers = self._matchers()
        if not matchers:
            raise Unavailable(f"no matcher of region {self.region}'s tier is alive")
        if self._stream is None or self._matcher not in {m.id for m in matchers}:
            self._close_stream()
            m = matchers[self._rr % len(matchers)]
            self._rr += 1
            channel = self.membership().transport.dial(m.address)
            self._stream = channel.stream_stream(MATCH_METHOD, request_serializer=lambda b: b,
                                                 response_deserializer=xpb.MatchResponse.FromString)()
            self._matcher, self._channel = m.id, channel
        batch_id = next(self._ids)
        request = xpb.MatchRequest(batch_id=batch_id, agents_only=True)
        request.events.extend(events)
        await self._stream.write(request.SerializeToString())
        response = await asyncio.wait_for(self._stream.read(), TIMEOUT)
        if response is grpc.aio.EOF or response.batch_id != batch_id:
            raise Unavailable("match stream closed or answered out of turn")
        return list(response.results)

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            asyncio.ensure_future(self._channel.close())
        self._stream = self._matcher = None
