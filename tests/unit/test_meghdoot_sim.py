"""Smoke test of loadtest/meghdoot_sim.py --quick: plots written, shares adding up."""

from __future__ import annotations

import pytest

from loadtest import meghdoot_sim


def test_quick_run_prints_the_tables_and_writes_the_plots(tmp_path, capsys):
    results = meghdoot_sim.main(["--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "Fig. 9" in out and "Fig. 12" in out and "of events contact < 5% of peers" in out
    assert "Tab. 1" in out and f"{results[0].zones:,} zones" in out
    assert "holding a subscription it matches" in out
    for name in ("fig9_peers_contacted.png", "fig12_load_deciles.png"):
        assert (tmp_path / name).stat().st_size > 0
    for r in results:
        assert sum(r.histogram()) == pytest.approx(100.0)
        assert len(r.contacted) == len(r.affected) == 3000
        assert all(0 < c <= 100 for c in r.contacted) and all(a <= c for a, c in zip(r.affected, r.contacted))
        # each peer's share is of the messages sent since it joined: the first peer saw them all
        assert 0 < r.loads[0] <= 100 and sum(r.loads) >= 100 - 1e-9
        assert r.zones <= r.peers == int(r.peers)
        # every tenth event also counted as routed-through plus holders of a match: a subset of
        # the peers it contacted
        assert len(r.relevant) == 300 and all(0 < x <= c for x, c in zip(r.relevant, r.contacted[9::10]))
    assert [r.peers for r in results] == [20, 60]


def test_join_rule_capacity_bounds_replication():
    """The default join rule replicates only a peer over capacity (handling more than the
    given share of recent events) whose event share also exceeds its subscription share.
    No peer handles more than every event, so a capacity of 1 never replicates (every join
    splits: zones == peers); a capacity of 0 leaves the share test alone, so it is the
    `share` rule (None) join for join; 5% lies between."""
    runs = {c: meghdoot_sim.simulate(40, 300, 1500, seed=3, capacity=c) for c in (1.0, 0.05, 0.0, None)}
    assert runs[1.0].zones == runs[1.0].peers == 40 and runs[1.0].max_degree == 0
    assert (runs[0.0].zones, runs[0.0].max_degree, runs[0.0].contacted) == (
        runs[None].zones, runs[None].max_degree, runs[None].contacted)
    assert runs[None].zones < 40 and runs[None].max_degree >= 1  # the share rule does replicate here
    assert runs[None].zones <= runs[0.05].zones <= 40


def test_join_rule_messages_measures_the_capacity_in_messages():
    """`--join-rule messages`: the capacity is a share of the recent messages (section 5.3's load),
    not of the events. The same bounds hold: 1 never replicates, 0 is the `share` rule join for
    join; and since an event sends many messages, a peer's share of them is far below its share
    of the events, so at one capacity this rule replicates less (here: at least as many zones)."""
    runs = {c: meghdoot_sim.simulate(40, 300, 1500, seed=3, capacity=c, unit="messages") for c in (1.0, 0.05, 0.0)}
    share = meghdoot_sim.simulate(40, 300, 1500, seed=3, capacity=None)
    assert runs[1.0].zones == runs[1.0].peers == 40 and runs[1.0].max_degree == 0
    assert (runs[0.0].zones, runs[0.0].max_degree, runs[0.0].contacted) == (share.zones, share.max_degree,
                                                                              share.contacted)
    events = meghdoot_sim.simulate(40, 300, 1500, seed=3, capacity=0.05)
    assert share.zones <= events.zones <= runs[0.05].zones <= 40


def test_capacity_outside_0_1_is_refused(capsys):
    with pytest.raises(SystemExit):
        meghdoot_sim.main(["--quick", "--capacity", "1.5"])
    assert "--capacity" in capsys.readouterr().err
