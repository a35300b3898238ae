"""The launcher (`echelon.launch`) with real processes on loopback: what it lists before
anything starts is what then serves (gRPC health, membership's view, /metrics, an
auxiliary's HTTP address), a periodic auxiliary runs again and again, one process is
killed and launched again, a process that exits early fails the start with its log, and
stop leaves no process behind."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from echelon.runtime.member import fetch_view
from echelon.launch import Cluster, Loopback, free_port, free_ports
from echelon.v1 import membership_pb2 as mpb
from tests.harness import wait_for
from tests.integration.test_cli import alive


async def serving(address: str) -> bool:
    async with grpc.aio.insecure_channel(address) as ch:
        r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return r.status == health_pb2.HealthCheckResponse.SERVING


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def test_the_layout_and_the_plan_are_checked():
    c = Cluster(agents=2, matchers=1, memberships=3, routers=1, placement=Loopback(7100))
    ports = {p.id: (p.address, p.metrics) for p in c.processes}
    assert ports["membership-2"] == ("127.0.0.1:7102", "127.0.0.1:8102")
    assert ports["matcher-0"] == ("127.0.0.1:7120", "127.0.0.1:8120")
    assert ports["router-0"] == ("127.0.0.1:7160", "127.0.0.1:8160")
    assert ports["agent-1"] == ("127.0.0.1:7201", "127.0.0.1:8201")
    assert c.replicas == ["127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.1:7102"]
    assert c.command(c.process("agent-0"))[-2:] == ["--membership", ",".join(c.replicas)]
    assert c.command(c.process("membership-0"))[-2:] == ["--peers", ",".join(c.replicas)]
    with pytest.raises(ValueError, match="membership replica before"):
        c.plan("membership")
    with pytest.raises(ValueError, match="planned twice"):
        c.plan("router", id="router-0")
    with pytest.raises(ValueError, match="role 'spark'"):
        c.plan("spark")
    with pytest.raises(ValueError, match="agents: 0"):
        Cluster(agents=0)
    free = Cluster(agents=3, placement=Loopback(0))
    used = [a.rsplit(":", 1)[1] for p in free.processes for a in (p.address, p.metrics)]
    assert len(set(used)) == len(used) == 2 * 7
    assert len(set(free_ports(50))) == 50


@pytest.mark.timeout(120)
async def test_what_is_listed_serves_and_stop_leaves_nothing(tmp_path):
    cluster = Cluster(agents=1, matchers=1, memberships=1, placement=Loopback(0), log_dir=tmp_path / "logs",
                      common=["--grace", "1"])
    router = cluster.plan("router", region="eu")
    web = f"127.0.0.1:{free_port()}"
    cluster.add_aux("web", [sys.executable, "-m", "http.server", web.split(":")[1], "--bind", "127.0.0.1",
                            "--directory", str(tmp_path)], address=web, ready_url=f"http://{web}/")
    ticks = tmp_path / "ticks"
    cluster.add_aux("tick", [sys.executable, "-c", f"open({str(ticks)!r}, 'a').write('x')"], every=0.3)
    listed = [p.as_dict() for p in cluster.processes]
    assert [(r["role"], r["id"], r["region"]) for r in listed] == [
        ("membership", "membership-0", "local"), ("matcher", "matcher-0", "local"), ("agent", "agent-0", "local"),
        ("router", "router-0", "eu"), ("web", "web", "local"), ("tick", "tick", "local")]
    pids = []
    try:
        await cluster.start()
        pids = cluster.pids()
        assert len(pids) == 6 and all(alive(p) for p in pids)
        for p in cluster.processes[:4]:
            assert await serving(p.address), p.id
            assert "grpc_server_started_total" in await asyncio.to_thread(get, f"http://{p.metrics}/metrics")
        view = await fetch_view(cluster.replicas[0])
        members = {m.id: m for m in view.members}
        assert {i: m.state for i, m in members.items()} == dict.fromkeys(
            ["matcher-0", "router-0", "agent-0"], mpb.MEMBER_STATE_ALIVE)
        assert members["router-0"].region == "eu" and members["router-0"].address == router.address
        assert members["agent-0"].metrics_address == cluster.process("agent-0").metrics
        assert await asyncio.to_thread(get, f"http://{web}/")
        await wait_for(lambda: ticks.exists() and len(ticks.read_text()) >= 3, 20, 0.1, what="three periodic runs")

        agent = cluster.process("agent-0")
        cluster.signal("agent-0", signal.SIGKILL)
        assert cluster.exited() == ["agent-0"]
        await cluster.launch(agent)
        assert agent.starts == 2 and await serving(agent.address) and cluster.exited() == []
        assert agent.log.read_text().count("=== start") == 2
        pids = cluster.pids()
    finally:
        cluster.stop()
    assert not [p for p in pids if alive(p)]
    runs = len(ticks.read_text())
    await asyncio.sleep(0.6)
    assert len(ticks.read_text()) == runs, "the periodic job ran after stop"


@pytest.mark.timeout(120)
async def test_a_process_that_exits_early_fails_the_start_with_its_log(tmp_path):
    cluster = Cluster(agents=1, matchers=1, memberships=1, placement=Loopback(0), log_dir=tmp_path,
                      extra={"agent": ["--stripes", "999"]})
    with pytest.raises(RuntimeError, match="agent-0 exited with 2") as e:
        await cluster.start()
    assert "--stripes" in str(e.value) and "999" in str(e.value)
    assert cluster.pids() and not [p for p in cluster.pids() if alive(p)]


LAUNCHER = """
import asyncio, json, shutil, sys
from echelon.launch import Cluster, Loopback

