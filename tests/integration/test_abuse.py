"""The abuse suite's short run (loadtest/abuse.py; `make abuse` is the full one): every
attack against a cluster of processes with --auth beside honest clients. Asserted: each
attack's status, that it changed no state it must not, and that no member was declared
dead; latency and memory are printed, not asserted (no timed assertions)."""

from __future__ import annotations

import pytest

from loadtest import abuse

pytestmark = pytest.mark.timeout(600)

async def test_the_attacks_are_refused_and_change_nothing(tmp_path):
    args = abuse.parse(["--short", "--no-control", "--out", str(tmp_path)])
    runner = abuse.Abuse(args)
    runner.scoped = True
    rows = await runner.run()
    print("\n" + abuse.table(rows))
    assert [r.attack for r in rows] == [a.__name__.replace("_", "-") for a in abuse.ATTACKS]
    assert [(r.attack, r.status, r.changed, r.dead) for r in rows] == [(r.attack, r.expected, "no", 0) for r in rows]
