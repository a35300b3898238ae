"""Fault tests (issue 4): a cluster of real processes, each agent in its own network
namespace, a numbered workload, and kill -9 of a relay, a 3 s SIGSTOP, a partition,
delay/loss on two links and a membership replica killed and restarted (loadtest/chaos.py
says how each is made and counted).

The targets: nothing acknowledged is lost, nothing unexpected or duplicated reaches a
client, no member is falsely declared dead (not the paused one, not the delayed ones),
and a crash is declared within 2 s on every replica.

- `test_short_schedule_meets_the_targets` (marker netns, in the default `make test`):
  one of each fault, about 100 s; skips where namespaces cannot be created.
- `test_full_schedule_meets_the_targets` (marker chaos, `make chaos`): the 5-minute run
  (ECHELON_CHAOS_MINUTES to change it); where namespaces cannot be created it runs the
  same faults on loopback processes, without partitions and delay/loss, and says so.
"""

from __future__ import annotations

import os

import pytest

from loadtest.chaos import Config, Result, run
from loadtest.netns import Unsupported, check_available

MINUTES = float(os.environ.get("ECHELON_CHAOS_MINUTES", "5"))


def assert_targets(result: Result) -> None:
    print(result.text)
    missed = {name: value for name, (ok, value) in result.targets.items() if not ok}
    assert not missed, f"targets missed in {result.mode} mode: {missed}"


@pytest.mark.netns
@pytest.mark.timeout(420)
def test_short_schedule_meets_the_targets(tmp_path):
    try:
        check_available()
    except Unsupported as e:
        pytest.skip(f"network namespaces unavailable ({e}); `python -m loadtest.chaos --short --loopback` "
                    "runs the same faults on loopback, without partitions and delay/loss")
    result = run(Config.short(out=tmp_path, log=print))
    assert result.mode == "netns"
    assert [r.fault for r in result.rows] == ["baseline", "netem", "pause", "kill", "partition", "replica"]
    assert_targets(result)
    kill = next(r for r in result.rows if r.fault == "kill")
    assert kill.dead_expected == 1 and kill.target not in ",".join(r.target for r in result.rows if r.fault == "pause")
    assert next(r for r in result.rows if r.fault == "partition").dead_expected == 1  # 9 s > the 7 s silence timeout


@pytest.mark.chaos
@pytest.mark.timeout(int(MINUTES * 60) + 600)
def test_full_schedule_meets_the_targets(tmp_path):
    result = run(Config(minutes=MINUTES, out=tmp_path, log=print))
    print(f"mode: {result.mode} {result.reason}")
    kinds = {r.fault for r in result.rows}
    assert kinds >= ({"netem", "pause", "kill", "partition", "replica"} if result.mode == "netns"
                     else {"pause", "kill", "replica"})
    assert_targets(result)
