"""Batching and dispatch of publishes: validated events queue here in units (a client's
batch, or one event), one future per unit; one task takes whole units until it holds
MAX_BATCH events or the queue is empty, matches them at once on the matcher tier
(attributes only: payloads stay here), delivers locally what is for this agent, hands
this region's destinations to the data plane as the root of their trees and other
regions' to the gateway plane, for a router of this region (DESIGN.md, "The path of one
event", steps 2-4; gateway.py). A payload still arriving (`slices.PayloadStream`) is read
by each plane that has destinations for it, both at once (each through its own reader).

Pipelined matching (issue 12). Up to DEPTH batches are out at once on the one Match
stream (agent/matching.py; the matcher matches them at once and answers in order), and
`_apply` hands on each answer in the order its batch was sent, so FIFO per producer and
the acks are as with one round trip at a time. With one in flight (until issue 12's
third session), an event arriving during a round trip (~2.5 ms at the trickle: entry,
holder, back) waited for it: `admit -> match out` was 0.09 ms alone and 1.87 ms p50 at
1,000/s. DEPTH 4: at 1,000/s events come ~1 ms apart, so about three round trips
overlap; past DEPTH the dispatcher waits and units join the next batch, so under
saturation batches grow rather than calls multiply (the cores are the limit there).

A unit whose publisher waits on it alone (`submit(alone=True)`) makes its dispatch's
frames ask for their acks at once (`ack_may_wait` unset, relay.py)."""

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
DEPTH = 4  # match batches in flight at most (module doc)
AHEAD_EVENTS = 32  # events in flight past which no other batch joins them (module doc)


class Dispatcher:
    def __init__(self, me: str, matching: MatchClient, plane: DataPlane, gateway: DataPlane,
                 deliver: Callable[[list[pb.Event]], int]):
        self.me = me
        self.matching = matching
        self.plane = plane
        self.gateway = gateway
        self.deliver = deliver
        self._queue: asyncio.Queue[tuple[list[pb.Event], list[bytes | PayloadStream], asyncio.Future, bool]] = \
            asyncio.Queue()
        self._rounds: asyncio.Queue[tuple[list, list[pb.Event], list[bytes], asyncio.Future]] = asyncio.Queue()
        self._out = self._out_events = 0  # batches sent and not yet handed on, their events
        self._freed = asyncio.Event()

    def submit(self, events: list[pb.Event], payloads: list[bytes | PayloadStream], alone: bool = False
               ) -> asyncio.Future:
        """Queue validated events (their payloads apart, whole or arriving) as one unit; its
        one future gives (destinations per event, the unit's delivery futures: done when
        every destination holds its events). One future per unit, not per event. `alone`:
        its publisher waits on it with nothing else in flight (its frames' acks must not wait)."""
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((events, payloads, future, alone))
        return future

    async def run(self) -> None:
        """Take whole units into a batch and send it to be matched, while fewer than DEPTH
        batches and AHEAD_EVENTS events are unanswered or not yet handed on (the first
        always goes); `_apply` hands on their answers in the order sent."""
        applier = asyncio.create_task(self._apply(), name="dispatch-apply")
        try:
            while True:
                units = [await self._queue.get()]
                while self._out and (self._out >= DEPTH or self._out_events >= AHEAD_EVENTS):
                    self._freed.clear()  # units that come meanwhile join this batch
                    await self._freed.wait()
                size = len(units[0][0])
                while size < MAX_BATCH and not self._queue.empty():
                    units.append(self._queue.get_nowait())
                    size += len(units[-1][0])
                events = [e for unit in units for e in unit[0]]
                encoded = [e.SerializeToString() for e in events]  # once: to the matcher, then down the trees
                self._out += 1
                self._out_events += size
                self._rounds.put_nowait((units, events, encoded, await self.matching.send(encoded)))
        finally:
            applier.cancel()

    async def _apply(self) -> None:
        """Each batch's answer, in the order the batches were sent (FIFO per producer)."""
        while True:
            units, events, encoded, answer = await self._rounds.get()
            try:
                await self._fan_out(units, events, encoded, await answer)
            except EchelonError as e:
                for _, _, future, _ in units:
                    if not future.done():
                        future.set_exception(e)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - never let the dispatcher die
                log.exception("dispatch failed")
                for _, _, future, _ in units:
                    if not future.done():
                        future.set_exception(Unavailable(f"dispatch failed: {e}"))
            finally:
                self._out -= 1
                self._out_events -= len(events)
                self._freed.set()

    async def _fan_out(self, units, events: list[pb.Event], encoded: list[bytes],
                       results: list[xpb.MatchResult]) -> None:
        """Local delivery here, this region's destinations to the data plane as the root,
        other regions' to the gateway."""
        alive, dead = self.plane.trees.alive, self.plane.trees.dead
        payloads = [p for unit in units for p in unit[1]]
        items, remote, local = [], [], []
        routed: dict[tuple[str, ...], tuple[list[str], list[str]]] = {}  # a batch repeats few agent sets
        for event, payload, result in zip(events, payloads, results):
            agents = tuple([a.agent for a in result.agents])
            split = routed.get(agents)
            if split is None:
                # A DEAD destination is parked by the data plane until it comes back (or the park ends).
                split = routed[agents] = ([a for a in agents if a == self.me or alive(a) or a in dead],
                                          self.gateway.trees.elsewhere(agents))
            dests, far = split
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
                    local.append(whole)
                else:
                    local.append(event)
            items.append((event, payload, dests))
        if local:
            self.deliver(local)  # in order, one filter pass (delivery.py)
        # Accepted: held here. The futures report delivery once every destination has it.
        may_wait = not any(unit[3] for unit in units)  # no publisher waits on these alone
        if any(r[2] for r in remote):  # at once: a payload still arriving is read by both
            delivered, handed = await asyncio.gather(self.plane.publish(items, may_wait, encoded),
                                                     self.gateway.publish(remote, may_wait, encoded))
        else:
            delivered, handed = await self.plane.publish(items, may_wait, encoded), [None] * len(items)
        at = 0
        for unit_events, _, future, _ in units:
            end = at + len(unit_events)
            counts = [len(items[i][2]) + len(remote[i][2]) for i in range(at, end)]
            # The plane's futures are shared by a run of events: each waited on once.
            waits = dict.fromkeys(delivered[at:end])
            waits.update(dict.fromkeys(f for f in handed[at:end] if f is not None))
            at = end
            if not future.done():
                future.set_result((counts, list(waits)))
