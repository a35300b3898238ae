"""The programs in examples/ run against a real local cluster (processes from the launcher, as `echelon up`)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from echelon.launch import Cluster, Loopback

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
    cluster = Cluster(agents=3, matchers=1, memberships=1, placement=Loopback(0),
                      log_dir=tmp_path_factory.mktemp("logs"))
    try:
        asyncio.run(cluster.start())
        yield [f"--agent={a}" for a in cluster.agent_addresses()]
    finally:
        cluster.stop()


def run(example: str, *args: str) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / example), *args], capture_output=True, text=True,
                         timeout=180, cwd=ROOT)
    assert out.returncode == 0, f"{example} exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def test_stock_alerts(agents):
    out = run("stock_alerts.py", *agents, "--count", "150")
    lines = [line for line in out.splitlines() if "expected" in line]
    assert len(lines) == 3 and all(line.endswith("ok") for line in lines), out
    assert "[aapl above 45] aapl" in out


def test_bulk_fanout(agents, tmp_path):
    out = run("bulk_fanout.py", *agents, "--out", str(tmp_path))
    assert "2 subscribers, every file intact: yes" in out, out
    for sub in ("subscriber-0", "subscriber-1"):
        assert sorted(p.name for p in (tmp_path / sub).iterdir()) == ["large.bin", "medium.bin", "small.bin"]
        assert (tmp_path / sub / "large.bin").stat().st_size == 6 << 20


def test_nack_consumer(agents):
    out = run("nack_consumer.py", agents[1], "--jobs", "20", "--max-outstanding", "3")
    assert "20 jobs done, 4 retried after a nack, at most" in out and out.rstrip().endswith("ok"), out
    assert "job 5: done (attempt 2)" in out
