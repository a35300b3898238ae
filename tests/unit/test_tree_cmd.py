"""`echelon tree` prints the same tree `build_tree` computes."""

from __future__ import annotations

import json

from click.testing import CliRunner

from echelon.core.lbdd import build_tree
from echelon.cli.tree import tree

PAPER = [f"10.3.17.{x}" for x in (74, 97, 234, 90, 98, 64, 61, 184, 72, 88, 44, 68)]


def test_json_matches_build_tree():
    source, members = PAPER[0], PAPER[1:]
    # Mix both spellings: repeated options and a comma-separated list.
    args = ["--source", source, "--members", ",".join(members[:6])]
    args += [a for m in members[6:] for a in ("--members", m)]
    result = CliRunner().invoke(tree, [*args, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    expected = build_tree(source, members)
    assert [tuple(e) for e in out["edges"]] == expected.edges
    assert out["depth"] == expected.depth == 3
    nodes = {n["key"]: n for n in out["nodes"]}
    assert set(nodes) == set(PAPER)
    for k, n in nodes.items():
        assert (n["bucket"], n["rank"], n["out_degree"]) == (
            expected.bucket[k],
            expected.rank[k],
            expected.out_degree[k],
        )
        assert n["parent"] == expected.parent.get(k)


def test_table_output():
    result = CliRunner().invoke(tree, ["--source", PAPER[0], "--members", ",".join(PAPER[1:])])
    assert result.exit_code == 0, result.output
    assert "10.3.17.184" in result.output
    assert "depth 3" in result.output
