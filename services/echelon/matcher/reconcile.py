"""The tier's side of reconciliation with the agents, and the reaping of copies whose
agent is gone.

- `Reconcile` (agent -> entry): the entry gathers, from itself and every alive matcher
  (`Holdings`), the copies held for the agent, and answers with the buckets whose digest
  differs from the agent's and the entries in them (core/holdings.py). A matcher that
  cannot answer makes the round UNAVAILABLE: a partial answer would look like lost
  copies. The agent decides what to fix (agent/reconcile.py).
- The reaper: an agent the view holds DEAD or LEFT (or holds no more) for the park time
  (the data plane parks its messages that long, dataplane/dissemination.py) will not remove its
  subscriptions itself; each matcher drops the copies it holds for it, keeping
  tombstones so a handoff push still travelling cannot bring them back. An agent that
  comes back in time clears its old copies by reconciling at its start.
"""

from __future__ import annotations

import asyncio
import logging
import time

from echelon.dataplane.dissemination import PARK_SECONDS
from echelon.core.holdings import DIGEST_BYTES, MAX_BUCKETS, Holding, differing
from echelon.matcher.peers import GrpcTransport, PeerUnavailable
from echelon.matcher.tier import Tier
from echelon.contract.errors import InvalidArgument, Unavailable
from echelon.v1 import matcher_pb2 as xpb

log = logging.getLogger("echelon.matcher.reconcile")


def holdings(tier: Tier, agent: str) -> list[Holding]:
    """The copies this matcher holds for `agent`."""
    return [(sid, c.version) for sid, c in tier.store.copies.items() if c.agent == agent]


async def reconcile(tier: Tier, transport: GrpcTransport, request: xpb.ReconcileRequest
                    ) -> xpb.ReconcileResponse:
    """The entry's side of Reconcile."""
    n = len(request.digests)
    if not request.agent or not 1 <= n <= MAX_BUCKETS or any(len(d) != DIGEST_BYTES for d in request.digests):
        raise InvalidArgument(f"reconcile needs an agent and 1 to {MAX_BUCKETS} digests of {DIGEST_BYTES} bytes")
    peers = [p for p in tier.layouts.view.matchers if p != tier.me]
    answers = await asyncio.gather(*(transport.holdings(p, request.agent) for p in peers), return_exceptions=True)
    held = set(holdings(tier, request.agent))
    for peer, answer in zip(peers, answers):
        if isinstance(answer, BaseException):
            if not isinstance(answer, PeerUnavailable):
                log.warning("holdings of %s failed: %r", peer, answer)
            raise Unavailable(f"matcher {peer} did not answer: reconcile again later")
        held.update(answer)
    buckets, entries = differing(list(request.digests), held)
    return xpb.ReconcileResponse(buckets=buckets, holdings=[xpb.Holding(id=i, version=v) for i, v in entries],
                                 matchers=len(peers) + 1)


class Reaper:
    """Drops the copies of agents gone (DEAD, LEFT, out of the view) for `park_seconds`."""

    def __init__(self, tier: Tier, alive_agents, counter, park_seconds: float = PARK_SECONDS):
        self.tier = tier
        self.alive_agents = alive_agents  # () -> ids of the agents the view holds ALIVE or SUSPECT
        self.counter = counter
        self.park_seconds = park_seconds
        self.gone_since: dict[str, float] = {}

    async def run(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.park_seconds / 4))
            await self.once(time.monotonic())

    async def once(self, now: float) -> int:
        alive = set(self.alive_agents())
        held = set(self.tier.store.agents.values())
        for agent in held - alive:
            self.gone_since.setdefault(agent, now)
        for agent in [a for a in self.gone_since if a in alive or a not in held]:
            del self.gone_since[agent]
        due = {a for a, since in self.gone_since.items() if now - since >= self.park_seconds}
        if not due:
            return 0
        items = [(sid, c.version) for sid, c in self.tier.store.copies.items() if c.agent in due]
        # Every matcher reaps for itself: nobody else is told (sent_to: all of them).
        dropped = await self.tier.drop(items, self.tier.me, list(self.tier.layouts.view.matchers))
        self.counter.inc(len(dropped))
        log.warning("dropped %d subscription copies of agents gone for %.0f s: %s", len(dropped),
                    self.park_seconds, ", ".join(sorted(due)))
        return len(dropped)
