"""Durable subscribers through the fault schedule (docs/guarantees.md, "Durable
subscriptions"; loadtest/chaos/durable.py says
how they are placed and counted): the full run (`make chaos`, test_faults.py) carries
them too; this one kills an agent and restarts it on an EMPTY data dir (the node lost its
disk), and its durable subscriptions still lose nothing, thanks to the replica."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loadtest.chaos import Config, run


@pytest.mark.chaos
@pytest.mark.timeout(900)
def test_wiped_disk_loses_nothing_for_durable_subscribers():
    out = Path(os.environ.get("ECHELON_CHAOS_OUT", "out/chaos")) / "wiped"
    result = run(Config.short(out=out, log=print, wipe_disk=True))
    print(result.text)
    durable = {k: v for k, v in result.targets.items() if k.startswith("durable")}
    # Order per key is printed, not asserted (loadtest/chaos/durable.py says why).
    assert set(durable) == {"durable: 0 lost", "durable: 0 duplicates after ack"}, durable
    assert all(ok for ok, _ in durable.values()), durable
    assert "kill" in {r.fault for r in result.rows}
