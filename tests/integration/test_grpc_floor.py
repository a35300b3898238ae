"""loadtest.grpc_floor: a real grpc.aio server with no Echelon code behind it, fed by the
raw-stub publisher or the Node one (loadtest/node) in a child process, in each of its modes
(and the agent's own Publish handler on a stub node): every request read and
acknowledged as the mode says (the client's sends return only once their last request is
acked), each measure present. No speed is asserted (`make bench-events`, `--floor`)."""

from __future__ import annotations

import pytest

from loadtest import grpc_floor


@pytest.mark.timeout(120)
@pytest.mark.parametrize("client", ["python", "node"])
def test_every_mode_acks_every_request_and_reports_its_costs(client):
    if client == "node":
        from loadtest.bench_events.node import install

        if why := install():
            pytest.skip(f"the Node publisher cannot run here: {why}")
    rows = grpc_floor.run(requests=2 * grpc_floor.SEND, window=grpc_floor.SEND, langs=(client,))
    assert [r["mode"] for r in rows] == list(grpc_floor.MODES) and {r["client"] for r in rows} == {client}
    for r in rows:
        assert r["requests_per_s"] > 0 and r["server_us_per_request"] > 0 and r["client_us_per_request"] > 0, r
    header, *lines = grpc_floor.table(rows).splitlines()
    assert "requests/s" in header
    assert [line.split("  ")[0].strip().removesuffix(" (node client)") for line in lines] == list(grpc_floor.MODES)
