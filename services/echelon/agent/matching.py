"""The agent's side of the matcher tier: registration of its subscriptions and batched
`Match` calls over a long-lived stream.

Any matcher is an entry to the whole tier: it stores each subscription in the zone
holding its point and a mirror copy elsewhere, and answers `Match` by visiting only the
zones each event's affected region meets (services/echelon/matcher). So every call goes to ONE
matcher, failing over to the next when it cannot be reached.

`Match` asks for the agents only (the dispatcher routes by agent, never by subscription)
and goes to the matcher the last answer suggested (MatchResponse.entry): the one holding
the zones of most of the batch's events, which answers with the fewest
matcher-to-matcher messages (none when it holds them all: at 1,000 events/s, when each
event travels alone, that saves a request to a peer and its reply per event, two of the
four messages of a match). The agent keeps no layout of its own (sending each batch to
the zones' holders itself would save the entry's hop too, but costs this agent, the
busiest process, a message per holder and a copy of the tier's layout barrier): any
matcher is still a correct entry, the suggestion only saves hops, and at most one
stream switch happens per SWITCH_SECONDS.

Several batches are out at once on the stream (`send`; the dispatcher bounds how many),
each answered in turn: the matcher answers in the order it read them (MatchResponse
echoes `batch_id`, checked). When the stream fails, or moves to a suggested entry, every
batch still unanswered is sent again, in order, on the next one: none is lost and their
answers keep their order (a batch matched twice is harmless, matching changes nothing).
Each stream offers zstd: once the matcher accepts, requests and answers travel as blocks
of the stream's compression contexts (contract/zstream.py, docs/compression.md).

The agent is the owner of its subscriptions. Each registration carries a version (this
agent's clock, increasing), so a re-registration replaces and a removal is not undone by
an older copy still travelling between matchers. The safety net under the tier's own
handoff and mirror recovery: a matcher that appears in the view (new, or restarted with
a new lifetime, runtime/member.py) is sent every subscription again, marked as all of
them (the matcher answers no Match before every alive agent did: matcher/refill.py); the
tier ignores copies it holds.

Registering and removing must complete whoever waits for them (a client that cancels its
stream cancels the handler that opened the subscription): a registration runs in a task
of its own, retried until a matcher acknowledges or `timeout` passes; a removal is
queued (synchronously, so a cancelled caller cannot lose it) and sent by one task,
batched, after any registration of the same id still on its way, and retried until a
matcher acknowledges. What is left over either way is found by reconciliation
(reconcile.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable

import grpc

from echelon.agent.crawl import MatcherSearch
from echelon.contract import zstream
from echelon.contract.errors import Unavailable
from echelon.contract.transport import MAX_MESSAGE_BYTES
from echelon.dataplane.tiers import tiers
from echelon.runtime.member import MemberClient, lifetime
from echelon.contract.wire import varints
from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import matcher_pb2_grpc as xgrpc
from echelon.v1 import membership_pb2 as mpb
from echelon.v1 import tags

log = logging.getLogger("echelon.agent.matching")

# A matcher that cannot answer is skipped for the next one; these codes mean "try another".
RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
               grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
RETRY = 0.1  # first pause between rounds of retries (doubling up to MAX_RETRY)
MAX_RETRY = 2.0
REMOVE_BATCH = 1000
FLUSH_SECONDS = 2.0  # at stop, queued removals are sent for at most this long
FRESH_SECONDS = 30.0  # a matcher this agent refilled this recently is sent removals directly too
SWITCH_SECONDS = 1.0  # at most one move to the suggested entry per this long (no flapping)
MATCH_METHOD = "/echelon.v1.Matcher/Match"  # written as bytes (`send`), not through the stub
EVENTS_TAG = tags.MatchRequest.events
_EVENTS = bytes((EVENTS_TAG,))


class MatchClient:
    def __init__(self, membership: MemberClient, timeout: float = 10.0, region: str | None = None,
                 refills: bool = True):
        """`region`: only the tier serving it is called (dataplane/tiers.py; None: every
        matcher); `refills`: False for a caller that owns no subscriptions (a router)."""
        self.membership = membership
        self.timeout = timeout
        self.region = region
        self.refills = refills
        self.subscriptions: dict[str, xpb.Subscription] = {}  # wanted: registered, or being registered
        self.registering: dict[str, asyncio.Task] = {}
        self._removals: dict[str, int] = {}  # id -> token of the unregister that queued it
        self._waiters: list[tuple[asyncio.Future, dict[str, int]]] = []
        self._removal_queued = asyncio.Event()
        self._remover: asyncio.Task | None = None
        self._tokens = itertools.count(1)
        self._known: dict[str, int] = {}  # matcher id -> lifetime already filled (a refutation keeps it)
        self._filled_at: dict[str, float] = {}  # matcher id -> when this agent refilled it
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stream = None
        self._compressor: zstream.Compressor | None = None  # the stream's, once the matcher accepted
        self._stream_matcher: str | None = None
        self._suggested: str | None = None  # the entry the last answer suggested
        self._switched = -SWITCH_SECONDS  # loop time of the last move to a suggested entry
        self._batch_ids = itertools.count(1)
        self._out: deque[_Round] = deque()  # batches sent and not answered, in the order sent
        self._lock = asyncio.Lock()  # held while writing to the stream
        self._server: asyncio.Task | None = None  # `_serve`
        self._rr = 0
        self._clock = 0
        self._refill: asyncio.Task | None = None
        self.search = MatcherSearch(membership, self._channel, self.on_view)  # when membership is lost
        self.changed: Callable[[list[str]], None] = lambda ids: None  # ids whose entry in `subscriptions` changed

    def _channel(self, m: mpb.Member) -> grpc.aio.Channel:
        ch = self._channels.get(m.address)
        if ch is None:
            ch = self._channels[m.address] = self.membership.transport.dial(m.address)
        return ch

    def _stub(self, m: mpb.Member) -> xgrpc.MatcherStub:
        return xgrpc.MatcherStub(self._channel(m))

    def matchers(self) -> list[mpb.Member]:
        alive = self.membership.alive(mpb.ROLE_MATCHER)
        if self.region is not None:
            alive = tiers(self.membership).matchers(alive, self.region)
        return self.search.matchers(alive)

    def _version(self) -> int:
        """Nanoseconds of this agent's clock, strictly increasing."""
        self._clock = max(self._clock + 1, time.time_ns())
        return self._clock

    def start(self) -> None:
        self._remover = asyncio.create_task(self._remove_loop(), name="matcher-removals")

    async def call(self, method: str, request):
        """One unary call on one matcher, failing over to the others (INVALID_ARGUMENT and
        NOT_FOUND propagate: every matcher would say the same)."""
        matchers = self.matchers()
        if not matchers:
            self.search.missed()
            raise Unavailable("no matcher is alive")
        error: Exception | None = None
        for k in range(len(matchers)):
            m = matchers[(self._rr + k) % len(matchers)]
            try:
                response = await getattr(self._stub(m), method)(request, timeout=self.timeout)
                self._rr += k + 1
                return response
            except grpc.aio.AioRpcError as e:
                if e.code() not in RETRY_CODES:
                    raise
                log.info("%s on %s failed (%s): trying the next matcher", method, m.id, e.code().name)
                self.search.missed(m.id)
                error = e
        raise Unavailable(f"no matcher accepted {method}: {error}")

    async def register(self, subs: list[xpb.Subscription]) -> None:
        """Register (or replace) subscriptions until a matcher acknowledges; Unavailable after
        `timeout`, INVALID_ARGUMENT / NOT_FOUND from the matcher propagate (nothing stored).
        The registration runs on if the caller is cancelled; a caller that gives up
        unregisters, and the removal is sent after it."""
        for s in subs:
            s.version = self._version()
            self.subscriptions[s.id] = s
            self._removals.pop(s.id, None)  # superseded: this version replaces what is there
        self.changed([s.id for s in subs])
        task = asyncio.create_task(self._register(subs))
        for s in subs:
            self.registering[s.id] = task
        task.add_done_callback(lambda t: self._registered(t, subs))
        await asyncio.shield(task)

    def _registered(self, task: asyncio.Task, subs: list[xpb.Subscription]) -> None:
        for s in subs:
            if self.registering.get(s.id) is task:
                del self.registering[s.id]
        if not task.cancelled() and task.exception() is not None:
            log.info("registering %d subscriptions failed: %s", len(subs), task.exception())

    async def _register(self, subs: list[xpb.Subscription]) -> None:
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + self.timeout, RETRY
        while True:
            live = [s for s in subs if self.subscriptions.get(s.id) is s]
            if not live:
                return  # unregistered meanwhile: the removal follows
            try:
                await self.call("Register", xpb.RegisterRequest(subscriptions=live))
            except grpc.aio.AioRpcError:
                for s in live:  # refused before anything was stored
                    if self.subscriptions.get(s.id) is s:
                        del self.subscriptions[s.id]
                self.changed([s.id for s in live])
                raise
            except Unavailable:
                if loop.time() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY)
                continue
            return

    def unregister(self, ids: list[str]) -> asyncio.Future:
        """Forget `ids` now and queue their removal from the tier; the future is done when a
        matcher has acknowledged it (or when they were registered again meanwhile)."""
        waiting = {}
        for i in ids:
            self.subscriptions.pop(i, None)
            waiting[i] = self._removals[i] = next(self._tokens)
        self.changed(list(ids))
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((future, waiting))
        self._removal_queued.set()
        return future

    @property
    def removals_queued(self) -> int:
        return len(self._removals)

    def removing(self, sid: str) -> bool:
        """Is a removal of `sid` queued and not yet acknowledged?"""
        return sid in self._removals

    async def _remove_loop(self) -> None:
        delay = RETRY
        while True:
            if not self._removals:
                self._removal_queued.clear()
                await self._removal_queued.wait()
            batch = dict(itertools.islice(self._removals.items(), REMOVE_BATCH))
            # A registration of one of these ids still on its way finishes first.
            pending = {self.registering[i] for i in batch if i in self.registering}
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            batch = {i: t for i, t in batch.items() if self._removals.get(i) == t}  # not registered again
            if batch:
                request = xpb.RemoveRequest(ids=list(batch), version=self._version())
                try:
                    await self.call("Remove", request)
                    await self._tell_fresh(request)
                except (Unavailable, grpc.aio.AioRpcError) as e:
                    log.warning("removing %d subscriptions failed (%s): retrying in %.1f s", len(batch), e, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_RETRY)
                    continue
            delay = RETRY
            for i, t in batch.items():
                if self._removals.get(i) == t:
                    del self._removals[i]
            self._settle_waiters()

    async def _tell_fresh(self, request: xpb.RemoveRequest) -> None:
        """A matcher refilled lately may not be in the entry's view yet, so the entry's drop
        would miss the copies the refill gave it: it gets the removal directly (best effort:
        the same version, so the order with any registration stays right)."""
        now = time.monotonic()
        fresh = [m for m in self.matchers() if now - self._filled_at.get(m.id, -FRESH_SECONDS) < FRESH_SECONDS]
        results = await asyncio.gather(*(self._stub(m).Remove(request, timeout=self.timeout) for m in fresh),
                                       return_exceptions=True)
        for m, r in zip(fresh, results):
            if isinstance(r, BaseException):
                log.info("removal sent to the fresh matcher %s failed: %s", m.id, r)

    def _settle_waiters(self) -> None:
        still = []
        for future, waiting in self._waiters:
            if any(self._removals.get(i) == t for i, t in waiting.items()):
                still.append((future, waiting))
            elif not future.done():
                future.set_result(None)
        self._waiters = still

    def on_view(self) -> None:
        """Refill matchers that are new to us or came back in a new lifetime (restarted: state lost)."""
        if not self.refills:
            return
        fresh = [m for m in self.matchers() if self._known.get(m.id) != lifetime(m.incarnation)]
        if fresh and (self._refill is None or self._refill.done()):
            self._refill = asyncio.create_task(self._fill(fresh))

    async def _fill(self, matchers: list[mpb.Member]) -> None:
        for m in matchers:
            try:
                # Marked as every subscription this agent owns, even none: the matcher's
                # reconciliation barrier waits for it (matcher/refill.py).
                req = xpb.RegisterRequest(subscriptions=list(self.subscriptions.values()), refill=self.membership.id)
                self._filled_at[m.id] = time.monotonic()
                await self._stub(m).Register(req, timeout=self.timeout)
                self._known[m.id] = lifetime(m.incarnation)
            except grpc.aio.AioRpcError as e:
                log.warning("refilling matcher %s failed: %s %s", m.id, e.code().name, e.details())
                if e.code() not in RETRY_CODES:  # e.g. a topic deleted since: retrying would not help
                    self._known[m.id] = lifetime(m.incarnation)
        if any(self._known.get(m.id) != lifetime(m.incarnation) for m in self.matchers()):
            await asyncio.sleep(0.2)
            self._refill = None
            self.on_view()

    async def send(self, encoded: list[bytes]) -> asyncio.Future:
        """Send a batch of serialized events to be matched behind the batches still
        unanswered (pipelined: the caller bounds how many); the future gives its results,
        agents only, or Unavailable when no matcher answered within `timeout`. Answers come
        in the order sent, from whichever matcher holds the stream: when it fails, every
        unanswered batch is sent again, in order, to the next one (`_serve`)."""
        batch_id = next(self._batch_ids)
        # The request's bytes from the events' (the root sends the same bytes on): no event
        # copied into a MatchRequest and serialized again.
        fields = zip(itertools.repeat(_EVENTS), varints(list(map(len, encoded))), encoded)  # iterated in C
        request = xpb.MatchRequest(batch_id=batch_id, agents_only=True).SerializeToString() + \
            b"".join(itertools.chain.from_iterable(fields))
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        async with self._lock:  # one writer: a failover's re-sends and new batches keep their order
            self._out.append(_Round(batch_id, request, future, loop.time() + self.timeout))
            if self._server is None or self._server.done():
                self._server = asyncio.create_task(self._serve(), name="match-stream")
            elif self._stream is not None:
                try:
                    await self._stream.write(self._coded(request))
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    pass  # the stream is ending: `_serve` sees it and sends this batch again
        return future

    async def _serve(self) -> None:
        """The stream's one reader, while batches are unanswered: open the stream (at the
        suggested entry), send every unanswered batch in order, hand each answer to its
        batch's future; on failure, the next matcher, until the oldest batch's deadline."""
        loop = asyncio.get_running_loop()
        try:
            while self._out:
                matchers = [m for m in self.matchers()
                            if not self.refills or self._known.get(m.id) == lifetime(m.incarnation)]
                if matchers:
                    by_id = {x.id: x for x in matchers}
                    m = by_id.get(self._suggested or "") or by_id.get(self._stream_matcher or "") or \
                        matchers[self._rr % len(matchers)]
                    try:
                        async with self._lock:
                            self._close_stream()
                            stream = self._stream = self._channel(m).stream_stream(
                                MATCH_METHOD, response_deserializer=xpb.MatchResponse.FromString)(
                                metadata=zstream.offer())
                            self._stream_matcher = m.id
                            # Requests go plain until the matcher accepts (an earlier release never does).
                            asyncio.ensure_future(stream.initial_metadata()).add_done_callback(
                                lambda f, stream=stream: self._accepted(stream, f))
                            for r in list(self._out):
                                await stream.write(self._coded(r.request))
                        await self._read(stream, by_id, loop, zstream.Decompressor(MAX_MESSAGE_BYTES))
                        continue  # moving to the suggested entry
                    except (grpc.aio.AioRpcError, Unavailable, asyncio.InvalidStateError) as e:
                        if isinstance(e, grpc.aio.AioRpcError) and e.code() not in RETRY_CODES:
                            r = self._out.popleft()  # answers come in order: the oldest is the one refused
                            if not r.future.done():
                                r.future.set_exception(e)
                            continue
                        log.info("match on %s failed (%s): failing over with %d batches", m.id, e, len(self._out))
                        self.search.missed(m.id)
                        self._suggested = None
                        self._rr += 1
                else:
                    self.search.missed()
                if self._out and loop.time() > self._out[0].deadline:
                    self._fail(Unavailable("no matcher answered in time"))
                    return
                await asyncio.sleep(0.05)
        finally:
            self._close_stream()

    def _accepted(self, stream, metadata: asyncio.Future) -> None:
        if stream is self._stream and not metadata.cancelled() and metadata.exception() is None \
                and zstream.accepted(metadata.result()):
            self._compressor = zstream.Compressor()

    def _coded(self, request: bytes) -> bytes:
        """A request as the current stream takes it: compressed once the matcher accepted."""
        return request if self._compressor is None else zstream.wrap(self._compressor.block(request))

    async def _read(self, stream, matchers: dict[str, mpb.Member], loop: asyncio.AbstractEventLoop,
                    decompressor: zstream.Decompressor) -> None:
        """Answers to their batches, in order; returns to move to a newly suggested entry
        (its unanswered batches sent there again: at most once per SWITCH_SECONDS)."""
        while True:
            response = await stream.read()
            if response is grpc.aio.EOF:
                raise Unavailable("match stream closed")
            if response.zstd:
                try:
                    response = xpb.MatchResponse.FromString(decompressor.message(response.zstd))
                except zstream.CompressionError as e:
                    raise Unavailable(f"match stream: {e}") from None
            if not self._out or response.batch_id != self._out[0].batch_id:
                raise Unavailable(f"match stream answered batch {response.batch_id} out of turn")
            r = self._out.popleft()
            if not r.future.done():
                r.future.set_result(list(response.results))
            self._suggest(response.entry, loop.time())
            if self._suggested in matchers and self._suggested != self._stream_matcher:
                return

    def _suggest(self, entry: str, now: float) -> None:
        """Follow the entry's suggestion, at most once per SWITCH_SECONDS."""
        if entry and entry != self._stream_matcher and now - self._switched >= SWITCH_SECONDS:
            self._suggested, self._switched = entry, now

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
        self._stream = self._stream_matcher = self._compressor = None

    def _fail(self, error: Exception) -> None:
        while self._out:
            r = self._out.popleft()
            if not r.future.done():
                r.future.set_exception(error)

    async def close(self) -> None:
        """Send the queued removals (for at most FLUSH_SECONDS), then stop."""
        if self._removals and self._remover is not None:
            waiters = [f for f, _ in self._waiters]
            if waiters:
                await asyncio.wait(waiters, timeout=FLUSH_SECONDS)
        for task in (self._refill, self._remover, self._server):
            if task:
                task.cancel()
        await self.search.close()
        self._fail(Unavailable("the agent is stopping"))
        await asyncio.gather(*(ch.close() for ch in self._channels.values()), return_exceptions=True)


class _Round:
    """A batch sent to be matched: its id, its request's bytes, its future, when it stops
    waiting for a matcher."""

    __slots__ = ("batch_id", "request", "future", "deadline")

    def __init__(self, batch_id: int, request: bytes, future: asyncio.Future, deadline: float):
        self.batch_id, self.request, self.future, self.deadline = batch_id, request, future, deadline
