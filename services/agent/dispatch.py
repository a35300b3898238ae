"""Batching and dispatch of publishes: validated events queue here; one task takes them
in batches of up to MAX_BATCH, matches each batch at once on the matcher tier
(attributes only: payloads stay here), delivers locally what is for this agent and hands
the rest to the data plane as the root of their trees (DESIGN.md, "The path of one
event", steps 2-3)."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from echelon.agent.dataplane import DataPlane
from echelon.agent.matching import MatchClient
from echelon.runtime.errors import EchelonError, Unavailable
from echelon.v1 import common_pb2 as pb
from echelon.v1 import matcher_pb2 as xpb

log = logging.getLogger("echelon.agent.dispatch")

MAX_BATCH = 512


class Dispatcher:
    def __init__(self, me: str, matching: MatchClient, plane: DataPlane, deliver: Callable[[pb.Event], int]):
        self.me = me
        self.matching = matching
        self.plane = plane
        self.deliver = deliver
        self._queue: asyncio.Queue[tuple[pb.Event, bytes, asyncio.Future]] = asyncio.Queue()

    def submit(self, event: pb.Event, payload: bytes = b"") -> asyncio.Future:
        """Queue a validated event (its payload apart); the future gives (destinations, delivery futures)."""
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((event, payload, future))
        return future

    async def run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                results = await self.matching.match([e for e, _, _ in batch])
                await self._fan_out(batch, results)
            except EchelonError as e:
                for *_, future in batch:
                    if not future.done():
                        future.set_exception(e)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - never let the dispatcher die
                log.exception("dispatch failed")
                for *_, future in batch:
                    if not future.done():
                        future.set_exception(Unavailable(f"dispatch failed: {e}"))

    async def _fan_out(self, batch, results: list[xpb.MatchResult]) -> None:
        """Local delivery here, the rest to the data plane as the root."""
        alive, dead = self.plane.trees.alive, self.plane.trees.dead
        items = []
        for (event, payload, _), result in zip(batch, results):
            # A DEAD destination is parked by the data plane until it comes back (or the park ends).
            dests = [a.agent for a in result.agents if a.agent == self.me or alive(a.agent) or a.agent in dead]
            if self.me in dests:
                if payload:
                    whole = pb.Event()
                    whole.CopyFrom(event)
                    whole.payload = payload
                    self.deliver(whole)
                else:
                    self.deliver(event)
            items.append((event, payload, dests))
        # Accepted: held here. The futures report delivery once every destination has it.
        delivered = await self.plane.publish(items)
        for (*_, future), (_, _, dests), done in zip(batch, items, delivered):
            if not future.done():
                future.set_result((len(dests), [done]))
