"""`make bench-overload --short` as a test: publishers past what the subscribers take, on
real processes; every event acked OK reaches the lagging subscriptions (ephemeral, named
and durable), the one that chose eviction loses only by a counted eviction, and nothing fails
the publishers."""

from __future__ import annotations

import pytest

from loadtest.bench_overload import report, run

pytestmark = pytest.mark.asyncio


@pytest.mark.timeout(300)
async def test_overload_short(tmp_path):
    r = await run(seconds=5.0, rate=4000.0, window=4096, bound=200, log_dir=tmp_path)
    print(report(r))
    assert r["accepted"] > 1000 and r["failed"] == 0, report(r)
    assert r["lost"]["ephemeral"] == r["lost"]["named"] == r["lost"]["durable"] == 0, report(r)
    assert r["lost"]["evict"] == 0 or r["overflows"] >= 1, report(r)  # its loss only by a counted eviction