async def main():
    cluster = Cluster(agents=1, matchers=1, memberships=1, placement=Loopback(0), log_dir=sys.argv[1])
    if shutil.which("setpriv"):
        cluster.add_aux("web", [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"])
    await cluster.start()
    print(json.dumps(cluster.pids()), flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


@pytest.mark.timeout(120)
async def test_a_launcher_killed_outright_takes_its_services_with_it(tmp_path):
    """The services run in sessions of their own, so nothing but the launcher stops them:
    killed with SIGKILL, it cannot. Each service asked the kernel for a SIGTERM when its
    parent dies (runtime/server.py `follow_parent`), and drains as on any SIGTERM; an
    auxiliary process gets the same from `setpriv` (skipped without it)."""
    launcher = await asyncio.create_subprocess_exec(sys.executable, "-c", LAUNCHER, str(tmp_path),
                                                    stdout=asyncio.subprocess.PIPE)
    pids: list[int] = []
    try:
        line = await asyncio.wait_for(launcher.stdout.readline(), 60)
        pids = json.loads(line)
        assert len(pids) == 3 + bool(shutil.which("setpriv")) and all(alive(p) for p in pids)
        # setpriv cannot look for a parent dead before its prctl (a service does): kill the
        # launcher only once setpriv has handed over to the program.
        await wait_for(lambda: not any(Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"setpriv") for p in pids),
                       20, 0.05, what="setpriv replaced by its program")
        launcher.kill()
        await launcher.wait()
        await wait_for(lambda: not any(alive(p) for p in pids), 20, 0.2, what="every service gone with the launcher")
        for log in tmp_path.glob("[!w]*.log"):
            assert "stopped" in log.read_text(), f"{log.name} did not drain"  # SIGTERM's path, not a crash
    finally:
        if launcher.returncode is None:
            launcher.kill()
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_a_service_whose_launcher_died_before_it_looked_does_not_start():
    """The launcher may die between its fork and the child's prctl: the child then has
    another parent, and must not start a service nobody owns."""
    check = "from echelon.runtime.server import follow_parent; print(follow_parent())"
    for parent, says in ((os.getpid(), "True"), (1, "False"), ("", "True")):
        out = subprocess.run([sys.executable, "-c", check], env={**os.environ, "ECHELON_PARENT_PID": str(parent)},
                             capture_output=True, text=True, timeout=60)
        assert out.stdout.split() == [says], (parent, out.stderr)
