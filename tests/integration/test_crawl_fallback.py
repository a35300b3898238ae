"""CRAWL as the agents' fallback when membership is gone (agent/crawl.py), with real
processes (`echelon.launch`).

Two membership replicas; the publisher's agent (agent-0) is given only the first. That
replica is killed, so agent-0's view stops there. The others go on with the second:
a new matcher joins, the old one is killed. Then the second replica is killed too: no
membership process is left. agent-0's last view names only the dead matcher; it must
find the new one by walking over the members it knew (the other agents), and its
events must reach the subscribers whose filters match them, and only those. Without
the walk every publish fails (Unavailable): the only matcher it knows is dead.
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from echelon.client import AckLevel, Client, errors
from echelon.launch import Cluster, Loopback
from echelon.runtime.member import fetch_view
from echelon.v1 import membership_pb2 as mpb
from tests.harness import wait_for

TOPIC = "ticks"


async def alive_in(replica: str, role: int) -> set[str]:
    view = await fetch_view(replica)
    return {m.id for m in view.members if m.role == role and m.state == mpb.MEMBER_STATE_ALIVE}


async def drain(sub, into: list) -> None:
    while True:
        try:
            msg = await sub.next(timeout=0.5)
        except errors.Timeout:
            continue
        into.append(int(msg.attributes["n"]))
        await msg.ack()


@pytest.mark.timeout(180)
async def test_an_agent_cut_off_from_membership_finds_a_matcher_by_crawl(tmp_path):
    c = Cluster(agents=3, matchers=1, memberships=2, placement=Loopback(0), log_dir=tmp_path)
    first = c.replicas[0]
    command = c.command
    # agent-0 knows only the first replica: when it dies, agent-0 hears nothing more.
    c.command = lambda p: [*command(p)[:-1], first] if p.id == "agent-0" else command(p)  # type: ignore[method-assign]
    await c.start()
    try:
        second = c.replicas[1]
        agents = c.agent_addresses()
        async with Client(agents[1]) as admin:
            await admin.create_topic(TOPIC, ["n:int:0:1000"])
        got: dict[str, list[int]] = {"high": [], "low": []}
        async with Client(agents[1]) as c1, Client(agents[2]) as c2, Client(agents[0]) as c0:
            high, low = c1.subscribe(TOPIC, "n >= 500"), c2.subscribe(TOPIC, "n < 500")
            await high.start()
            await low.start()
            tasks = [asyncio.create_task(drain(high, got["high"])), asyncio.create_task(drain(low, got["low"]))]
            pub = c0.publisher(ack_level=AckLevel.DELIVERED)
            await pub.publish(TOPIC, {"n": 1})  # the cluster works as it stands
            await wait_for(lambda: got["low"] == [1], 10, what="the first event")

            c.signal(c.by_role("membership")[0].id, signal.SIGKILL)
            new = c.plan("matcher")
            await c.launch(new)
            await wait_for(lambda: _has(second, new.id), 30, what="the new matcher in the second replica's view")
            c.signal("matcher-0", signal.SIGKILL)
            await wait_for(lambda: _lacks(second, "matcher-0"), 30, what="matcher-0 dead in the second replica's view")
            # The tier has settled on the new matcher (agent-2 still hears membership).
            await asyncio.wait_for(c2.publisher(ack_level=AckLevel.DELIVERED).publish(TOPIC, {"n": 4}), 30)
            c.signal(c.by_role("membership")[1].id, signal.SIGKILL)
            assert not any(p.running() for p in c.by_role("membership"))

            sent = [2, 700, 3, 999, 499, 500]
            for n in sent:
                await asyncio.wait_for(pub.publish(TOPIC, {"n": n}), 30)  # DELIVERED: raises if it was not
            want_high, want_low = [n for n in sent if n >= 500], [1, 4] + [n for n in sent if n < 500]
            await wait_for(lambda: sorted(got["high"]) == sorted(want_high) and sorted(got["low"]) == sorted(want_low),
                           15, what="every event at the subscribers that match it")
            await asyncio.sleep(0.5)  # nothing more arrives: no event went to a subscriber it does not match
            assert sorted(got["high"]) == sorted(want_high) and sorted(got["low"]) == sorted(want_low)
            log = (tmp_path / "agent-0.log").read_text()
            assert "crawl:" in log and new.id in log
            for t in tasks:
                t.cancel()
            await pub.close(timeout=5)
    finally:
        c.stop()


async def _has(replica: str, matcher: str) -> bool:
    return matcher in await alive_in(replica, mpb.ROLE_MATCHER)


async def _lacks(replica: str, matcher: str) -> bool:
    return matcher not in await alive_in(replica, mpb.ROLE_MATCHER)


async def test_every_member_answers_a_crawl_step_from_its_view():
    import grpc

    from echelon.v1 import crawl_pb2 as cpb
    from echelon.v1 import crawl_pb2_grpc as cgrpc
    from tests.harness import Cluster as InProcess

    c = await InProcess(agents=2, matchers=2).start()
    try:
        for node in (c.agent_nodes[0], c.matcher_nodes[1]):
            async with grpc.aio.insecure_channel(node.address) as ch:
                stub = cgrpc.CrawlStub(ch)
                r = await stub.Step(cpb.CrawlStepRequest(role=mpb.ROLE_MATCHER), timeout=5)
                assert sorted(m.id for m in r.holders) == sorted({"matcher-0", "matcher-1"} - {node.config.id})
                assert sorted(m.id for m in r.neighbours) == sorted({"agent-0", "agent-1"} - {node.config.id})
                assert r.view_age_seconds < 5
                with pytest.raises(grpc.aio.AioRpcError) as bad:
                    await stub.Step(cpb.CrawlStepRequest(role=mpb.ROLE_MEMBERSHIP), timeout=5)
                assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await c.stop()
