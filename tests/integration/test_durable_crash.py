"""A crash at every step of a durable acknowledgement, on real processes (the launcher's,
as `echelon up`; each agent's log in its own data dir under tmp): the serving agent
exits as kill -9 would (`os._exit`, from durable_sub.crash_point) right

- `ack-received`: before the ack is written to its log,
- `ack-logged`: after the log write, before the other holder has it,
- `ack-replicated`: after the other holder has it,

then restarts on the same disk. The oracle is the step: nothing published is ever lost,
order is kept, and the acked message comes back exactly when no log the restarted
subscription reads from had its ack: with one holder, iff the crash came before the log
write; with two, also after it (the restarted process takes the older process's copy,
which had not got the ack yet), and not once the replica had it.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from echelon.agent.durable.subscription import CRASH_ENV
from echelon.client import Client, Durable, errors
from echelon.core.durability import holders
from echelon.launch import Cluster, Loopback

pytestmark = pytest.mark.asyncio

TOPIC = "acks"
CASES = [  # (step, holders, the acked message 0 comes back)
    ("ack-received", 1, True), ("ack-logged", 1, False),
    ("ack-received", 2, True), ("ack-logged", 2, True), ("ack-replicated", 2, False),
]


async def open_durable(addresses: list[str], name: str, replicas: int, deadline: float):
    """A durable stream on the first agent that takes it (one that just died is skipped)."""
    while True:
        for address in addresses:
            client = Client(address)
            sub = client.subscribe(TOPIC, "", name=name, durable=Durable(replicas=replicas), max_outstanding=10)
            try:
                await sub.start()
                return client, sub
            except (errors.Unavailable, errors.NotFound, errors.AlreadyExists, errors.Timeout):
                await client.close()
        if time.monotonic() > deadline:
            raise AssertionError(f"no agent served {name} in time")
        await asyncio.sleep(0.2)


async def relaunch(cluster: Cluster, pid: str, monkeypatch, step: str | None) -> None:
    if step is None:
        monkeypatch.delenv(CRASH_ENV, raising=False)
    else:
        monkeypatch.setenv(CRASH_ENV, step)
    cluster.signal(pid, signal.SIGKILL)
    await cluster.launch(cluster.process(pid))
    await cluster.wait_members(60)


# In make test, one case per step, each with the outcome that tells a fault apart (the
# message back with one holder, gone once the replica had the ack); every case: make test-slow.
QUICK = [CASES[0], CASES[3], CASES[4]]


@pytest.mark.timeout(300)
async def test_crash_at_every_step_of_an_ack(tmp_path, monkeypatch):
    await crash_at(QUICK, tmp_path, monkeypatch)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_crash_at_every_step_of_an_ack_every_case(tmp_path, monkeypatch):
    await crash_at(CASES, tmp_path, monkeypatch)


async def crash_at(cases, tmp_path, monkeypatch) -> None:
    cluster = Cluster(agents=2, matchers=1, memberships=1, placement=Loopback(0), log_dir=tmp_path)
    await cluster.start()
    try:
        agents = {p.id: p.address for p in cluster.by_role("agent")}
        async with Client(list(agents.values())) as admin:
            await admin.create_topic(TOPIC)
            for k, (step, replicas, comes_back) in enumerate(cases):
                name = next(f"c{k}-{i}" for i in range(200) if holders(f"c{k}-{i}", agents, 2)[0] == "agent-0")
                await relaunch(cluster, "agent-0", monkeypatch, step)  # only agent-0 crashes at `step`
                deadline = time.monotonic() + 60
                client, sub = await open_durable([agents["agent-1"]], name, replicas, deadline)  # relayed
                async with client.publisher(producer_id=name) as pub:
                    for n in range(5):
                        await pub.publish(TOPIC, {"n": n}, ordering_key="k")
                first = await sub.next(timeout=30)
                assert first.attributes["n"] == 0
                await first.ack()
                exited = time.monotonic() + 30
                while cluster.process("agent-0").running():
                    assert time.monotonic() < exited, f"agent-0 did not crash at {step}"
                    await asyncio.sleep(0.05)
                assert cluster.process("agent-0").popen.returncode == 137
                await sub.close()
                await client.close()
                await relaunch(cluster, "agent-0", monkeypatch, None)
                client, sub = await open_durable(list(agents.values()), name, replicas, time.monotonic() + 60)
                want = list(range(0 if comes_back else 1, 5))
                got = []
                for _ in want:
                    msg = await sub.next(timeout=30)
                    got.append(msg.attributes["n"])
                    await msg.ack()
                with pytest.raises(errors.Timeout):
                    await sub.next(timeout=0.5)
                assert got == want, (step, replicas)
                await sub.close()
                await client.close()
    finally:
        cluster.stop()
