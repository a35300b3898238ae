"""The chaos run's intruder (loadtest/chaos/intruder.py) against real servers over mTLS
(in-process, tests/harness.py): every kind of attempt is refused, counted, and leaves no
mark the cluster shows; and, the control that shows the counting can see a success, the
same attempts made with credentials the cluster trusts for them are accepted, deliver,
and leave the marks `evidence` looks for (an event in a real subscription, a member in
the watched view, a plan), so the report's intruder rows FAIL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from echelon.runtime.transport import TlsDir, Transport
from loadtest.chaos.intruder import (ATTEMPTS, JOIN_INCARNATION, Evidence, Intruder, Target, current_plans, evidence,
                                     prepare, report)
from loadtest.chaos.observer import Observer
from loadtest.chaos.workload import SCHEMA, TOPIC, Subscriber, wait_opened
from tests.harness import Cluster

pytestmark = pytest.mark.timeout(90)


async def attack(c: Cluster, creds: Path, rounds: int):
    """The intruder's rounds, with a real subscription to everything on agent-1 and a
    watch on the replica running; returns (counts, evidence, report targets)."""
    client_dir = c.tls_dir("client-test", "client")
    await c.client(0).create_topic(TOPIC, SCHEMA)
    real = Subscriber("real", "agent-1", c.agent_nodes[1].address, "", tls=client_dir)
    observer = Observer(c.replicas, Transport(TlsDir(Path(client_dir))))
    observer.start()
    task = asyncio.create_task(real.run())
    try:
        await wait_opened([real], 20.0)
        target = Target({n.config.id: n.address for n in c.agent_nodes}, c.replicas, victim="agent-0")
        counts = await Intruder(creds, target).run(seconds=30.0, rounds=rounds)
        await asyncio.sleep(1.0)  # a delivery or a view change an accepted write caused arrives
        plans = await current_plans(c.replicas, Transport(TlsDir(Path(client_dir))))
        seen = evidence([real], observer.changes, plans)
    finally:
        real.stopping = True
        await asyncio.gather(task, return_exceptions=True)
        await observer.stop()
    lines, targets = report(counts, seen)
    print("\n".join(lines))
    return counts, seen, targets


async def test_every_intruder_attempt_is_refused_and_leaves_no_mark(tmp_path):
    c = Cluster(agents=2, tls=tmp_path / "tls")
    try:
        await c.start()
        creds = prepare(tmp_path / "creds", c.authority.pem, lambda role, name: c.tls_dir(name, role), "agent-0")
        counts, seen, targets = await attack(c, creds, rounds=2)
    finally:
        await c.stop()
    assert set(counts) == {f"{cred}/{action}" for cred, action in ATTEMPTS}
    for kind, n in counts.items():
        assert n["attempts"] == 2 and n["accepted"] == 0 and n["deliveries"] == 0, (kind, n)
        # Without a certificate from the cluster's CA the handshake fails; with one naming
        # someone else the member check refuses the call.
        want = "UNAVAILABLE" if kind.startswith(("no-cert", "foreign-ca")) else "PERMISSION_DENIED"
        assert n["codes"] == {want: 2}, (kind, n)
    assert seen.total == 0, seen
    assert all(ok for ok, _ in targets.values()), targets


async def test_the_same_attempts_with_trusted_credentials_are_seen_as_accepted(tmp_path):
    """The control: `no-cert` holds a client certificate of the cluster (it may subscribe
    and publish), `foreign-ca` agent-0's own certificate (it may join and relay as agent-0;
    pushing a plan is checked by no identity on this branch)."""
    c = Cluster(agents=2, tls=tmp_path / "tls")
    try:
        await c.start()
        creds = tmp_path / "trusted"
        for name, (cert, role) in {"no-cert": ("client-test", "client"), "foreign-ca": ("agent-0", "agent"),
                                   "client-as-agent": ("client-test", "client"),
                                   "agent-as-other": ("agent-1", "agent")}.items():
            src = Path(c.tls_dir(cert, role))
            (creds / name).mkdir(parents=True)
            for f in ("tls.crt", "tls.key", "ca.crt"):
                (creds / name / f).write_bytes((src / f).read_bytes())
        counts, seen, targets = await attack(c, creds, rounds=2)
    finally:
        await c.stop()
    assert counts["no-cert/subscribe"]["deliveries"] > 0, counts
    for kind in ("no-cert/publish", "foreign-ca/publish", "foreign-ca/join", "foreign-ca/relay", "foreign-ca/plan"):
        assert counts[kind]["accepted"] > 0, (kind, counts[kind])
    assert seen.events_delivered > 0
    assert any(m.startswith("agent-0@") and int(m.split("@")[1]) >= JOIN_INCARNATION for m in seen.members_seen), seen
    assert seen.plans, seen
    assert not targets["intruder: 0 deliveries"][0] and not targets["intruder: 0 writes accepted"][0], targets


def test_an_intruder_that_never_tried_fails_the_report():
    _, targets = report(None, Evidence(), "it exited with 1")
    assert [ok for ok, _ in targets.values()] == [False, False, False]
