"""Batching and dispatch of publishes: validated events queue here; one task takes them
in batches of up to MAX_BATCH, matches each batch at once on the matcher tier
(attributes only: payloads stay here), delivers locally what is for this agent, hands
this region's destinations to the data plane as the root of their trees and other
regions' to the gateway plane, for a router of this region (DESIGN.md, "The path of one
event", steps 2-4; gateway.py). A payload still arriving (`slices.PayloadStream`) is read
by each plane that has destinations for it, both at once (each through its own reader)."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from echelon.agent.dataplane import DataPlane
from echelon.agent.matching import MatchClient
from echelon.agent.slices import PayloadStream
from echelon.runtime.errors import EchelonError, Unavailable
from echelon.v1 import common_pb2 as pb
from echelon.v1 import matcher_pb2 as xpb

log = logging.getLogger("echelon.agent.dispatch")

MAX_BATCH = 512


class Dispatcher:
    def __init__(self, me: str, matching: MatchClient, plane: DataPlane, gateway: DataPlane,
                 deliver: Callable[[pb.Event], int]):
        self.me = me
        self.matching = matching
        self.plane = plane
        self.gateway = gateway
        self.deliver = deliver
        self._queue: asyncio.Queue[tuple[pb.Event, bytes, asyncio.Future]] = asyncio.Queue()

    def submit(self, event: pb.Event, payload: bytes | PayloadStream = b"") -> asyncio.Future:
        """Queue a validated event (its payload apart, whole or arriving); the future gives
        (destinations, delivery futures)."""
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
        """Local delivery here, this region's destinations to the data plane as the root,
        other regions' to the gateway."""
        alive, dead = self.plane.trees.alive, self.plane.trees.dead
        items, remote = [], []
        for (event, payload, _), result in zip(batch, results):
            # A DEAD destination is parked by the data plane until it comes back (or the park ends).
            dests = [a.agent for a in result.agents if a.agent == self.me or alive(a.agent) or a.agent in dead]
            far = self.gateway.trees.elsewhere(a.agent for a in result.agents)
            if isinstance(payload, PayloadStream):
                readers = iter(payload.split(bool(dests) + bool(far)))  # none: it is read and dropped
                here = next(readers) if dests else b""
                there = next(readers) if far else b""
                remote.append((event, there, far))
                items.append((event, here, dests))
                continue
            remote.append((event, payload, far))
            if self.me in dests and not self.plane.sliced(payload):
                if payload:
                    whole = pb.Event()
                    whole.CopyFrom(event)
                    whole.payload = payload
                    self.deliver(whole)
                else:
                    self.deliver(event)
            items.append((event, payload, dests))
        # Accepted: held here. The futures report delivery once every destination has it.
        if any(r[2] for r in remote):  # at once: a payload still arriving is read by both
            delivered, handed = await asyncio.gather(self.plane.publish(items), self.gateway.publish(remote))
        else:
            delivered, handed = await self.plane.publish(items), [None] * len(items)
        for (*_, future), (_, _, dests), (_, _, far), done, far_done in zip(batch, items, remote, delivered, handed):
            if not future.done():
                future.set_result((len(dests) + len(far), [done] + ([far_done] if far else [])))
