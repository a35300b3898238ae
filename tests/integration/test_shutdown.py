"""Shutdown order seen from outside (runtime/node.py): not serving, drain, stop; and a
matcher's drain (matcher/server.py): it leaves first and answers until the tier routes
around it."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from echelon.v1 import matcher_pb2 as xpb
from echelon.v1 import matcher_pb2_grpc as xgrpc
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


async def health_of(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as ch:
        return (await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)).status


async def test_a_stopping_matcher_leaves_first_and_answers_until_the_other_matchers_route_around_it():
    c = Cluster(agents=2, matchers=2)
    await c.start()
    draining, agent = c.matcher_nodes[1], c.agent_nodes[0]
    ping = asyncio.Event()
    pinger: asyncio.Task | None = None
    stop: asyncio.Task | None = None

    async def peer_still_calling() -> None:
        """What a matcher routing by the old layout does: call it (here Sync, every 0.2 s)."""
        async with grpc.aio.insecure_channel(draining.address) as ch:
            stub = xgrpc.MatcherStub(ch)
            while ping.is_set():
                await stub.Sync(xpb.SyncRequest(member="matcher-0", seq=1), timeout=5)
                await asyncio.sleep(0.2)

    try:
        await c.client(1).create_topic("t", ["x:int:0:100"])
        async with c.client(0).subscribe("t", "x >= 50", name="s", credits=1000) as sub:
            ping.set()
            pinger = asyncio.create_task(peer_still_calling())
            stop = asyncio.create_task(draining.stop(GRACE * 5))

            async def not_serving() -> bool:
                return await health_of(draining.address) == NOT_SERVING

            await wait_for(not_serving, what="NOT_SERVING")
            await wait_for(lambda: agent.membership.members.get(draining.config.id, mpb.Member()).state
                           == mpb.MEMBER_STATE_LEFT, what="the matcher left the view first")
            # Out of the view, yet new calls are still answered while a peer calls.
            async with grpc.aio.insecure_channel(draining.address) as ch:
                zones = await xgrpc.MatcherStub(ch).ListZones(xpb.ListZonesRequest(topic="t"), timeout=5)
            assert zones.member == draining.config.id and not stop.done()
            publisher = c.client(1).publisher()
            for x in range(40, 60):  # matched by the tier without it
                await publisher.publish("t", {"x": x})
            got = sorted([(await sub.next(timeout=10)).attributes["x"] for _ in range(10)])
            assert got == list(range(50, 60))
            ping.clear()
            await pinger
            await asyncio.wait_for(stop, GRACE * 5)  # quiet now: the drain ends, the server stops
        c.crashed.append(draining)  # stopped already
    finally:
        ping.clear()
        for task in (pinger, stop):
            if task is not None and not task.done():
                await asyncio.gather(task, return_exceptions=True)
        if draining not in c.crashed:
            c.crashed.append(draining)
        await c.stop()
