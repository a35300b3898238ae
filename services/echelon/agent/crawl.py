"""A matcher found by CRAWL when membership cannot be reached (docs/papers.md, CBDLO).

While a membership replica answers, the view is the truth about matchers. When none
has answered for STALE_AFTER seconds and a matcher of the last view fails, the agent
does not give up: it walks over the members of its last view (core/crawl.py), asking
each one step at a time (`Crawl.Step`, served by every member: runtime/crawl.py) for
the matchers its own view holds alive; a member that does not answer is a dead end.
The first member that knows a matcher this agent has not seen fail ends the walk, and
the matchers it named are used beside the view's until membership answers again.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Callable

import grpc

from echelon.core.crawl import MAX_HOPS, TRACE, Crawler
from echelon.runtime.member import STALE_VIEW, MemberClient
from echelon.v1 import crawl_pb2 as cpb
from echelon.v1 import crawl_pb2_grpc as cgrpc
from echelon.v1 import membership_pb2 as mpb

log = logging.getLogger("echelon.agent.crawl")

STALE_AFTER = STALE_VIEW  # a replica confirms the view every second
STEP_TIMEOUT = 1.0
WALK_EVERY = 1.0  # at most one walk started per this long


class MatcherSearch:
    def __init__(self, membership: MemberClient, channel: Callable[[mpb.Member], grpc.aio.Channel],
                 on_found: Callable[[], None], *, max_hops: int = MAX_HOPS, trace: int = TRACE,
                 rng: random.Random | None = None):
        self.membership = membership
        self._channel = channel
        self._on_found = on_found
        self.max_hops, self.trace = max_hops, trace
        self.rng = rng or random.Random()
        self.found: dict[str, mpb.Member] = {}  # matchers named by a walk
        self.failed: set[str] = set()  # matchers that failed since membership was lost
        self.walks = 0
        self.messages = 0
        self._task: asyncio.Task | None = None
        self._started = -WALK_EVERY

    def lost(self) -> bool:
        return self.membership.view_age() > STALE_AFTER

    def matchers(self, alive: list[mpb.Member]) -> list[mpb.Member]:
        """The view's live matchers, and while membership is lost those a walk found."""
        if not self.lost():
            self.found.clear()
            self.failed.clear()
            return alive
        merged = {m.id: m for m in alive}
        merged.update(self.found)
        usable = [m for m in merged.values() if m.id not in self.failed] or list(merged.values())
        return sorted(usable, key=lambda m: m.id)

    def missed(self, matcher_id: str | None = None) -> None:
        """A matcher failed (or none was usable): walk, if membership is lost and no walk runs."""
        if matcher_id:
            self.failed.add(matcher_id)
            self.found.pop(matcher_id, None)
        now = asyncio.get_running_loop().time()
        if self.lost() and (self._task is None or self._task.done()) and now - self._started >= WALK_EVERY:
            self._started = now
            self._task = asyncio.create_task(self._walk(), name="crawl")

    async def _walk(self) -> None:
        self.walks += 1
        me = self.membership.id
        known = {m.id: m for role in (mpb.ROLE_AGENT, mpb.ROLE_MATCHER, mpb.ROLE_ROUTER)
                 for m in self.membership.alive(role) if m.id != me}
        mine = sorted(set(known) - self.failed)
        c = Crawler(me, max_hops=self.max_hops, trace=self.trace, rng=self.rng)
        node = c.next_hop(mine)  # its own table missed: that is why it walks
        while node is not None:
            if node == me:  # a restart from the start
                node = c.next_hop(mine)
                continue
            answer = await self._ask(known[node])
            neighbours: list[str] = []
            if answer is not None:
                holders = [m for m in answer.holders if m.id not in self.failed]
                if holders:
                    c.found()
                    self.messages += c.messages
                    self.found.update((m.id, m) for m in holders)
                    log.info("crawl: %s named matchers %s after %d messages", node, [m.id for m in holders],
                             c.messages)
                    self._on_found()
                    return
                for m in answer.neighbours:
                    if m.id != me:
                        known.setdefault(m.id, m)
                        neighbours.append(m.id)
            node = c.next_hop(neighbours)
        self.messages += c.messages
        log.warning("crawl: no matcher found in %d messages", c.messages)

    async def _ask(self, member: mpb.Member) -> cpb.CrawlStepResponse | None:
        try:
            return await cgrpc.CrawlStub(self._channel(member)).Step(
                cpb.CrawlStepRequest(role=mpb.ROLE_MATCHER), timeout=STEP_TIMEOUT)
        except grpc.aio.AioRpcError as e:
            log.info("crawl: %s did not answer (%s)", member.id, e.code().name)
            return None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
