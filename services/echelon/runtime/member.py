"""The member side of membership, shared by agents, matchers and routers.

A member joins every membership replica and heartbeats to each of them: every replica
judges liveness from the beats it sees itself, so losing one replica changes nothing
for the others. The view (and the routing plan) is watched from ONE replica: the first
reachable one in the fixed order of `replicas` (`core.replication.watch_target`), so in
steady state every member shares one view history. When that stream breaks the member
fails over to the next replica with known_version 0 (a snapshot: versions are per
replica); it moves back to a preferred replica once its heartbeat stream there has been
up for `PREFER_AFTER` seconds, by which time every member has rejoined it. If no replica
answers, the member goes on with its last view and `view_age()` grows (exported as
`echelon_membership_view_age_seconds`).

Plans are adopted at their epoch: a plan from the watched replica waits until this
member's view (from the same replica) has reached `plan.epoch`.

An incarnation is two numbers in one: `lifetime(inc) * LIFETIME + refutations`, where the
lifetime is the wall-clock millisecond the process started (like Cassandra's gossip
generation and version). SWIM orders incarnations as whole numbers, so a restart always
outranks any refutation of the previous lifetime. Refuting a suspicion (SWIM 4.2) adds
one and keeps the lifetime: the process and its state are the same. A rejoin after DEAD
or LEFT, or after membership refused a stale incarnation, starts a new lifetime, as a
restart does: whoever dropped the member's state must not trust it again. State held
for a peer (a matcher's copies) depends on its lifetime, never on its refutations.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

import grpc

from echelon.core.acl import rule_key
from echelon.core.detector import BEAT_EVERY
from echelon.core.replication import watch_target
from echelon.core.view import View, ViewDelta, merge
from echelon.contract.transport import INCARNATION_KEY, PLAIN, RECONNECT_OPTIONS, Transport
from echelon.v1 import common_pb2 as pb
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import membership_pb2_grpc as mgrpc

log = logging.getLogger("echelon.member")

ALIVE, SUSPECT = mpb.MEMBER_STATE_ALIVE, mpb.MEMBER_STATE_SUSPECT
GONE = (mpb.MEMBER_STATE_DEAD, mpb.MEMBER_STATE_LEFT)
MAX_BACKOFF = 1.0  # between reconnects to one replica; PREFER_AFTER must exceed it
PREFER_AFTER = 2.0
WATCH_RETRY = 1.0  # a replica whose watch stream failed is skipped this long
STALE_VIEW = 3.0  # no update or keepalive (sent every second) for this long: fail over
SILENT_RETRY = 10.0  # a replica whose stream went silent (paused?) is skipped this long
RPC_TIMEOUT = 2.0
LIFETIME = 1000  # incarnations per process lifetime: room for 999 refutations (more roll into a new one)


def membership_channel(address: str, transport: Transport = PLAIN) -> grpc.aio.Channel:
    """A channel to a membership replica (members and peer replicas use it): reconnects fast."""
    return transport.dial(address, RECONNECT_OPTIONS)


async def fetch_view(address: str, transport: Transport = PLAIN) -> mpb.View:
    """One snapshot of the view from the membership replica at `address`, as an observer
    (`echelon status`, the launcher's wait for a cluster) sees it: no join, no heartbeat."""
    async with transport.dial(address) as ch:
        call = mgrpc.MembershipStub(ch).Watch(mpb.WatchRequest(member_id="cli"), timeout=5.0)
        async for update in call:
            call.cancel()
            return update.snapshot
    raise ValueError(f"{address}: the Watch stream ended without a view")


def lifetime(incarnation: int) -> int:
    """The process lifetime (restart epoch) of an incarnation; see the module doc."""
    return incarnation // LIFETIME


def next_lifetime(incarnation: int) -> int:
    """The first incarnation of the lifetime after `incarnation`'s."""
    return (lifetime(incarnation) + 1) * LIFETIME


class MemberClient:
    def __init__(self, member: mpb.Member, replicas: list[str], beat_interval: float = 0.2,
                 transport: Transport = PLAIN):
        if not replicas:
            raise ValueError("at least one membership address is needed")
        self.member = mpb.Member()
        self.member.CopyFrom(member)
        if not self.member.incarnation:
            # Wall-clock milliseconds: a restarted process always comes back higher.
            self.member.incarnation = int(time.time() * 1000) * LIFETIME
        self.member.state = ALIVE
        self.replicas = list(dict.fromkeys(replicas))
        self.beat_interval = beat_interval
        self.transport = transport
        self.version = 0
        self.members: dict[str, mpb.Member] = {}
        self.topics: dict[str, pb.Topic] = {}
        self.acls: dict[str, pb.AclRule] = {}  # rule key -> rule (core/acl.py), from the view
        self.plan: mpb.RoutingPlan | None = None  # the adopted plan
        self.watching: str | None = None  # the replica being watched
        self._view_from: str | None = None  # the replica whose numbering self.version is in
        self._pending_plan: mpb.RoutingPlan | None = None
        self._last_view = 0.0
        self._listeners: list[Callable[[], None]] = []
        self._plan_listeners: list[Callable[[], None]] = []
        self._tasks: list[asyncio.Task] = []
        self._stopped = False
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._made: dict[str, int] = {}  # replica -> the transport generation its channel was dialled at
        self._retired: list[grpc.aio.Channel] = []  # dialled before a certificate rotation; closed at stop
        self._topics_gen = 0
        self._up: dict[str, float] = {}  # replica -> when its heartbeat stream came up
        self._reach = asyncio.Event()
        self._has_view = asyncio.Event()

    @property
    def id(self) -> str:
        return self.member.id

    @property
    def plan_version(self) -> int:
        return self.plan.version if self.plan else 0

    def on_change(self, callback: Callable[[], None]) -> None:
        """Call `callback()` after every view change (snapshot or delta applied)."""
        self._listeners.append(callback)

    def on_plan(self, callback: Callable[[], None]) -> None:
        """Call `callback()` when a new routing plan is adopted (`self.plan`)."""
        self._plan_listeners.append(callback)

    def alive(self, role: int) -> list[mpb.Member]:
        """Members of `role` that the view holds ALIVE or SUSPECT (suspects still get traffic)."""
        return sorted((m for m in self.members.values() if m.role == role and m.state in (ALIVE, SUSPECT)),
                      key=lambda m: m.id)

    def view_age(self) -> float:
        """Seconds since the watched replica last confirmed the view (any update or keepalive)."""
        return time.monotonic() - self._last_view if self._last_view else float("inf")

    def set_topics(self, publishes: set[str], subscribes: set[str]) -> None:
        """The LBDD peer table entry; sent with the next beat."""
        if set(self.member.publishes) == publishes and set(self.member.subscribes) == subscribes:
            return
        del self.member.publishes[:], self.member.subscribes[:]
        self.member.publishes.extend(sorted(publishes))
        self.member.subscribes.extend(sorted(subscribes))
        self._topics_gen += 1

    async def start(self, timeout: float = 30.0) -> None:
        """Join and wait for the first view; raises TimeoutError if no replica answers."""
        for address in self.replicas:
            self._dial(address)
            self._tasks.append(asyncio.create_task(self._beat_loop(address), name=f"beat-{address}"))
        self._tasks.append(asyncio.create_task(self._watch_loop(), name="watch"))
        await asyncio.wait_for(self._has_view.wait(), timeout)

    async def stop(self, leave: bool = True) -> None:
        """Stop beating and watching, and (`leave`) tell the replicas; once."""
        if self._stopped:
            return
        self._stopped = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if leave:
            req = mpb.LeaveRequest(member_id=self.id, incarnation=self.member.incarnation)
            await asyncio.gather(*(mgrpc.MembershipStub(ch).Leave(req, timeout=1.0)
                                   for ch in self._channels.values()), return_exceptions=True)
        await asyncio.gather(*(ch.close() for ch in (*self._channels.values(), *self._retired)),
                             return_exceptions=True)

    def _dial(self, address: str) -> None:
        """(Re)dial a replica; the old channel keeps serving the streams open on it."""
        if address in self._channels:
            self._retired.append(self._channels[address])
        self._channels[address] = membership_channel(address, self.transport)
        self._made[address] = self.transport.generation

    async def report(self, member_id: str, reason: str) -> None:
        """Evidence from the data plane: a peer's stream broke."""
        target = self.members.get(member_id)
        req = mpb.SuspectRequest(reporter=self.id, member_id=member_id, reason=reason,
                                 incarnation=target.incarnation if target else 0)
        await asyncio.gather(*(mgrpc.MembershipStub(ch).Suspect(req, timeout=1.0)
                               for ch in self._channels.values()), return_exceptions=True)

    # -- heartbeats: one stream per replica ------------------------------------------

    def _refute(self, above: int) -> None:
        """Take an incarnation above `above` in this lifetime: the suspicion was wrong."""
        if above >= self.member.incarnation:
            self.member.incarnation = above + 1

    def _new_lifetime(self, above: int) -> None:
        """Take the next lifetime above `above` (rejoin after DEAD or LEFT, stale join): the
        cluster let go of this member's state, so it must count as a restarted process."""
        self.member.incarnation = next_lifetime(max(above, self.member.incarnation))

    async def _beats(self):
        sent = -1
        while True:
            beat = mpb.Beat(member_id=self.id, incarnation=self.member.incarnation)
            if sent != self._topics_gen:
                sent = self._topics_gen
                beat.has_topics = True
                beat.publishes.extend(self.member.publishes)
                beat.subscribes.extend(self.member.subscribes)
            yield beat
            await asyncio.sleep(BEAT_EVERY * self.beat_interval)

    async def _beat_loop(self, address: str) -> None:
        backoff = self.beat_interval
        while not self._stopped:  # not only cancellation: 3.11's wait_for can swallow a cancel
            call = None
            opened = 0.0
            if self.transport.stale(self._made[address]):  # new certificates: new connections present them
                self._dial(address)
            stub = mgrpc.MembershipStub(self._channels[address])
            try:
                await stub.Join(mpb.JoinRequest(member=self.member), timeout=RPC_TIMEOUT)
                call = stub.Heartbeat(self._beats())
                opened = time.monotonic()
                self._set_up(address, True)
                backoff = self.beat_interval
                async for reply in call:
                    if reply.state == SUSPECT:
                        self._refute(reply.incarnation)
                    elif reply.state in GONE:
                        log.warning("declared %s by %s: rejoining", mpb.MemberState.Name(reply.state), address)
                        self._new_lifetime(reply.incarnation)
                        backoff = 0.0
                        break
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.FAILED_PRECONDITION:  # a stale incarnation: come back higher
                    recorded = dict(e.trailing_metadata() or ()).get(INCARNATION_KEY, "")
                    self._new_lifetime(int(recorded) if recorded.isdigit() else self.member.incarnation)
                    backoff = 0.0
                log.debug("membership %s: %s %s", address, e.code().name, e.details())
            finally:
                if call is not None:
                    call.cancel()
                    if time.monotonic() - opened > 2 * self.beat_interval:
                        # A stream that was up broke: reopen it at once. The replica reads
                        # its end as a crash, DEAD unless we are back within a second.
                        backoff = 0.0
                self._set_up(address, False)
            await asyncio.sleep(backoff)
            backoff = min(max(backoff * 2, self.beat_interval), MAX_BACKOFF)

    def _set_up(self, address: str, up: bool) -> None:
        if up:
            self._up[address] = time.monotonic()
        else:
            self._up.pop(address, None)
        self._reach.set()

    # -- the view: watched from one replica ------------------------------------------

    def _target(self, skip: dict[str, float]) -> str | None:
        """The first reachable replica not skipped (`skip`: replica -> until when); a healthy
        current one is left only for a replica that has been up for PREFER_AFTER (a
        restarted replica is still being rejoined by the other members)."""
        now = time.monotonic()
        usable = {a for a in self._up if skip.get(a, 0.0) <= now}
        best = watch_target(self.replicas, usable)
        current = self.watching
        if current in usable and best != current:
            settled = {a for a in usable if now - self._up[a] >= PREFER_AFTER}
            return watch_target(self.replicas, settled | {current})
        return best

    async def _watch_loop(self) -> None:
        skip: dict[str, float] = {}
        # Ends on `_stopped` too: Python 3.11's wait_for swallows a cancel that lands as
        # its inner wait completes (gh-86296), and stop() would wait for this loop forever.
        while not self._stopped:
            target = self._target(skip)
            if target is None:
                self._reach.clear()
                try:
                    await asyncio.wait_for(self._reach.wait(), 0.5)
                except asyncio.TimeoutError:
                    pass
                continue
            if target != self.watching:
                log.info("watching the view from %s", target)
            task = asyncio.create_task(self._watch(target))
            started = time.monotonic()
            try:
                while not task.done():
                    done, _ = await asyncio.wait({task}, timeout=0.25)
                    if done:
                        break
                    if self._target(skip) != target:
                        break  # a preferred replica is back
                    if time.monotonic() - max(started, self._last_view) > STALE_VIEW:
                        # A silent stream: the replica is paused or cut off, though the
                        # connection has not failed yet (gRPC keepalive takes 15 s).
                        log.info("view stream from %s is silent: failing over", target)
                        skip[target] = time.monotonic() + SILENT_RETRY
                        break
                if task.done():
                    task.result()  # a clean end (a gap): resynchronise from the same replica
                    await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():
                    raise
                skip[target] = time.monotonic() + WATCH_RETRY  # the call, not this loop, was cancelled
            except grpc.aio.AioRpcError as e:
                log.info("view stream from %s broke (%s): failing over", target, e.code().name)
                skip[target] = time.monotonic() + WATCH_RETRY
            except Exception:  # noqa: BLE001 - the view must keep flowing
                log.exception("view stream from %s failed", target)
                skip[target] = time.monotonic() + WATCH_RETRY
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _watch(self, address: str) -> None:
        """Follow the view and the plan of one replica until either stream ends."""
        stub = mgrpc.MembershipStub(self._channels[address])
        control = mgrpc.ControlStub(self._channels[address])
        same = address == self._view_from
        if address != self.watching:
            self._pending_plan = None  # its epoch is in the other replica's numbering
        self.watching = address
        view = stub.Watch(mpb.WatchRequest(member_id=self.id, known_version=self.version if same else 0))
        plans = control.WatchPlan(mpb.WatchPlanRequest(known_version=self.plan_version))
        tasks = [asyncio.create_task(self._follow_view(view)), asyncio.create_task(self._follow_plans(plans))]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()
        finally:
            for t in tasks:
                t.cancel()
            view.cancel()
            plans.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _follow_view(self, call) -> None:
        async for update in call:
            if not self._apply(update):
                return  # a gap: ask again from our version
            self._last_view = time.monotonic()
            self._has_view.set()

    async def _follow_plans(self, call) -> None:
        async for plan in call:
            newer = plan.version > self.plan_version
            if newer or (plan.version == self.plan_version and not _same_plan(plan, self.plan)):
                self._pending_plan = plan
                self._adopt_plan()

    def _apply(self, update: mpb.ViewUpdate) -> bool:
        """One update from the watched replica; False when the delta does not follow our view."""
        kind = update.WhichOneof("kind")
        if kind == "keepalive":
            return update.keepalive == self.version
        if kind == "snapshot":
            snap = update.snapshot
            self.members = {m.id: m for m in snap.members}
            self.topics = {t.name: t for t in snap.topics}
            self.acls = {rule_key(a.principal, a.pattern): a for a in snap.acls}
            self.version = snap.version
            self._view_from = self.watching
        else:
            d = update.delta
            local = View(self.version, self.members, self.topics, self.acls)
            view = merge(local, ViewDelta(d.from_version, d.version, {m.id: m for m in d.upserted},
                                          {t.name: t for t in d.topics_upserted}, tuple(d.topics_deleted),
                                          tuple(d.removed),
                                          {rule_key(a.principal, a.pattern): a for a in d.acls_upserted},
                                          tuple(d.acls_deleted)))
            if view is None:
                return False
            if view is local:
                return True  # a replay
            self.members, self.topics, self.version = dict(view.members), dict(view.topics), view.version
            self.acls = dict(view.acls)
        self._adopt_plan()
        for callback in self._listeners:
            callback()
        return True

    def _adopt_plan(self) -> None:
        plan = self._pending_plan
        if plan is None or self._view_from != self.watching or self.version < plan.epoch:
            return
        self._pending_plan = None
        self.plan = plan
        for callback in self._plan_listeners:
            callback()


def _same_plan(a: mpb.RoutingPlan, b: mpb.RoutingPlan | None) -> bool:
    """Equal but for the epoch (each replica sets its own)."""
    if b is None:
        return False
    a2, b2 = mpb.RoutingPlan(), mpb.RoutingPlan()
    a2.CopyFrom(a)
    b2.CopyFrom(b)
    a2.epoch = b2.epoch = 0
    return a2 == b2
