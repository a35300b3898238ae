"""loadtest.netns: the pure parts always; real namespaces where we are root (marked netns)."""

from __future__ import annotations

import ipaddress
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadtest.netns import Network, NetnsError, Shaping, Unsupported, check_available, pick_subnet

SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5001)); s.listen(); s.settimeout(20)
c, _ = s.accept(); c.settimeout(20); n = 0
while (b := c.recv(1 << 20)):
    n += len(b)
print(n, flush=True)
"""
CLIENT = """
import socket, sys
s = socket.create_connection((sys.argv[1], 5001), timeout=float(sys.argv[3]))
s.sendall(bytes(int(sys.argv[2]))); s.close()
"""


def test_pick_subnet_takes_the_first_free_24():
    used = {ipaddress.ip_network("198.18.0.0/24"), ipaddress.ip_network("198.18.1.0/24")}
    assert str(pick_subnet(used)) == "198.18.2.0/24"
    assert str(pick_subnet(set(), "198.19.7.0/24")) == "198.19.7.0/24"
    with pytest.raises(ValueError):
        pick_subnet(set(), "10.0.0.0/24")  # outside 198.18.0.0/15
    with pytest.raises(NetnsError):
        pick_subnet(used, "198.18.1.0/24")


def test_shaping_commands():
    s = Shaping(rate_mbit=40)
    assert s.burst == 32 << 10 and not s.netem
    (tbf,) = s.leaf_commands("eth0")
    assert tbf[tbf.index("parent") + 1] == "1:10" and "tbf" in tbf and "40000kbit" in tbf
    netem, tbf = Shaping(rate_mbit=1000, delay_ms=10, jitter_ms=2, loss_pct=1).leaf_commands("eth0")
    assert netem[netem.index("delay"):][:3] == ["delay", "10ms", "2ms"] and "loss" in netem
    assert tbf[tbf.index("parent") + 1] == "20:1"  # tbf under netem
    assert Shaping(rate_mbit=1000).burst == 625_000  # 5 ms at the rate
    with pytest.raises(ValueError):
        Shaping(loss_pct=101)


def test_network_names_fit_and_suffixes_are_checked():
    net = Network(12, suffixes=range(2, 14), prefix="ech-4194304")
    assert len(net.bridge) <= 15 and len(net._veth(11) + "p") <= 15
    for bad in ([1, 2], [2, 2], [2, 255]):
        with pytest.raises(ValueError):
            Network(2, suffixes=bad)


def test_not_root_is_unsupported_with_the_reason(monkeypatch):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(Unsupported, match="need root"):
        check_available()


def _available() -> None:
    try:
        check_available()
    except Unsupported as e:
        pytest.skip(f"network namespaces unavailable: {e}")


@pytest.mark.netns
def test_hosts_shaping_partition_and_teardown():
    _available()
    net = Network(3)
    with net:
        a, b, c = net.hosts
        assert a.address.endswith(".2") and net.gateway.endswith(".1")
        net.shape(a, rate_mbit=16)
        qdiscs = {q["kind"] for q in net.qdisc_stats(a)}
        assert {"htb", "tbf", "pfifo"} <= qdiscs

        # 2 MB at 16 Mbit/s takes about a second: the tbf is in the path.
        server = net.popen(b, [sys.executable, "-c", SERVER, b.address], stdout=subprocess.PIPE, text=True)
        time.sleep(0.3)
        before = net.counters(a)["tx_bytes"]
        t0 = time.monotonic()
        net.run(a, [sys.executable, "-c", CLIENT, b.address, str(2_000_000), "5"], timeout=30)
        assert server.communicate(timeout=30)[0].strip() == "2000000"
        assert 0.8 < time.monotonic() - t0 < 5
        assert net.counters(a)["tx_bytes"] - before > 2_000_000

        # Partitioned: a connect from a to c times out (silent drops, no refusal).
        net.partition([a], [c])
        r = net.run(a, [sys.executable, "-c", CLIENT, c.address, "10", "1"], check=False)
        assert r.returncode != 0 and "timed out" in r.stderr
        net.heal()
        server = net.popen(c, [sys.executable, "-c", SERVER, c.address], stdout=subprocess.PIPE, text=True)
        time.sleep(0.3)
        net.run(a, [sys.executable, "-c", CLIENT, c.address, "10", "5"], timeout=30)
        assert server.communicate(timeout=30)[0].strip() == "10"

        net.link(b, up=False)
        r = net.run(a, [sys.executable, "-c", CLIENT, b.address, "10", "1"], check=False)
        assert r.returncode != 0
        net.link(b, up=True)

        sleeper = net.popen(c, ["sleep", "300"])
    assert sleeper.poll() is not None  # stopped by teardown
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(h.name in names for h in net.hosts)
    assert subprocess.run(["ip", "link", "show", net.bridge], capture_output=True).returncode != 0
    net.teardown()  # idempotent


HOLDER = """
import sys, time
from loadtest.netns import Network
with Network(2) as net:
    net.popen(net.hosts[0], ["sleep", "300"])
    print(" ".join([net.bridge] + [h.name for h in net.hosts]), flush=True)
    time.sleep(60)
"""


@pytest.mark.netns
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_tears_everything_down(sig):
    _available()
    p = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    try:
        bridge, *names = p.stdout.readline().split()
        assert names, "the holder did not build its network"
        p.send_signal(getattr(signal, sig))
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed.split() for n in names)
    assert subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode != 0



@pytest.mark.netns
def test_the_launcher_placement_puts_each_agent_in_a_host_of_its_own():
    """`NetnsPlacement`: agent i bound to host i's address inside its namespace, every
    other process in the root namespace on the bridge (the launcher itself is tested on
    loopback in tests/integration/test_launch.py; chaos and bulk run it on this placement)."""
    from echelon.launch import Cluster
    from loadtest.netns import NetnsPlacement

    _available()
    with Network(2) as net:
        placement = NetnsPlacement(net)
        cluster = Cluster(agents=2, matchers=1, memberships=1, placement=placement)
        assert [p.address for p in cluster.processes] == [
            f"{net.gateway}:7000", f"{net.gateway}:7020", f"{net.hosts[0].address}:7100",
            f"{net.hosts[1].address}:7100"]
        with pytest.raises(ValueError, match="2 hosts"):
            cluster.plan("agent")
        procs = {p.id: placement.popen(p.site, ["sleep", "30"]) for p in cluster.processes}
        expected = {h.name: {str(procs[f"agent-{h.index}"].pid)} for h in net.hosts}

        def inside():  # a child enters its namespace a moment after popen returns
            return {h.name: set(subprocess.run(["ip", "netns", "pids", h.name], capture_output=True,
                                               text=True).stdout.split()) for h in net.hosts}
        deadline = time.monotonic() + 10
        while (seen := inside()) != expected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen == expected
    assert all(p.poll() is not None for p in procs.values())  # teardown stopped them
