"""What `echelon top` and `echelon topology` compute, without a cluster: the tree drawn is
the one the agents route on (checked against `dataplane.trees.Trees`, each node routing for
itself), congestion levels follow the alert's rule, values read in their units."""

import math

import pytest

from echelon.dataplane.trees import Trees
from echelon.observe import catalog
from echelon.observe.prometheus import Target, scrape_config, target_groups
from echelon.observe.top import fmt, legend, sparkline
from echelon.observe.topology import LinkState, Member, Topology, positions, tree_edges
from echelon.v1 import membership_pb2 as mpb

TOPIC = "quotes"


def view(n: int, subscribers: set[int]) -> tuple[list[Member], list[mpb.Member]]:
    ours, pbs = [], []
    for i in range(n):
        subs = (TOPIC,) if i in subscribers else ()
        ours.append(Member(f"agent-{i}", "agent", "local", "alive", f"10.0.0.{i}:7200", (), subs))
        pbs.append(mpb.Member(id=f"agent-{i}", role=mpb.ROLE_AGENT, address=f"10.0.0.{i}:7200", subscribes=subs))
    return ours, pbs


@pytest.mark.parametrize("stripe", [0, 1, 3])
@pytest.mark.parametrize("n", [2, 7, 23])
def test_drawn_tree_is_the_routing_of_every_agent(n, stripe):
    members, pbs = view(n, set(range(1, n)))
    edges = tree_edges(members, TOPIC, "agent-0", stripe)
    destinations = [m.id for m in members[1:]]
    # Oracle: the frames' path. The root routes every destination from its own Trees; each
    # target routes the destinations the frame carries to it, from its own Trees.
    trees = {}
    for m in members:
        trees[m.id] = Trees(m.id, m.address, "lbdd", stripes=4)
        trees[m.id].update(pbs)
    sent, todo = set(), [("agent-0", destinations)]
    while todo:
        node, carried = todo.pop()
        out, lost = trees[node].route(members[0].address, TOPIC, stripe, [d for d in carried if d != node])
        assert not lost
        for target, behind in out.items():
            sent.add((node, target))
            todo.append((target, behind))
    assert sent == set(edges)
    assert sorted(c for _, c in edges) == sorted(destinations)  # a tree: every destination once


def test_positions_put_children_below_parents():
    members, _ = view(9, set(range(1, 9)))
    topo = Topology(members, TOPIC, "agent-0", [tree_edges(members, TOPIC, "agent-0", 0)])
    pos = positions(topo)
    for parent, child in topo.trees[0]:
        assert pos[child][1] < pos[parent][1]


@pytest.mark.parametrize("ce,queue,level", [
    (math.nan, 0, "idle"),
    (1.0, 0, "flowing"),
    (0.8, 500, "flowing"),
    (2.0, 5, "backlogged"),
    (1.0, catalog.CONGESTED_QUEUE + 1, "congested"),
    (math.nan, catalog.CONGESTED_QUEUE + 1, "congested"),  # nothing dequeued: CE infinite
    (math.inf, 3, "backlogged"),
])
def test_link_levels_follow_the_congestion_rule(ce, queue, level):
    assert LinkState(ce, queue).level == level


@pytest.mark.parametrize("value,unit,text", [
    (1234.0, "ops", "1.23 k/s"), (0.0123, "s", "12.3 ms"), (3 << 20, "Bps", "3 MiB/s"),
    (0.667, "percentunit", "66.7%"), (math.nan, "s", "-"), (math.inf, "none", "∞"), (12.0, "short", "12"),
])
def test_values_read_in_their_unit(value, unit, text):
    assert fmt(value, unit) == text


def test_legend_and_sparkline():
    assert legend("{{member}} -> {{ peer }}", {"member": "a", "peer": "b"}) == "a -> b"
    assert legend("", {"__name__": "x", "job": "agent"}) == "job=agent"
    assert sparkline([0, 1, 2, math.nan]) == "▁▄█ "
    assert sparkline([]) == ""


def test_scrape_config_labels_targets_by_role_member_region():
    groups = target_groups([Target("agent", "agent-0", "127.0.0.1:8200", "eu"),
                            Target("membership", "membership-0", "127.0.0.1:8100")])
    assert [g["labels"]["role"] for g in groups] == ["membership", "agent"]
    assert groups[1] == {"targets": ["127.0.0.1:8200"], "labels": {"role": "agent", "member": "agent-0", "region": "eu"}}
    config = scrape_config(1.0, ["/r.json"], "/t.json")
    assert config["global"]["scrape_interval"] == "1s" and config["rule_files"] == ["/r.json"]
    assert {"source_labels": ["role"], "target_label": "job"} in config["scrape_configs"][0]["relabel_configs"]
