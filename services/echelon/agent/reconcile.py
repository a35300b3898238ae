"""Reconciliation: what this agent holds against what the matcher tier holds for it.

Every `period` seconds (at once after a start, so a restarted agent clears what its
previous life left in the tier) the agent sends a digest per bucket of its registrations
not in flight (core/holdings.py); the entry gathers every matcher's copies for this
agent and answers with the entries of the buckets that differ. Then, judged against the
agent's state *now* (a subscription opened or closed since the request is not touched):

- `tier`: a copy the agent does not hold at that version (a ghost: a removal that was
  lost, a previous life of this agent) is removed from the tier;
- `agent`: a registration the tier lost (every holder gone at once) or never got (the
  tier was unreachable when a named subscription changed its filter) is sent again;
- `stream`: an ephemeral subscription with no stream (it cannot get one back) is
  closed here.

Each is counted in `echelon_agent_subscriptions_reconciled_total{direction}`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Callable

import grpc

from echelon.agent.matching import MatchClient
from echelon.core.holdings import BUCKETS, diff, digests
from echelon.contract.errors import EchelonError
from echelon.v1 import matcher_pb2 as xpb

log = logging.getLogger("echelon.agent.reconcile")

PERIOD = 30.0
RETRY = 1.0  # until the first round succeeds


class Reconciler:
    def __init__(self, agent: str, matching: MatchClient, orphans: Callable[[], int], counter,
                 period: float = PERIOD):
        self.agent = agent
        self.matching = matching
        self.orphans = orphans  # closes ephemeral subscriptions without a stream; returns how many
        self.counter = counter  # labels(direction)
        self.period = period

    async def run(self) -> None:
        while True:
            ok = await self.once()
            # Jitter: agents restarted together do not reconcile in step.
            await asyncio.sleep(self.period * random.uniform(0.9, 1.1) if ok else min(RETRY, self.period))

    async def once(self) -> bool:
        """One round; False when the tier could not answer (tried again soon)."""
        self.counter.labels("stream").inc(self.orphans())
        m = self.matching
        ours = {sid: s.version for sid, s in m.subscriptions.items() if sid not in m.registering}
        request = xpb.ReconcileRequest(agent=self.agent, digests=digests(ours.items(), BUCKETS))
        try:
            response = await m.call("Reconcile", request)
        except (EchelonError, grpc.aio.AioRpcError) as e:
            log.info("reconciliation skipped: %s", e)
            return False
        if not response.buckets:
            return True
        d = diff(ours, [(h.id, h.version) for h in response.holdings], response.buckets, BUCKETS)
        # Against the state now: what was registered or removed meanwhile is left alone.
        ghosts = sorted({sid for sid, v in d.extra if sid not in m.subscriptions and sid not in m.registering
                         and not m.removing(sid)})
        stale = sorted({sid for sid, v in d.extra if sid in m.subscriptions and sid not in m.registering
                        and m.subscriptions[sid].version != v})
        lost = sorted({sid for sid, v in d.missing if sid in m.subscriptions and sid not in m.registering
                       and m.subscriptions[sid].version == v})
        if ghosts:
            log.warning("reconciliation: the tier held %d subscriptions this agent does not: removing them",
                        len(ghosts))
            m.unregister(ghosts)
            self.counter.labels("tier").inc(len(ghosts))
        again = sorted(set(stale) | set(lost))
        if again:
            log.warning("reconciliation: the tier lacked %d subscriptions of this agent: registering them again",
                        len(again))
            self.counter.labels("agent").inc(len(again))
            try:
                await m.register([m.subscriptions[sid] for sid in again if sid in m.subscriptions])
            except (EchelonError, grpc.aio.AioRpcError) as e:
                log.warning("registering again failed (next round retries): %s", e)
        return True
