"""Dead messages through the SDK on a real cluster, enforced by the agents
(agent/redelivery.py): a message not settled within its ack deadline comes back;
`in_progress()` holds it; `term()` ends it for good; a message given back after
`max_deliveries` deliveries goes to the dead-letter topic with its delivery count, for a
named and a durable subscription. Each checks the agents' own counters as well, so the
client's fallback (client/deadlines.py) could not pass for the agents' work.
tests/integration/test_redelivery_raw.py holds the raw-stub client and the refusals."""

from __future__ import annotations

import asyncio

import pytest

from echelon.client import AckLevel, errors
from tests.harness import wait_for

pytestmark = pytest.mark.asyncio


def counted(cluster, name: str) -> float:
    """An agent counter summed over every agent and label."""
    return sum(s.value for a in cluster.agent_nodes for m in a.registry.collect() if m.name == name
               for s in m.samples if s.name == f"{name}_total")


async def client_of_t(cluster):
    c = cluster.client(1)
    await c.create_topic("t")
    return c


async def published(cluster, topic: str, events: list[dict]) -> None:
    # ACCEPTED: a DELIVERED publish to a named subscription with its client attached waits
    # for that client's ack (docs/guarantees.md), and these clients read only afterwards.
    async with cluster.client(0).publisher(ack_level=AckLevel.ACCEPTED) as pub:
        await pub.publish_batch(topic, events)


async def test_past_its_ack_deadline_the_agent_redelivers_and_the_late_ack_does_nothing(cluster):
    c = await client_of_t(cluster)
    async with c.subscribe("t", "", name="slow", ack_deadline=0.5) as sub:
        await published(cluster, "t", [{"n": 1}])
        first = await sub.next(timeout=10)
        assert first.redelivery_count == 0
        again = await sub.next(timeout=10)  # not settled: the agent's deadline gave it back
        assert (again.attributes, again.redelivery_count) == ({"n": 1}, 1)
        assert counted(cluster, "echelon_agent_ack_deadline_expired") == 1
        await wait_for(lambda: sub.expired == 1 and first.settled, what="the client settles the first copy")
        await first.ack()  # too late: nothing happens
        await again.ack()
        with pytest.raises(errors.Timeout):
            await sub.next(timeout=1.5)  # acked: it does not come back
        assert counted(cluster, "echelon_agent_ack_deadline_expired") == 1


async def test_in_progress_holds_the_message_past_its_deadline_at_the_agent(cluster):
    c = await client_of_t(cluster)
    async with c.subscribe("t", "", name="long", ack_deadline=1.0) as sub:
        await published(cluster, "t", [{"n": 1}])
        m = await sub.next(timeout=10)
        for _ in range(8):  # four deadlines' worth of work, reported every half deadline
            await m.in_progress()
            await asyncio.sleep(0.5)
        assert (sub.expired, m.settled, counted(cluster, "echelon_agent_ack_deadline_expired")) == (0, False, 0)
        await m.ack()
        with pytest.raises(errors.Timeout):
            await sub.next(timeout=1.5)


async def test_term_ends_a_poison_message_for_good(cluster):
    c = await client_of_t(cluster)
    async with c.subscribe("t", "", name="poison", ack_deadline=0.5) as sub:
        await published(cluster, "t", [{"n": 1}, {"n": 2}])
        bad = await sub.next(timeout=10)
        await bad.term()
        good = await sub.next(timeout=10)
        await good.ack()
        assert sub.terminated == 1
        with pytest.raises(errors.Timeout):
            await sub.next(timeout=1.5)  # three deadlines: a termed message is not redelivered
        await wait_for(lambda: counted(cluster, "echelon_agent_terminated") == 1, what="the agent counts it")


@pytest.mark.parametrize("kind", ["named", "durable"])
async def test_past_max_deliveries_the_agent_publishes_to_the_dead_letter_topic(cluster, kind):
    """Delivered twice: nacked once, then left past its deadline; the agent sends it to
    the dead-letter topic with the count, and the application never sees it again. The
    other message is termed: settled for good on a shared stream and on a durable one's."""
    c = cluster.client(1)
    await c.create_topic("jobs", ["n:int"])
    await c.create_topic("jobs.dead")  # no schema: the event's attributes and the dead-letter ones
    async with c.subscribe("jobs.dead", "") as dead, \
            c.subscribe("jobs", "", name=f"worker-{kind}", durable=kind == "durable", ack_deadline=0.5,
                        max_deliveries=2, dead_letter_topic="jobs.dead") as sub:
        await asyncio.sleep(0.3)  # the registrations reach the matcher
        await published(cluster, "jobs", [{"n": 7}, {"n": 8}])
        first = {m.attributes["n"]: m for m in [await sub.next(timeout=10), await sub.next(timeout=10)]}
        await first[8].term()  # (a durable subscription's term is logged as its ack)
        await first[7].nack()
        second = await sub.next(timeout=10)
        assert (second.attributes, second.redelivery_count) == ({"n": 7}, 1)
        # not settled: past its deadline it has been delivered twice, and goes
        letter = await dead.next(timeout=10)
        assert letter.attributes == {"n": 7, "dead_letter_deliveries": 2,
                                     "dead_letter_subscription": sub.name if kind == "named" else letter.attributes[
                                         "dead_letter_subscription"]}
        assert letter.attributes["dead_letter_subscription"].endswith(f"worker-{kind}")
        await letter.ack()
        with pytest.raises(errors.Timeout):
            await sub.next(timeout=1.5)  # the application never sees it a third time
        assert counted(cluster, "echelon_agent_dead_lettered") == 1
        assert counted(cluster, "echelon_agent_ack_deadline_expired") == 1
        assert counted(cluster, "echelon_agent_dead_letter_failures") == 0
        assert counted(cluster, "echelon_agent_terminated") == 1
    if kind == "durable":  # settled in the log: nothing is owed any more
        info = await c.get_subscription(sub.name)
        assert info.backlog_messages == 0
        assert (info.ack_deadline, info.max_deliveries, info.dead_letter_topic) == (0.5, 2, "jobs.dead")


