"""The bulk experiment, short: 4 MiB from one publisher to 4 subscribers in every mode the
agent supports, each host in its own namespace with a shaped uplink. Every subscriber
must hold the exact payload (SHA-256), once. Runs in the default `make test` where
namespaces can be created (root); skips with the reason elsewhere."""

from __future__ import annotations

import pytest

from loadtest.bulk import MB, Experiment, modes
from loadtest.netns import Unsupported, check_available

pytestmark = pytest.mark.netns


@pytest.mark.timeout(150)
def test_every_subscriber_gets_the_exact_payload_in_every_mode(tmp_path):
    try:
        check_available()
    except Unsupported as e:
        pytest.skip(f"network namespaces unavailable: {e}")
    exp = Experiment(payload=4 * MB, rate_mbit=100, subscribers=4, modes=modes(["p2p", "lbdd", "striped"], 4, 65536),
                     sweep=False, chunk=1 * MB, window=8 * MB, out=tmp_path, log=print)
    results = exp.run()
    ran = {r.mode for r in results["main"]}
    assert "p2p" in ran
    for name, reason in results["skipped"].items():
        print(f"{name} skipped: {reason}")
    for r in results["main"]:
        assert r.ok, f"{r.mode}: {r.errors}"
        assert r.verified == 4 and r.duplicates == 0, r
        assert r.seconds > 0
