"""The README's main job, `echelon demo` (services/echelon/cli/demo.py): a local cluster of processes,
200 quotes and one with a 1 MiB payload (streamed to its subscribers in chunks, beside the
small events on their shared Subscribe streams) published at DELIVERED; every subscriber
gets exactly what its filter matches, in order. Under a deadline: a hang (an event never
acknowledged, a chunked payload never finished) fails it."""

from __future__ import annotations

import asyncio
import json

from echelon.cli.demo import run_demo


async def test_the_demo_delivers_exactly_what_each_filter_matches(capsys):
    ok = await asyncio.wait_for(run_demo(events=200, as_json=True), 120)
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = report["subscribers"]
    assert ok and report["ok"], rows
    assert all(r["in_order_exact"] and r["payload_intact"] and r["received"] == r["expected"] for r in rows), rows
    assert sum(r["received"] for r in rows) > report["events"] // 10  # the filters match something
