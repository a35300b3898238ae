"""`echelon up` as a user runs it: real processes and the Prometheus scraping them, then
SIGTERM leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path
import os
import signal
import subprocess
import sys
import time

import pytest

from echelon.observe.prometheus import PrometheusAPI
from tests.harness import wait_registered


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def echelon(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "echelon", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(180)
def test_up_serves_then_sigterm_stops_every_process(tmp_path):
    up = subprocess.Popen([sys.executable, "-m", "echelon", "up", "--agents", "2", "--base-port", "0", "--json",
                           "--log-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = []
    try:
        line = up.stdout.readline()
        assert line, up.stderr.read()
        ready = json.loads(line)
        procs = ready["processes"]
        pids = [p["pid"] for p in procs] + [ready["prometheus"]["pid"]]
        assert ready["ready"] and sorted(p["role"] for p in procs) == ["agent", "agent", "matcher"] + ["membership"] * 3
        assert all(alive(pid) for pid in pids)
        prometheus = PrometheusAPI(ready["prometheus"]["url"])
        deadline = time.time() + 30
        while len(prometheus.query("up == 1")) < len(procs) and time.time() < deadline:
            time.sleep(0.5)
        scraped = {(s["metric"]["job"], s["metric"]["member"]) for s in prometheus.query("up == 1")}
        assert scraped == {(p["role"], p["id"]) for p in procs}
        membership = next(p["address"] for p in procs if p["role"] == "membership")
        agents = [p["address"] for p in procs if p["role"] == "agent"]

        status = echelon("status", "--membership", membership, "--json")
        assert status.returncode == 0, status.stderr
        view = json.loads(status.stdout)
        assert {m["id"] for m in view["members"]} == {"agent-0", "agent-1", "matcher-0"}

        assert echelon("topic", "create", "t", "--attr", "n:int:0:9", "--agent", agents[0]).returncode == 0
        sub = subprocess.Popen([sys.executable, "-m", "echelon", "sub", "--agent", agents[1], "--topic", "t",
                                "--filter", "n >= 5", "--count", "2", "--json", "--compress"],
                               stdout=subprocess.PIPE, text=True)
        wait_registered(next(p["address"] for p in procs if p["role"] == "matcher"), "t")  # before we publish
        # `--compress`: agent-1 took the subscription's stream as a compressed one (docs/compression.md)
        deadline = time.time() + 30
        while not prometheus.query('echelon_agent_compressed_client_streams{member="agent-1"} == 1') \
                and time.time() < deadline:
            time.sleep(0.5)
        assert prometheus.query('echelon_agent_compressed_client_streams{member="agent-1"} == 1')
        for n, compress in ((7, ("--compress",)), (1, ()), (9, ())):
            pub = echelon("pub", "--agent", agents[0], "--topic", "t", "--attr", f"n={n}", "--delivered", *compress)
            assert pub.returncode == 0, pub.stdout + pub.stderr
        bad = echelon("pub", "--agent", agents[0], "--topic", "t", "--attr", "n=10")
        assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr and "'n'" in bad.stderr
        out, _ = sub.communicate(timeout=30)
        assert [json.loads(x)["attributes"]["n"] for x in out.splitlines()] == [7, 9]

        context = Path(os.environ["ECHELON_CONTEXT"])  # (tests/conftest.py: never the user's)
        assert json.loads(context.read_text())["agents"] == agents
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=60) == 0
        assert not context.exists()  # the cluster it named is gone
        deadline = time.time() + 10
        while any(alive(p) for p in pids) and time.time() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if alive(p)]
    finally:
        if up.poll() is None:
            up.kill()
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
