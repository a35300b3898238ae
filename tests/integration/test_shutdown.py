"""Shutdown order seen from outside (runtime/node.py): not serving, drain, stop."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from echelon.v1 import membership_pb2 as mpb
from tests.harness import Cluster, wait_for

GRACE = 4.0  # long enough for a few relayed deliveries on a loaded machine
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING


async def watch_health(address: str, service: str, seen: list[int]) -> None:
    async with grpc.aio.insecure_channel(address) as ch:
        async for r in health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=service)):
            seen.append(r.status)


async def test_a_stopping_agent_is_not_serving_while_its_last_deliveries_still_arrive():
    c = Cluster(agents=2)
    await c.start()
    draining, other = c.agent_nodes
    watchers: list[asyncio.Task] = []
    stop: asyncio.Task | None = None
    try:
        await c.client(1).create_topic("t", ["x:int:0:100"])
        async with c.client(0).subscribe("t", "x >= 0", name="s", credits=100) as sub:
            publisher = c.client(1).publisher()
            await publisher.publish("t", {"x": 0})  # through the other agent: a relayed delivery
            assert (await sub.next(timeout=10)).attributes == {"x": 0}
            seen = {name: [] for name in ("", "echelon.v1.PubSub")}
            watchers = [asyncio.create_task(watch_health(draining.address, name, s)) for name, s in seen.items()]
            await wait_for(lambda: all(s == [SERVING] for s in seen.values()), what="both watches see SERVING")

            stop = asyncio.create_task(draining.stop(GRACE))
            await wait_for(lambda: all(s[-1] == NOT_SERVING for s in seen.values()), what="NOT_SERVING")
            # Readiness failed, yet the agent is still a member and still running: what the
            # cluster routes to it now is delivered within the grace.
            assert draining.config.id in {m.id for m in other.membership.alive(mpb.ROLE_AGENT)}
            for x in range(1, 11):
                await publisher.publish("t", {"x": x})
            got = sorted([(await sub.next(timeout=GRACE)).attributes["x"] for _ in range(10)])
            assert got == list(range(1, 11))
            assert not stop.done()
            # and no new call is taken while draining
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async with grpc.aio.insecure_channel(draining.address) as ch:
                    await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        await stop
        # Stopped last: only now does it leave membership.
        await wait_for(lambda: draining.config.id not in other.membership.members
                       or other.membership.members[draining.config.id].state == mpb.MEMBER_STATE_LEFT,
                       what="the drained agent left the view")
        c.crashed.append(draining)  # stopped already
    finally:
        for w in watchers:
            w.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        if stop is not None and not stop.done():
            await asyncio.gather(stop, return_exceptions=True)
            c.crashed.append(draining)
        await c.stop()