async def test_bad_dead_message_options_are_refused_before_any_call(cluster):
    c = cluster.client(1)
    with pytest.raises(errors.InvalidArgument, match="dead_letter_topic"):
        c.subscribe("t", "", max_deliveries=3)
    with pytest.raises(errors.InvalidArgument, match="ack_deadline"):
        c.subscribe("t", "", ack_deadline=-1)


async def test_with_an_agent_that_does_not_enforce_it_the_client_does(cluster, monkeypatch):
    """An agent from before the contract (simulated: it announces nothing and keeps no
    deadline nor max deliveries): the SDK's fallback (client/deadlines.py) nacks at the
    deadline, and publishes the dead letter itself."""
    import echelon.agent.redelivery as redelivery
    import echelon.agent.registry as registry
    import echelon.agent.shared_stream as shared_stream
    from echelon.agent.subscriptions import Subscription
    from echelon.core.redelivery import Policy

    async def nothing_checked(topics, access, open_):
        return None
    monkeypatch.setattr(registry, "policy_of", lambda p, topic: Policy(None, 0, ""))
    monkeypatch.setattr(shared_stream, "check_open", nothing_checked)
    monkeypatch.setattr(shared_stream, "HEADER", ("x-echelon-something-else", "1"))
    monkeypatch.setattr(Subscription, "headers", lambda self: ())
    c = cluster.client(1)
    await c.create_topic("jobs", ["n:int"])
    await c.create_topic("jobs.dead")
    async with c.subscribe("jobs.dead", "") as dead, \
            c.subscribe("jobs", "", name="old", ack_deadline=0.5, max_deliveries=2,
                        dead_letter_topic="jobs.dead") as sub:
        assert not sub._enforced
        await asyncio.sleep(0.3)
        await published(cluster, "jobs", [{"n": 3}])
        first = await sub.next(timeout=10)
        again = await sub.next(timeout=10)  # the client's deadline nacked the first copy
        assert (again.redelivery_count, sub.expired, first.settled) == (1, 1, True)
        await again.nack()
        letter = await dead.next(timeout=10)  # published by the client
        assert letter.attributes == {"n": 3, "dead_letter_deliveries": 2, "dead_letter_subscription": "old"}
        await wait_for(lambda: sub.dead_lettered == 1, what="counted")
    assert counted(cluster, "echelon_agent_dead_lettered") == counted(cluster, "echelon_agent_ack_deadline_expired") == 0
    assert redelivery.HEADER[0] == "x-echelon-redelivery"  # (only the copies above were changed)


async def test_the_cli_subscribes_with_a_dead_letter_topic_and_says_what_is_wrong(cluster):
    """`echelon sub --max-deliveries --dead-letter-topic` (click's runner, in a thread: the CLI
    runs its own loop) against the agents: a durable subscription created with the policy,
    and the agent's refusals printed as such."""
    from click.testing import CliRunner

    from echelon.cli.main import cli

    agent = cluster.agent_nodes[0].address

    async def echelon(*args: str):
        r = await asyncio.to_thread(CliRunner().invoke, cli, ["sub", "--agent", agent, *args])
        return r.exit_code, r.output

    c = cluster.client(0)
    await c.create_topic("jobs")
    await c.create_topic("jobs.dead")
    code, out = await echelon("--topic", "jobs", "--durable", "cli-worker", "--max-deliveries", "4",
                              "--dead-letter-topic", "jobs.dead", "--timeout", "0.5")
    assert code == 0, out
    info = await c.get_subscription("cli-worker")
    assert (info.ack_deadline, info.max_deliveries, info.dead_letter_topic) == (60.0, 4, "jobs.dead")
    code, out = await echelon("--topic", "jobs", "--max-deliveries", "4", "--dead-letter-topic", "nowhere",
                              "--timeout", "0.5")
    assert code == 1 and "NOT_FOUND" in out and "nowhere" in out, out
    code, out = await echelon("--topic", "jobs", "--max-deliveries", "4", "--timeout", "0.5")
    assert code == 1 and "dead_letter_topic" in out, out
