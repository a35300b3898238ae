"""What a replica streams to its members: views (`Membership.Watch`), routing plans
(`Control.WatchPlan`) and heartbeat prompts (`Membership.Heartbeat` replies).

`Streams` is the one owner of every stream's queue: the replica's listeners (a view
delta, a new plan, a SUSPECT verdict) put into them here, and the handlers
(servicers.py) only read. A view watcher that falls behind (its queue full) gets a
snapshot instead of the deltas it missed (core/view.py, the `Watch` contract).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from echelon.core.detector import State, Transition
from echelon.core.view import ViewDelta
from echelon.membership.replica import Replica
from echelon.membership.wire import STATES, delta_to_pb, unix_ms, view_to_pb
from echelon.v1 import membership_pb2 as mpb

log = logging.getLogger("echelon.membership")

RESYNC = object()  # in a watcher's queue: it fell behind, send a snapshot


class BeatReplies:
    """The replies of one Heartbeat stream: the handler's own (a DEAD or LEFT verdict,
    the end) and the replica's prompts once the stream names its member."""

    def __init__(self, streams: Streams):
        self._streams = streams
        self._queue: asyncio.Queue[mpb.BeatReply | None] = asyncio.Queue()
        self.member_id = ""

    def bind(self, member_id: str) -> None:
        """The stream's first beat names its member: prompts for it come here from now on."""
        self.member_id = member_id
        self._streams._claim(self)

    def send(self, reply: mpb.BeatReply) -> None:
        self._queue.put_nowait(reply)

    def end(self) -> None:
        self._queue.put_nowait(None)

    def release(self) -> bool:
        """The stream is over; True if it was still its member's current one."""
        return self._streams._release(self)

    async def __aiter__(self) -> AsyncIterator[mpb.BeatReply]:
        while (reply := await self._queue.get()) is not None:
            yield reply


class Streams:
    def __init__(self, replica: Replica, keepalive: float = 1.0, watch_queue: int = 256):
        self.replica = replica
        self.keepalive = keepalive  # seconds of silence on a view stream before a keepalive
        self.watch_queue = watch_queue
        self._watchers: set[asyncio.Queue] = set()
        self._plan_watchers: set[asyncio.Queue] = set()
        self._beats: dict[str, BeatReplies] = {}
        replica.on_delta.append(self._broadcast)
        replica.on_plan.append(self._broadcast_plan)
        replica.on_transitions.append(self._prompt)

    @property
    def watching(self) -> int:
        """View streams open now."""
        return len(self._watchers)

    # -- what the streams carry ------------------------------------------------------

    def _last_beat_ms(self, member_id: str) -> int:
        return unix_ms(self.replica.detector.get(member_id).last_beat)

    def snapshot(self) -> mpb.View:
        return view_to_pb(self.replica.log.snapshot(), self._last_beat_ms)

    def plan(self) -> mpb.RoutingPlan:
        """The current plan, its epoch this replica's view version when it won here."""
        out = mpb.RoutingPlan()
        if self.replica.plans.plan is not None:
            out.CopyFrom(self.replica.plans.plan)
            out.epoch = self.replica.plan_epoch
        return out

    # -- the streams -----------------------------------------------------------------

    async def views(self, known_version: int) -> AsyncIterator[mpb.ViewUpdate]:
        """A snapshot (or the deltas after `known_version`), then deltas; keepalives while idle."""
        log_ = self.replica.log
        queue: asyncio.Queue = asyncio.Queue(self.watch_queue)
        deltas = log_.since(known_version) if known_version else None
        self._watchers.add(queue)
        try:
            if deltas is None:
                yield mpb.ViewUpdate(snapshot=self.snapshot())
            for d in deltas or ():
                yield mpb.ViewUpdate(delta=delta_to_pb(d, self._last_beat_ms))
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), self.keepalive)
                except asyncio.TimeoutError:
                    yield mpb.ViewUpdate(keepalive=log_.version)
                    continue
                if item is RESYNC:
                    yield mpb.ViewUpdate(snapshot=self.snapshot())
                else:
                    yield mpb.ViewUpdate(delta=item)
        finally:
            self._watchers.discard(queue)

    async def plans(self, known_version: int) -> AsyncIterator[mpb.RoutingPlan]:
        """The current plan, then every plan adopted here."""
        queue: asyncio.Queue = asyncio.Queue()
        self._plan_watchers.add(queue)
        try:
            # The current plan even at known_version: two replicas that accepted different
            # plans of one version settle on one, and the member must learn which.
            if self.replica.plans.version and self.replica.plans.version >= known_version:
                yield self.plan()
            while True:
                yield await queue.get()
        finally:
            self._plan_watchers.discard(queue)

    def heartbeat(self) -> BeatReplies:
        return BeatReplies(self)

    def _claim(self, replies: BeatReplies) -> None:
        self._beats[replies.member_id] = replies  # a newer stream of the member replaces the old

    def _release(self, replies: BeatReplies) -> bool:
        if replies.member_id and self._beats.get(replies.member_id) is replies:
            del self._beats[replies.member_id]
            return True
        return False

    # -- the replica's listeners -----------------------------------------------------

    def _broadcast(self, d: ViewDelta) -> None:
        if not self._watchers:
            return
        delta = delta_to_pb(d, self._last_beat_ms)
        for q in self._watchers:
            if q.full():  # the watcher fell behind: a snapshot replaces what it missed
                while not q.empty():
                    q.get_nowait()
                q.put_nowait(RESYNC)
            else:
                q.put_nowait(delta)

    def _broadcast_plan(self) -> None:
        plan = self.plan()
        log.info("plan %d adopted at epoch %d", plan.version, plan.epoch)
        for q in self._plan_watchers:
            q.put_nowait(plan)

    def _prompt(self, transitions: list[Transition]) -> None:
        """Prompt a member turned SUSPECT to refute with a higher incarnation (its next
        beat refutes anyway)."""
        for t in transitions:
            if t.old is not t.new and t.new is State.SUSPECT and t.member_id in self._beats:
                rec = self.replica.detector.get(t.member_id)
                self._beats[t.member_id].send(mpb.BeatReply(
                    state=STATES[State.SUSPECT], incarnation=rec.incarnation, view_version=self.replica.log.version))
