"""OctopiA's control-plane experiments, short (the CI version of
`python -m loadtest.octopia_control_sim`). Oracles: events routed through either
system's tables reach exactly the subscriptions that match them (brute force over every
subscription); the counts that follow from the overlay's structure, computed here from
its definition (a flood over a connected graph costs 2|E| - (n - 1) messages, OctopiA's
advertisement one per other region, its SRT holds each advertisement at one region's
brokers, its PRT each subscription at every broker of its cluster); and the direction of
each of the paper's figures."""

from __future__ import annotations

from click.testing import CliRunner

from loadtest.octopia_control_sim import Setting, main, publisher_sweep, subscriber_sweep


def test_short_run_counts_directions_and_oracle():
    s = Setting(advertisements=(60,), publishers=100, subscribers=(250,))
    n, t, k = s.t * s.regions, s.t, s.regions
    edges = k * (t - 1) + t * k * (k - 1) // 2
    [pub] = publisher_sweep(s)
    o, tid = pub["octopia"], pub["tid"]
    assert tid["srt"] == 60 and o["srt"] == 60 * k / n  # every broker against one region's
    assert tid["ims"] == 2 * edges - (n - 1) and o["ims"] == k - 1  # no subscriptions yet: no CIB_SET
    assert o["delay"] < tid["delay"]
    [sub], oracle = subscriber_sweep(s, check_events=60)
    o, tid = sub["octopia"], sub["tid"]
    assert o["prt"] == 250 * t / n  # subgrouping: each subscription on every broker of its cluster
    assert o["prt"] > tid["prt"]  # the paper: OctopiA's PRTs are larger ...
    assert t - 1 <= o["ims"] <= t - 1 + (k - 1) and tid["ims"] < o["ims"]  # ... and it sends more IMs per subscription ...
    assert o["delay"] < tid["delay"]  # ... yet subscribes faster
    assert oracle["events"] == 60 and oracle["deliveries"] > 0
    assert oracle["octopia_exact"] and oracle["tid_exact"]


def test_command_prints_both_tables_beside_the_paper():
    result = CliRunner().invoke(main, ["--advertisements", "20", "--subscribers", "50", "--check-events", "10"])
    assert result.exit_code == 0, result.output
    assert "[93.0%]" in result.output and "[98.9x]" in result.output and "OctopiA exact: True" in result.output
    bad = CliRunner().invoke(main, ["--subscribers", "0"])
    assert bad.exit_code != 0
    assert CliRunner().invoke(main, ["--sensitivity", "x"]).exit_code != 0
